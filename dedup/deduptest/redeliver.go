package deduptest

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/dedup"
)

// TB is the part of testing.TB the helpers use: *testing.T, *testing.B and
// *testing.F satisfy it.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// EventIDKey is the metadata field [NewMessage] puts the event ID in: the
// one to read the key from with dedup.KeyFromMetadata(deduptest.EventIDKey).
const EventIDKey = "event_id"

// NewMessage returns a message of the business event eventID, as a
// producer publishes it: a new UUID (it identifies the delivery, not the
// event), payload as its payload, eventID in the metadata field EventIDKey,
// and metadata as further key, value pairs (a tenant ID, a correlation ID).
// An odd number of metadata strings is a mistake in the test: NewMessage
// panics.
func NewMessage(eventID, payload string, metadata ...string) *message.Message {
	if len(metadata)%2 != 0 {
		panic(fmt.Sprintf("deduptest: NewMessage: metadata must be key, value pairs, got %d strings", len(metadata)))
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
	msg.Metadata.Set(EventIDKey, eventID)
	for i := 0; i < len(metadata); i += 2 {
		msg.Metadata.Set(metadata[i], metadata[i+1])
	}
	return msg
}

// NoPublish adapts a handler that publishes nothing (the kind
// message.Router.AddConsumerHandler takes) to a message.HandlerFunc, as the
// router does.
func NoPublish(h message.NoPublishHandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) { return nil, h(msg) }
}

// DefaultTimes is how many times [Redeliver] delivers a message unless
// told otherwise ([Times]).
const DefaultTimes = 5

// Option changes how [Redeliver] delivers.
type Option func(*options)

type options struct {
	times      int
	concurrent bool
	retries    int
}

// Times delivers the message n times: the first delivery and n-1
// redeliveries. Defaults to DefaultTimes.
func Times(n int) Option { return func(o *options) { o.times = n } }

// Concurrently makes every delivery at the same moment, each in a goroutine
// of its own, as consumers do when a rebalance or an expired visibility
// timeout hands a message that is still being handled to another one.
// Without it the deliveries follow one another: each redelivery comes after
// the previous delivery returned, as after a lost ack.
func Concurrently() Option { return func(o *options) { o.concurrent = true } }

// UntilAcked delivers a nacked message again, as a broker does after a
// nack, up to max more times for each of the Times deliveries, so that the
// report shows how the redeliveries ended rather than the transient
// refusals on the way (another delivery holding the intent, a failed
// handler run, a deadlock). A poison error (dedup.IsPoison) is not
// redelivered: a poison queue would take the message. Every delivery made
// is in Report.Deliveries.
func UntilAcked(max int) Option { return func(o *options) { o.retries = max } }

// Delivery is one delivery of the message and how it ended.
type Delivery struct {
	// N numbers the Times deliveries from 1; Attempt numbers the
	// deliveries of one of them from 1 (above 1 only with UntilAcked).
	N, Attempt int
	// Output is what the middleware returned for the router to publish:
	// the handler's messages, or for a duplicate the stored ones.
	Output []*message.Message
	// Err is nil when the router would ack the delivery, and why it would
	// nack it otherwise.
	Err error
}

// Acked reports whether the router would ack the delivery.
func (d Delivery) Acked() bool { return d.Err == nil }

// Report is what [Redeliver] saw.
type Report struct {
	// Deliveries is every delivery made, in the order they returned.
	Deliveries []Delivery
	// Acked and Nacked count Deliveries by how they ended.
	Acked, Nacked int
	// Runs is how many times the middleware let the handler body run,
	// including runs that failed (and were rolled back or released).
	Runs int
}

// Errors returns the errors of the nacked deliveries, in Deliveries order.
func (r Report) Errors() []error {
	var errs []error
	for _, d := range r.Deliveries {
		if d.Err != nil {
			errs = append(errs, d.Err)
		}
	}
	return errs
}

// Outputs returns the output of every acked delivery, in Deliveries order.
func (r Report) Outputs() [][]*message.Message {
	var outs [][]*message.Message
	for _, d := range r.Deliveries {
		if d.Err == nil {
			outs = append(outs, d.Output)
		}
	}
	return outs
}

// String summarises the report in one line, for test failures.
func (r Report) String() string {
	times := "times"
	if r.Runs == 1 {
		times = "time"
	}
	s := fmt.Sprintf("%d deliveries: %d acked, %d nacked; the handler ran %d %s", len(r.Deliveries), r.Acked, r.Nacked, r.Runs, times)
	if errs := r.Errors(); len(errs) > 0 {
		s += fmt.Sprintf("; errors: %v", errs)
	}
	return s
}

// Redeliver delivers msg through d's middleware in front of h, several
// times (Times), one after the other or all at once (Concurrently), and
// reports what happened. Every delivery is a copy of msg with its UUID,
// payload, metadata and context, as a broker's redelivery is: what a
// handler under test must survive. It fails t only when called wrongly;
// what the deliveries did is the report's to tell, and the test's to
// judge, typically:
//
//	rep := deduptest.Redeliver(t, d, h, msg, deduptest.Times(5), deduptest.Concurrently())
//	require.Equal(t, 5, rep.Acked, rep)
//	require.Equal(t, 1, rep.Runs, rep)
//
// plus a look at the effect itself (the row the handler wrote, the call
// it made). Outside a message.Router the middleware has no handler name to
// use as the operation: set dedup.Config.Operation.
func Redeliver(t TB, d *dedup.Deduplicator, h message.HandlerFunc, msg *message.Message, opts ...Option) Report {
	t.Helper()
	o := options{times: DefaultTimes}
	for _, opt := range opts {
		opt(&o)
	}
	var wrong string
	switch {
	case d == nil:
		wrong = "the Deduplicator is nil"
	case h == nil:
		wrong = "the handler is nil"
	case msg == nil:
		wrong = "the message is nil"
	case o.times < 1:
		wrong = fmt.Sprintf("Times(%d): deliver at least once", o.times)
	case o.retries < 0:
		wrong = fmt.Sprintf("UntilAcked(%d) is negative", o.retries)
	}
	if wrong != "" {
		t.Fatalf("deduptest: Redeliver: %s", wrong)
		return Report{}
	}
	var (
		runs atomic.Int64
		mu   sync.Mutex
		rep  Report
	)
	handler := d.Middleware(func(m *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		return h(m)
	})
	deliver := func(n int) {
		for attempt := 1; ; attempt++ {
			out, err := handler(msg.CopyWithContext())
			mu.Lock()
			rep.Deliveries = append(rep.Deliveries, Delivery{N: n, Attempt: attempt, Output: out, Err: err})
			mu.Unlock()
			if err == nil || attempt > o.retries || dedup.IsPoison(err) {
				return
			}
		}
	}
	if o.concurrent {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for n := 1; n <= o.times; n++ {
			wg.Go(func() {
				<-start
				deliver(n)
			})
		}
		close(start)
		wg.Wait()
	} else {
		for n := 1; n <= o.times; n++ {
			deliver(n)
		}
	}
	for _, dl := range rep.Deliveries {
		if dl.Err == nil {
			rep.Acked++
		} else {
			rep.Nacked++
		}
	}
	rep.Runs = int(runs.Load())
	return rep
}
