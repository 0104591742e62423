package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/inbox/migrationfiles"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// TestMigrate takes a table through up, status, validate and down on
// every database.
func TestMigrate(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var (
				dsn string
				db  *sql.DB
			)
			switch kind {
			case testdb.SQLite:
				// A file that does not exist yet (sql.Open connects to
				// nothing): migrate creates it.
				dsn = filepath.Join(t.TempDir(), "fresh.db")
				db = testdb.OpenSQLiteUnopened(t, dsn)
			case testdb.MySQL:
				db, dsn = testdb.Open(t, kind), testdb.MySQLDSN()
			default:
				db, dsn = testdb.Open(t, kind), testdb.PostgresDSN()
			}
			table := inboxtest.UniqueTable("mig")
			if kind != testdb.SQLite {
				store, err := inbox.NewStore(db, testdb.Dialect(kind), inbox.Config{Table: table})
				require.NoError(t, err)
				t.Cleanup(func() {
					_ = store.MigrateDown(context.Background(), 0)
					_ = store.Close()
				})
			}
			ms, err := inbox.LoadMigrations(testdb.Dialect(kind).Migrations(), table)
			require.NoError(t, err)
			newest := ms[len(ms)-1].Version
			m := func(args ...string) result {
				return runCmd(t, append(append([]string{"migrate"}, args...), "--dsn", dsn, "--table", table)...)
			}

			if kind == testdb.SQLite {
				r := m("status")
				require.Equal(t, exitFailed, r.code)
				require.Contains(t, r.stderr, "no SQLite database at "+dsn)
			} else {
				r := m("status")
				require.Equal(t, exitOK, r.code, r.String())
				require.Regexp(t, `(?m)^1\s+create_inbox\s+no$`, r.stdout)
				require.Contains(t, r.stdout, fmt.Sprintf("%d version(s) missing: run `inboxmill migrate --table %s` with the same --dsn", len(ms), table))
				r = m("validate")
				require.Equal(t, exitFailed, r.code)
				require.Contains(t, r.stderr, "there is no inbox table "+table)
			}

			r := m()
			require.Equal(t, exitOK, r.code, r.String())
			require.Contains(t, r.stdout, fmt.Sprintf("table %s: applied version 1, ", table))
			require.Contains(t, r.stdout, fmt.Sprintf("now at version %d", newest))
			r = m("up")
			require.Equal(t, exitOK, r.code, r.String())
			require.Contains(t, r.stdout, fmt.Sprintf("table %s is up to date (version %d", table, newest))
			r = m("validate")
			require.Equal(t, exitOK, r.code, r.String())
			require.Contains(t, r.stdout, fmt.Sprintf("the schema of table %s is current (version %d", table, newest))
			r = m("status")
			require.Equal(t, exitOK, r.code, r.String())
			for _, mg := range ms {
				require.Regexp(t, fmt.Sprintf(`(?m)^%d\s+%s\s+yes$`, mg.Version, mg.Name), r.stdout)
			}
			require.Contains(t, r.stdout, "the schema is current")

			// Down asks for --yes, and says what it would undo.
			r = m("down", "--to", "1")
			require.Equal(t, exitUsage, r.code, r.String())
			require.Contains(t, r.stderr, "pass --yes")
			r = m("down", "--to", "0")
			require.Equal(t, exitUsage, r.code)
			require.Contains(t, r.stderr, "drops the inbox table "+table+" and every record")
			r = m("down", "--to", "1", "--yes")
			require.Equal(t, exitOK, r.code, r.String())
			require.Contains(t, r.stdout, fmt.Sprintf("undid version %d", newest))
			require.Contains(t, r.stdout, "now at version 1")
			r = m("validate")
			require.Equal(t, exitFailed, r.code)
			require.Contains(t, r.stderr, fmt.Sprintf("the inbox table %s lacks schema versions", table))
			require.Contains(t, r.stderr, "run `inboxmill migrate --table "+table+"`")
			r = runCmd(t, "stats", "--dsn", dsn, "--table", table)
			require.Equal(t, exitFailed, r.code, "a command needs the whole schema")
			require.Contains(t, r.stderr, "inboxmill migrate")

			r = m("up", "--to", "1")
			require.Equal(t, exitOK, r.code)
			require.Contains(t, r.stdout, "is up to date (version 1")
			r = m()
			require.Equal(t, exitOK, r.code)
			r = m("down", "--to", "0", "--yes")
			require.Equal(t, exitOK, r.code, r.String())
			require.Contains(t, r.stdout, "the inbox table is dropped")
			store, err := inbox.NewStore(db, testdb.Dialect(kind), inbox.Config{Table: table})
			require.NoError(t, err)
			defer store.Close()
			applied, err := store.AppliedMigrations(ctx)
			require.NoError(t, err)
			require.Empty(t, applied)
		})
	}
}

