package rerun_test

import (
	"bytes"
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/inboxmill/inboxmill/examples/internal/rerun"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

func setup(t *testing.T) (*inbox.Store, context.Context) {
	t.Helper()
	db, err := sql.Open("sqlite", sqlite.DSN(filepath.Join(t.TempDir(), "rerun.db")))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{Table: "example_inbox"})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, store.Migrate(ctx))
	return store, ctx
}

func claim(t *testing.T, store *inbox.Store, op, key string) {
	t.Helper()
	_, err := store.Claim(context.Background(), store.DB(), inbox.ClaimParams{
		ID: inbox.ID{Operation: op, Key: key}, PayloadHash: []byte{1},
	})
	require.NoError(t, err)
}

func report(t *testing.T, store *inbox.Store, events int) string {
	t.Helper()
	found, err := rerun.Find(context.Background(), store)
	require.NoError(t, err)
	var out bytes.Buffer
	found.Report(&out, events)
	return out.String()
}

// A first run hears that the table is empty; a later one how many records
// it found, by operation, whether executed=0 is to be expected, and how to
// start over.
func TestReport(t *testing.T) {
	t.Parallel()
	store, _ := setup(t)
	require.Equal(t, "inbox: table example_inbox holds no records from earlier runs\n", report(t, store, 2))

	claim(t, store, "ship_order", "evt-1")
	require.Equal(t, "note: 1 event was already recorded by an earlier run in table example_inbox; "+
		"it is acknowledged as a duplicate (the rest of this run's events execute). "+
		"Run with -reset to start over.\n", report(t, store, 2))

	claim(t, store, "ship_order", "evt-2")
	require.Equal(t, "note: 2 events were already recorded by an earlier run in table example_inbox; "+
		"they are acknowledged as duplicates (executed=0 is expected). Run with -reset to start over.\n",
		report(t, store, 2))
	require.Contains(t, report(t, store, 3), "(the rest of this run's events execute)")

	claim(t, store, "schedule_delivery", "evt-1")
	claim(t, store, "schedule_delivery", "evt-2")
	require.Equal(t, "note: 4 events (schedule_delivery: 2, ship_order: 2) were already recorded by an earlier run "+
		"in table example_inbox; they are acknowledged as duplicates (executed=0 is expected). "+
		"Run with -reset to start over.\n", report(t, store, 4))
}

// Reset drops the inbox with its migrations table and the example's own
// tables, and a migration afterwards starts from an empty inbox.
func TestReset(t *testing.T) {
	t.Parallel()
	store, ctx := setup(t)
	claim(t, store, "ship_order", "evt-1")
	_, err := store.DB().ExecContext(ctx, `CREATE TABLE example_shipments (event_id TEXT)`)
	require.NoError(t, err)

	var out bytes.Buffer
	require.NoError(t, rerun.Reset(ctx, &out, store, "example_shipments"))
	require.Equal(t, "reset: dropped the inbox example_inbox and example_shipments\n", out.String())
	var tables int
	require.NoError(t, store.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'`).Scan(&tables))
	require.Zero(t, tables, "every table is gone, the migrations table too")

	require.NoError(t, store.Migrate(ctx))
	require.Equal(t, "inbox: table example_inbox holds no records from earlier runs\n", report(t, store, 1))

	// Resetting what does not exist is not an error.
	out.Reset()
	require.NoError(t, rerun.Reset(ctx, &out, store, "example_shipments"))
}

func TestQueued(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	rerun.Queued(&out, 0, "watermill_x")
	require.Empty(t, out.String(), "nothing left over, nothing to say")
	rerun.Queued(&out, 3, "watermill_x")
	require.Equal(t, "note: 3 messages an earlier run left unconsumed in table watermill_x are delivered in this run too. "+
		"Run with -reset to start over.\n", out.String())
}
