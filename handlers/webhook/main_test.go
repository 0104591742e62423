package webhook_test

import (
	"testing"

	"github.com/inboxmill/inboxmill/tests/testkit"
)

// TestMain fails the package's tests when any goroutine outlives them, such
// as a router or a subscriber of the end-to-end test that was not closed.
// The shared databases are closed first: an idle pgx connection may keep
// a goroutine reading its socket (after a write that was slow under load),
// which is the pool's, not a leak.
func TestMain(m *testing.M) { testkit.MainWithLeakCheck(m) }
