package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// TestPartitionedTable: migrate --partitioned creates a partitioned table;
// every command then finds it partitioned by itself, purge drops a closed
// partition whose records all expired and deletes the rest in batches,
// and a width other than the table's is refused with the right flag to
// pass.
func TestPartitionedTable(t *testing.T) {
	db := testdb.Open(t, testdb.PostgresPGX)
	table := inboxtest.UniqueTable("clip")
	dsn := testdb.PostgresDSN()
	t.Cleanup(func() {
		s, err := inbox.NewStore(db, postgres.Partitioned(postgres.Partitions{}), inbox.Config{Table: table})
		if err == nil {
			_ = s.MigrateDown(context.Background(), 0)
			_ = s.Close()
		}
	})
	r := runCmd(t, "migrate", "--partitioned", "--dsn", dsn, "--table", table)
	require.Equal(t, exitOK, r.code, r.String())
	var kind string
	require.NoError(t, db.QueryRow(`SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)`, table).Scan(&kind))
	require.Equal(t, "p", kind)

	// A partition ten days old, its records expired (as a store running
	// then would have left it), and an expired record in today's.
	old := time.Now().UTC().Truncate(24 * time.Hour).Add(-10 * 24 * time.Hour)
	name := inbox.PartitionName(table, old)
	_, err := db.Exec(`SELECT "`+table+`_add_partition"($1, $2, $3)`, name, old, old.Add(24*time.Hour))
	require.NoError(t, err)
	for n := range 12 {
		bucket := old
		if n == 11 {
			bucket = time.Now().UTC().Truncate(24 * time.Hour)
		}
		_, err := db.Exec(`INSERT INTO "`+table+`" (operation, key, bucket, payload_hash, status, created_at, updated_at, expires_at)
VALUES ('ship', $1, $2, '\x01', 'completed', now(), now(), now() - interval '1 hour')`, fmt.Sprintf("k-%d", n), bucket.Add(time.Hour))
		require.NoError(t, err)
	}

	r = runCmd(t, "stats", "--dsn", dsn, "--table", table)
	require.Equal(t, exitOK, r.code, r.String())
	r = runCmd(t, "purge", "--yes", "--reason", "retention", "--progress=false", "--dsn", dsn, "--table", table)
	require.Equal(t, exitOK, r.code, r.String())
	require.Contains(t, r.stdout, "purged 12 records from table "+table+": 1 partition dropped, then 1 batch\n")
	var exists bool
	require.NoError(t, db.QueryRow(`SELECT to_regclass($1) IS NOT NULL`, `"`+name+`"`).Scan(&exists))
	require.False(t, exists)

	r = runCmd(t, "stats", "--dsn", dsn, "--table", table, "--partition-width", "1h")
	require.Equal(t, exitUsage, r.code, r.String())
	require.Contains(t, r.stderr, "pass --partition-width 24h0m0s")

	// An unpartitioned table is not partitioned by migrating.
	plain := inboxtest.NewStore(t, db, postgres.Dialect(), inbox.Config{})
	r = runCmd(t, "migrate", "--partitioned", "--dsn", dsn, "--table", plain.Table())
	require.Equal(t, exitUsage, r.code, r.String())
	require.Contains(t, r.stderr, "is not partitioned")
}
