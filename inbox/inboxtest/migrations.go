package inboxtest

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
)

// versions returns the versions of ms, in order.
func versions(ms []inbox.Migration) []int {
	vs := make([]int, len(ms))
	for i, m := range ms {
		vs[i] = m.Version
	}
	return vs
}

// schemaError returns err's *inbox.SchemaError, failing t when there is none.
func schemaError(t *testing.T, err error) *inbox.SchemaError {
	t.Helper()
	var se *inbox.SchemaError
	require.ErrorAs(t, err, &se)
	return se
}

// SampleSavepoint is the savepoint name [AllQueries] builds the savepoint
// statements for: one the store could choose.
const SampleSavepoint = "inboxmill_sp_1"

// NamedQuery is one statement of a dialect with the name of the
// [inbox.Queries] method that returns it.
type NamedQuery struct {
	Name string
	inbox.Query
}

// AllQueries returns every statement of q, by method name in alphabetical
// order, so that a dialect's tests can check or pin (in a
// golden file) all of them without listing them: a statement added to the
// interface is covered at once. Statements over several records
// (InsertMany, SelectMany) are built for two records, and the savepoint
// statements for the name SampleSavepoint.
func AllQueries(q inbox.Queries) []NamedQuery {
	v := reflect.ValueOf(q)
	it := reflect.TypeFor[inbox.Queries]()
	var out []NamedQuery
	for i := range it.NumMethod() {
		name := it.Method(i).Name
		m := v.MethodByName(name)
		switch {
		case m.Type().NumIn() == 1 && m.Type().In(0).Kind() == reflect.String:
			// A statement on a named object: a savepoint.
			out = append(out, NamedQuery{Name: name,
				Query: m.Call([]reflect.Value{reflect.ValueOf(SampleSavepoint)})[0].Interface().(inbox.Query)})
		case m.Type().NumIn() == 1 && m.Type().In(0) == reflect.TypeFor[inbox.ListOrder]():
			// A statement per order.
			for _, o := range inbox.ListOrders() {
				q := m.Call([]reflect.Value{reflect.ValueOf(o)})[0].Interface().(inbox.Query)
				out = append(out, NamedQuery{Name: name + "(" + o.String() + ")", Query: q})
			}
		case m.Type().NumIn() == 1:
			// A statement over several records: built for two of them.
			rq := m.Call([]reflect.Value{reflect.ValueOf(2)})[0].Interface().(inbox.RowsQuery)
			out = append(out, NamedQuery{Name: name, Query: rq.Query(2)})
		default:
			out = append(out, NamedQuery{Name: name, Query: m.Call(nil)[0].Interface().(inbox.Query)})
		}
	}
	// The optional statements of a database that hashes keys itself.
	if dq, ok := q.(inbox.DigestQueries); ok {
		out = append(out, NamedQuery{Name: "KeyAt", Query: dq.KeyAt()},
			NamedQuery{Name: "SelectDigest", Query: dq.SelectDigest()})
	}
	return out
}

