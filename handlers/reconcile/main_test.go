package reconcile_test

import (
	"database/sql"
	"fmt"
	"os"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/inboxmill/inboxmill/internal/testdb"
)

// TestMain fails the package's tests when any goroutine outlives them, such
// as a reconciler's loop that Close did not stop. The server databases the
// tests share are closed first, so that their drivers' connection
// goroutines end with them.
func TestMain(m *testing.M) {
	code := m.Run()
	closeShared()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener")); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	sharedMu sync.Mutex
	shared   = map[*sql.DB]bool{}
)

// openShared is testdb.Open, remembering the server databases (which
// testdb shares for the whole binary and never closes) for TestMain to
// close.
func openShared(t testing.TB, kind testdb.Kind) *sql.DB {
	t.Helper()
	db := testdb.Open(t, kind)
	if kind != testdb.SQLite {
		sharedMu.Lock()
		shared[db] = true
		sharedMu.Unlock()
	}
	return db
}

func closeShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	for db := range shared {
		_ = db.Close()
	}
}
