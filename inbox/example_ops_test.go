package inbox_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

// memoryDB opens an in-memory SQLite database. One connection: every
// connection to ":memory:" is a database of its own.
func memoryDB() *sql.DB {
	db, err := sql.Open("sqlite", sqlite.DSN(":memory:"))
	if err != nil {
		panic(err)
	}
	db.SetMaxOpenConns(1)
	return db
}

// Migrating is explicit and idempotent: run it once per deploy (or apply
// Store.Migrations with your own tool) and check at start-up with Validate.
// MigrateDown(ctx, 0) drops the table, and every record with it.
func ExampleStore_Migrate() {
	ctx := context.Background()
	db := memoryDB()
	defer db.Close()
	store, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{Table: "payments_inbox"})
	if err != nil {
		panic(err)
	}
	defer store.Close()

	applied, _ := store.AppliedMigrations(ctx)
	fmt.Println("applied before:", applied)
	for range 2 { // a second run finds nothing to do
		if err := store.Migrate(ctx); err != nil {
			panic(err)
		}
	}
	applied, _ = store.AppliedMigrations(ctx)
	fmt.Println("applied after:", applied, "valid:", store.Validate(ctx) == nil)

	if err := store.MigrateDown(ctx, 0); err != nil {
		panic(err)
	}
	fmt.Println("after MigrateDown, outdated:", errors.Is(store.Validate(ctx), inbox.ErrSchemaOutdated))
	// Output:
	// applied before: []
	// applied after: [1 2] valid: true
	// after MigrateDown, outdated: true
}

// The purger deletes finished records once their retention has passed, in
// short batches, on an interval. Records still processing (or pending) are
// kept whatever their age: their outcome is not settled.
func ExampleNewPurger() {
	ctx := context.Background()
	db := memoryDB()
	defer db.Close()
	var offset atomic.Int64 // a clock the example moves forward
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	store, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{Now: now})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	hash := sha256.Sum256([]byte(`{"amount":100}`))
	for _, key := range []string{"evt-1", "evt-2", "evt-3"} {
		_, err := store.Claim(ctx, db, inbox.ClaimParams{ID: inbox.ID{Operation: "ship", Key: key},
			PayloadHash: hash[:], Status: inbox.StatusCompleted, Retention: 24 * time.Hour})
		if err != nil {
			panic(err)
		}
	}
	_, err = store.Reserve(ctx, inbox.ReserveParams{ID: inbox.ID{Operation: "ship", Key: "evt-4"},
		PayloadHash: hash[:], Owner: "worker-1", Lease: time.Minute, Retention: 24 * time.Hour})
	if err != nil {
		panic(err)
	}
	offset.Store(int64(48 * time.Hour)) // two days later

	purged := make(chan inbox.PurgeResult, 1)
	p, err := inbox.NewPurger(store, inbox.PurgerConfig{
		Interval: time.Hour,
		OnPurge: func(r inbox.PurgeResult, err error) {
			select {
			case purged <- r:
			default:
			}
		},
	})
	if err != nil {
		panic(err)
	}
	if err := p.Start(); err != nil { // purges now, then every Interval
		panic(err)
	}
	defer p.Close()
	fmt.Println("deleted:", (<-purged).Deleted)

	_, err = store.Get(ctx, db, inbox.ID{Operation: "ship", Key: "evt-4"})
	fmt.Println("processing record kept:", err == nil)
	// Output:
	// deleted: 3
	// processing record kept: true
}
