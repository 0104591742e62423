// Package inboxtest is the conformance suite of the inbox store, and helpers
// for tests of your own that need a store.
//
// The suite checks that a [inbox.Dialect] makes the one [inbox.Store] behave
// the same on its database as on every other: claims, leases and their
// fencing, purging, the clock, the migrations, and the operator tools
// (listing, resolving and forgetting records, the audit table) racing the
// workers they must never overrule. It runs against a real
// database, because what it pins down (which of two racing writers wins,
// what a boundary comparison returns, whether a savepoint survives an error)
// is decided by the database, not by Go. A dialect written out of tree, or a
// new driver for a shipped one, proves itself by running it:
//
//	func TestInboxConformance(t *testing.T) {
//		inboxtest.Run(t, inboxtest.Harness{
//			Dialect: postgres.Dialect(),
//			DB:      func(t testing.TB) *sql.DB { return myTestDB(t) },
//		})
//	}
//
// Every test creates its own tables with random names and drops them
// afterwards, so the suite runs in parallel against one shared database.
// The dedup middleware's own suite is package dedup/deduptest.
//
// For tests of your own, [NewStore] returns a migrated store over a table
// of its own, and [Clock] moves time forward so that leases expire without
// sleeping.
package inboxtest

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
)

// Harness describes the database under test.
type Harness struct {
	// Dialect is the dialect under test. Required.
	Dialect inbox.Dialect
	// DB returns the database to test against. It is called once per test
	// and may return the same *sql.DB every time. Required.
	DB func(t testing.TB) *sql.DB
	// Concurrency is how many callers race for one record in the
	// concurrency tests. Defaults to 32: enough to queue behind a pool of
	// ten connections.
	Concurrency int
	// Prepare is passed to every store the suite creates (inbox.Config), so
	// that the suite can run once per statement mode.
	Prepare inbox.Prepare
}

// config is the store configuration of a test's own table.
func (h Harness) config(table string) inbox.Config {
	return inbox.Config{Table: table, Prepare: h.Prepare}
}

// closeStore closes the store when the test ends: a shared database would
// otherwise collect the prepared statements of every test, and the store's
// background clock measurement would outlive it.
func closeStore(t testing.TB, s *inbox.Store) {
	t.Cleanup(func() { _ = s.Close() })
}

// Run runs the whole suite as subtests of t: Store, Lease, Purge, Clock,
// Migrations, Operator and Hostile (what careless or hostile callers pass).
// The subtests run in parallel.
func Run(t *testing.T, h Harness) {
	t.Helper()
	require.NotNil(t, h.Dialect, "Harness.Dialect")
	require.NotNil(t, h.DB, "Harness.DB")
	if h.Concurrency == 0 {
		h.Concurrency = 32
	}
	t.Run("Store", func(t *testing.T) { runStore(t, h) })
	t.Run("ClaimMany", func(t *testing.T) { runClaimMany(t, h) })
	t.Run("ReserveMany", func(t *testing.T) { runReserveMany(t, h) })
	t.Run("Lease", func(t *testing.T) { runLease(t, h) })
	t.Run("Purge", func(t *testing.T) { runPurge(t, h) })
	t.Run("Clock", func(t *testing.T) { runClock(t, h) })
	t.Run("Migrations", func(t *testing.T) { runMigrations(t, h) })
	t.Run("Operator", func(t *testing.T) { runOperator(t, h) })
	t.Run("Hostile", func(t *testing.T) { runHostile(t, h) })
}

// bundle is what one test needs: a migrated store over a fresh table, and a
// business table for effects.
type bundle struct {
	h       Harness
	db      *sql.DB
	store   *inbox.Store
	table   string
	effects string
	ctx     context.Context
}

// setup returns a bundle whose store runs on the database's clock (the
// default configuration).
func setup(t *testing.T, h Harness) *bundle {
	return setupWith(t, h, func(*inbox.Config) {})
}

