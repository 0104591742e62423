package inbox_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/internal/testdb"
)

// TestResultLimitWithInterpolatedParams: with interpolateParams=true the
// MySQL driver writes a result into the statement's text, escaped — a NUL
// byte becomes two — so the limit must hold for a result of NUL bytes
// twice its size: it does, at exactly the limit.
func TestResultLimitWithInterpolatedParams(t *testing.T) {
	testdb.Open(t, testdb.MySQL) // skips (or fails under CI) when the server is unreachable
	db, err := sql.Open("mysql", testdb.MySQLDSN()+"&interpolateParams=true")
	require.NoError(t, err)
	defer db.Close()
	db.SetMaxOpenConns(2)
	store := inboxtest.NewStore(t, db, testdb.Dialect(testdb.MySQL), inbox.Config{})
	ctx := context.Background()
	limit, err := store.ResultLimit(ctx, db)
	require.NoError(t, err)

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	id := inbox.ID{Operation: "big", Key: "interpolated"}
	res, err := store.Claim(ctx, tx, inbox.ClaimParams{ID: id, PayloadHash: []byte("p"),
		CorrelationID: "corr"})
	require.NoError(t, err)
	require.NoError(t, store.SaveOutput(ctx, tx, res.Record, make([]byte, limit)))
	require.NoError(t, tx.Commit())
	rec, err := store.Get(ctx, db, id)
	require.NoError(t, err)
	require.Len(t, rec.Result, limit)
}

// TestResultLimitFallsBackWhenUnreadable: a database that does not answer
// yields FallbackResultLimit with the error, and a result over it is
// refused with the reason.
func TestResultLimitFallsBackWhenUnreadable(t *testing.T) {
	t.Parallel()
	db := testdb.OpenSQLite(t, filepath.Join(t.TempDir(), "inbox.db"))
	store := inboxtest.NewStore(t, db, testdb.Dialect(testdb.SQLite), inbox.Config{})
	ctx := context.Background()
	require.NoError(t, db.Close())

	limit, err := store.ResultLimit(ctx, db)
	require.Error(t, err)
	require.Equal(t, inbox.FallbackResultLimit, limit)
	again, err2 := store.ResultLimit(ctx, db)
	require.Equal(t, inbox.FallbackResultLimit, again)
	require.Equal(t, err, err2, "not read again at once")

	require.NoError(t, store.CheckResult(ctx, db, make([]byte, inbox.FallbackResultLimit)), "no read needed")
	cerr := store.CheckResult(ctx, db, make([]byte, inbox.FallbackResultLimit+1))
	require.ErrorIs(t, cerr, inbox.ErrResultTooLarge)
	var tl *inbox.ResultTooLargeError
	require.ErrorAs(t, cerr, &tl)
	require.Equal(t, inbox.FallbackResultLimit+1, tl.Size)
	require.Equal(t, err, tl.ReadErr)
	require.Contains(t, cerr.Error(), "fallback")
}

// TestDialectsKeepTheResultMargin: the dialects write the margin into their
// SQL as a literal; it must be ResultMargin.
func TestDialectsKeepTheResultMargin(t *testing.T) {
	for _, d := range []testdb.Kind{testdb.SQLite, testdb.PostgresPQ, testdb.MySQL} {
		sql := testdb.Dialect(d).Queries("inbox").ResultLimit().SQL
		require.Contains(t, sql, "- "+strconv.Itoa(inbox.ResultMargin), d)
	}
}
