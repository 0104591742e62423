package dedup_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "modernc.org/sqlite"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

// A payment event delivered three times: once, again (a redelivery), and
// with its ID reused for another amount. The handler runs once; the reused
// key is refused.
func Example() {
	dir, _ := os.MkdirTemp("", "inboxmill-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", sqlite.DSN(filepath.Join(dir, "example.db")))
	defer db.Close()

	store, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{Table: "inbox"})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		panic(err)
	}
	_, _ = db.Exec(`CREATE TABLE payments (event_id TEXT, amount INTEGER)`)

	d, err := dedup.New(store, dedup.Config{
		Key: dedup.KeyFromMetadata("event_id"),
		// Inside a message.Router the handler's name is the default.
		Operation: "record_payment",
	})
	if err != nil {
		panic(err)
	}
	handler := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		// The business write goes through the claim's transaction.
		tx, _ := dedup.TxFromContext(msg.Context())
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO payments (event_id, amount) VALUES (?, 100)`,
			msg.Metadata.Get("event_id"))
		fmt.Println("handler: recorded", msg.Metadata.Get("event_id"))
		return nil, err
	})

	deliver := func(eventID, payload string) {
		msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
		msg.Metadata.Set("event_id", eventID)
		_, err := handler(msg)
		switch {
		case errors.Is(err, dedup.ErrPayloadConflict):
			fmt.Println("refused: same key, different payload")
		case err != nil:
			fmt.Println("error:", err)
		default:
			fmt.Println("acked")
		}
	}
	deliver("pay-1", `{"amount":100,"currency":"EUR"}`)
	deliver("pay-1", `{"currency": "EUR", "amount": 100}`) // same intent, other key order
	deliver("pay-1", `{"amount":250,"currency":"EUR"}`)

	var n int
	_ = db.QueryRow(`SELECT COUNT(*) FROM payments`).Scan(&n)
	fmt.Println("payments:", n)
	fmt.Printf("%+v\n", d.Stats())
	// Output:
	// handler: recorded pay-1
	// acked
	// acked
	// refused: same key, different payload
	// payments: 1
	// {Executed:1 Duplicates:1 Conflicts:1 InFlight:0 Invalid:0 Retries:0 Failed:0 Pending:0 Takeovers:0 OutputsDropped:0}
}

// Keys can come from the payload when producers put the event ID there.
func ExampleKeyFromJSON() {
	key := dedup.KeyFromJSON("data.object.id")
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"type":"charge.succeeded","data":{"object":{"id":"ch_123"}}}`))
	k, err := key(msg)
	fmt.Println(k, err)

	_, err = key(message.NewMessage(watermill.NewUUID(), []byte(`{"type":"ping"}`)))
	fmt.Println(errors.Is(err, dedup.ErrMissingKey))
	// Output:
	// ch_123 <nil>
	// true
}

// A message that can never be processed goes to a poison queue rather than
// being redelivered forever; transient failures are nacked and retried.
func ExampleIsPoison() {
	err := fmt.Errorf("handling: %w", dedup.ErrPayloadConflict)
	fmt.Println(dedup.IsPoison(err), dedup.IsRetryable(err))
	fmt.Println(dedup.IsPoison(dedup.ErrInFlight), dedup.IsRetryable(dedup.ErrInFlight))
	// Output:
	// true false
	// false true
}
