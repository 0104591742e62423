package dedup_test

import (
	"testing"

	"github.com/inboxmill/inboxmill/tests/testkit"
)

// TestMain fails the package's tests when any goroutine outlives them: a
// reserve-mode heartbeat that did not end with its delivery, a
// reconciler's loop that Close did not stop.
func TestMain(m *testing.M) { testkit.MainWithLeakCheck(m) }
