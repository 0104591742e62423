package dedup_test

import (
	"database/sql"
	"testing"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/deduptest"
	"github.com/inboxmill/inboxmill/dedup/pgxgroup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// TestConformance runs the middleware's suite on every database and driver
// with the default statement mode (prepared on MySQL and SQLite, text on
// PostgreSQL), and once more on each driver in the mode its default leaves
// out: PrepareAlways on both PostgreSQL drivers, PrepareNever on SQLite and
// MySQL.
func TestConformance(t *testing.T) {
	testdb.EachMode(t, func(t *testing.T, kind testdb.Kind, prepare inbox.Prepare) {
		deduptest.Run(t, deduptest.Harness{
			Dialect: testdb.Dialect(kind),
			DB:      func(t testing.TB) *sql.DB { return testdb.Open(t, kind) },
			Prepare: prepare,
		})
	})
}

// TestConformanceGroupsAndBatches runs the suite again with group commit
// on for every transactional test and batches on for every reserve-mode
// test, on every database and driver: one run for both, as each setting
// changes only its own mode's tests (TestConformance covers both off).
// Coordinators and Statements are fixed low, so that deliveries in flight
// together form groups and batches: the adaptive default lets them run
// alone until grouping pays, which is the path TestConformance runs.
func TestConformanceGroupsAndBatches(t *testing.T) {
	testdb.EachMode(t, func(t *testing.T, kind testdb.Kind, prepare inbox.Prepare) {
		deduptest.Run(t, deduptest.Harness{
			Dialect: testdb.Dialect(kind),
			DB:      func(t testing.TB) *sql.DB { return testdb.Open(t, kind) },
			Prepare: prepare,
			Group:   &dedup.Group{Coordinators: 2},
			Batch:   &dedup.Batch{Statements: 1},
		})
	})
}

// TestConformanceGroupPipeline runs the suite with group commit sending
// its statements in pgx pipelines: every handler queues its writes.
func TestConformanceGroupPipeline(t *testing.T) {
	for _, prepare := range []inbox.Prepare{inbox.PrepareAuto} {
		t.Run(string(testdb.PostgresPGX), func(t *testing.T) {
			t.Parallel()
			deduptest.Run(t, deduptest.Harness{
				Dialect: testdb.Dialect(testdb.PostgresPGX),
				DB:      func(t testing.TB) *sql.DB { return testdb.Open(t, testdb.PostgresPGX) },
				Prepare: prepare,
				Group:   &dedup.Group{Pipeline: pgxgroup.Pipeline(), Coordinators: 2},
			})
		})
	}
}

// TestConformancePartitioned runs the suite on a partitioned PostgreSQL
// inbox (pgx; the store's race tests cover both drivers), without and with
// group commit, the event time read from the message.
func TestConformancePartitioned(t *testing.T) {
	for _, kind := range []testdb.Kind{testdb.PostgresPGX} {
		for _, group := range []*dedup.Group{nil, {Coordinators: 2}} {
			name := string(kind)
			if group != nil {
				name += "/group"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				deduptest.Run(t, deduptest.Harness{
					Dialect:   postgres.Partitioned(postgres.Partitions{}),
					DB:        func(t testing.TB) *sql.DB { return testdb.Open(t, kind) },
					Group:     group,
					EventTime: deduptest.KeyedEventTime,
				})
			})
		}
	}
}
