package inboxtest

import (
	"context"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"

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
// (InsertMany, SelectMany) are built for two records.
func AllQueries(q inbox.Queries) []NamedQuery {
	v := reflect.ValueOf(q)
	it := reflect.TypeFor[inbox.Queries]()
	var out []NamedQuery
	for i := range it.NumMethod() {
		name := it.Method(i).Name
		m := v.MethodByName(name)
		switch {
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
