package horizon_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/inboxmill/inboxmill/tests/testdb"
)

// TestMain fails the package's tests when a goroutine outlives them: a
// DescribeConfig call left running past its context, a client not closed.
// go-metrics' meter arbiter, which sarama starts once per process, is not
// a leak.
func TestMain(m *testing.M) {
	code := m.Run()
	testdb.CloseShared()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
			goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick")); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
