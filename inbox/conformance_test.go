package inbox_test

import (
	"database/sql"
	"testing"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// TestConformance runs the shared suite on every database and driver with
// the default statement mode (prepared on MySQL and SQLite, text on
// PostgreSQL), and once more on each driver in the mode its default leaves
// out: PrepareAlways on both PostgreSQL drivers, PrepareNever on SQLite and
// MySQL.
func TestConformance(t *testing.T) {
	testdb.EachMode(t, func(t *testing.T, kind testdb.Kind, prepare inbox.Prepare) {
		inboxtest.Run(t, inboxtest.Harness{
			Dialect: testdb.Dialect(kind),
			DB:      func(t testing.TB) *sql.DB { return testdb.Open(t, kind) },
			Prepare: prepare,
		})
	})
}

// TestConformancePartitioned runs the shared suite on a partitioned
// PostgreSQL table: partitioning changes where records live and how they
// are purged, never what a caller sees. One driver: the partitioned
// table's SQL is the same for both, and the race tests of partition_test.go
// run on each.
func TestConformancePartitioned(t *testing.T) {
	for _, kind := range []testdb.Kind{testdb.PostgresPGX} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			inboxtest.Run(t, inboxtest.Harness{
				Dialect: postgres.Partitioned(postgres.Partitions{}),
				DB:      func(t testing.TB) *sql.DB { return testdb.Open(t, kind) },
			})
		})
	}
}
