package main

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/tests/testdb"
)

func TestResolveDialect(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://app:pw@db:5432/shop?sslmode=disable": "postgres",
		"postgresql://app@db/shop":                       "postgres",
		"host=db dbname=shop user=app":                   "postgres",
		"app:pw@tcp(db:3306)/shop?parseTime=true":        "mysql",
		"root@unix(/run/mysqld/mysqld.sock)/shop":        "mysql",
		"mysql://app:pw@db:3306/shop":                    "mysql",
		"inbox.db":                                       "sqlite",
		"/var/lib/app/inbox.sqlite3":                     "sqlite",
		"./data/inbox":                                   "sqlite",
		"file:inbox.db?_pragma=busy_timeout(5000)":       "sqlite",
		":memory:": "sqlite",
	} {
		got, err := resolveDialect("", dsn)
		require.NoError(t, err, dsn)
		require.Equal(t, want, got, dsn)
	}
	for flag, want := range map[string]string{"postgresql": "postgres", "MariaDB": "mysql", "sqlite3": "sqlite", "pg": "postgres"} {
		got, err := resolveDialect(flag, "whatever")
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	_, err := resolveDialect("oracle", "inbox.db")
	require.ErrorIs(t, err, errUnknownDialect)
	require.ErrorContains(t, err, `--dialect takes postgres, mysql or sqlite`)
	_, err = resolveDialect("", "redis://u:s3cret@cache:6379")
	require.ErrorIs(t, err, errUnknownDialect)
	require.ErrorContains(t, err, "pass --dialect")
	require.NotContains(t, err.Error(), "s3cret")
}

func TestResolveTarget(t *testing.T) {
	tg, err := resolveTarget(dbFlags{dsn: "mysql://app:s3cret@db/shop?tls=false"})
	require.NoError(t, err)
	require.Equal(t, "mysql", tg.dialect)
	require.Contains(t, tg.dsn, "app:s3cret@tcp(db:3306)/shop?")
	require.Contains(t, tg.dsn, "parseTime=true")
	require.Contains(t, tg.dsn, "tls=false")
	require.Equal(t, "s3cret", tg.password)
	require.NotContains(t, tg.shown, "s3cret")

	tg, err = resolveTarget(dbFlags{dsn: "app:s3cret@tcp(db:3306)/shop"})
	require.NoError(t, err)
	require.Contains(t, tg.dsn, "parseTime=true")
	require.Equal(t, "app:xxxxx@tcp(db:3306)/shop", tg.shown)

	tg, err = resolveTarget(dbFlags{dsn: "postgres://app:s3cret@db/shop"})
	require.NoError(t, err)
	require.Equal(t, "postgres://app:xxxxx@db/shop", tg.shown)
	require.Equal(t, "s3cret", tg.password)
	require.EqualError(t, tg.scrub(errString("dial postgres://app:s3cret@db: refused")), "dial postgres://app:xxxxx@db: refused")

	tg, err = resolveTarget(dbFlags{dsn: "data/inbox.db", dialect: "sqlite"})
	require.NoError(t, err)
	require.Equal(t, "data/inbox.db", tg.sqlitePath)
	require.True(t, strings.HasPrefix(tg.dsn, "file:data/inbox.db?"), tg.dsn)
	tg, err = resolveTarget(dbFlags{dsn: "file:/tmp/x.db?mode=rwc"})
	require.NoError(t, err)
	require.Equal(t, "/tmp/x.db", tg.sqlitePath)
	require.Equal(t, "file:/tmp/x.db?mode=rwc", tg.dsn)
	tg, err = resolveTarget(dbFlags{dsn: ":memory:"})
	require.NoError(t, err)
	require.Empty(t, tg.sqlitePath)

	_, err = resolveTarget(dbFlags{})
	require.ErrorContains(t, err, "pass --dsn or set INBOXMILL_DSN")
}

type errString string

func (e errString) Error() string { return string(e) }

func TestShellQuote(t *testing.T) {
	require.Equal(t, "pi_0013", shellQuote("pi_0013"))
	require.Equal(t, "''", shellQuote(""))
	require.Equal(t, `'it'\''s here'`, shellQuote("it's here"))
	require.Equal(t, `'$(rm -rf /)'`, shellQuote("$(rm -rf /)"))
}

func TestText(t *testing.T) {
	require.Equal(t, "evt-1", text("evt-1"))
	require.Equal(t, `""`, text(""))
	require.Equal(t, `"\x1b[2Jgotcha"`, text("\x1b[2Jgotcha"), "a terminal escape is shown, not obeyed")
	require.Equal(t, `"a\nb"`, text("a\nb"))
	require.Equal(t, `" padded"`, text(" padded"))
	// Bytes that are not UTF-8 (a row written around the store, on
	// MySQL's binary columns) reach the terminal escaped: 0x9b is a
	// control sequence introducer to a terminal that reads Latin-1.
	require.Equal(t, `"a\xffb"`, text("a\xffb"))
	require.Equal(t, `"\x9b2J"`, text("\x9b2J"))
	require.Equal(t, `"\u2028"`, text("\u2028"), "a line separator is not printable")
	require.Equal(t, "évènement", text("évènement"))
}

