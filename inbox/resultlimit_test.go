package inbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// maxAllowedPacket is the MySQL server's max_allowed_packet for db's
// sessions.
func maxAllowedPacket(t *testing.T, db *sql.DB) int {
	t.Helper()
	var packet int
	require.NoError(t, db.QueryRow("SELECT @@max_allowed_packet").Scan(&packet))
	return packet
}

// TestResultLimitFollowsHowTheResultIsSent: the MySQL driver binds a
// result as a parameter of a server-side prepared statement (its default,
// and every statement the store prepares), which takes a value up to the
// whole max_allowed_packet, less ResultMargin for the rest of the
// statement. A result between half the packet and that is stored and read
// back on every path that writes one; a result over the limit, or the size
// of the packet, is refused before it is sent, the transaction intact.
func TestResultLimitFollowsHowTheResultIsSent(t *testing.T) {
	db := testdb.Open(t, testdb.MySQL)
	store := inboxtest.NewStore(t, db, testdb.Dialect(testdb.MySQL), inbox.Config{})
	ctx := context.Background()
	packet := maxAllowedPacket(t, db)
	limit, err := store.ResultLimit(ctx, db)
	require.NoError(t, err)
	require.Equal(t, packet-inbox.ResultMargin, limit, "bound as a parameter, the result has the whole packet")

	// 10 MiB at the default packet of 16 MiB: over half of it.
	size := packet/2 + packet/8
	result := bytes.Repeat([]byte{0, 'x', '\\', '\''}, size/4)
	saved := func(key string, tx interface {
		inbox.DBTX
		Commit() error
	}, result []byte) error {
		t.Helper()
		res, err := store.Claim(ctx, tx, inbox.ClaimParams{ID: inbox.ID{Operation: "big", Key: key}, PayloadHash: []byte("p")})
		require.NoError(t, err)
		require.True(t, res.Claimed)
		serr := store.SaveOutput(ctx, tx, res.Record, result)
		require.NoError(t, tx.Commit(), "refused or not, the transaction commits")
		return serr
	}
	stored := func(key string) []byte {
		t.Helper()
		rec, err := store.Get(ctx, db, inbox.ID{Operation: "big", Key: key})
		require.NoError(t, err)
		return rec.Result
	}

	plain, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, saved("plain-tx", plain, result), "a plain *sql.Tx: the driver prepares the statement")
	require.Equal(t, result, stored("plain-tx"))

	own, err := store.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, saved("store-tx", own, result), "Store.BeginTx: the store's prepared statement")
	require.Equal(t, result, stored("store-tx"))

	rr, err := store.Reserve(ctx, inbox.ReserveParams{ID: inbox.ID{Operation: "big", Key: "lease"}, PayloadHash: []byte("p"),
		Owner: "w", Lease: time.Minute})
	require.NoError(t, err)
	require.NoError(t, rr.Lease.Complete(ctx, inbox.Outcome{Result: result}))
	require.Empty(t, rr.Lease.Dropped())
	require.Equal(t, result, stored("lease"))

	for _, n := range []int{limit + 1, packet} {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		key := "over-" + strconv.Itoa(n)
		err = saved(key, tx, make([]byte, n))
		require.ErrorIs(t, err, inbox.ErrResultTooLarge, "%d bytes", n)
		var tl *inbox.ResultTooLargeError
		require.ErrorAs(t, err, &tl)
		require.Equal(t, limit, tl.Limit)
		require.Nil(t, stored(key), "the claim committed without the result")
	}
}

// TestResultLimitWithInterpolatedParams: with interpolateParams=true the
// MySQL driver writes a result into the statement's text, escaped — a NUL
// byte becomes two — so the limit must hold for a result of NUL bytes
// twice its size: it is half the packet (less ResultMargin), a result of
// exactly that size is stored, and one of the size the bound statement
// stores is refused before it is sent.
func TestResultLimitWithInterpolatedParams(t *testing.T) {
	testdb.Open(t, testdb.MySQL) // skips (or fails under CI) when the server is unreachable
	db, err := sql.Open("mysql", testdb.MySQLDSN()+"&interpolateParams=true")
	require.NoError(t, err)
	defer db.Close()
	db.SetMaxOpenConns(2)
	store := inboxtest.NewStore(t, db, testdb.Dialect(testdb.MySQL), inbox.Config{})
	ctx := context.Background()
	packet := maxAllowedPacket(t, db)
	limit, err := store.ResultLimit(ctx, db)
	require.NoError(t, err)
	require.Equal(t, packet/2-inbox.ResultMargin, limit)

	over, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = over.Rollback() }()
	overID := inbox.ID{Operation: "big", Key: "over-half"}
	res, err := store.Claim(ctx, over, inbox.ClaimParams{ID: overID, PayloadHash: []byte("p")})
	require.NoError(t, err)
	require.ErrorIs(t, store.SaveOutput(ctx, over, res.Record, make([]byte, packet/2+packet/8)), inbox.ErrResultTooLarge)
	require.NoError(t, over.Commit(), "the transaction is intact")
	rec, err := store.Get(ctx, db, overID)
	require.NoError(t, err)
	require.Nil(t, rec.Result)

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	id := inbox.ID{Operation: "big", Key: "interpolated"}
	res, err = store.Claim(ctx, tx, inbox.ClaimParams{ID: id, PayloadHash: []byte("p"),
		CorrelationID: "corr"})
	require.NoError(t, err)
	require.NoError(t, store.SaveOutput(ctx, tx, res.Record, make([]byte, limit)))
	require.NoError(t, tx.Commit())
	rec, err = store.Get(ctx, db, id)
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
