package inbox_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

// TestClosedStatementsFallBackToText: a call that finds its prepared
// statement closed under it (Store.Close racing with it) sends the text.
func TestClosedStatementsFallBackToText(t *testing.T) {
	db, err := sql.Open("sqlite", sqlite.DSN(filepath.Join(t.TempDir(), "x.db")))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{Prepare: inbox.PrepareAlways})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, store.Migrate(ctx))
	params := func(key string) inbox.ClaimParams {
		return inbox.ClaimParams{ID: inbox.ID{Operation: "op", Key: key}, PayloadHash: []byte{1}}
	}

	res, err := store.Claim(ctx, db, params("a")) // prepares the claim
	require.NoError(t, err)
	require.True(t, res.Claimed)
	_, err = store.Get(ctx, db, inbox.ID{Operation: "op", Key: "a"}) // prepares the read
	require.NoError(t, err)

	inbox.CloseCachedStatements(store)
	res, err = store.Claim(ctx, db, params("b"))
	require.NoError(t, err, "the insert goes out as text")
	require.True(t, res.Claimed)
	res, err = store.Claim(ctx, db, params("a"))
	require.NoError(t, err, "the read of the existing record goes out as text")
	require.False(t, res.Claimed)
	rec, err := store.Get(ctx, db, inbox.ID{Operation: "op", Key: "b"})
	require.NoError(t, err)
	require.Equal(t, inbox.StatusCompleted, rec.Status)

	// In a transaction of the store's own, database/sql prepares a closed
	// statement again on the transaction's connection.
	tx, err := store.BeginTx(ctx, nil)
	require.NoError(t, err)
	res, err = store.Claim(ctx, tx, params("c"))
	require.NoError(t, err)
	require.True(t, res.Claimed)
	require.NoError(t, tx.Commit())
}

// TestPreparingHonoursTheCallersDeadline: preparing a statement waits for
// a connection no longer than the caller's context allows, as sending the
// text would.
func TestPreparingHonoursTheCallersDeadline(t *testing.T) {
	db, err := sql.Open("sqlite", sqlite.DSN(filepath.Join(t.TempDir(), "x.db")))
	require.NoError(t, err)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	store, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{Prepare: inbox.PrepareAlways})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(context.Background()))

	hold, err := db.BeginTx(context.Background(), nil) // the pool's only connection
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = store.Get(ctx, db, inbox.ID{Operation: "op", Key: "a"})
	require.ErrorIs(t, err, context.DeadlineExceeded, "preparing gave up at the deadline")
	require.NoError(t, hold.Rollback())

	// The store answers normally once the connection is free.
	_, err = store.Get(context.Background(), db, inbox.ID{Operation: "op", Key: "a"})
	require.ErrorIs(t, err, inbox.ErrNotFound)
}
