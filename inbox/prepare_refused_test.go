package inbox_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
	sqlitedriver "modernc.org/sqlite"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/mysql"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

// errMaxPrepared is what a MySQL server at max_prepared_stmt_count answers
// to a prepare.
var errMaxPrepared = &mysqldriver.MySQLError{Number: 1461,
	Message: "Can't create more than max_prepared_stmt_count statements (current value: 16382)"}

func TestMySQLClassifiesARefusedPrepare(t *testing.T) {
	d := mysql.Dialect()
	for _, err := range []error{errMaxPrepared, fmt.Errorf("wrapped: %w", errMaxPrepared)} {
		got := d.Classify(err)
		require.ErrorIs(t, got, inbox.ErrPrepareRefused)
		require.ErrorIs(t, got, err, "the driver's error stays in the chain")
		require.False(t, inbox.IsRetryable(got), "a refused prepare is no reason to retry the transaction")
	}
	dup := &mysqldriver.MySQLError{Number: 1062, Message: "Duplicate entry"}
	require.Same(t, dup, d.Classify(dup), "other errors are left alone")
	require.True(t, inbox.IsRetryable(d.Classify(&mysqldriver.MySQLError{Number: 1213})), "a deadlock is transient")
	require.True(t, inbox.IsRetryable(d.Classify(&mysqldriver.MySQLError{Number: 1047})),
		"a Galera node outside the primary component is transient")
}

// refusingConnector opens SQLite connections that refuse to prepare
// statements, with MySQL's error 1461, while refuse is set; SQL sent as
// text runs. A MySQL server at max_prepared_stmt_count cannot be staged in
// a shared test database (every other test's statements would fail), so
// this stands in for one.
type refusingConnector struct {
	dsn     string
	refuse  atomic.Bool
	refused atomic.Int64
}

func (c *refusingConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := (&sqlitedriver.Driver{}).Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &refusingConn{Conn: conn, c: c}, nil
}

func (c *refusingConnector) Driver() driver.Driver { return &sqlitedriver.Driver{} }

type refusingConn struct {
	driver.Conn
	c *refusingConnector
}

func (c *refusingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if c.c.refuse.Load() {
		c.c.refused.Add(1)
		return nil, errMaxPrepared
	}
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (c *refusingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (c *refusingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
}

func (c *refusingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

// sqliteWithMySQLErrors is SQLite's SQL with MySQL's error classification,
// so that the refusals above are recognised.
type sqliteWithMySQLErrors struct{ inbox.Dialect }

func (d sqliteWithMySQLErrors) Classify(err error) error {
	if c := mysql.Dialect().Classify(err); c != err {
		return c
	}
	return d.Dialect.Classify(err)
}

// TestARefusedPrepareFallsBackToText: when the server refuses to prepare a
// statement on a new connection, the store sends its SQL text instead of
// failing the call, in and out of transactions.
func TestARefusedPrepareFallsBackToText(t *testing.T) {
	c := &refusingConnector{dsn: sqlite.DSN(filepath.Join(t.TempDir(), "x.db"))}
	db := sql.OpenDB(c)
	t.Cleanup(func() { _ = db.Close() })
	store := testkit.MigratedStore(t, db, sqliteWithMySQLErrors{sqlite.Dialect()}, inbox.Config{Prepare: inbox.PrepareAlways})
	ctx := context.Background()
	claim := func(key string) inbox.ClaimResult {
		t.Helper()
		res, err := store.Claim(ctx, db, inbox.ClaimParams{ID: inbox.ID{Operation: "op", Key: key}, PayloadHash: []byte{1}})
		require.NoError(t, err)
		return res
	}
	// Prepared while the server still accepts.
	require.True(t, claim("a").Claimed)
	_, err := store.Get(ctx, db, inbox.ID{Operation: "op", Key: "a"})
	require.NoError(t, err)

	// From now on every connection is new, so database/sql prepares the
	// store's statements again on it, and is refused.
	c.refuse.Store(true)
	db.SetMaxIdleConns(0)
	require.True(t, claim("b").Claimed, "the insert goes out as text")
	require.False(t, claim("a").Claimed, "so does the read of the existing record")
	rec, err := store.Get(ctx, db, inbox.ID{Operation: "op", Key: "b"})
	require.NoError(t, err)
	require.Equal(t, inbox.StatusCompleted, rec.Status)
	refused := c.refused.Load()
	require.Positive(t, refused, "the store did ask")

	// A statement first prepared now is refused too, and sent as text.
	require.NoError(t, store.Delete(ctx, db, inbox.ID{Operation: "op", Key: "b"}))

	// In a transaction of the store's own.
	tx, err := store.BeginTx(ctx, nil)
	require.NoError(t, err)
	res, err := store.Claim(ctx, tx, inbox.ClaimParams{ID: inbox.ID{Operation: "op", Key: "c"}, PayloadHash: []byte{1}})
	require.NoError(t, err)
	require.True(t, res.Claimed)
	require.NoError(t, store.SaveOutput(ctx, tx, res.Record, []byte("out")))
	require.NoError(t, tx.Commit())
	rec, err = store.Get(ctx, db, inbox.ID{Operation: "op", Key: "c"})
	require.NoError(t, err)
	require.Equal(t, []byte("out"), rec.Result)
	require.Greater(t, c.refused.Load(), refused)
}
