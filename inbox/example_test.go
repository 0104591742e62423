package inbox_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

// exampleStore opens a migrated store over a new SQLite file; done removes
// it again.
func exampleStore() (store *inbox.Store, done func()) {
	dir, err := os.MkdirTemp("", "inboxmill-example")
	if err != nil {
		panic(err)
	}
	db, err := sql.Open("sqlite", sqlite.DSN(filepath.Join(dir, "example.db")))
	if err != nil {
		panic(err)
	}
	store, err = inbox.NewStore(db, sqlite.Dialect(), inbox.Config{Table: "inbox"})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		panic(err)
	}
	return store, func() {
		_ = store.Close() // its prepared statements
		_ = db.Close()
		_ = os.RemoveAll(dir)
	}
}

// Claiming in the transaction that does the work: the first claim owns the
// intent, the second is a duplicate, a third with another payload conflicts.
func ExampleStore_Claim() {
	store, done := exampleStore()
	defer done()
	ctx := context.Background()

	claim := func(payload string) {
		h := sha256.Sum256([]byte(payload))
		tx, _ := store.BeginTx(ctx, nil)
		defer tx.Rollback()
		res, err := store.Claim(ctx, tx, inbox.ClaimParams{
			ID:          inbox.ID{Scope: "tenant-1", Operation: "create_order", Key: "order-intent-42"},
			PayloadHash: h[:],
			Retention:   30 * 24 * time.Hour,
		})
		switch {
		case errors.Is(err, inbox.ErrPayloadConflict):
			fmt.Println("conflict: the key was used for another payload")
		case err != nil:
			fmt.Println("error:", err)
		case res.Claimed:
			fmt.Println("claimed: do the work in tx, then commit")
			_ = tx.Commit()
		default:
			fmt.Println("duplicate: status", res.Record.Status, "attempt", res.Record.Attempt)
		}
	}
	claim(`{"sku":"A","qty":1}`)
	claim(`{"sku":"A","qty":1}`)
	claim(`{"sku":"A","qty":2}`)
	// Output:
	// claimed: do the work in tx, then commit
	// duplicate: status completed attempt 1
	// conflict: the key was used for another payload
}

// Reserving an intent whose effect is outside the database (a payment
// provider's API): the lease holds it while the call is made, and the
// outcome is recorded through the lease. A redelivery meanwhile, or after,
// finds the record instead of running the call again.
func ExampleStore_Reserve() {
	store, done := exampleStore()
	defer done()
	ctx := context.Background()
	owner := inbox.NewOwnerID("payments")
	charge := inbox.ID{Scope: "tenant-1", Operation: "charge", Key: "invoice-7"}
	h := sha256.Sum256([]byte(`{"amount":1200}`))

	res, err := store.Reserve(ctx, inbox.ReserveParams{ID: charge, PayloadHash: h[:], Owner: owner,
		Lease: time.Minute, Retention: 30 * 24 * time.Hour})
	if err != nil {
		panic(err)
	}
	lease := res.Lease
	fmt.Println("reserved: attempt", lease.Attempt(), res.Record.Status)
	// Call the provider with charge.IdempotencyKey() here; then:
	if err := lease.Complete(ctx, inbox.Outcome{ExternalRef: "ch_123"}); err != nil {
		panic(err)
	}

	again, err := store.Reserve(ctx, inbox.ReserveParams{ID: charge, PayloadHash: h[:], Owner: owner, Lease: time.Minute})
	if err != nil {
		panic(err)
	}
	fmt.Println("redelivery: lease", again.Lease != nil, again.Record.Status, again.Record.ExternalRef)
	fmt.Println("lease ended:", errors.Is(lease.Complete(ctx, inbox.Outcome{}), inbox.ErrIllegalTransition))
	// Output:
	// reserved: attempt 1 processing
	// redelivery: lease false completed ch_123
	// lease ended: true
}

// Checking the schema at start-up: a database that was never migrated (or
// migrated by an older release) is reported before the first message
// fails on a missing table.
func ExampleStore_Validate() {
	dir, _ := os.MkdirTemp("", "inboxmill-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", sqlite.DSN(filepath.Join(dir, "example.db")))
	defer db.Close()
	ctx := context.Background()
	store, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{Table: "inbox"})
	if err != nil {
		panic(err)
	}
	defer store.Close()

	err = store.Validate(ctx)
	var se *inbox.SchemaError
	fmt.Println("outdated:", errors.Is(err, inbox.ErrSchemaOutdated), errors.As(err, &se) && len(se.Missing) > 0)

	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	fmt.Println("after Migrate:", store.Validate(ctx))
	// Output:
	// outdated: true true
	// after Migrate: <nil>
}