// runMigrations checks the schema's versions: applying, undoing and
// validating them, for any table name.
func runMigrations(t *testing.T, h Harness) {
	t.Run("MigrateIsIdempotentAndValidates", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		require.NoError(t, b.store.Validate(b.ctx))
		require.NoError(t, b.store.Migrate(b.ctx))
		require.NoError(t, b.store.Migrate(b.ctx))
		ms, err := b.store.Migrations()
		require.NoError(t, err)
		require.NotEmpty(t, ms)
		vs, err := b.store.AppliedMigrations(b.ctx)
		require.NoError(t, err)
		require.Equal(t, versions(ms), vs)
		require.NoError(t, b.store.Validate(b.ctx))
	})

	t.Run("MigrateConcurrently", func(t *testing.T) {
		t.Parallel()
		db := h.DB(t)
		table := UniqueTable("inbox")
		t.Cleanup(func() {
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table)
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table+"_audit")
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table+"_migrations")
		})
		const n = 4
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				s, err := inbox.NewStore(db, h.Dialect, h.config(table))
				if err == nil {
					err = s.Migrate(context.Background())
					_ = s.Close()
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		s, err := inbox.NewStore(db, h.Dialect, h.config(table))
		require.NoError(t, err)
		closeStore(t, s)
		vs, err := s.AppliedMigrations(context.Background())
		require.NoError(t, err)
		ms, err := s.Migrations()
		require.NoError(t, err)
		require.Equal(t, versions(ms), vs, "every version recorded once")
		require.NoError(t, s.Validate(context.Background()))
	})

	t.Run("AMissingTableIsOutdated", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		s := b.newStore(t, func(cfg *inbox.Config) { cfg.Table = UniqueTable("never") })
		vs, err := s.AppliedMigrations(b.ctx)
		require.NoError(t, err)
		require.Empty(t, vs)
		err = s.Validate(b.ctx)
		require.ErrorIs(t, err, inbox.ErrSchemaOutdated)
		require.NotErrorIs(t, err, inbox.ErrSchemaNewer)
		ms, err := s.Migrations()
		require.NoError(t, err)
		se := schemaError(t, s.Validate(b.ctx))
		require.Equal(t, s.Table(), se.Table)
		require.Equal(t, versions(ms), se.Missing)
		require.Empty(t, se.Unknown)
	})

	// A table of the schema dropped by hand leaves its versions recorded:
	// the versions table alone would say the schema is current, and the
	// first message would fail on the missing table.
	t.Run("ADroppedTableWithItsVersionsRecorded", func(t *testing.T) {
		t.Parallel()
		for _, which := range []string{"inbox", "audit"} {
			t.Run(which, func(t *testing.T) {
				t.Parallel()
				b := setup(t, h)
				dropped := b.table
				if which == "audit" {
					dropped = b.table + "_audit"
				}
				_, err := b.db.ExecContext(b.ctx, "DROP TABLE "+dropped)
				require.NoError(t, err)
				ms, err := b.store.Migrations()
				require.NoError(t, err)
				vs, err := b.store.AppliedMigrations(b.ctx)
				require.NoError(t, err)
				require.Equal(t, versions(ms), vs, "every version is still recorded")

				err = b.store.Validate(b.ctx)
				require.ErrorIs(t, err, inbox.ErrTableMissing)
				require.NotErrorIs(t, err, inbox.ErrSchemaOutdated, "running the migrations does not bring it back")
				require.NotErrorIs(t, err, inbox.ErrSchemaNewer)
				se := schemaError(t, err)
				require.Equal(t, []string{dropped}, se.MissingTables)
				require.Empty(t, se.Missing)
				require.Empty(t, se.Unknown)
				require.Contains(t, err.Error(), dropped)

				// Migrate goes by the versions and creates nothing (a
				// partitioned table fails to list its partitions).
				_ = b.store.Migrate(b.ctx)
				require.ErrorIs(t, b.store.Validate(b.ctx), inbox.ErrTableMissing, "the versions say it is there")
				// What the error advises: without the versions table, the
				// migrations run again and create what is missing.
				_, err = b.db.ExecContext(b.ctx, "DROP TABLE "+b.table+"_migrations")
				require.NoError(t, err)
				require.NoError(t, b.store.Migrate(b.ctx))
				require.NoError(t, b.store.Validate(b.ctx))
				claimWorks(t, b.ctx, b.store, "after")
			})
		}
	})

	// A migration statement the database refuses stops Migrate with a
	// *MigrationError that names the version, the step and the statement,
	// and wraps the database's error unclassified as transient: running
	// it again would fail again.
	t.Run("AFailedStatementIsAMigrationError", func(t *testing.T) {
		t.Parallel()
		db := h.DB(t)
		table := UniqueTable("inbox")
		t.Cleanup(func() {
			for _, tbl := range inbox.TableNames(table) {
				_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tbl)
			}
		})
		broken := withMigration(t, h.Dialect, 900, "broken",
			"SELECT 1;\nSELECT * FROM {{table}}_no_such_table;\n", "SELECT 1;\n")
		s, err := inbox.NewStore(db, broken, h.config(table))
		require.NoError(t, err)
		closeStore(t, s)
		err = s.Migrate(context.Background())
		require.Error(t, err)
		var me *inbox.MigrationError
		require.ErrorAs(t, err, &me)
		require.Equal(t, table, me.Table)
		require.Equal(t, 900, me.Version)
		require.Equal(t, "broken", me.Name)
		require.False(t, me.Down)
		require.Equal(t, inbox.MigrateStatement, me.Step)
		require.Equal(t, 2, me.Statement, "the second statement of the file")
		require.Error(t, me.Err)
		require.False(t, inbox.IsRetryable(err), "a statement the database refuses is no transient failure: %v", err)
		require.Contains(t, err.Error(), "version 900 (broken)")
		require.Contains(t, err.Error(), "statement 2")
		require.Contains(t, err.Error(), "no_such_table", "the database's own error is in the message")

		vs, err := s.AppliedMigrations(context.Background())
		require.NoError(t, err)
		ms, err := b0Store(t, db, h, table).Migrations()
		require.NoError(t, err)
		require.Equal(t, versions(ms), vs, "the versions before it are applied, it is not")
	})

	t.Run("MigrateToALowerVersionThenMigrate", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		s := b.newStore(t, func(cfg *inbox.Config) { cfg.Table = UniqueTable("inbox") })
		t.Cleanup(func() {
			_ = s.MigrateDown(context.Background(), 0)
			_, _ = b.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+s.Table()+"_migrations")
		})
		ms, err := s.Migrations()
		require.NoError(t, err)
		first := ms[0].Version
		require.NoError(t, s.MigrateTo(b.ctx, first))
		vs, err := s.AppliedMigrations(b.ctx)
		require.NoError(t, err)
		require.Equal(t, []int{first}, vs)
		if len(ms) > 1 {
			se := schemaError(t, s.Validate(b.ctx))
			require.Equal(t, versions(ms[1:]), se.Missing)
			require.ErrorIs(t, se, inbox.ErrSchemaOutdated)
		}
		// A target below what is applied changes nothing.
		require.NoError(t, s.Migrate(b.ctx))
		require.NoError(t, s.MigrateTo(b.ctx, first))
		vs, err = s.AppliedMigrations(b.ctx)
		require.NoError(t, err)
		require.Equal(t, versions(ms), vs)
		require.NoError(t, s.Validate(b.ctx))
		claimWorks(t, b.ctx, s, "after-migrate")

		for _, v := range []int{-1, ms[len(ms)-1].Version + 1} {
			require.Error(t, s.MigrateTo(b.ctx, v), "version %d", v)
			require.Error(t, s.MigrateDown(b.ctx, v), "version %d", v)
		}
		require.NoError(t, s.Validate(b.ctx), "an unknown target changes nothing")
	})

	t.Run("MigrateDownThenUpAgain", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		claimWorks(t, b.ctx, b.store, "before")
		ms, err := b.store.Migrations()
		require.NoError(t, err)
		if len(ms) > 1 {
			require.NoError(t, b.store.MigrateDown(b.ctx, ms[0].Version))
			vs, err := b.store.AppliedMigrations(b.ctx)
			require.NoError(t, err)
			require.Equal(t, []int{ms[0].Version}, vs)
			require.NoError(t, b.store.Migrate(b.ctx))
			_, err = b.store.Get(b.ctx, b.db, id("op", "before"))
			require.NoError(t, err, "a partial down keeps the records")
		}

		require.NoError(t, b.store.MigrateDown(b.ctx, 0))
		require.NoError(t, b.store.MigrateDown(b.ctx, 0), "nothing left to undo")
		err = b.store.Validate(b.ctx)
		require.ErrorIs(t, err, inbox.ErrSchemaOutdated)
		se := schemaError(t, err)
		require.Equal(t, versions(ms), se.Missing)
		require.Empty(t, se.Unknown)
		vs, err := b.store.AppliedMigrations(b.ctx)
		require.NoError(t, err)
		require.Empty(t, vs)
		_, err = b.store.Get(b.ctx, b.db, id("op", "before"))
		require.Error(t, err, "the table is gone")
		require.NotErrorIs(t, err, inbox.ErrNotFound)

		require.NoError(t, b.store.Migrate(b.ctx))
		require.NoError(t, b.store.Validate(b.ctx))
		_, err = b.store.Get(b.ctx, b.db, id("op", "before"))
		require.ErrorIs(t, err, inbox.ErrNotFound, "dropping the table forgot every intent")
		claimWorks(t, b.ctx, b.store, "after")
	})

	t.Run("AnUnknownVersionIsNewer", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		ms, err := b.store.Migrations()
		require.NoError(t, err)
		future := ms[len(ms)-1].Version + 100
		d := h.Dialect
		_, err = b.db.ExecContext(b.ctx, fmt.Sprintf("INSERT INTO %s_migrations (version, name, applied_at) VALUES (%s, %s, %s)",
			b.table, d.Placeholder(1), d.Placeholder(2), d.Placeholder(3)), future, "from_the_future", d.TimeArg(b.store.Now()))
		require.NoError(t, err)
		err = b.store.Validate(b.ctx)
		require.ErrorIs(t, err, inbox.ErrSchemaNewer)
		require.NotErrorIs(t, err, inbox.ErrSchemaOutdated)
		se := schemaError(t, err)
		require.Equal(t, []int{future}, se.Unknown)
		require.Empty(t, se.Missing)
		require.Contains(t, err.Error(), b.table)
		require.NoError(t, b.store.Migrate(b.ctx), "Migrate leaves versions it does not know alone")
		require.ErrorIs(t, b.store.Validate(b.ctx), inbox.ErrSchemaNewer)
	})

	t.Run("CustomTableNamesAreRenderedEverywhere", func(t *testing.T) {
		t.Parallel()
		// A name unlike the default, so that no identifier of the default
		// name can hide in it.
		table := UniqueTable("acme")
		s := NewStore(t, h.DB(t), h.Dialect, inbox.Config{Table: table, Prepare: h.Prepare})
		require.Equal(t, table, s.Table())
		require.NoError(t, s.Validate(context.Background()))
		claimWorks(t, context.Background(), s, "k")

		leftover := regexp.MustCompile(`\binbox\b|\binbox_`) // comments aside
		for _, q := range AllQueries(h.Dialect.Queries(table)) {
			require.NotEmpty(t, q.SQL, q.Name)
			require.NotContains(t, q.SQL, "{{", q.Name)
			require.NotRegexp(t, leftover, stripComments(q.SQL), q.Name)
			for _, a := range q.Args {
				require.NotContains(t, a.String(), "Arg(", "%s binds an unknown argument", q.Name)
			}
		}
		ms, err := s.Migrations()
		require.NoError(t, err)
		again, err := inbox.LoadMigrations(h.Dialect.Migrations(), table)
		require.NoError(t, err)
		require.Equal(t, ms, again)
		for _, m := range ms {
			for dir, body := range map[string]string{"up": m.Up, "down": m.Down} {
				require.NotContains(t, body, "{{", "version %d %s", m.Version, dir)
				require.Contains(t, body, table, "version %d %s", m.Version, dir)
				require.NotRegexp(t, leftover, stripComments(body), "version %d %s", m.Version, dir)
			}
		}
	})
}

