package main

import (
	"bytes"
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/internal/testdb"
)

// TestSQLQueue runs the program twice against PostgreSQL on fresh tables:
// the first run books every invoice once despite producer retries and a
// failure between two writes; the second executes nothing again.
func TestSQLQueue(t *testing.T) {
	db := testdb.Open(t, testdb.PostgresPGX) // skips, or fails under CI, without PostgreSQL
	cfg := config{dsn: testdb.PostgresDSN(), topic: testdb.UniqueName("invoices"), table: testdb.UniqueName("inbox"), events: 30}
	t.Cleanup(func() { dropAll(db, cfg) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var out bytes.Buffer
	sum, err := run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	// 30 events, 7 of them twice (i%4 == 3), plus one reused key: 38.
	// Events 5, 15 and 25 fail once and come back.
	require.Equal(t, summary{published: 38, delivered: 41, executed: 30, duplicates: 7, conflicts: 1, rows: 60, distinct: 30}, sum)
	require.Contains(t, out.String(), "delivered=41 executed=30 duplicates=7 conflicts=1\n")

	out.Reset()
	sum, err = run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Equal(t, 0, sum.executed)
	require.Equal(t, 60, sum.rows, "nothing booked again")
}

func dropAll(db *sql.DB, cfg config) {
	for _, t := range []string{cfg.table + "_invoices", cfg.table, cfg.table + "_migrations", "watermill_" + cfg.topic} {
		_, _ = db.Exec("DROP TABLE IF EXISTS " + t)
	}
}
