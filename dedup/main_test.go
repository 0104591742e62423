package dedup_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when any goroutine outlives them: the
// middleware holds none of its own, and the reserve mode's heartbeat must
// end with every delivery.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}
