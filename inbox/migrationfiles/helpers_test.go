package migrationfiles_test

import (
	"context"
	"database/sql"
	"io/fs"
	"path/filepath"
	"strconv"
	"testing"
	"testing/fstest"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// kinds are the databases the round trips run on: one PostgreSQL driver is
// enough, every tool opens its own connections.
var kinds = []testdb.Kind{testdb.SQLite, testdb.PostgresPQ, testdb.MySQL}

// extraMigrations are test-only migrations in the shape the shipped files
// keep to (a statement ends at a line ending in a semicolon), with what
// trips a tool up: semicolons inside a statement followed by a comment
// (goose would cut there), inside literals, in a function or trigger body,
// and on MySQL a session variable shared by the version's statements.
// Each leaves one row (1, 'a;b!') in "<table>_extra".
var extraMigrations = map[string][2]string{
	"postgres": {`-- A table, and a trigger that marks what is inserted.
CREATE TABLE IF NOT EXISTS "{{table}}_extra" (id integer PRIMARY KEY, note text NOT NULL DEFAULT 'a;b');

CREATE OR REPLACE FUNCTION "{{table}}_mark"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.note = NEW.note || '!'; -- mark it
    RETURN NEW; -- and keep it
END
$$;

CREATE TRIGGER "{{table}}_mark" BEFORE INSERT ON "{{table}}_extra"
    FOR EACH ROW EXECUTE FUNCTION "{{table}}_mark"();

INSERT INTO "{{table}}_extra" (id) VALUES (1);
`, `DROP TABLE IF EXISTS "{{table}}_extra";
DROP FUNCTION IF EXISTS "{{table}}_mark"();
`},
	"mysql": {`-- A note kept in a session variable between statements.
SET @inboxmill_note = CONCAT('a;b', '!');
CREATE TABLE IF NOT EXISTS ` + "`{{table}}_extra`" + ` (id INT PRIMARY KEY, note VARCHAR(16) NOT NULL DEFAULT 'a;b');
INSERT INTO ` + "`{{table}}_extra`" + ` (id, note) VALUES (1, @inboxmill_note);
SET @inboxmill_note = NULL;
`, "DROP TABLE IF EXISTS `{{table}}_extra`;\n"},
	"sqlite": {`CREATE TABLE IF NOT EXISTS "{{table}}_extra" (id INTEGER PRIMARY KEY, note TEXT NOT NULL DEFAULT 'a;b');

CREATE TRIGGER "{{table}}_mark" AFTER INSERT ON "{{table}}_extra"
BEGIN UPDATE "{{table}}_extra" SET note = note || '!' WHERE id = NEW.id; -- mark it
END;

INSERT INTO "{{table}}_extra" (id) VALUES (1);
`, `DROP TABLE IF EXISTS "{{table}}_extra";
`},
}

// extended is a dialect with one migration more than it ships, so that
// the tests show the files follow however many versions there are.
type extended struct {
	inbox.Dialect
	fsys fs.FS
}

func (e extended) Migrations() fs.FS { return e.fsys }

func extend(t testing.TB, d inbox.Dialect) inbox.Dialect {
	t.Helper()
	m := fstest.MapFS{}
	names, err := fs.Glob(d.Migrations(), "*.sql")
	require.NoError(t, err)
	for _, n := range names {
		b, err := fs.ReadFile(d.Migrations(), n)
		require.NoError(t, err)
		m[n] = &fstest.MapFile{Data: b}
	}
	extra := extraMigrations[d.Name()]
	m["090_extra.up.sql"] = &fstest.MapFile{Data: []byte(extra[0])}
	m["090_extra.down.sql"] = &fstest.MapFile{Data: []byte(extra[1])}
	return extended{Dialect: d, fsys: m}
}

// bundle is what a round trip needs: a table of its own, the database it
// lives in, and a way to open more connections to it for a tool (tools
// close the *sql.DB they are given).
type bundle struct {
	kind  testdb.Kind
	d     inbox.Dialect
	table string
	db    *sql.DB // for the checks
	path  string  // the SQLite file
}

func setup(t *testing.T, kind testdb.Kind, d inbox.Dialect) *bundle {
	t.Helper()
	b := &bundle{kind: kind, d: d, table: inboxtest.UniqueTable("mf")}
	if kind == testdb.SQLite {
		b.path = filepath.Join(t.TempDir(), "inbox.db")
		b.db = testdb.OpenSQLite(t, b.path)
	} else {
		b.db = testdb.Open(t, kind) // skips, or fails under CI, when the server is down
	}
	t.Cleanup(func() {
		// Whatever a failed test left: the inbox's tables and the tools'.
		s, err := inbox.NewStore(b.db, d, inbox.Config{Table: b.table})
		if err == nil {
			_ = s.MigrateDown(context.Background(), 0)
			_ = s.Close()
		}
		for _, name := range []string{"goose_" + b.table, "gm_" + b.table, b.table + "_extra"} {
			_, _ = b.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+name)
		}
		if kind == testdb.MySQL {
			for v := range 100 {
				_, _ = b.db.ExecContext(context.Background(), "DROP PROCEDURE IF EXISTS `"+b.table+"_migrate_"+strconv.Itoa(v)+"`")
			}
		}
		if kind == testdb.PostgresPQ {
			_, _ = b.db.ExecContext(context.Background(), `DROP FUNCTION IF EXISTS "`+b.table+`_mark"()`)
		}
	})
	return b
}

