package inbox_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sqlitedriver "modernc.org/sqlite"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

// lostAnswerConnector opens SQLite connections on which the next
// statement starting with prefix runs to the end and commits, and then
// reports a lost connection instead of its rows: a write whose answer was
// lost.
type lostAnswerConnector struct {
	dsn    string
	prefix string
	armed  atomic.Bool
}

func (c *lostAnswerConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := (&sqlitedriver.Driver{}).Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &lostAnswerConn{Conn: conn, c: c}, nil
}

func (c *lostAnswerConnector) Driver() driver.Driver { return &sqlitedriver.Driver{} }

type lostAnswerConn struct {
	driver.Conn
	c *lostAnswerConnector
}

func (c *lostAnswerConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil || !strings.HasPrefix(query, c.c.prefix) {
		return st, err
	}
	return &lostAnswerStmt{Stmt: st, c: c.c}, nil
}

func (c *lostAnswerConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

type lostAnswerStmt struct {
	driver.Stmt
	c *lostAnswerConnector
}

var errConnectionLost = errors.New("read: connection reset by peer")

func (s *lostAnswerStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := s.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
	if err != nil || !s.c.armed.CompareAndSwap(true, false) {
		return rows, err
	}
	dest := make([]driver.Value, len(rows.Columns()))
	for rows.Next(dest) == nil {
	}
	_ = rows.Close()
	return nil, errConnectionLost
}

// A CompleteMany whose statement committed but whose answer was lost
// reports every completion done: the records show them, and a redelivery
// must find them completed rather than be told the leases were lost.
func TestCompleteManyWhoseAnswerWasLostCountsWhatTheRecordsShow(t *testing.T) {
	c := &lostAnswerConnector{dsn: sqlite.DSN(filepath.Join(t.TempDir(), "x.db")), prefix: `UPDATE "inbox" SET status = r.column4`}
	db := sql.OpenDB(c)
	t.Cleanup(func() { _ = db.Close() })
	store := testkit.MigratedStore(t, db, sqlite.Dialect(), inbox.Config{})
	ctx := context.Background()

	ps := make([]inbox.ReserveParams, 3)
	for i := range ps {
		ps[i] = inbox.ReserveParams{ID: inbox.ID{Operation: "op", Key: string(rune('a' + i))}, PayloadHash: []byte{1},
			Owner: "w1", Lease: time.Minute}
	}
	res, err := store.ReserveMany(ctx, ps)
	require.NoError(t, err)
	cs := make([]inbox.Completion, len(res))
	for i, r := range res {
		require.NotNil(t, r.Lease)
		cs[i] = inbox.Completion{Lease: r.Lease, Outcome: inbox.Outcome{Result: []byte(ps[i].ID.Key)}}
	}

	c.armed.Store(true)
	errs := store.CompleteMany(ctx, cs)
	require.False(t, c.armed.Load(), "the shared statement ran, and lost its answer")
	for i, err := range errs {
		require.NoError(t, err, ps[i].ID.Key)
		rec, err := store.Get(ctx, db, ps[i].ID)
		require.NoError(t, err)
		require.Equal(t, inbox.StatusCompleted, rec.Status)
		require.Equal(t, []byte(ps[i].ID.Key), rec.Result)
	}
}
