package inbox_test

import (
	"database/sql"
	"testing"

	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/internal/testdb"
)

// TestConformance runs the shared suite on every database and driver.
func TestConformance(t *testing.T) {
	for _, kind := range testdb.All {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			inboxtest.Run(t, inboxtest.Harness{
				Dialect: testdb.Dialect(kind),
				DB:      func(t testing.TB) *sql.DB { return testdb.Open(t, kind) },
			})
		})
	}
}