// setupWith returns a bundle whose store's configuration edit changed.
func setupWith(t *testing.T, h Harness, edit func(*inbox.Config)) *bundle {
	t.Helper()
	db := h.DB(t)
	b := &bundle{h: h, db: db, table: UniqueTable("inbox"), effects: UniqueTable("effects"), ctx: context.Background()}
	t.Cleanup(func() {
		for _, tbl := range []string{b.effects, b.table, b.table + "_audit", b.table + "_migrations"} {
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tbl)
		}
	})
	b.store = b.newStore(t, edit)
	require.NoError(t, b.store.Migrate(b.ctx))
	// No unique constraint on purpose: a duplicated effect must show up as
	// a second row, not as an error that hides it.
	_, err := db.ExecContext(b.ctx, fmt.Sprintf(
		"CREATE TABLE %s (event_id VARCHAR(255) NOT NULL, note VARCHAR(255))", b.effects))
	require.NoError(t, err)
	return b
}

// newStore returns another store over the bundle's table, closed when the
// test ends.
func (b *bundle) newStore(t *testing.T, edit func(*inbox.Config)) *inbox.Store {
	t.Helper()
	cfg := b.h.config(b.table)
	edit(&cfg)
	s, err := inbox.NewStore(b.db, b.h.Dialect, cfg)
	require.NoError(t, err)
	closeStore(t, s)
	return s
}

func (b *bundle) ph(n int) string { return b.h.Dialect.Placeholder(n) }

// effect records one business effect through q.
func (b *bundle) effect(ctx context.Context, q inbox.DBTX, eventID, note string) error {
	_, err := q.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (event_id, note) VALUES (%s, %s)", b.effects, b.ph(1), b.ph(2)),
		eventID, note)
	return err
}

// countEffects counts the business effects of an event.
func (b *bundle) countEffects(t *testing.T, eventID string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRowContext(b.ctx,
		fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE event_id = %s", b.effects, b.ph(1)), eventID).Scan(&n))
	return n
}

// records counts the inbox records.
func (b *bundle) records(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRowContext(b.ctx, "SELECT COUNT(*) FROM "+b.table).Scan(&n))
	return n
}

// get reads a record that must exist.
func (b *bundle) get(t *testing.T, id inbox.ID) *inbox.Record {
	t.Helper()
	rec, err := b.store.Get(b.ctx, b.db, id)
	require.NoError(t, err)
	return rec
}

// keyColumn is the key column as the dialect quotes it (key is reserved in
// MySQL), read off its record select list so that a dialect written out of
// tree is served too.
func (b *bundle) keyColumn() string {
	sel := b.h.Dialect.Queries(b.table).Select().SQL
	if _, rest, ok := strings.Cut(sel, "operation, "); ok {
		if col, _, ok := strings.Cut(rest, ", payload_hash"); ok {
			return strings.TrimSpace(col)
		}
	}
	return "key"
}

// hash is a payload fingerprint that reads as s in a failure message.
func hash(s string) []byte {
	h := make([]byte, 32)
	copy(h, s)
	return h
}

// id is an intent of the global scope.
func id(op, key string) inbox.ID { return inbox.ID{Operation: op, Key: key} }

// fixedClock is a clock that moves only when told to, so that tests can
// assert exact times (expiries, lease boundaries). It starts at a time with
// a sub-microsecond part, which the store must cut off the way the
// database does.
type fixedClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFixedClock() *fixedClock {
	return &fixedClock{t: time.Now().UTC().Truncate(time.Second).Add(123_456_789 * time.Nanosecond)}
}

func (c *fixedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fixedClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func (c *fixedClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// onClock makes a store run on c (and so not sync with the database).
func onClock(c *fixedClock) func(*inbox.Config) {
	return func(cfg *inbox.Config) { cfg.Now = c.Now }
}

// usec is t at the databases' precision.
func usec(t time.Time) time.Time { return t.Truncate(time.Microsecond) }