// toolDB opens a connection pool of the tool's own. On MySQL it never has
// multiStatements, so that a file of several statements fails as it would
// for an application's own DSN.
func (b *bundle) toolDB(t *testing.T) *sql.DB {
	t.Helper()
	var db *sql.DB
	var err error
	switch b.kind {
	case testdb.SQLite:
		return testdb.OpenSQLite(t, b.path)
	case testdb.MySQL:
		cfg, perr := gomysql.ParseDSN(testdb.MySQLDSN())
		require.NoError(t, perr)
		cfg.MultiStatements = false
		db, err = sql.Open("mysql", cfg.FormatDSN())
	default:
		db, err = sql.Open("postgres", testdb.PostgresDSN())
	}
	require.NoError(t, err)
	db.SetMaxOpenConns(3)
	db.SetConnMaxIdleTime(time.Minute)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// reference migrates a table of its own with Store.Migrate (to version
// target, 0 for all) and returns its snapshot: what a tool's result must
// equal.
func (b *bundle) reference(t *testing.T, target int) string {
	t.Helper()
	table := inboxtest.UniqueTable("ref")
	s, err := inbox.NewStore(b.db, b.d, inbox.Config{Table: table})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = s.MigrateDown(context.Background(), 0)
		_ = s.Close()
	})
	require.NoError(t, s.MigrateTo(context.Background(), target))
	snap := snapshot(t, b.db, b.kind, table)
	require.NoError(t, s.MigrateDown(context.Background(), 0))
	require.Empty(t, snapshot(t, b.db, b.kind, table), "Store.MigrateDown leaves nothing behind")
	return snap
}

// store returns a store over the bundle's table, not migrated by it.
func (b *bundle) store(t *testing.T) *inbox.Store {
	t.Helper()
	s, err := inbox.NewStore(b.db, b.d, inbox.Config{Table: b.table})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// versions are the inbox versions of the bundle's dialect.
func (b *bundle) versions(t *testing.T) []int {
	t.Helper()
	ms, err := inbox.LoadMigrations(b.d.Migrations(), b.table)
	require.NoError(t, err)
	var vs []int
	for _, m := range ms {
		vs = append(vs, m.Version)
	}
	return vs
}

// checkApplied checks that the table is at every version, as Store.Migrate
// leaves it, and works: Validate passes, a claim is claimed, its repeat is
// a duplicate and another payload a conflict.
func (b *bundle) checkApplied(t *testing.T, want string) {
	t.Helper()
	ctx := context.Background()
	require.Equal(t, want, snapshot(t, b.db, b.kind, b.table), "the tool's schema is Store.Migrate's")
	s := b.store(t)
	require.NoError(t, s.Validate(ctx))
	applied, err := s.AppliedMigrations(ctx)
	require.NoError(t, err)
	require.Equal(t, b.versions(t), applied)

	id := inbox.ID{Operation: "charge", Key: "evt-1"}
	p := inbox.ClaimParams{ID: id, PayloadHash: []byte("payload-a"), Retention: time.Hour}
	res, err := s.Claim(ctx, b.db, p)
	require.NoError(t, err)
	require.True(t, res.Claimed, "a first claim is claimed")
	res, err = s.Claim(ctx, b.db, p)
	require.NoError(t, err)
	require.False(t, res.Claimed, "a repeated claim is a duplicate")
	require.Equal(t, int64(1), res.Record.Attempt)
	p.PayloadHash = []byte("payload-b")
	_, err = s.Claim(ctx, b.db, p)
	require.ErrorIs(t, err, inbox.ErrPayloadConflict)
}

// checkUndone checks that nothing of the table is left and Validate says
// every version is missing.
func (b *bundle) checkUndone(t *testing.T) {
	t.Helper()
	require.Empty(t, snapshot(t, b.db, b.kind, b.table), "undoing every version leaves nothing behind")
	err := b.store(t).Validate(context.Background())
	require.ErrorIs(t, err, inbox.ErrSchemaOutdated)
	var se *inbox.SchemaError
	require.ErrorAs(t, err, &se)
	require.Equal(t, b.versions(t), se.Missing)
}

// checkAtFirst checks that the table is at the first version only, as
// Store.MigrateTo leaves it.
func (b *bundle) checkAtFirst(t *testing.T, want string) {
	t.Helper()
	require.Equal(t, want, snapshot(t, b.db, b.kind, b.table))
	vs := b.versions(t)
	applied, err := b.store(t).AppliedMigrations(context.Background())
	require.NoError(t, err)
	require.Equal(t, vs[:1], applied)
	err = b.store(t).Validate(context.Background())
	require.ErrorIs(t, err, inbox.ErrSchemaOutdated)
	var se *inbox.SchemaError
	require.ErrorAs(t, err, &se)
	require.Equal(t, vs[1:], se.Missing)
}
