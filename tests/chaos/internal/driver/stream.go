package driver

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// msgKind is why a message is in the stream.
type msgKind int

const (
	kindOriginal msgKind = iota // the event, first time
	kindRetry                   // a producer retry: same event, new message, shortly after
	kindLater                   // the same event republished much later, on any partition
	kindConflict                // the event ID reused with another payload
)

// event is one business event of the stream.
type event struct {
	id, tenant string
	amount     int
	// account and seq: the kafka-parallel stream's record key and the
	// event's place among the account's (empty and 0 elsewhere).
	account string
	seq     int
}

// streamMsg is one message to publish.
type streamMsg struct {
	ev        *event
	kind      msgKind
	amount    int
	sentAt    time.Time
	partition int32
}

// key is the record key: the account, in the kafka-parallel stream.
func (m streamMsg) key() []byte {
	if m.ev.account == "" {
		return nil
	}
	return []byte(m.ev.account)
}

func (m streamMsg) payload() []byte {
	b, _ := json.Marshal(wire.Event{EventID: m.ev.id, Amount: m.amount, SentAt: m.sentAt.Format(time.RFC3339Nano)})
	return b
}

// stream is everything one mode publishes, in publishing order, cut into
// chunks that the driver publishes as the consumers catch up.
type stream struct {
	events    []*event
	byID      map[string]*event
	conflicts map[string]int // event ID -> the conflicting payload's amount
	chunks    [][]streamMsg
	// originals[k] is how many events have their first message in
	// chunks[0..k].
	originals []int
	messages  int
	counts    [4]int // messages by kind
}

// Shares of the stream: of every 100 events, 15 get a producer retry and 8
// are republished later; one in 100 (at least 2) gets a conflicting payload.
const (
	retryShare    = 0.15
	laterShare    = 0.08
	conflictShare = 0.01
	maxChunks     = 20
)

// newStream builds the stream of n events for partitions partitions (1 for
// a queue). A retry and a conflict go to their event's partition, after it,
// as a producer keyed by event does: the original is always done when the
// conflicting payload arrives, so it is the conflicting one that must be
// refused. A later republication goes to any partition and races the
// original.
//
// With accounts (kafka-parallel), event i belongs to an account
// (wire.AccountOf), whose partition every message of the event goes to, a
// later republication too: as a producer keyed by account does, so that
// the account's events are in order on its partition.
func newStream(rng *rand.Rand, n int, partitions int32, accounts int) *stream {
	s := &stream{byID: map[string]*event{}, conflicts: map[string]int{}}
	type placed struct {
		pos float64
		msg streamMsg
	}
	var all []placed
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	home := func(id string) int32 {
		h := fnv.New32a()
		h.Write([]byte(id))
		return int32(h.Sum32() % uint32(partitions))
	}
	nConflicts := max(2, int(float64(n)*conflictShare))
	conflicting := map[int]bool{}
	for _, i := range rng.Perm(n)[:min(nConflicts, n)] {
		conflicting[i] = true
	}
	for i := range n {
		ev := &event{id: fmt.Sprintf("evt-%07d", i), tenant: fmt.Sprintf("tenant-%d", i%3), amount: 100 + rng.IntN(900)}
		s.events = append(s.events, ev)
		s.byID[ev.id] = ev
		p := home(ev.id)
		anywhere := rng.Int32N(partitions)
		if accounts > 0 {
			ev.account, ev.seq = wire.AccountOf(i, accounts)
			p = home(ev.account)
			anywhere = p
		}
		at := base.Add(time.Duration(i) * time.Millisecond)
		all = append(all, placed{float64(i), streamMsg{ev: ev, kind: kindOriginal, amount: ev.amount, sentAt: at, partition: p}})
		if rng.Float64() < retryShare {
			all = append(all, placed{float64(i) + 0.5 + 20*rng.Float64(),
				streamMsg{ev: ev, kind: kindRetry, amount: ev.amount, sentAt: at.Add(time.Second), partition: p}})
		}
		if rng.Float64() < laterShare {
			all = append(all, placed{float64(i) + float64(n)/5 + float64(n)/3*rng.Float64(),
				streamMsg{ev: ev, kind: kindLater, amount: ev.amount, sentAt: at.Add(time.Hour), partition: anywhere}})
		}
		if conflicting[i] {
			other := ev.amount + 1 + rng.IntN(99)
			s.conflicts[ev.id] = other
			all = append(all, placed{float64(i) + 1 + float64(n)/5*rng.Float64(),
				streamMsg{ev: ev, kind: kindConflict, amount: other, sentAt: at.Add(time.Minute), partition: p}})
		}
	}
	sort.SliceStable(all, func(a, b int) bool { return all[a].pos < all[b].pos })

	s.messages = len(all)
	chunks := max(1, min(maxChunks, len(all)/20))
	seen := 0
	for k := range chunks {
		lo, hi := k*len(all)/chunks, (k+1)*len(all)/chunks
		chunk := make([]streamMsg, 0, hi-lo)
		for _, pl := range all[lo:hi] {
			chunk = append(chunk, pl.msg)
			s.counts[pl.msg.kind]++
			if pl.msg.kind == kindOriginal {
				seen++
			}
		}
		s.chunks = append(s.chunks, chunk)
		s.originals = append(s.originals, seen)
	}
	return s
}

// topicOrder is what a mode's topic holds, read back after the run in
// offset order per partition: for each event, the payloads on the topic
// and which of them comes first on a partition. The publish order is not
// what the consumers saw: a producer that retries a batch after a broker
// restart can land an event's first payload after its conflicting one,
// and then the conflicting payload is the one the inbox must take.
type topicOrder struct {
	events   map[string]*onTopic
	messages int
}

// onTopic is one event as its topic holds it. Payloads are told apart by
// their amount (what a conflicting payload changes).
type onTopic struct {
	amounts    []int   // the distinct payloads on the topic
	firsts     []int   // the distinct payloads that come first on a partition
	partitions []int32 // the partitions the event is on
	// pos is where the event first appears: the count of messages added
	// before it. Of two events first on one partition, the one with the
	// lower pos comes first in offset order.
	pos int
}

func newTopicOrder() *topicOrder { return &topicOrder{events: map[string]*onTopic{}} }

// add records a message of event id with amount on partition p. The
// messages of one partition must be added in offset order.
func (t *topicOrder) add(p int32, id string, amount int) {
	e := t.events[id]
	if e == nil {
		e = &onTopic{pos: t.messages}
		t.events[id] = e
	}
	t.messages++
	if !slices.Contains(e.partitions, p) {
		e.partitions = append(e.partitions, p)
		if !slices.Contains(e.firsts, amount) {
			e.firsts = append(e.firsts, amount)
		}
	}
	if !slices.Contains(e.amounts, amount) {
		e.amounts = append(e.amounts, amount)
	}
}

// orderOf returns where event id comes in the topic's order (see
// onTopic.pos), or seq, its place in the publish order, when the topic
// does not hold it.
func (t *topicOrder) orderOf(id string, seq int) int {
	if e := t.events[id]; e != nil {
		return e.pos
	}
	return seq
}

// mayWin reports whether a delivery of the event with amount may be the
// one that makes its effect: a consumer group reads each partition in
// offset order, so a payload can be claimed first only if it comes first
// on some partition. When an event's payloads come first on different
// partitions (a later republication of the first payload elsewhere, the
// conflicting one first on the event's own partition), either may win,
// as the consumers' progress on each partition decides.
func (e *onTopic) mayWin(amount int) bool { return slices.Contains(e.firsts, amount) }
