package dedup_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

// Reserve mode for an effect outside the database, here a payment
// provider that deduplicates by idempotency key. The handler runs with no
// transaction open and sends Claim.IdempotencyKey; a redelivery after
// success is a duplicate, and one after a timeout, whose outcome nobody
// knows, is not run again: it waits for the reconciler (package
// handlers/reconcile).
func ExampleReserve() {
	// One connection: every connection to ":memory:" is a database of its own.
	db, _ := sql.Open("sqlite", sqlite.DSN(":memory:"))
	db.SetMaxOpenConns(1)
	defer db.Close()
	store, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if err := store.Migrate(context.Background()); err != nil {
		panic(err)
	}

	charged := map[string]bool{} // the provider's view, by idempotency key
	d, err := dedup.New(store, dedup.Config{
		Key:       dedup.KeyFromMetadata("payment_id"),
		Operation: "charge_card",
		Mode:      dedup.Reserve{InFlightWait: -1}, // nack at once rather than wait for a held intent
		Logger:    watermill.NopLogger{},
	})
	if err != nil {
		panic(err)
	}
	handler := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		claim, _ := dedup.ClaimFromContext(msg.Context())
		charged[claim.IdempotencyKey] = true
		fmt.Println("handler: charged", msg.Metadata.Get("payment_id"), "attempt", claim.Attempt)
		if msg.Metadata.Get("payment_id") == "pay-2" {
			// The request left; the answer did not arrive.
			return nil, dedup.Uncertain(errors.New("provider timed out"), claim.IdempotencyKey)
		}
		return nil, nil
	})

	deliver := func(id string) {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":100}`))
		msg.Metadata.Set("payment_id", id)
		_, err := handler(msg)
		switch {
		case errors.Is(err, dedup.ErrPending):
			fmt.Println(id, "nacked: pending until reconciled")
		case err != nil:
			fmt.Println(id, "error:", err)
		default:
			fmt.Println(id, "acked")
		}
	}
	deliver("pay-1")
	deliver("pay-1") // redelivered: a duplicate
	deliver("pay-2")
	deliver("pay-2") // redelivered: not charged again

	st, _ := store.Stats(context.Background())
	fmt.Println("charges sent:", len(charged), "pending:", st.Pending)
	// Output:
	// handler: charged pay-1 attempt 1
	// pay-1 acked
	// pay-1 acked
	// handler: charged pay-2 attempt 1
	// pay-2 nacked: pending until reconciled
	// pay-2 nacked: pending until reconciled
	// charges sent: 2 pending: 1
}
