package inbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testdb"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

// measuring returns the stacks of the goroutines inside a store's
// background clock measurement. (One that has finished it may still be
// on its way out of the goroutine; it is not counted.)
func measuring() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("inbox.(*clockSync).start")) && bytes.Contains(g, []byte("inbox.(*Store).SyncClock")) {
			out = append(out, string(g))
		}
	}
	return out
}

// TestCloseStopsTheClockSync is not parallel: goleak looks at every
// goroutine of the process. On each database with a clock of its own the
// store's first Now starts a background measurement; it is kept waiting
// for a connection, and Close must end it and wait for it before
// returning, after which no goroutine of the store is left.
func TestCloseStopsTheClockSync(t *testing.T) {
	for _, kind := range []testdb.Kind{testdb.PostgresPQ, testdb.PostgresPGX, testdb.MySQL} {
		t.Run(string(kind), func(t *testing.T) {
			testdb.Open(t, kind) // skips (or fails under CI) when the server is unreachable
			ignore := goleak.IgnoreCurrent()
			before := len(measuring())

			driver, dsn := map[testdb.Kind]string{testdb.PostgresPQ: "postgres", testdb.PostgresPGX: "pgx", testdb.MySQL: "mysql"}[kind],
				testdb.PostgresDSN()
			if kind == testdb.MySQL {
				dsn = testdb.MySQLDSN()
			}
			db, err := sql.Open(driver, dsn)
			require.NoError(t, err)
			defer db.Close()
			db.SetMaxOpenConns(1)
			ctx := context.Background()
			held, err := db.Conn(ctx) // the pool's only connection
			require.NoError(t, err)

			store, err := inbox.NewStore(db, testdb.Dialect(kind), inbox.Config{ClockSync: time.Minute})
			require.NoError(t, err)
			_ = store.Now() // starts the measurement, which waits for a connection
			testkit.WaitFor(t, 30*time.Second, "the measurement to wait for a connection", func() (bool, error) {
				return db.Stats().WaitCount > 0, nil
			})
			require.Len(t, measuring(), before+1)

			require.NoError(t, store.Close())
			require.Len(t, measuring(), before, "Close waited for the measurement to end")
			_, measured := store.ClockOffset()
			require.False(t, measured, "the measurement was cancelled")

			// A closed store measures only when asked.
			_ = store.Now()
			require.Len(t, measuring(), before)
			require.NoError(t, held.Close())
			require.NoError(t, store.SyncClock(ctx))
			_, measured = store.ClockOffset()
			require.True(t, measured)
			require.NoError(t, store.Close(), "Close is idempotent")

			require.NoError(t, db.Close())
			goleak.VerifyNone(t, ignore, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
		})
	}
}