// TestMigrateNoticesADroppedTable: an inbox table dropped by hand leaves
// its versions recorded; migrate, migrate status and migrate validate say
// so instead of calling the schema current.
func TestMigrateNoticesADroppedTable(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var (
				dsn string
				db  *sql.DB
			)
			switch kind {
			case testdb.SQLite:
				dsn = filepath.Join(t.TempDir(), "dropped.db")
				db = testdb.OpenSQLiteUnopened(t, dsn)
			case testdb.MySQL:
				db, dsn = testdb.Open(t, kind), testdb.MySQLDSN()
			default:
				db, dsn = testdb.Open(t, kind), testdb.PostgresDSN()
			}
			table := inboxtest.UniqueTable("drop")
			store, err := inbox.NewStore(db, testdb.Dialect(kind), inbox.Config{Table: table})
			require.NoError(t, err)
			t.Cleanup(func() {
				for _, tbl := range inbox.TableNames(table) {
					_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tbl)
				}
				_ = store.Close()
			})
			m := func(args ...string) result {
				return runCmd(t, append(append([]string{"migrate"}, args...), "--dsn", dsn, "--table", table)...)
			}
			r := m()
			require.Equal(t, exitOK, r.code, r.String())
			_, err = db.ExecContext(ctx, "DROP TABLE "+table)
			require.NoError(t, err)

			r = m("validate")
			require.Equal(t, exitFailed, r.code, r.String())
			require.Contains(t, r.stderr, fmt.Sprintf("tables [%s] do not exist", table))
			require.Contains(t, r.stderr, "drop "+table+"_migrations")
			r = m()
			require.Equal(t, exitFailed, r.code, "not up to date: %s", r.String())
			require.Contains(t, r.stderr, fmt.Sprintf("tables [%s] do not exist", table))
			r = m("status")
			require.Equal(t, exitOK, r.code, r.String())
			require.NotContains(t, r.stdout, "the schema is current")
			require.Contains(t, r.stdout, fmt.Sprintf("tables [%s] do not exist", table))

			// What the advice says: without the versions, migrate creates
			// what is missing.
			_, err = db.ExecContext(ctx, "DROP TABLE "+table+"_migrations")
			require.NoError(t, err)
			r = m()
			require.Equal(t, exitOK, r.code, r.String())
			r = m("validate")
			require.Equal(t, exitOK, r.code, r.String())
		})
	}
}

