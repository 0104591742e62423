package handlers_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when any goroutine outlives them, such
// as a reconciler's loop that Close did not stop.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}
