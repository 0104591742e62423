package inbox_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	sqlitedriver "modernc.org/sqlite"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

// countingConnector opens SQLite connections that count how often each
// statement is prepared. The connections offer no direct Exec or Query, so
// database/sql prepares every statement it runs: the count is the number
// of parses the store caused.
type countingConnector struct {
	dsn      string
	mu       sync.Mutex
	prepares map[string]int
}

func (c *countingConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := (&sqlitedriver.Driver{}).Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: conn, c: c}, nil
}

func (c *countingConnector) Driver() driver.Driver { return &sqlitedriver.Driver{} }

// count returns how often a statement starting with prefix was prepared.
func (c *countingConnector) count(prefix string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for q, k := range c.prepares {
		if strings.HasPrefix(q, prefix) {
			n += k
		}
	}
	return n
}

type countingConn struct {
	driver.Conn
	c *countingConnector
}

func (c *countingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	c.c.mu.Lock()
	c.c.prepares[query]++
	c.c.mu.Unlock()
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (c *countingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func countingStore(t *testing.T, prepare inbox.Prepare) (*inbox.Store, *countingConnector) {
	t.Helper()
	c := &countingConnector{dsn: sqlite.DSN(filepath.Join(t.TempDir(), "x.db")), prepares: map[string]int{}}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(1) // every statement on one connection
	t.Cleanup(func() { _ = db.Close() })
	return testkit.MigratedStore(t, db, sqlite.Dialect(), inbox.Config{Prepare: prepare}), c
}

func claimParams(key string) inbox.ClaimParams {
	return inbox.ClaimParams{ID: inbox.ID{Operation: "op", Key: key}, PayloadHash: []byte{1}}
}

// claimAll claims keys from..from+n-1: half in transactions of the
// store's own (Store.BeginTx), half directly on the database.
func claimAll(t *testing.T, store *inbox.Store, from, n int) {
	t.Helper()
	ctx := context.Background()
	for i := from; i < from+n; i++ {
		key := string(rune('a' + i))
		if i%2 == 0 {
			tx, err := store.BeginTx(ctx, nil)
			require.NoError(t, err)
			res, err := store.Claim(ctx, tx, claimParams(key))
			require.NoError(t, err)
			require.True(t, res.Claimed)
			require.NoError(t, tx.Commit())
			continue
		}
		res, err := store.Claim(ctx, store.DB(), claimParams(key))
		require.NoError(t, err)
		require.True(t, res.Claimed)
	}
}

func TestPreparedStatementsAreParsedOncePerConnection(t *testing.T) {
	store, c := countingStore(t, inbox.PrepareAlways)
	claimAll(t, store, 0, 10)
	require.Equal(t, 1, c.count(`INSERT INTO "inbox" (`), "the claim's INSERT, prepared once and reused")

	// A duplicate's read is prepared once too, in or out of a transaction.
	ctx := context.Background()
	for range 3 {
		res, err := store.Claim(ctx, store.DB(), claimParams("a"))
		require.NoError(t, err)
		require.False(t, res.Claimed)
	}
	require.Equal(t, 1, c.count(`INSERT INTO "inbox" (`))
	require.Equal(t, 1, c.count("SELECT scope"), "the read of the existing record")
}

func TestUnpreparedStatementsAreParsedEveryTime(t *testing.T) {
	store, c := countingStore(t, inbox.PrepareNever)
	claimAll(t, store, 0, 10)
	require.Equal(t, 10, c.count(`INSERT INTO "inbox" (`))
}

func TestPlainTransactionsDoNotUseTheCache(t *testing.T) {
	// The store cannot tell which database a *sql.Tx belongs to, so it
	// sends the text rather than bind a statement of its own database to it.
	store, c := countingStore(t, inbox.PrepareAlways)
	ctx := context.Background()
	claimAll(t, store, 0, 1) // the claim is prepared and cached
	require.Equal(t, 1, c.count(`INSERT INTO "inbox" (`))
	for _, key := range []string{"x", "y"} {
		tx, err := store.DB().BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = store.Claim(ctx, tx, claimParams(key))
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
	}
	require.Equal(t, 1+2, c.count(`INSERT INTO "inbox" (`), "the text, parsed for each plain transaction")
}

func TestTxOfAnotherDatabaseSendsText(t *testing.T) {
	// A *inbox.Tx of a store over another database is a foreign transaction:
	// binding this store's statement to it would fail.
	store, _ := countingStore(t, inbox.PrepareAlways)
	other, _ := countingStore(t, inbox.PrepareAlways)
	ctx := context.Background()
	// Both caches warm: store's own statements are prepared and would be
	// picked for a *inbox.Tx of store.
	claimAll(t, store, 0, 2)
	claimAll(t, other, 0, 2)
	tx, err := other.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = store.Claim(ctx, tx, claimParams("x")) // runs on other's database
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	_, err = other.Get(ctx, other.DB(), inbox.ID{Operation: "op", Key: "x"})
	require.NoError(t, err)
	_, err = store.Get(ctx, store.DB(), inbox.ID{Operation: "op", Key: "x"})
	require.ErrorIs(t, err, inbox.ErrNotFound)
}

func TestStoreWorksAfterClose(t *testing.T) {
	store, c := countingStore(t, inbox.PrepareAlways)
	claimAll(t, store, 0, 2)
	require.NoError(t, store.Close())
	require.NoError(t, store.Close(), "Close is idempotent")
	claimAll(t, store, 2, 2)
	require.Equal(t, 1+2, c.count(`INSERT INTO "inbox" (`), "after Close the text is sent every time")
}

func TestPrepareConfigIsValidated(t *testing.T) {
	db, err := sql.Open("sqlite", ":memory:")
	require.NoError(t, err)
	defer db.Close()
	_, err = inbox.NewStore(db, sqlite.Dialect(), inbox.Config{Prepare: inbox.Prepare(7)})
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)
	require.Equal(t, "auto", inbox.PrepareAuto.String())
}