// Tools that apply migrations themselves (goose, golang-migrate, atlas) get
// the dialect's files rendered for the table.
func ExampleStore_Migrations() {
	store, err := inbox.NewStore(&sql.DB{}, postgres.Dialect(), inbox.Config{Table: "payments_inbox"})
	if err != nil {
		panic(err)
	}
	ms, err := store.Migrations()
	if err != nil {
		panic(err)
	}
	for _, m := range ms {
		fmt.Printf("%03d_%s\n", m.Version, m.Name)
	}
	// Output:
	// 001_create_inbox
	// 002_create_audit
}

// Table names are checked before they reach any SQL.
func ExampleNewStore_invalidTable() {
	_, err := inbox.NewStore(&sql.DB{}, postgres.Dialect(), inbox.Config{Table: "inbox; DROP TABLE users"})
	fmt.Println(errors.Is(err, inbox.ErrInvalidConfig))
	// Output:
	// true
}

// Settling an intent whose outcome was uncertain: the worker timed out
// after the request left and left the record pending; an operator who
// checked with the provider resolves it as completed. A dry run first
// shows what would change. The resolve and its audit entry commit
// together, and a redelivery is a duplicate from then on.
func ExampleStore_Resolve() {
	store, done := exampleStore()
	defer done()
	ctx := context.Background()
	charge := inbox.ID{Scope: "tenant-1", Operation: "charge", Key: "invoice-7"}
	h := sha256.Sum256([]byte(`{"amount":1200}`))
	res, err := store.Reserve(ctx, inbox.ReserveParams{ID: charge, PayloadHash: h[:], Owner: "worker-1",
		Lease: time.Minute, Retention: 30 * 24 * time.Hour})
	if err != nil {
		panic(err)
	}
	if err := res.Lease.Pend(ctx, "", "provider timed out"); err != nil {
		panic(err)
	}

	p := inbox.ResolveParams{
		ID:          charge,
		To:          inbox.StatusCompleted,
		Attempt:     res.Lease.Attempt(), // the attempt the operator looked at
		Actor:       inbox.Actor{Name: "alice", Reason: "OPS-42: the provider shows ch_123 as paid"},
		ExternalRef: "ch_123",
		DryRun:      true,
	}
	before, after, err := store.Resolve(ctx, p)
	if err != nil {
		panic(err)
	}
	fmt.Println("dry run:", before.Status, "->", after.Status, after.ExternalRef)

	p.DryRun = false
	if _, _, err := store.Resolve(ctx, p); err != nil {
		panic(err)
	}
	_, _, err = store.Resolve(ctx, p)
	fmt.Println("again:", errors.Is(err, inbox.ErrNotResolvable))

	entries, _, err := store.ListAudit(ctx, inbox.AuditFilter{Record: &charge})
	if err != nil {
		panic(err)
	}
	for _, e := range entries {
		fmt.Println("audit:", e.Action, e.StatusBefore, "->", e.StatusAfter, "by", e.Actor)
	}
	again, err := store.Reserve(ctx, inbox.ReserveParams{ID: charge, PayloadHash: h[:], Owner: "worker-2", Lease: time.Minute})
	if err != nil {
		panic(err)
	}
	fmt.Println("redelivery:", again.Record.Status, again.Record.ExternalRef)
	// Output:
	// dry run: pending -> completed ch_123
	// again: true
	// audit: resolve pending -> completed by alice
	// redelivery: completed ch_123
}

// Forgetting an intent so that its next delivery runs again: never while
// a worker holds it under a live lease.
func ExampleStore_Forget() {
	store, done := exampleStore()
	defer done()
	ctx := context.Background()
	ship := inbox.ID{Operation: "ship", Key: "order-9"}
	h := sha256.Sum256([]byte(`{"order":9}`))
	res, err := store.Reserve(ctx, inbox.ReserveParams{ID: ship, PayloadHash: h[:], Owner: "worker-1", Lease: time.Minute})
	if err != nil {
		panic(err)
	}
	actor := inbox.Actor{Name: "bob", Reason: "OPS-43: the shipment was cancelled by hand"}

	_, err = store.Forget(ctx, inbox.ForgetParams{ID: ship, Actor: actor})
	fmt.Println("while leased:", errors.Is(err, inbox.ErrLeaseLive))

	if err := res.Lease.Fail(ctx, "carrier refused"); err != nil {
		panic(err)
	}
	rec, err := store.Forget(ctx, inbox.ForgetParams{ID: ship, Attempt: res.Record.Attempt, Actor: actor})
	if err != nil {
		panic(err)
	}
	fmt.Println("forgot a", rec.Status, "record")

	claim, err := store.Reserve(ctx, inbox.ReserveParams{ID: ship, PayloadHash: h[:], Owner: "worker-2", Lease: time.Minute})
	if err != nil {
		panic(err)
	}
	fmt.Println("next delivery runs again:", claim.Lease != nil)
	// Output:
	// while leased: true
	// forgot a failed record
	// next delivery runs again: true
}
