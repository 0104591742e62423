package webhook_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/inboxmill/inboxmill/tests/testdb"
)

// TestMain fails the package's tests when any goroutine outlives them, such
// as a router or a subscriber of the end-to-end test that was not closed.
// The shared databases are closed first: an idle pgx connection may keep
// a goroutine reading its socket (after a write that was slow under load),
// which is the pool's, not a leak.
func TestMain(m *testing.M) {
	code := m.Run()
	testdb.CloseShared()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener")); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