// TestUsageErrors: what the command cannot make sense of exits 2 with a
// message that says what is wrong, before anything is opened.
func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	dsn := filepath.Join(dir, "inbox.db")
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"unknown command", []string{"frobnicate"}, []string{`unknown command "frobnicate"`}},
		{"unknown flag", []string{"stats", "--nope"}, []string{"unknown flag: --nope"}},
		{"stray argument", []string{"stats", "extra", "--dsn", dsn}, []string{`unexpected arguments ["extra"]`}},
		{"bad output", []string{"stats", "-o", "yaml", "--dsn", dsn}, []string{`"yaml": want table or json`}},
		{"no dsn", []string{"stats"}, []string{"pass --dsn or set INBOXMILL_DSN"}},
		{"unknown dialect", []string{"stats", "--dsn", dsn, "--dialect", "oracle"}, []string{`unknown dialect "oracle"`}},
		{"dialect not inferable", []string{"stats", "--dsn", "shop"}, []string{"cannot tell the database from the DSN", "--dialect"}},
		{"resolve without reason", []string{"resolve", "--operation", "op", "--key", "k", "--to", "completed", "--dsn", dsn},
			[]string{"--reason is required"}},
		{"resolve without to", []string{"resolve", "--operation", "op", "--key", "k", "--reason", "r", "--dsn", dsn},
			[]string{"--to is required"}},
		{"resolve to pending", []string{"resolve", "--digest", "0123456789abcdef", "--to", "pending", "--reason", "r", "--dsn", dsn},
			[]string{`--to "pending": want completed or failed`}},
		{"forget names nothing", []string{"forget", "--reason", "r", "--dsn", dsn}, []string{"name the record"}},
		{"forget names twice", []string{"forget", "--digest", "0123456789abcdef", "--key", "k", "--reason", "r", "--dsn", dsn},
			[]string{"either --digest"}},
		{"inspect without key", []string{"inspect", "--operation", "op", "--dsn", dsn}, []string{"name the record"}},
		{"purge without reason", []string{"purge", "--dsn", dsn}, []string{"--reason is required"}},
		{"list bad status", []string{"list", "--status", "done", "--dsn", dsn}, []string{`--status "done"`}},
		{"list bad age", []string{"list", "--older-than", "soon", "--dsn", dsn}, []string{`"soon" is not a duration`}},
		{"audit bad action", []string{"audit", "--action", "delete", "--dsn", dsn}, []string{`--action "delete"`}},
		{"migrate down without to", []string{"migrate", "down", "--dsn", dsn}, []string{"--to is required"}},
		{"print unknown dialect", []string{"migrate", "--print", "--dialect", "db2"}, []string{`unknown dialect "db2"`}},
		{"print bad table", []string{"migrate", "--print", "--dialect", "sqlite", "--table", "inbox; drop"}, []string{"plain identifier"}},
		{"serve beyond loopback without token", []string{"serve", "--addr", "0.0.0.0:0", "--dsn", dsn}, []string{"token"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runCmd(t, c.args...)
			require.Equal(t, exitUsage, r.code, r.String())
			require.Empty(t, r.stdout)
			for _, w := range c.want {
				require.Contains(t, r.stderr, w)
			}
			require.Contains(t, r.stderr, "--help' for usage")
		})
	}
	_, err := os.Stat(dsn)
	require.ErrorIs(t, err, os.ErrNotExist, "no usage error created the SQLite file")

	r := runCmd(t, "--help")
	require.Equal(t, exitOK, r.code)
	for _, sub := range []string{"migrate", "stats", "list", "inspect", "resolve", "forget", "purge", "audit", "replay", "serve", "completion"} {
		require.Contains(t, r.stdout, "\n  "+sub+" ")
	}
	r = runCmd(t, "completion", "bash")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "__inboxmill_")
}

