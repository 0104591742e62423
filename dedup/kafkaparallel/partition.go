package kafkaparallel

import (
	"context"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// partition runs one claimed partition: it reads records while the
// in-flight limits allow, routes each to its lane, hands the first
// message of every lane to the router, starts a lane's next message when
// the one before is acked, and marks the partition's watermark — the
// first offset read and not done — whenever it moves. One goroutine (run)
// owns every field; each message handed to the router has a goroutine
// (deliver) that waits for its ack and reports back on results.
type partition struct {
	sub   *subscription
	s     *Subscriber
	sess  sarama.ConsumerGroupSession
	claim sarama.ConsumerGroupClaim
	log   watermill.LoggerAdapter

	// results carries each deliverer's one report; it holds one per
	// message in flight, so no deliverer ever waits to report.
	results chan result
	// stop is closed when the partition drains: nothing more goes to the
	// router. hard is closed when the drain's time is up: deliverers stop
	// waiting for acks and cancel their messages' contexts.
	stop, hard chan struct{}

	// window holds the entries read and not yet below the watermark, in
	// offset order, from head on.
	window []*entry
	head   int
	lanes  map[string]*lane
	// inFlight counts the entries read and not done; running the
	// deliverers alive.
	inFlight, running int
	next              int64 // the offset after the last one read; -1 before
	marked            int64 // the watermark last marked; -1 before
	token             bool  // holds a token of Subscriber.tokens for the next record
	draining          bool
	// ahead holds records read from the claim and not yet taken in: the
	// limits were reached.
	ahead  []*sarama.ConsumerMessage
	paused bool
	group  sarama.ConsumerGroup
}

// entry is one record read from the partition.
type entry struct {
	rec  *sarama.ConsumerMessage
	msg  *message.Message // nil when the Unmarshaler refused the record
	err  error            // the Unmarshaler's error
	lane *lane            // nil: ordered with nothing (OrderNone)
	done bool
}

// lane is the entries of one ordering key that wait, in offset order,
// behind the one running.
type lane struct {
	key   string
	busy  bool
	queue []*entry
}

type result struct {
	e     *entry
	acked bool
}

func newPartition(sub *subscription, group sarama.ConsumerGroup, sess sarama.ConsumerGroupSession,
	claim sarama.ConsumerGroupClaim) *partition {
	s := sub.s
	return &partition{
		sub: sub, s: s, sess: sess, claim: claim, group: group,
		log: sub.log.With(watermill.LogFields{"kafka_partition": claim.Partition(),
			"kafka_initial_offset": claim.InitialOffset()}),
		results: make(chan result, s.cfg.MaxInFlightPerPartition),
		stop:    make(chan struct{}),
		hard:    make(chan struct{}),
		lanes:   map[string]*lane{},
		next:    -1,
		marked:  -1,
	}
}

// run consumes the partition until it is revoked, the session ends or the
// subscriber closes, then drains it.
//
// It reads the claim's records as they come, so that it sees the channel
// close when a cooperative rebalance revokes the partition, even while
// the in-flight limits are reached. Records it cannot take in yet wait in
// ahead; once that holds Consumer.ChannelBufferSize records the partition
// is paused, so that Sarama fetches nothing more for it, until ahead is
// empty again. The read-ahead is thus about twice Sarama's own.
func (p *partition) run() {
	s := p.s
	s.n.partitions.Add(1)
	defer s.n.partitions.Add(-1)
	p.log.Debug("Consuming partition", nil)
	records := p.claim.Messages()
	for !p.draining {
		p.admit()
		// Paused once ahead holds as many records as Sarama buffers for
		// a partition, fetching again once it is empty.
		if len(p.ahead) >= max(1, s.sarama.ChannelBufferSize) {
			p.pause(true)
		} else if len(p.ahead) == 0 {
			p.pause(false)
		}
		var take chan<- struct{}
		if len(p.ahead) > 0 && p.room() && !p.token {
			take = s.tokens
		}
		select {
		case take <- struct{}{}:
			p.token = true
		case rec, ok := <-records:
			if !ok { // revoked (cooperative rebalance), or the consumer stopped
				p.draining = true
				break
			}
			p.ahead = append(p.ahead, rec)
		case r := <-p.results:
			p.finish(r)
		case <-p.sess.Context().Done():
			p.draining = true
		case <-s.closing:
			p.draining = true
		case <-p.sub.ctx.Done():
			p.draining = true
		}
	}
	p.drain()
}

// room reports whether the partition's limits let one more record in.
func (p *partition) room() bool {
	return p.inFlight < p.s.cfg.MaxInFlightPerPartition && len(p.window)-p.head < p.s.cfg.MaxWindow
}

// admit takes in the records waiting ahead while the limits allow.
func (p *partition) admit() {
	for len(p.ahead) > 0 && p.room() {
		if !p.token {
			select {
			case p.s.tokens <- struct{}{}:
				p.token = true
			default:
				return
			}
		}
		rec := p.ahead[0]
		p.ahead[0] = nil
		p.ahead = p.ahead[1:]
		p.token = false
		p.add(rec)
	}
	if len(p.ahead) == 0 {
		p.ahead = p.ahead[:0:0] // let a long backlog's array go
	}
}

// pause pauses or resumes fetching the partition.
func (p *partition) pause(on bool) {
	if on == p.paused {
		return
	}
	p.paused = on
	tp := map[string][]int32{p.claim.Topic(): {p.claim.Partition()}}
	if on {
		p.group.Pause(tp)
	} else {
		p.group.Resume(tp)
	}
}

// add takes a record read from the partition: it becomes an entry of the
// window and of its lane, and runs at once if its lane is free.
func (p *partition) add(rec *sarama.ConsumerMessage) {
	s := p.s
	p.next = rec.Offset + 1
	e := &entry{rec: rec}
	if msg, err := s.kafka.Unmarshaler.Unmarshal(rec); err != nil {
		e.err = err
		s.n.undecodable.Add(1)
	} else {
		e.msg = msg
	}
	p.window = append(p.window, e)
	p.inFlight++
	s.n.inFlight.Add(1)
	if key, ordered := p.laneKey(e); ordered {
		l := p.lanes[key]
		if l == nil {
			l = &lane{key: key}
			p.lanes[key] = l
		}
		e.lane = l
		if l.busy {
			l.queue = append(l.queue, e)
			return
		}
	}
	p.start(e)
}

// laneKey returns the lane of e, or ordered false when e is ordered with
// nothing.
func (p *partition) laneKey(e *entry) (key string, ordered bool) {
	switch p.s.cfg.Ordering {
	case OrderByPartition:
		return "", true
	case OrderNone:
		return "", false
	}
	switch {
	case p.s.cfg.OrderingKey == nil:
		return string(e.rec.Key), true
	case e.msg == nil:
		// Its key is a function of the message it could not become.
		return "", false
	default:
		return p.s.cfg.OrderingKey(e.msg), true
	}
}

// start hands e to a deliverer.
func (p *partition) start(e *entry) {
	if e.lane != nil {
		e.lane.busy = true
	}
	p.running++
	p.s.n.running.Add(1)
	p.sub.deliverers.Add(1)
	go p.deliver(e)
}

// finish takes a deliverer's report: an acked entry is done, which may
// move the watermark, and its lane's next entry starts.
func (p *partition) finish(r result) {
	s, e := p.s, r.e
	p.running--
	s.n.running.Add(-1)
	if r.acked {
		e.done = true
		p.inFlight--
		s.n.inFlight.Add(-1)
		<-s.tokens
		p.advance()
	}
	l := e.lane
	if l == nil {
		return
	}
	l.busy = false
	if p.draining {
		return
	}
	if len(l.queue) == 0 {
		delete(p.lanes, l.key)
		return
	}
	next := l.queue[0]
	l.queue[0] = nil
	l.queue = l.queue[1:]
	p.start(next)
}

// advance drops the done entries at the window's head and marks the
// watermark if it moved.
func (p *partition) advance() {
	for p.head < len(p.window) && p.window[p.head].done {
		p.window[p.head] = nil
		p.head++
	}
	switch {
	case p.head == len(p.window):
		p.window, p.head = p.window[:0], 0
	case p.head >= 256 && 2*p.head >= len(p.window):
		n := copy(p.window, p.window[p.head:])
		clear(p.window[n:])
		p.window, p.head = p.window[:n], 0
	}
	wm := p.next
	if p.head < len(p.window) {
		wm = p.window[p.head].rec.Offset
	}
	if wm > p.marked {
		p.sess.MarkOffset(p.claim.Topic(), p.claim.Partition(), wm, "")
		p.marked = wm
	}
}

// drain stops handing messages to the router, waits up to DrainTimeout
// for those running, and commits the watermark; what is not done is left
// to the partition's next owner.
func (p *partition) drain() {
	s := p.s
	close(p.stop)
	timedOut := false
	if p.running > 0 && s.cfg.DrainTimeout > 0 {
		t := time.NewTimer(s.cfg.DrainTimeout)
		for p.running > 0 && !timedOut {
			select {
			case r := <-p.results:
				p.finish(r)
			case <-t.C:
				timedOut = true
			}
		}
		t.Stop()
	}
	close(p.hard)
	// Sarama keeps a partition paused across reassignments.
	p.pause(false)
	stragglers := p.running
	// The deliverers still alive report into results' buffer and exit;
	// nobody reads them any more.
	s.n.running.Add(-int64(stragglers))
	left := p.inFlight
	s.n.inFlight.Add(-int64(left))
	s.n.left.Add(uint64(left))
	for range left {
		<-s.tokens
	}
	if p.token {
		<-s.tokens
	}
	p.sess.Commit()
	s.n.committed.Add(1)
	s.n.revoked.Add(1)
	fields := watermill.LogFields{"watermark": p.marked, "left": left}
	if timedOut {
		p.log.Info("Partition drained with messages still running: their next owner receives them again", fields.Add(
			watermill.LogFields{"still_running": stragglers, "drain_timeout": s.cfg.DrainTimeout.String()}))
		return
	}
	p.log.Debug("Partition drained", fields)
}

// deliver runs e: it hands its message to the router, sends it again
// after each nack, and reports once it is acked or given up.
func (p *partition) deliver(e *entry) {
	defer p.sub.deliverers.Done()
	var acked bool
	if e.msg == nil {
		acked = p.passUndecodable(e)
	} else {
		acked = p.send(e)
	}
	p.results <- result{e: e, acked: acked}
}

func (p *partition) send(e *entry) bool {
	s := p.s
	ctx, cancel := context.WithCancel(withRecord(p.sub.ctx, e.rec))
	defer cancel()
	msg := e.msg
	for {
		msg.SetContext(ctx)
		select {
		case p.sub.output <- msg:
		case <-p.stop:
			return false
		}
		s.n.delivered.Add(1)
		select {
		case <-msg.Acked():
			s.n.acked.Add(1)
			return true
		case <-msg.Nacked():
			s.n.nacked.Add(1)
		case <-p.hard:
			return false
		}
		if d := s.kafka.NackResendSleep; d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-p.stop:
				t.Stop()
				return false
			}
		}
		msg = msg.Copy() // a message is acked or nacked once
	}
}

// passUndecodable offers a record the Unmarshaler refused to
// Config.Undecodable until it takes it; without one the record stays
// until the partition drains.
func (p *partition) passUndecodable(e *entry) bool {
	s := p.s
	fields := watermill.LogFields{"kafka_partition_offset": e.rec.Offset}
	if s.cfg.Undecodable == nil {
		p.log.Error("Kafka record cannot be unmarshaled: it stays unprocessed, and the partition's committed offset stays below it", e.err, fields)
		<-p.stop
		return false
	}
	pause := max(s.kafka.NackResendSleep, 10*time.Millisecond)
	for {
		err := s.cfg.Undecodable(withRecord(p.sub.ctx, e.rec), e.rec, e.err)
		if err == nil {
			return true
		}
		p.log.Error("Undecodable Kafka record not taken, trying again", err, fields.Add(watermill.LogFields{"unmarshal_error": e.err.Error()}))
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-p.stop:
			t.Stop()
			return false
		}
		pause = min(2*pause, time.Minute)
	}
}
