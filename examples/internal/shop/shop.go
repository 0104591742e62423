// Package shop is the small order domain the quickstart and kafka examples
// share: the event stream their producers publish, the handler that ships
// an order, and the faults they inject, so that each example's main.go
// shows only how inboxmill is wired to its transport.
package shop

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/dedup"
)

// Order is an order event's payload.
type Order struct {
	OrderID string    `json:"order_id"`
	SKU     string    `json:"sku"`
	Qty     int       `json:"qty"`
	SentAt  time.Time `json:"sent_at"`
}

// Stream is what the producers publish for n events: each event once, every
// fifth one a second time (a producer retry: new message UUID, new sent_at,
// same event), and finally event 7's ID reused for a different order.
func Stream(n int) []*message.Message {
	var msgs []*message.Message
	for i := 1; i <= n; i++ {
		msgs = append(msgs, OrderMessage(i, 1))
		if i%5 == 0 {
			msgs = append(msgs, OrderMessage(i, 1))
		}
	}
	return append(msgs, OrderMessage(7, 99))
}

// OrderMessage is event i, an order of qty items.
func OrderMessage(i, qty int) *message.Message {
	payload, _ := json.Marshal(Order{
		OrderID: fmt.Sprintf("o-%04d", i),
		SKU:     fmt.Sprintf("sku-%d", i%3),
		Qty:     qty,
		SentAt:  time.Now().UTC(),
	})
	// The UUID identifies this delivery attempt only; the event ID in the
	// metadata (a Kafka header, on Kafka) identifies the business event and
	// is what dedup keys on.
	msg := message.NewMessage(watermill.NewUUID(), payload)
	msg.Metadata.Set("event_id", EventID(i))
	msg.Metadata.Set("tenant_id", "shop-1")
	return msg
}

// EventID is event i's business ID.
func EventID(i int) string { return fmt.Sprintf("evt-%04d", i) }

func eventNumber(id string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(id, "evt-"))
	return n
}

// Faults injects what at-least-once delivery throws at a consumer and counts
// deliveries. It is safe for concurrent use.
type Faults struct {
	mu        sync.Mutex
	delivered int
	lostAck   map[string]bool
	failed    map[string]bool
}

// NewFaults returns fresh fault bookkeeping.
func NewFaults() *Faults {
	return &Faults{lostAck: map[string]bool{}, failed: map[string]bool{}}
}

// Count is a router middleware counting every delivery.
func (f *Faults) Count(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		f.mu.Lock()
		f.delivered++
		f.mu.Unlock()
		return h(msg)
	}
}

// LoseAcks is a router middleware, placed outside dedup's, that simulates a
// consumer crashing after its transaction committed but before the broker
// saw the ack, once for every sixth event: the message comes back.
func (f *Faults) LoseAcks(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		id := msg.Metadata.Get("event_id")
		if err == nil && eventNumber(id)%6 == 0 {
			f.mu.Lock()
			defer f.mu.Unlock()
			if !f.lostAck[id] {
				f.lostAck[id] = true
				return nil, errors.New("simulated crash after commit, before ack")
			}
		}
		return out, err
	}
}

// ShipOrder returns the business handler: it records a shipment through
// the claim's transaction with insert (INSERT INTO shipments (event_id,
// order_id, sku, qty) with four placeholders). Every fourth event fails
// once after writing: the write is rolled back with the inbox record, and
// the redelivery runs it again.
func (f *Faults) ShipOrder(insert string) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		tx, ok := dedup.TxFromContext(msg.Context())
		if !ok {
			return errors.New("ship order: no transaction in the context")
		}
		var o Order
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return dedup.Permanent(fmt.Errorf("order payload: %w", err))
		}
		id := msg.Metadata.Get("event_id")
		if _, err := tx.ExecContext(msg.Context(), insert, id, o.OrderID, o.SKU, o.Qty); err != nil {
			return err
		}
		if eventNumber(id)%4 == 0 {
			f.mu.Lock()
			defer f.mu.Unlock()
			if !f.failed[id] {
				f.failed[id] = true
				return errors.New("simulated failure of the warehouse API")
			}
		}
		return nil
	}
}

// Settled reports whether every one of the published messages has ended
// acked — executed, duplicate, or refused as a conflict — counting a lost
// ack's redelivery once more.
func (f *Faults) Settled(st dedup.Stats, published int) bool {
	return f.Acked(st) >= published
}

// Acked is how many published messages have ended acked, by st: executed,
// duplicates and conflicts, less the ones whose ack was lost (they come
// back, and end again).
func (f *Faults) Acked(st dedup.Stats) int {
	f.mu.Lock()
	lost := len(f.lostAck)
	f.mu.Unlock()
	return int(st.Executed+st.Duplicates+st.Conflicts) - lost
}

// Delivered is how many deliveries reached the router's handler.
func (f *Faults) Delivered() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.delivered
}

// Report prints the examples' closing lines and fails when an event shipped
// more than once.
func Report(out io.Writer, st dedup.Stats, delivered, published, events, shipments, distinct int, where string) error {
	fmt.Fprintf(out, "published %d messages for %d events%s; %d handler runs failed and were rolled back\n",
		published, events, where, st.Retries)
	fmt.Fprintf(out, "shipments: %d rows for %d distinct events", shipments, distinct)
	if shipments == distinct {
		fmt.Fprintln(out, " — every event shipped exactly once")
	} else {
		fmt.Fprintln(out, " — DUPLICATE EFFECTS")
	}
	fmt.Fprintf(out, "delivered=%d executed=%d duplicates=%d conflicts=%d\n",
		delivered, st.Executed, st.Duplicates, st.Conflicts)
	if shipments != distinct {
		return errors.New("an event was shipped more than once")
	}
	return nil
}
