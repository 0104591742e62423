package dedup_test

import (
	"database/sql"
	"testing"

	"github.com/inboxmill/inboxmill/dedup/deduptest"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/internal/testdb"
)

// TestConformance runs the middleware's suite on every database and driver
// with the default statement mode (prepared on MySQL and SQLite, text on
// PostgreSQL), and once more on each driver in the mode its default leaves
// out: PrepareAlways on both PostgreSQL drivers, PrepareNever on SQLite and
// MySQL.
func TestConformance(t *testing.T) {
	other := map[testdb.Kind]inbox.Prepare{
		testdb.PostgresPQ:  inbox.PrepareAlways,
		testdb.PostgresPGX: inbox.PrepareAlways,
		testdb.SQLite:      inbox.PrepareNever,
		testdb.MySQL:       inbox.PrepareNever,
	}
	for _, kind := range testdb.All {
		for _, prepare := range []inbox.Prepare{inbox.PrepareAuto, other[kind]} {
			name := string(kind)
			if prepare != inbox.PrepareAuto {
				name += "/prepare-" + prepare.String()
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				deduptest.Run(t, deduptest.Harness{
					Dialect: testdb.Dialect(kind),
					DB:      func(t testing.TB) *sql.DB { return openShared(t, kind) },
					Prepare: prepare,
				})
			})
		}
	}
}
