package main

import (
	"bytes"
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// TestSQLQueue runs the program three times against PostgreSQL on fresh
// tables: the first run books every invoice once despite producer retries
// and a failure between two writes; the second executes nothing again and
// says why; the third, with -reset, starts over and books them again.
func TestSQLQueue(t *testing.T) {
	db := testdb.Open(t, testdb.PostgresPGX) // skips, or fails under CI, without PostgreSQL
	cfg := config{dsn: testdb.PostgresDSN(), topic: testdb.UniqueName("invoices"), table: testdb.UniqueName("inbox"), events: 30}
	t.Cleanup(func() { dropAll(db, cfg) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// 30 events, 7 of them twice (i%4 == 3), plus one reused key: 38.
	// Events 5, 15 and 25 fail once and come back.
	first := summary{published: 38, delivered: 41, executed: 30, duplicates: 7, conflicts: 1, rows: 60, distinct: 30}
	var out bytes.Buffer
	sum, err := run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Equal(t, first, sum)
	require.Contains(t, out.String(), "inbox: table "+cfg.table+" holds no records from earlier runs\n")
	require.Contains(t, out.String(), "delivered=41 executed=30 duplicates=7 conflicts=1\n")

	out.Reset()
	sum, err = run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Equal(t, summary{published: 38, delivered: 38, executed: 0, duplicates: 37, conflicts: 1, rows: 60, distinct: 30}, sum,
		"nothing booked again, and nothing of the first run's left to deliver")
	require.Contains(t, out.String(), "note: 30 events were already recorded by an earlier run in table "+cfg.table+
		"; they are acknowledged as duplicates (executed=0 is expected). Run with -reset to start over.\n")
	require.NotContains(t, out.String(), "left unconsumed", "the first run consumed everything it published")

	out.Reset()
	cfg.reset = true
	sum, err = run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Equal(t, first, sum, "after -reset the run books every invoice again, once")
	require.Contains(t, out.String(), "reset: dropped the inbox "+cfg.table+" and "+cfg.table+"_invoices, \"watermill_"+cfg.topic+"\"\n")
	require.Contains(t, out.String(), "holds no records from earlier runs\n")
}

// TestSQLQueueLeftovers: messages a stopped run published but never
// consumed are announced and delivered by the next run, which waits for
// them too.
func TestSQLQueueLeftovers(t *testing.T) {
	db := testdb.Open(t, testdb.PostgresPGX)
	cfg := config{dsn: testdb.PostgresDSN(), topic: testdb.UniqueName("invoices"), table: testdb.UniqueName("inbox"), events: 10}
	t.Cleanup(func() { dropAll(db, cfg) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	_, err := run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	// Two events of a run stopped before its consumer got to them.
	_, err = db.ExecContext(ctx, `UPDATE "watermill_`+cfg.topic+`" SET acked = false
		WHERE "offset" IN (SELECT "offset" FROM "watermill_`+cfg.topic+`" ORDER BY "offset" LIMIT 2)`)
	require.NoError(t, err)

	out.Reset()
	sum, err := run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Contains(t, out.String(), "note: 2 messages an earlier run left unconsumed in table \"watermill_"+cfg.topic+
		"\" are delivered in this run too.")
	require.Equal(t, 13, sum.published, "10 events, 2 of them twice, one reused key")
	require.Equal(t, 15, sum.executed+sum.duplicates+sum.conflicts, "this run's messages and the two left over")
	require.Zero(t, sum.executed)
	require.Equal(t, 20, sum.rows)
}

// An error names the database it could not reach without its password.
func TestSQLQueueRedactsPassword(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := cli([]string{"-dsn", "postgres://app:s3cret@127.0.0.1:1/x?sslmode=disable", "-reset"}, &stdout, &stderr)
	require.Equal(t, 1, code, stderr.String())
	require.Contains(t, stderr.String(), "sql-queue: PostgreSQL at postgres://app:xxxxx@127.0.0.1:1/x?sslmode=disable: ")
	require.NotContains(t, stdout.String()+stderr.String(), "s3cret")
}

// The deadline grows with -events, from a floor the default run is far
// below, and -h says so.
func TestSQLQueueDeadline(t *testing.T) {
	t.Parallel()
	require.Equal(t, 2*time.Minute, runDeadline.For(30))
	require.Equal(t, 20*time.Minute, runDeadline.For(60_000))
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, cli([]string{"-h"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "the run gives up after 2m0s or 20ms per event, whichever is longer")
	require.Contains(t, stderr.String(), "-reset")
}

// dropAll drops what the runs created: the inbox with every table its
// migrations made, the invoices and the queue.
func dropAll(db *sql.DB, cfg config) {
	if store, err := inbox.NewStore(db, postgres.Dialect(), inbox.Config{Table: cfg.table}); err == nil {
		_ = store.MigrateDown(context.Background(), 0)
	}
	for _, t := range []string{cfg.table + "_invoices", "watermill_" + cfg.topic} {
		_, _ = db.Exec("DROP TABLE IF EXISTS " + t)
	}
}
