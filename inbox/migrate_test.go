package inbox_test

import (
	"context"
	"database/sql"
	"io/fs"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/mysql"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// TestMigrationsRenderEveryIdentifier checks that no identifier written for
// a table called "inbox" survives the rendering for another name, in DDL,
// in index names and in the string literals MySQL's migrations compare with
// information_schema, and that every version has both its files.
func TestMigrationsRenderEveryIdentifier(t *testing.T) {
	leftover := regexp.MustCompile(`\binbox\b|\binbox_`)
	for _, d := range dialects {
		t.Run(d.Name(), func(t *testing.T) {
			ms, err := inbox.LoadMigrations(d.Migrations(), "acme")
			require.NoError(t, err)
			require.NotEmpty(t, ms)
			for i, m := range ms {
				require.Equal(t, i+1, m.Version, "versions run 1, 2, …")
				require.NotEmpty(t, m.Name)
				for _, body := range []string{m.Up, m.Down} {
					require.NotContains(t, body, "{{")
					for _, stmt := range inbox.SplitStatements(body) {
						require.NotRegexp(t, leftover, withoutComments(stmt), "version %d", m.Version)
					}
				}
			}
			ups, err := fs.Glob(d.Migrations(), "*.up.sql")
			require.NoError(t, err)
			downs, err := fs.Glob(d.Migrations(), "*.down.sql")
			require.NoError(t, err)
			require.Len(t, ups, len(ms))
			require.Len(t, downs, len(ms))
			for _, up := range ups {
				_, err := fs.Stat(d.Migrations(), strings.TrimSuffix(up, ".up.sql")+".down.sql")
				require.NoError(t, err, up)
			}
		})
	}

	ms, err := inbox.LoadMigrations(mysql.Dialect().Migrations(), "acme")
	require.NoError(t, err)
	require.Len(t, ms, 3)
	require.Equal(t, "status_updated_index", ms[1].Name)
	require.Equal(t, "create_audit", ms[2].Name)
	require.Contains(t, ms[2].Up, "CREATE TABLE IF NOT EXISTS `acme_audit`")
	require.Contains(t, ms[2].Down, "DROP TABLE IF EXISTS `acme_audit`")
	require.Contains(t, ms[1].Up, "table_name = 'acme'")
	require.Contains(t, ms[1].Up, "ADD INDEX `acme_status_updated_idx` (status, updated_at)")
	require.Contains(t, ms[1].Up, "DROP INDEX `acme_status_lease_idx`")
}

// TestLoadMigrationsRejectsMalformedSets: a set of files the store would
// apply wrongly is refused before anything runs.
func TestLoadMigrationsRejectsMalformedSets(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	for name, fsys := range map[string]fstest.MapFS{
		"no down file":        {"001_a.up.sql": file("CREATE TABLE {{table}} (x int);")},
		"no up file":          {"001_a.down.sql": file("DROP TABLE {{table}};")},
		"unknown marker":      {"001_a.up.sql": file("CREATE TABLE {{tabel}} (x int);"), "001_a.down.sql": file("DROP TABLE {{table}};")},
		"two names":           {"001_a.up.sql": file("SELECT 1;"), "001_b.down.sql": file("SELECT 1;")},
		"no version":          {"a.up.sql": file("SELECT 1;"), "a.down.sql": file("SELECT 1;")},
		"version zero":        {"000_a.up.sql": file("SELECT 1;"), "000_a.down.sql": file("SELECT 1;")},
		"neither up nor down": {"001_a.sql": file("SELECT 1;")},
	} {
		_, err := inbox.LoadMigrations(fsys, "acme")
		require.Error(t, err, name)
	}
	ms, err := inbox.LoadMigrations(fstest.MapFS{
		"002_b.up.sql": file("ALTER TABLE {{table}} ADD y int;"), "002_b.down.sql": file("ALTER TABLE {{table}} DROP y;"),
		"001_a.up.sql": file("CREATE TABLE {{table}} (x int);"), "001_a.down.sql": file("DROP TABLE {{table}};"),
		"README.md": file("not a migration"),
	}, "acme")
	require.NoError(t, err)
	require.Equal(t, []inbox.Migration{
		{Version: 1, Name: "a", Up: "CREATE TABLE acme (x int);", Down: "DROP TABLE acme;"},
		{Version: 2, Name: "b", Up: "ALTER TABLE acme ADD y int;", Down: "ALTER TABLE acme DROP y;"},
	}, ms)
}

// TestSplitStatements pins how a migration file is cut into statements.
func TestSplitStatements(t *testing.T) {
	require.Equal(t, []string{
		"-- leading comment\nCREATE TABLE a (x int)",
		"CREATE INDEX b ON a (x)\n    WHERE x > 0",
	}, inbox.SplitStatements("-- leading comment\nCREATE TABLE a (x int);\n\nCREATE INDEX b ON a (x)\n    WHERE x > 0;\n-- trailing; comment\n"))
	require.Empty(t, inbox.SplitStatements("-- only a comment;\n\n"))
}

// withoutComments drops SQL line comments.
func withoutComments(sql string) string {
	var out []string
	for line := range strings.Lines(sql) {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

// TestMySQLStatusIndex checks that migration 2 replaces the status index, and
// that it and its down file can each run again after a crash at any point:
// MySQL commits DDL implicitly, so Migrate may find a version applied but not
// recorded.
func TestMySQLStatusIndex(t *testing.T) {
	db := testdb.Open(t, testdb.MySQL)
	ctx := context.Background()
	table := testdb.UniqueName("inbox")
	t.Cleanup(func() {
		_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table)
		_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table+"_audit")
		_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table+"_migrations")
	})
	store, err := inbox.NewStore(db, mysql.Dialect(), inbox.Config{Table: table})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	oldIdx, newIdx := table+"_status_lease_idx", table+"_status_updated_idx"

	// indexes returns the table's secondary indexes and their columns.
	indexes := func(t *testing.T) map[string]string {
		t.Helper()
		rows, err := db.QueryContext(ctx, `SELECT index_name, GROUP_CONCAT(column_name ORDER BY seq_in_index)
FROM information_schema.statistics
WHERE table_schema = DATABASE() AND table_name = ? AND index_name <> 'PRIMARY'
GROUP BY index_name`, table)
		require.NoError(t, err)
		defer rows.Close()
		got := map[string]string{}
		for rows.Next() {
			var name, cols string
			require.NoError(t, rows.Scan(&name, &cols))
			got[name] = cols
		}
		require.NoError(t, rows.Err())
		return got
	}
	migrated := map[string]string{table + "_expires_at_idx": "expires_at", newIdx: "status,updated_at"}
	version1 := map[string]string{table + "_expires_at_idx": "expires_at", oldIdx: "status,lease_until"}
	applied := func(t *testing.T, want ...int) {
		t.Helper()
		vs, err := store.AppliedMigrations(ctx)
		require.NoError(t, err)
		require.Equal(t, want, vs)
	}
	forget2 := func(t *testing.T) {
		t.Helper()
		_, err := db.ExecContext(ctx, "DELETE FROM "+table+"_migrations WHERE version = 2")
		require.NoError(t, err)
	}
	// runFile runs a migration file by hand, as a user would, on one
	// connection: its user variable and prepared statement are per session.
	runFile := func(t *testing.T, name string) {
		t.Helper()
		body, err := fs.ReadFile(mysql.Dialect().Migrations(), name)
		require.NoError(t, err)
		conn, err := db.Conn(ctx)
		require.NoError(t, err)
		defer conn.Close()
		for _, stmt := range inbox.SplitStatements(inbox.MustRenderSQL(string(body), table)) {
			_, err := conn.ExecContext(ctx, stmt)
			require.NoError(t, err, stmt)
		}
	}

	require.NoError(t, store.Migrate(ctx))
	applied(t, 1, 2, 3)
	require.Equal(t, migrated, indexes(t))

	// Records in every status survive the round trips below.
	for i, status := range []string{"processing", "pending", "completed", "failed"} {
		_, err := db.ExecContext(ctx, "INSERT INTO "+table+
			" (operation, `key`, payload_hash, status, created_at, updated_at) VALUES ('op', ?, 'h', ?, NOW(6), NOW(6))",
			i, status)
		require.NoError(t, err)
	}

	t.Run("CrashBeforeRecording", func(t *testing.T) {
		forget2(t)
		require.NoError(t, store.Migrate(ctx))
		applied(t, 1, 2, 3)
		require.Equal(t, migrated, indexes(t))
	})

	t.Run("CrashBetweenSteps", func(t *testing.T) {
		// The new index is built, the old one not dropped yet.
		_, err := db.ExecContext(ctx, "ALTER TABLE "+table+" ADD INDEX "+oldIdx+" (status, lease_until)")
		require.NoError(t, err)
		forget2(t)
		require.NoError(t, store.Migrate(ctx))
		applied(t, 1, 2, 3)
		require.Equal(t, migrated, indexes(t))
	})

	t.Run("DownAndUpAgain", func(t *testing.T) {
		runFile(t, "002_status_updated_index.down.sql")
		require.Equal(t, version1, indexes(t))
		runFile(t, "002_status_updated_index.down.sql")
		require.Equal(t, version1, indexes(t))

		// The down file leaves the runner's record alone, as 001's does.
		applied(t, 1, 2, 3)
		forget2(t)
		require.NoError(t, store.Migrate(ctx))
		applied(t, 1, 2, 3)
		require.Equal(t, migrated, indexes(t))

		runFile(t, "002_status_updated_index.up.sql")
		require.Equal(t, migrated, indexes(t))
	})

	t.Run("ScansUseTheIndex", func(t *testing.T) {
		// Mostly completed records, as in a working inbox, a few in the
		// other statuses; 10,000 rows from a cross join (MySQL has no
		// sequence engine).
		digits := "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4" +
			" UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)"
		_, err := db.ExecContext(ctx, "INSERT INTO "+table+
			" (operation, `key`, payload_hash, status, lease_until, created_at, updated_at)\n"+
			"SELECT 'bulk', n, 'h', CASE n % 200 WHEN 0 THEN 'processing' WHEN 1 THEN 'pending' WHEN 2 THEN 'failed' ELSE 'completed' END,\n"+
			"\tIF(n % 200 = 0, UTC_TIMESTAMP(6) - INTERVAL n % 7 MINUTE, NULL),\n"+
			"\tUTC_TIMESTAMP(6) - INTERVAL n SECOND, UTC_TIMESTAMP(6) - INTERVAL n SECOND\n"+
			"FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS n FROM "+
			digits+" a, "+digits+" b, "+digits+" c, "+digits+" e) g")
		require.NoError(t, err)
		t.Cleanup(func() {
			_, err := db.ExecContext(ctx, "DELETE FROM "+table+" WHERE operation = 'bulk'")
			require.NoError(t, err)
		})
		_, err = db.ExecContext(ctx, "ANALYZE TABLE "+table)
		require.NoError(t, err)

		q := mysql.Dialect().Queries(table)
		now := time.Now().UTC()
		for name, c := range map[string]struct {
			query string
			args  []any
		}{
			"SelectPending":   {q.SelectPending().SQL, []any{100}},
			"SelectStale":     {q.SelectStale().SQL, []any{now, now.Add(-time.Minute), 100}},
			"UnfinishedStats": {q.UnfinishedStats().SQL, nil},
		} {
			rows, err := db.QueryContext(ctx, "EXPLAIN "+c.query, c.args...)
			require.NoError(t, err, name)
			plans := explain(t, rows)
			require.Len(t, plans, 1, name)
			require.Equal(t, newIdx, plans[0]["key"], "%s: %v", name, plans[0])
			require.NotContains(t, plans[0]["Extra"], "filesort", "%s: %v", name, plans[0])
		}
	})

	var n int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&n))
	require.Equal(t, 4, n)
	st, err := store.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Processing)
	require.Equal(t, int64(1), st.Pending)
}