// TestSQLiteNothingCreated: a read command or a dry run against an SQLite
// path that does not exist fails, says how to create it, and creates
// nothing.
func TestSQLiteNothingCreated(t *testing.T) {
	dsn := filepath.Join(t.TempDir(), "new.db")
	for _, args := range [][]string{
		{"stats"}, {"list"}, {"inspect", "--digest", "0123456789abcdef"}, {"audit"},
		{"resolve", "--digest", "0123456789abcdef", "--to", "completed", "--reason", "r", "--dry-run"},
		{"forget", "--operation", "op", "--key", "k", "--reason", "r", "--dry-run"},
		{"purge", "--reason", "r", "--dry-run"},
		{"migrate", "status"}, {"migrate", "validate"}, {"migrate", "down", "--to", "0", "--yes"},
		{"serve", "--addr", "127.0.0.1:0"},
	} {
		r := runCmd(t, append(args, "--dsn", dsn)...)
		require.Equal(t, exitFailed, r.code, "%v: %s", args, r)
		require.Contains(t, r.stderr, "no SQLite database at "+dsn, args)
		require.Contains(t, r.stderr, "inboxmill migrate --dsn "+dsn, args)
		_, err := os.Stat(dsn)
		require.ErrorIs(t, err, os.ErrNotExist, "%v created the file", args)
	}
}

// TestUnreachable: a database that does not answer is reported with the
// DSN's password redacted, and what to check.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"postgres://app:s3cret-pw@127.0.0.1:1/shop?sslmode=disable&connect_timeout=2",
		"app:s3cret-pw@tcp(127.0.0.1:1)/shop?timeout=2s",
	} {
		r := runCmd(t, "stats", "--dsn", dsn, "--connect-timeout", "3s")
		require.Equal(t, exitFailed, r.code, r.String())
		require.Contains(t, r.stderr, "cannot reach the ")
		require.Contains(t, r.stderr, "app:xxxxx@")
		require.Contains(t, r.stderr, "check --dsn (or INBOXMILL_DSN)")
		require.NotContains(t, r.stderr, "s3cret-pw")
	}
}

// TestMissingTable: a table that was never migrated is reported with the
// command that creates it.
func TestMissingTable(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind) // a migrated table, so that the SQLite file exists
			for _, args := range [][]string{{"stats"}, {"list"}, {"audit"}, {"purge", "--yes", "--reason", "r"}} {
				r := runCmd(t, append(args, "--dsn", e.dsn, "--table", "never_migrated")...)
				require.Equal(t, exitFailed, r.code, r.String())
				require.Contains(t, r.stderr, "there is no inbox table never_migrated")
				require.Contains(t, r.stderr, "run `inboxmill migrate --table never_migrated` with the same --dsn")
			}
		})
	}
}

// TestEnvironment: INBOXMILL_DSN, INBOXMILL_DIALECT and INBOXMILL_TABLE
// stand in for the flags, which win over them.
func TestEnvironment(t *testing.T) {
	e := setup(t, testdb.SQLite)
	env := map[string]string{"INBOXMILL_DSN": "file:" + e.dsn, "INBOXMILL_DIALECT": "sqlite", "INBOXMILL_TABLE": e.table}
	runEnv := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		a := &app{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: func(k string) string { return env[k] },
			actorDefault: func() string { return "env-user" }}
		return a.run(context.Background(), args), stdout.String(), stderr.String()
	}
	code, stdout, stderr := runEnv("stats")
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "table "+e.table+" (sqlite): 0 records")

	code, _, stderr = runEnv("stats", "--table", "other")
	require.Equal(t, exitFailed, code)
	require.Contains(t, stderr, "no inbox table other")

	// The DSN from the environment never shows up in help.
	env["INBOXMILL_DSN"] = "postgres://app:s3cret@db/shop"
	code, stdout, _ = runEnv("stats", "--help")
	require.Equal(t, exitOK, code)
	require.NotContains(t, stdout, "s3cret")
}

// TestSQLiteReadCommandsChangeNothing: the read commands open an existing
// SQLite file read-only: its journal mode is left as it was (the store's
// own DSN would switch a rollback-journal file to WAL for good), and the
// file is not written.
func TestSQLiteReadCommandsChangeNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.db")
	r := runCmd(t, "migrate", "--dsn", path)
	require.Equal(t, exitOK, r.code, r.String())
	db, err := sql.Open("sqlite", "file:"+path)
	require.NoError(t, err)
	_, err = db.Exec("PRAGMA journal_mode=DELETE")
	require.NoError(t, err)
	require.NoError(t, db.Close())
	before, err := os.ReadFile(path)
	require.NoError(t, err)

	for _, args := range [][]string{
		{"stats"}, {"list"}, {"audit"}, {"migrate", "status"}, {"migrate", "validate"},
	} {
		r := runCmd(t, append(args, "--dsn", path)...)
		require.Equal(t, exitOK, r.code, "%v: %s", args, r)
	}
	r = runCmd(t, "inspect", "--operation", "op", "--key", "k", "--dsn", path)
	require.Contains(t, r.stderr, "no record in table inbox", "the read itself worked")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, before, after, "a read command wrote to the file")
	db, err = sql.Open("sqlite", "file:"+path)
	require.NoError(t, err)
	defer db.Close()
	var mode string
	require.NoError(t, db.QueryRow("PRAGMA journal_mode").Scan(&mode))
	require.Equal(t, "delete", mode)
}
