// Package deduptest tests the dedup middleware's promise — one effect per
// business intent, whatever the broker throws at a consumer — against a
// real database, and helps programs test their own handlers the same way.
//
// # Your handler, redelivered
//
// [Redeliver] delivers one message through a [dedup.Deduplicator] several
// times, one after the other or all at once, as a broker does after a lost
// ack or a consumer-group rebalance, and reports what happened: how many
// deliveries were acked and nacked, their errors and outputs, and how many
// times the handler body actually ran. Together with inboxtest.NewStore a
// test of a handler's exactly-once effect takes a few lines:
//
//	func TestShipOrderOnce(t *testing.T) {
//		db, _ := sql.Open("sqlite", sqlite.DSN(filepath.Join(t.TempDir(), "shop.db")))
//		store := inboxtest.NewStore(t, db, sqlite.Dialect(), inbox.Config{})
//		d, _ := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "ship_order"})
//		msg := deduptest.NewMessage("evt-1", `{"order_id":"o-1"}`)
//		rep := deduptest.Redeliver(t, d, deduptest.NoPublish(shipOrder), msg, deduptest.Times(5), deduptest.Concurrently())
//		if rep.Acked != 5 || rep.Runs != 1 {
//			t.Fatal(rep)
//		}
//		// ... and count the shipments the handler wrote: one.
//	}
//
// # The conformance suite
//
// [Run] is the middleware's conformance suite: transactional mode (one
// effect under concurrent deliveries of one event and of many, rollback of
// failed and panicking handlers, replay of stored output, conflicts,
// invalid keys, permanent failures, read-first, a joined consuming
// transaction) and reserve mode (a crashed worker's intent taken over by
// exactly one redelivery and the zombie fenced, one handler call under
// concurrency, permanent and transient failures, uncertain outcomes left
// pending and never re-executed, the heartbeat, no transaction open while
// the handler runs, a lost lease cancelling the handler's context) and
// group commit (members in one transaction, a failing, panicking or
// timed-out member nacked alone, two members of one key, a duplicate from
// another group, a commit that fails, a connection killed mid-group, a
// router closing while a group lingers); Harness.Group runs the whole
// transactional suite again with group commit on. A dialect proves the
// middleware works on it by running it:
//
//	func TestDedupConformance(t *testing.T) {
//		deduptest.Run(t, deduptest.Harness{
//			Dialect: postgres.Dialect(),
//			DB:      func(t testing.TB) *sql.DB { return myTestDB(t) },
//		})
//	}
//
// Every test creates its own inbox and business tables with random names
// and drops them afterwards, so the suite runs in parallel against one
// database. The store's own conformance suite is package inbox/inboxtest;
// the reconciler's settling of pending and abandoned intents is tested in
// package handlers/reconcile.
//
// This package imports no SQL driver: the caller's test opens the database.
package deduptest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/pgxgroup"
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
	// Group, when set, runs every transactional test with group commit
	// (dedup.Transactional.Group) on, except those that join a consuming
	// transaction, which are never grouped. The group commit tests run
	// either way, with settings of their own and Group's Pipeline. With a
	// Pipeline the handlers queue their writes (package dedup/pgxgroup).
	Group *dedup.Group
	// Batch, when set, runs every reserve-mode test with batches
	// (dedup.Reserve.Batch) on, unless the test sets its own. The batch
	// tests run either way, with settings of their own.
	Batch *dedup.Batch
	// EventTime, when set, is every middleware's Config.EventTime, for
	// stores partitioned by event time. It must accept every message the
	// suite sends (they carry an "event_id" metadata field and a JSON
	// payload); KeyedEventTime is one that does.
	EventTime dedup.EventTimeFunc
}

