package reconcile_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/handlers/reconcile"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

// A charge whose answer never arrived is pending; the reconciler asks the
// provider by the idempotency key the handler sent, learns it succeeded and
// completes the record, so the redelivery is acked without charging again.
func ExampleReconciler() {
	ctx := context.Background()
	// One connection: every connection to ":memory:" is a database of its own.
	db, _ := sql.Open("sqlite", sqlite.DSN(":memory:"))
	db.SetMaxOpenConns(1)
	defer db.Close()
	store, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}

	provider := map[string]string{} // charges by idempotency key
	d, err := dedup.New(store, dedup.Config{
		Key:       dedup.KeyFromMetadata("payment_id"),
		Operation: "charge_card",
		Mode:      dedup.Reserve{InFlightWait: -1},
		Logger:    watermill.NopLogger{},
	})
	if err != nil {
		panic(err)
	}
	handler := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		claim, _ := dedup.ClaimFromContext(msg.Context())
		provider[claim.IdempotencyKey] = "ch_1"
		fmt.Println("handler: charge sent")
		return nil, dedup.Uncertain(errors.New("provider timed out"), "")
	})
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":100}`))
	msg.Metadata.Set("payment_id", "pay-1")
	_, err = handler(msg)
	fmt.Println("delivery pending:", errors.Is(err, dedup.ErrPending))

	r, err := reconcile.New(store, reconcile.Config{
		Logger: watermill.NopLogger{},
		Resolve: func(ctx context.Context, rec *inbox.Record) (reconcile.Resolution, error) {
			ref, found := provider[rec.IdempotencyKey()]
			if !found {
				return reconcile.Resolution{Verdict: reconcile.NotHappened}, nil
			}
			return reconcile.Resolution{Verdict: reconcile.Succeeded, ExternalRef: ref}, nil
		},
	})
	if err != nil {
		panic(err)
	}
	rep, err := r.RunOnce(ctx) // or r.Start() and r.Close() to run a pass every Interval
	if err != nil {
		panic(err)
	}
	fmt.Println("examined:", rep.Examined, "succeeded:", rep.Resolved[reconcile.Succeeded])

	_, err = handler(msg) // the redelivery
	fmt.Println("redelivery acked:", err == nil)
	rec, _ := store.Get(ctx, db, inbox.ID{Operation: "charge_card", Key: "pay-1"})
	fmt.Println("record:", rec.Status, rec.ExternalRef)
	// Output:
	// handler: charge sent
	// delivery pending: true
	// examined: 1 succeeded: 1
	// redelivery acked: true
	// record: completed ch_1
}