// explain reads EXPLAIN rows as column name to value.
func explain(t *testing.T, rows *sql.Rows) []map[string]string {
	t.Helper()
	defer rows.Close()
	cols, err := rows.Columns()
	require.NoError(t, err)
	var out []map[string]string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		require.NoError(t, rows.Scan(ptrs...))
		row := map[string]string{}
		for i, c := range cols {
			row[c] = vals[i].String
		}
		out = append(out, row)
	}
	require.NoError(t, rows.Err())
	return out
}

// TestMigrateRaceIsRetryable: a migration whose version record waits on
// the same version's record in another, uncommitted transaction — another
// migrator that no lock kept apart, as on two Galera nodes — fails with a
// *MigrationError at the record step that IsRetryable, whether the other
// transaction holds on past the session's lock timeout or commits; the
// next Migrate then succeeds.
func TestMigrateRaceIsRetryable(t *testing.T) {
	for _, kind := range []testdb.Kind{testdb.PostgresPQ, testdb.PostgresPGX, testdb.MySQL} {
		for _, commit := range []bool{false, true} {
			name := string(kind) + "/lock-timeout"
			if commit {
				name = string(kind) + "/other-commits"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				migrateRace(t, kind, commit)
			})
		}
	}
}

func migrateRace(t *testing.T, kind testdb.Kind, commit bool) {
	ctx := context.Background()
	shared := testdb.Open(t, kind) // skips or fails when the server is down
	driverName, dsn := "mysql", testdb.MySQLDSN()+"&innodb_lock_wait_timeout=1"
	if kind != testdb.MySQL {
		driverName, dsn = "postgres", testdb.PostgresDSN()+"&lock_timeout=1000"
		if kind == testdb.PostgresPGX {
			driverName = "pgx"
		}
	}
	if commit {
		dsn = strings.NewReplacer("lock_wait_timeout=1", "lock_wait_timeout=30", "lock_timeout=1000", "lock_timeout=30000").Replace(dsn)
	}
	db, err := sql.Open(driverName, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	table := testdb.UniqueName("inbox")
	t.Cleanup(func() {
		for _, tbl := range inbox.TableNames(table) {
			_, _ = shared.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tbl)
		}
	})
	store, err := inbox.NewStore(db, testdb.Dialect(kind), inbox.Config{Table: table})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	ms, err := store.Migrations()
	require.NoError(t, err)
	last := ms[len(ms)-1]
	require.NoError(t, store.MigrateTo(ctx, ms[len(ms)-2].Version))

	// The other migrator has applied the last version and inserted its
	// record, not committed yet: Migrate's own insert waits on its key.
	for _, stmt := range last.UpStatements() {
		_, err := shared.ExecContext(ctx, stmt)
		require.NoError(t, err)
	}
	other, err := shared.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = other.Rollback() }()
	ph := testdb.Dialect(kind).Placeholder
	_, err = other.ExecContext(ctx, "INSERT INTO "+table+"_migrations (version, name, applied_at) VALUES ("+
		ph(1)+", "+ph(2)+", "+ph(3)+")", last.Version, last.Name, testdb.Dialect(kind).TimeArg(time.Now()))
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { done <- store.Migrate(ctx) }()
	if commit {
		waitForRecordInsert(t, shared, kind, table+"_migrations")
		require.NoError(t, other.Commit())
	}
	err = <-done
	require.Error(t, err)
	require.True(t, inbox.IsRetryable(err), "transient: %v", err)
	var me *inbox.MigrationError
	require.ErrorAs(t, err, &me)
	require.Equal(t, table, me.Table)
	require.Equal(t, last.Version, me.Version)
	require.Equal(t, last.Name, me.Name)
	require.Equal(t, inbox.MigrateRecord, me.Step)
	require.False(t, me.Down)

	if !commit {
		require.NoError(t, other.Rollback())
	}
	require.NoError(t, store.Migrate(ctx), "running it again succeeds")
	require.NoError(t, store.Validate(ctx))
}

// waitForRecordInsert returns once a session inserts into table while the
// test's other transaction holds the row: past the version check.
func waitForRecordInsert(t *testing.T, db *sql.DB, kind testdb.Kind, table string) {
	t.Helper()
	q := "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'"
	if kind == testdb.MySQL {
		// Running the insert while the other transaction holds the key:
		// waiting on it, or about to.
		q = "SELECT COUNT(*) FROM information_schema.processlist WHERE info LIKE CONCAT('INSERT INTO `', ?, '`%')"
	}
	require.Eventually(t, func() bool {
		var n int
		return db.QueryRowContext(context.Background(), q, table).Scan(&n) == nil && n > 0
	}, 20*time.Second, 10*time.Millisecond, "Migrate waits on the other transaction's record")
}