// KeyedEventTime is an event time for every message the suite sends: a
// time within the last two days, derived from the message's event_id
// alone, so that the events of a test spread over several buckets and
// every delivery of one event has the same time.
func KeyedEventTime(msg *message.Message) (time.Time, error) {
	key := msg.Metadata.Get(EventIDKey)
	if key == "" {
		return time.Time{}, errors.New("no event_id")
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return time.Now().UTC().Truncate(48 * time.Hour).Add(-time.Duration(h.Sum64() % uint64(48*time.Hour))), nil
}

// Run runs the whole suite as subtests of t: "Middleware" (transactional
// mode) and "Reserve" (reserve mode). Every test in it runs in parallel.
func Run(t *testing.T, h Harness) {
	t.Helper()
	require.NotNil(t, h.Dialect, "Harness.Dialect")
	require.NotNil(t, h.DB, "Harness.DB")
	if h.Concurrency == 0 {
		h.Concurrency = 32
	}
	require.Positive(t, h.Concurrency, "Harness.Concurrency")
	t.Run("Middleware", func(t *testing.T) { runMiddleware(t, h) })
	t.Run("Reserve", func(t *testing.T) { runReserve(t, h) })
	t.Run("Group", func(t *testing.T) { runGroup(t, h) })
	t.Run("Batch", func(t *testing.T) { runBatch(t, h) })
	t.Run("Storable", func(t *testing.T) { runStorable(t, h) })
}

// bundle is what one test needs: a migrated store over a fresh table, and
// a business table for effects.
type bundle struct {
	h       Harness
	db      *sql.DB
	store   *inbox.Store
	table   string
	effects string
	ctx     context.Context
}

// setup creates the tables of one test; cfg.Table and cfg.Prepare are the
// harness's.
func setup(t *testing.T, h Harness, cfg inbox.Config) *bundle {
	t.Helper()
	db := h.DB(t)
	require.NotNil(t, db, "Harness.DB returned nil")
	b := &bundle{h: h, db: db, table: uniqueName("inbox"), effects: uniqueName("effects"), ctx: context.Background()}
	t.Cleanup(func() {
		for _, tbl := range append([]string{b.effects}, inbox.TableNames(b.table)...) {
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tbl)
		}
	})
	cfg.Table, cfg.Prepare = b.table, h.Prepare
	store, err := inbox.NewStore(db, h.Dialect, cfg)
	require.NoError(t, err)
	// Release the store's prepared statements when the test ends; a shared
	// database would otherwise collect them from every test. Registered
	// after the drop, so it runs before it.
	t.Cleanup(func() { _ = store.Close() })
	require.NoError(t, store.Migrate(b.ctx))
	b.store = store
	// No unique constraint on purpose: a duplicated effect must show up as
	// a second row, not as an error that hides it.
	_, err = db.ExecContext(b.ctx, fmt.Sprintf(
		"CREATE TABLE %s (event_id VARCHAR(255) NOT NULL, note VARCHAR(255))", b.effects))
	require.NoError(t, err)
	return b
}

func (b *bundle) ph(n int) string { return b.h.Dialect.Placeholder(n) }

// effect records one business effect through q; in a pipelined group
// (q a *pgxgroup.Tx) it queues the statement, as a handler written for
// pipelines does.
func (b *bundle) effect(ctx context.Context, q inbox.DBTX, eventID, note string) error {
	query := fmt.Sprintf("INSERT INTO %s (event_id, note) VALUES (%s, %s)", b.effects, b.ph(1), b.ph(2))
	if ptx, ok := q.(*pgxgroup.Tx); ok {
		ptx.Queue(query, eventID, note)
		return nil
	}
	_, err := q.ExecContext(ctx, query, eventID, note)
	return err
}

// handlerTx returns the transaction a transactional handler writes
// through: the *sql.Tx of dedup.TxFromContext, or in a pipelined group
// the member's *pgxgroup.Tx.
func handlerTx(ctx context.Context) (inbox.DBTX, bool) {
	if tx, ok := dedup.TxFromContext(ctx); ok {
		return tx, true
	}
	if tx, ok := pgxgroup.FromContext(ctx); ok {
		return tx, true
	}
	return nil, false
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

// get reads the record of key under operation op in the default scope.
func (b *bundle) get(t *testing.T, op, key string) *inbox.Record {
	t.Helper()
	rec, err := b.store.Get(b.ctx, b.db, inbox.ID{Operation: op, Key: key})
	require.NoError(t, err)
	return rec
}

func uniqueName(prefix string) string {
	var r [5]byte
	_, _ = rand.Read(r[:])
	return prefix + "_" + hex.EncodeToString(r[:])
}
