package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

type order struct {
	OrderID string    `json:"order_id"`
	SKU     string    `json:"sku"`
	Qty     int       `json:"qty"`
	SentAt  time.Time `json:"sent_at"`
}

func decodeOrder(b []byte, o *order) error {
	if err := json.Unmarshal(b, o); err != nil {
		return fmt.Errorf("order payload: %w", err)
	}
	return nil
}

// stream is what the producers publish for n events: each event once, every
// fifth one a second time (a producer retry: new message UUID, new sent_at,
// same event), and finally event 7's ID reused for a different order.
func stream(n int) []*message.Message {
	var msgs []*message.Message
	for i := 1; i <= n; i++ {
		msgs = append(msgs, orderMessage(i, 1))
		if i%5 == 0 {
			msgs = append(msgs, orderMessage(i, 1))
		}
	}
	return append(msgs, orderMessage(7, 99))
}

func orderMessage(i, qty int) *message.Message {
	payload, _ := json.Marshal(order{
		OrderID: fmt.Sprintf("o-%04d", i),
		SKU:     fmt.Sprintf("sku-%d", i%3),
		Qty:     qty,
		SentAt:  time.Now().UTC(),
	})
	// The UUID identifies this delivery attempt only; the event ID in the
	// metadata (a Kafka header) identifies the business event and is what
	// dedup keys on.
	msg := message.NewMessage(watermill.NewUUID(), payload)
	msg.Metadata.Set("event_id", eventID(i))
	msg.Metadata.Set("tenant_id", "shop-1")
	return msg
}

func eventID(i int) string { return fmt.Sprintf("evt-%04d", i) }

func eventNumber(id string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(id, "evt-"))
	return n
}

func splitBrokers(s string) []string {
	var out []string
	for _, b := range strings.Split(s, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}
