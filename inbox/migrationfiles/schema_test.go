package migrationfiles_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/tests/testdb"
)

// owned tells whether an object's name belongs to table: the table itself
// or one named "<table>_...".
func owned(name, table string) bool { return name == table || strings.HasPrefix(name, table+"_") }

// snapshot describes every database object table owns (tables with their
// columns, indexes and constraints, routines, triggers), the versions
// "<table>_migrations" records, and the rows of "<table>_extra", with
// table's name written as T: two tables migrated alike have equal
// snapshots, and a table dropped with everything it owns has "".
func snapshot(t *testing.T, db *sql.DB, kind testdb.Kind, table string) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	rows := func(query string, args ...any) [][]string {
		t.Helper()
		rs, err := db.QueryContext(ctx, query, args...)
		require.NoError(t, err, query)
		defer rs.Close()
		cols, err := rs.Columns()
		require.NoError(t, err)
		var out [][]string
		for rs.Next() {
			vals := make([]sql.NullString, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			require.NoError(t, rs.Scan(ptrs...))
			row := make([]string, len(cols))
			for i, v := range vals {
				row[i] = v.String
			}
			out = append(out, row)
		}
		require.NoError(t, rs.Err())
		return out
	}
	var tables []string
	switch kind {
	case testdb.SQLite:
		for _, r := range rows(`SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name`) {
			if owned(r[2], table) {
				fmt.Fprintf(&b, "%s %s: %s\n", r[0], r[1], r[3])
				if r[0] == "table" {
					tables = append(tables, r[1])
				}
			}
		}
	case testdb.MySQL:
		for _, r := range rows(`SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() ORDER BY table_name`) {
			if owned(r[0], table) {
				tables = append(tables, r[0])
				fmt.Fprintf(&b, "table %s: %s\n", r[0], rows("SHOW CREATE TABLE `" + r[0] + "`")[0][1])
			}
		}
		for _, r := range rows(`SELECT routine_type, routine_name FROM information_schema.routines WHERE routine_schema = DATABASE() ORDER BY routine_name`) {
			if owned(r[1], table) {
				fmt.Fprintf(&b, "%s %s\n", r[0], r[1])
			}
		}
	default:
		for _, r := range rows(`SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename`) {
			if !owned(r[0], table) {
				continue
			}
			tables = append(tables, r[0])
			fmt.Fprintf(&b, "table %s\n", r[0])
			for _, c := range rows(`SELECT column_name, data_type, is_nullable, column_default, collation_name
				FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position`, r[0]) {
				fmt.Fprintf(&b, "  column %s\n", strings.Join(c, " "))
			}
			for _, c := range rows(`SELECT indexname, indexdef FROM pg_indexes
				WHERE schemaname = current_schema() AND tablename = $1 ORDER BY indexname`, r[0]) {
				fmt.Fprintf(&b, "  index %s\n", strings.Join(c, " "))
			}
			for _, c := range rows(`SELECT c.conname, pg_get_constraintdef(c.oid) FROM pg_constraint c
				JOIN pg_class r ON r.oid = c.conrelid JOIN pg_namespace n ON n.oid = r.relnamespace
				WHERE n.nspname = current_schema() AND r.relname = $1 ORDER BY c.conname`, r[0]) {
				fmt.Fprintf(&b, "  constraint %s\n", strings.Join(c, " "))
			}
			for _, c := range rows(`SELECT tgname, pg_get_triggerdef(g.oid) FROM pg_trigger g
				JOIN pg_class r ON r.oid = g.tgrelid JOIN pg_namespace n ON n.oid = r.relnamespace
				WHERE n.nspname = current_schema() AND r.relname = $1 AND NOT g.tgisinternal ORDER BY tgname`, r[0]) {
				fmt.Fprintf(&b, "  trigger %s\n", strings.Join(c, " "))
			}
		}
		for _, r := range rows(`SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p
			JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = current_schema() ORDER BY p.proname`) {
			if owned(r[0], table) {
				fmt.Fprintf(&b, "function %s: %s\n", r[0], r[1])
			}
		}
	}
	q := func(name string) string {
		if kind == testdb.MySQL {
			return "`" + name + "`"
		}
		return `"` + name + `"`
	}
	if slices.Contains(tables, table+"_migrations") {
		for _, r := range rows(`SELECT version, name FROM ` + q(table+"_migrations") + ` ORDER BY version`) {
			fmt.Fprintf(&b, "recorded %s %s\n", r[0], r[1])
		}
	}
	if slices.Contains(tables, table+"_extra") {
		for _, r := range rows(`SELECT id, note FROM ` + q(table+"_extra") + ` ORDER BY id`) {
			fmt.Fprintf(&b, "extra %s %s\n", r[0], r[1])
		}
	}
	return strings.ReplaceAll(b.String(), table, "T")
}
