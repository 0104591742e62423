package pgxgroup_test

import (
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/pgxgroup"
)

// BenchmarkLoneDelivery is one delivery at a time through a pipelined
// group (a group of one): its allocations are the path's own. The
// messages are made before the clock starts, and the handler queues one
// insert: what it allocates is the statement and its argument.
func BenchmarkLoneDelivery(b *testing.B) {
	f := setup(b, dedup.Group{})
	insert := "INSERT INTO " + f.effects + " (event_id, note) VALUES ($1, 'ok')"
	h := f.d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := pgxgroup.FromContext(msg.Context())
		tx.Queue(insert, msg.Metadata.Get("event_id"))
		return nil, nil
	})
	msgs := make([]*message.Message, b.N)
	for i := range msgs {
		msgs[i] = event("b"+strconv.Itoa(i), "ok")
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := h(msgs[i]); err != nil {
			b.Fatal(err)
		}
	}
}
