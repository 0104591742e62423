// Package inboxtest is the conformance suite every inbox store passes: the
// same behaviour on PostgreSQL, MySQL/MariaDB and SQLite, from the store's
// claim up to the dedup middleware's exactly-once effect. It runs against a
// real database; a new dialect (or a fork of one) proves itself by running it:
//
//	func TestConformance(t *testing.T) {
//		inboxtest.Run(t, inboxtest.Harness{
//			Dialect: inbox.Postgres(),
//			DB:      func(t testing.TB) *sql.DB { return myTestDB(t) },
//		})
//	}
//
// Every test creates its own inbox and business tables with random names and
// drops them afterwards, so the suite runs in parallel against one database.
package inboxtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"testing"

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
	// Concurrency is how many deliveries of one event race in the
	// concurrency tests. Defaults to 32.
	Concurrency int
	// Prepare is passed to every store the suite creates (inbox.Config).
	Prepare inbox.Prepare
}

// config is the store configuration of a test's own table.
func (h Harness) config(table string) inbox.Config {
	return inbox.Config{Table: table, Prepare: h.Prepare}
}

// closeStore releases the store's prepared statements when the test ends;
// a shared database would otherwise collect them from every test.
func closeStore(t testing.TB, s *inbox.Store) {
	t.Cleanup(func() { _ = s.Close() })
}

// Run runs the whole suite as subtests of t.
func Run(t *testing.T, h Harness) {
	t.Helper()
	require.NotNil(t, h.Dialect, "Harness.Dialect")
	require.NotNil(t, h.DB, "Harness.DB")
	if h.Concurrency == 0 {
		h.Concurrency = 32
	}
	t.Run("Store", func(t *testing.T) { runStore(t, h) })
	t.Run("Middleware", func(t *testing.T) { runMiddleware(t, h) })
	t.Run("Reserve", func(t *testing.T) { runReserve(t, h) })
	t.Run("Purge", func(t *testing.T) { runPurge(t, h) })
	t.Run("Clock", func(t *testing.T) { runClock(t, h) })
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

func setup(t *testing.T, h Harness) *bundle {
	t.Helper()
	db := h.DB(t)
	b := &bundle{h: h, db: db, table: uniqueName("inbox"), effects: uniqueName("effects"), ctx: context.Background()}
	store, err := inbox.NewStore(db, h.Dialect, h.config(b.table))
	require.NoError(t, err)
	closeStore(t, store)
	require.NoError(t, store.Migrate(b.ctx))
	b.store = store
	// No unique constraint on purpose: a duplicated effect must show up as
	// a second row, not as an error that hides it.
	_, err = db.ExecContext(b.ctx, fmt.Sprintf(
		"CREATE TABLE %s (event_id VARCHAR(255) NOT NULL, note VARCHAR(255))", b.effects))
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, tbl := range []string{b.effects, b.table, b.table + "_migrations"} {
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tbl)
		}
	})
	return b
}

func (b *bundle) ph(n int) string { return b.h.Dialect.Placeholder(n) }

// effect records one business effect through q.
func (b *bundle) effect(ctx context.Context, q inbox.DBTX, eventID, note string) error {
	_, err := q.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (event_id, note) VALUES (%s, %s)", b.effects, b.ph(1), b.ph(2)),
		eventID, note)
	return err
}

// effects counts the business effects of an event.
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

func uniqueName(prefix string) string {
	var r [5]byte
	_, _ = rand.Read(r[:])
	return prefix + "_" + hex.EncodeToString(r[:])
}

func hash(s string) []byte {
	h := make([]byte, 32)
	copy(h, s)
	return h
}
