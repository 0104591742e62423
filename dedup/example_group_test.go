package dedup_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

// Group commit: deliveries handled at the same time share one claim
// statement and one commit. Each call returns once its group committed;
// the second delivery of ord-2 does not run the handler, whichever group
// it lands in.
func ExampleGroup() {
	dir, _ := os.MkdirTemp("", "inboxmill-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", sqlite.DSN(filepath.Join(dir, "example.db")))
	defer db.Close()
	store, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		panic(err)
	}
	_, _ = db.Exec(`CREATE TABLE shipments (order_id TEXT)`)

	d, err := dedup.New(store, dedup.Config{
		Key:       dedup.KeyFromMetadata("event_id"),
		Operation: "ship_order",
		Mode: dedup.Transactional{Group: &dedup.Group{
			MaxSize:   32,
			MaxLinger: 2 * time.Millisecond,
		}},
		Logger: watermill.NopLogger{},
	})
	if err != nil {
		panic(err)
	}
	handler := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		// One member at a time uses the group's transaction.
		tx, _ := dedup.TxFromContext(msg.Context())
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO shipments (order_id) VALUES (?)`, msg.Metadata.Get("event_id"))
		return nil, err
	})

	var wg sync.WaitGroup
	for _, id := range []string{"ord-1", "ord-2", "ord-3", "ord-2"} {
		wg.Go(func() {
			msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order":"`+id+`"}`))
			msg.Metadata.Set("event_id", id)
			if _, err := handler(msg); err != nil {
				fmt.Println("nacked:", err)
			}
		})
	}
	wg.Wait()

	var shipments int
	_ = db.QueryRow(`SELECT COUNT(*) FROM shipments`).Scan(&shipments)
	st := d.Stats()
	fmt.Printf("shipments: %d, executed: %d, duplicates: %d\n", shipments, st.Executed, st.Duplicates)
	// Output: shipments: 3, executed: 3, duplicates: 1
}

// Batches in reserve mode: the reservations of deliveries in flight share
// one statement, their completions another, and each handler still runs
// outside any transaction under its own lease. The second delivery of
// ord-2 waits for the first's outcome and does not charge again. (SQLite,
// so that the example runs anywhere; batches pay with many deliveries in
// flight against PostgreSQL or MariaDB.)
func ExampleBatch() {
	dir, _ := os.MkdirTemp("", "inboxmill-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", sqlite.DSN(filepath.Join(dir, "example.db")))
	defer db.Close()
	store, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		panic(err)
	}

	var (
		mu      sync.Mutex
		charges = map[string]int{} // the provider, by idempotency key
	)
	d, err := dedup.New(store, dedup.Config{
		Key:       dedup.KeyFromMetadata("event_id"),
		Operation: "charge",
		Mode:      dedup.Reserve{Batch: &dedup.Batch{MaxSize: 32}},
		Logger:    watermill.NopLogger{},
	})
	if err != nil {
		panic(err)
	}
	handler := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		claim, _ := dedup.ClaimFromContext(msg.Context())
		mu.Lock()
		charges[claim.IdempotencyKey]++
		mu.Unlock()
		return nil, nil
	})

	var wg sync.WaitGroup
	for _, id := range []string{"ord-1", "ord-2", "ord-3", "ord-2"} {
		wg.Go(func() {
			msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order":"`+id+`"}`))
			msg.Metadata.Set("event_id", id)
			if _, err := handler(msg); err != nil {
				fmt.Println("nacked:", err)
			}
		})
	}
	wg.Wait()

	total := 0
	for _, n := range charges {
		total += n
	}
	st, bs := d.Stats(), d.BatchStats()
	fmt.Printf("charges: %d, executed: %d, duplicates: %d, reservations: %d\n",
		total, st.Executed, st.Duplicates, bs.Reservations)
	// Output: charges: 3, executed: 3, duplicates: 1, reservations: 4
}