// TestMigratePrint: --print writes the dialect's migrations for the table,
// connecting to nothing.
func TestMigratePrint(t *testing.T) {
	for _, d := range []string{"postgres", "mysql", "sqlite"} {
		t.Run(d, func(t *testing.T) {
			ms, err := inbox.LoadMigrations(dialects[d].dialect().Migrations(), "payment_inbox")
			require.NoError(t, err)
			r := runCmd(t, "migrate", "--print", "--dialect", d, "--table", "payment_inbox")
			require.Equal(t, exitOK, r.code, r.String())
			require.Empty(t, r.stderr)
			pos := -1
			for _, m := range ms {
				head := fmt.Sprintf("-- inboxmill migration %03d_%s.up.sql (%s, table payment_inbox)\n", m.Version, m.Name, d)
				i := strings.Index(r.stdout, head+strings.TrimRight(m.Up, "\n")+"\n")
				require.Greater(t, i, pos, "version %d in order", m.Version)
				pos = i
			}
			require.NotContains(t, r.stdout, "{{table}}")

			r = runCmd(t, "migrate", "down", "--print", "--dialect", d, "--table", "payment_inbox")
			require.Equal(t, exitOK, r.code, r.String())
			pos = -1
			for i := len(ms) - 1; i >= 0; i-- {
				m := ms[i]
				at := strings.Index(r.stdout, fmt.Sprintf("%03d_%s.down.sql", m.Version, m.Name))
				require.Greater(t, at, pos, "down files newest first")
				pos = at
				require.Contains(t, r.stdout, strings.TrimRight(m.Down, "\n"))
			}

			r = runCmd(t, "migrate", "--print", "--dialect", d, "--version", "1")
			require.Equal(t, exitOK, r.code, r.String())
			require.Equal(t, fmt.Sprintf("-- inboxmill migration 001_%s.up.sql (%s, table inbox)\n", ms[0].Name, d)+
				strings.TrimRight(mustRender(t, d, "inbox")[0].Up, "\n")+"\n", r.stdout)
			r = runCmd(t, "migrate", "--print", "--dialect", d, "--version", "99")
			require.Equal(t, exitUsage, r.code)
			require.Contains(t, r.stderr, "has no version 99")
		})
	}
	// The dialect comes from the DSN too, which is not opened.
	dsn := filepath.Join(t.TempDir(), "never.db")
	r := runCmd(t, "migrate", "--print", "--dsn", dsn)
	require.Equal(t, exitOK, r.code, r.String())
	require.Contains(t, r.stdout, "(sqlite, table inbox)")
	_, err := os.Stat(dsn)
	require.ErrorIs(t, err, os.ErrNotExist)
	r = runCmd(t, "migrate", "--print", "--dsn", "root@tcp(127.0.0.1:1)/nowhere")
	require.Equal(t, exitOK, r.code, r.String())
	require.Contains(t, r.stdout, "(mysql, table inbox)")
}

func mustRender(t *testing.T, d, table string) []inbox.Migration {
	t.Helper()
	ms, err := inbox.LoadMigrations(dialects[d].dialect().Migrations(), table)
	require.NoError(t, err)
	return ms
}

// TestMigratePrintFormat: --format renders the files migrationfiles
// renders, headed by their names on standard output or written into --dir.
func TestMigratePrintFormat(t *testing.T) {
	for _, d := range []string{"postgres", "mysql", "sqlite"} {
		for _, f := range migrationfiles.Formats() {
			t.Run(d+"/"+f.String(), func(t *testing.T) {
				want, err := migrationfiles.Render(dialects[d].dialect(), "payment_inbox", f)
				require.NoError(t, err)
				r := runCmd(t, "migrate", "--print", "--dialect", d, "--table", "payment_inbox", "--format", f.String())
				require.Equal(t, exitOK, r.code, r.String())
				pos := -1
				for _, file := range want {
					i := strings.Index(r.stdout, fmt.Sprintf("-- file: %s (%s, %s, table payment_inbox)\n", file.Name, f, d)+string(file.Body))
					require.Greater(t, i, pos, "%s in order", file.Name)
					pos = i
				}

				dir := t.TempDir()
				r = runCmd(t, "migrate", "--print", "--dialect", d, "--table", "payment_inbox", "--format", f.String(), "--dir", dir)
				require.Equal(t, exitOK, r.code, r.String())
				for _, file := range want {
					body, err := os.ReadFile(filepath.Join(dir, file.Name))
					require.NoError(t, err)
					require.Equal(t, string(file.Body), string(body))
					require.Contains(t, r.stdout, filepath.Join(dir, file.Name))
				}
			})
		}
	}
	r := runCmd(t, "migrate", "--print", "--dialect", "sqlite", "--format", "flyway")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, `unknown format "flyway"`)
	r = runCmd(t, "migrate", "--dialect", "sqlite", "--format", "goose")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "go with --print")
	r = runCmd(t, "migrate", "--print", "--dialect", "sqlite", "--format", "goose", "--version", "1")
	require.Equal(t, exitUsage, r.code)
}