// withMigration returns d with one more migration, version v, whose files
// are up and down.
func withMigration(t *testing.T, d inbox.Dialect, v int, name, up, down string) inbox.Dialect {
	t.Helper()
	files := fstest.MapFS{}
	require.NoError(t, fs.WalkDir(d.Migrations(), ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		body, err := fs.ReadFile(d.Migrations(), p)
		files[p] = &fstest.MapFile{Data: body}
		return err
	}))
	files[fmt.Sprintf("%03d_%s.up.sql", v, name)] = &fstest.MapFile{Data: []byte(up)}
	files[fmt.Sprintf("%03d_%s.down.sql", v, name)] = &fstest.MapFile{Data: []byte(down)}
	return extraMigrations{Dialect: d, files: files}
}

// extraMigrations is a dialect whose migrations are files.
type extraMigrations struct {
	inbox.Dialect
	files fs.FS
}

func (d extraMigrations) Migrations() fs.FS { return d.files }

// b0Store is a store over table with the harness's own dialect.
func b0Store(t *testing.T, db *sql.DB, h Harness, table string) *inbox.Store {
	t.Helper()
	s, err := inbox.NewStore(db, h.Dialect, h.config(table))
	require.NoError(t, err)
	closeStore(t, s)
	return s
}

// claimWorks claims key through s, which needs the table in place.
func claimWorks(t *testing.T, ctx context.Context, s *inbox.Store, key string) {
	t.Helper()
	res, err := s.Claim(ctx, s.DB(), inbox.ClaimParams{ID: id("op", key), PayloadHash: hash("x")})
	require.NoError(t, err)
	require.True(t, res.Claimed)
}

// stripComments drops SQL line comments.
func stripComments(sql string) string {
	var out strings.Builder
	for line := range strings.Lines(sql) {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i] + "\n"
		}
		out.WriteString(line)
	}
	return out.String()
}
