package shop_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/deduptest"
	"github.com/inboxmill/inboxmill/examples/internal/shop"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

const insertShipment = `INSERT INTO shipments (event_id, order_id, sku, qty) VALUES (?, ?, ?, ?)`

// shopDB is what the examples run on: a SQLite file with the inbox and the
// shipments table, and the middleware configured as theirs is, with the
// operation their router would take from the handler's name.
func shopDB(t *testing.T) (*sql.DB, *dedup.Deduplicator) {
	t.Helper()
	db, err := sql.Open("sqlite", sqlite.DSN(filepath.Join(t.TempDir(), "shop.db")))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store := inboxtest.NewStore(t, db, sqlite.Dialect(), inbox.Config{})
	_, err = db.Exec(`CREATE TABLE shipments (event_id TEXT NOT NULL, order_id TEXT NOT NULL, sku TEXT NOT NULL, qty INTEGER NOT NULL)`)
	require.NoError(t, err)
	d, err := dedup.New(store, dedup.Config{
		Key:          dedup.KeyFromMetadata("event_id"),
		Scope:        dedup.ScopeFromMetadata("tenant_id"),
		Operation:    "ship_order",
		IgnoreFields: []string{"sent_at"},
	})
	require.NoError(t, err)
	return db, d
}

func shipments(t *testing.T, db *sql.DB, eventID string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRowContext(context.Background(),
		`SELECT COUNT(*) FROM shipments WHERE event_id = ?`, eventID).Scan(&n))
	return n
}

// An order ships once however often its event is delivered: five times in
// a row (acks lost after the commit) or five times at once (a rebalance),
// including event 4, whose first run fails after writing its shipment.
func TestOrderShipsOnceUnderRedelivery(t *testing.T) {
	t.Parallel()
	for name, opts := range map[string][]deduptest.Option{
		"in a row": {deduptest.Times(5), deduptest.UntilAcked(3)},
		"at once":  {deduptest.Times(5), deduptest.UntilAcked(3), deduptest.Concurrently()},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db, d := shopDB(t)
			ship := deduptest.NoPublish(shop.NewFaults().ShipOrder(insertShipment))

			rep := deduptest.Redeliver(t, d, ship, shop.OrderMessage(1, 1), opts...)
			require.Equal(t, 5, rep.Acked, "%v", rep)
			require.Zero(t, rep.Nacked, "%v", rep)
			require.Equal(t, 1, rep.Runs, "the handler ran once: %v", rep)
			require.Equal(t, 1, shipments(t, db, shop.EventID(1)))

			// Event 4's first run fails after its insert: rolled back, nacked,
			// redelivered, and shipped by the next run alone.
			rep = deduptest.Redeliver(t, d, ship, shop.OrderMessage(4, 1), opts...)
			require.Equal(t, 5, rep.Acked, "%v", rep)
			require.Equal(t, 1, rep.Nacked, "%v", rep)
			require.ErrorContains(t, rep.Errors()[0], "simulated failure of the warehouse API")
			require.Equal(t, 2, rep.Runs, "the failed run and the one that shipped: %v", rep)
			require.Equal(t, 1, shipments(t, db, shop.EventID(4)))
		})
	}
}

// A producer's retry is a new message (new UUID, new sent_at) of the same
// event: a duplicate. An event ID reused for another order is refused as
// poison every time, and ships nothing.
func TestProducerRetryIsADuplicateAndAReusedIDIsPoison(t *testing.T) {
	t.Parallel()
	db, d := shopDB(t)
	ship := deduptest.NoPublish(shop.NewFaults().ShipOrder(insertShipment))
	rep := deduptest.Redeliver(t, d, ship, shop.OrderMessage(7, 1), deduptest.Times(1))
	require.Equal(t, 1, rep.Runs, "%v", rep)

	rep = deduptest.Redeliver(t, d, ship, shop.OrderMessage(7, 1), deduptest.Concurrently())
	require.Equal(t, deduptest.DefaultTimes, rep.Acked, "%v", rep)
	require.Zero(t, rep.Runs, "a producer retry does not ship again: %v", rep)

	rep = deduptest.Redeliver(t, d, ship, shop.OrderMessage(7, 99), deduptest.UntilAcked(3))
	require.Equal(t, deduptest.DefaultTimes, rep.Nacked, "%v", rep)
	require.Len(t, rep.Deliveries, deduptest.DefaultTimes, "poison is not redelivered")
	for _, err := range rep.Errors() {
		require.ErrorIs(t, err, dedup.ErrPayloadConflict)
		require.True(t, dedup.IsPoison(err))
	}
	require.Zero(t, rep.Runs)
	require.Equal(t, 1, shipments(t, db, shop.EventID(7)))
}
