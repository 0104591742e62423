package inbox_test

import (
	"database/sql"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/inbox/mysql"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

var update = flag.Bool("update", false, "rewrite testdata/<dialect>.golden from the dialects' SQL")

// dialects are the dialects this module ships.
var dialects = []inbox.Dialect{postgres.Dialect(), postgres.Partitioned(postgres.Partitions{}), mysql.Dialect(), sqlite.Dialect()}

// dialectName tells the partitioned PostgreSQL dialect from the plain one.
func dialectName(d inbox.Dialect) string {
	if _, ok := d.(inbox.PartitionedDialect); ok {
		return d.Name() + "-partitioned"
	}
	return d.Name()
}

// partitionQueries are a partitioned dialect's partition statements, for
// table and one of its partitions.
func partitionQueries(d inbox.Dialect, table string) []inboxtest.NamedQuery {
	pd, ok := d.(inbox.PartitionedDialect)
	if !ok {
		return nil
	}
	pq := pd.PartitionQueries(table)
	part := inbox.PartitionName(table, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	return []inboxtest.NamedQuery{
		{Name: "ListPartitions", Query: pq.ListPartitions()},
		{Name: "AddPartition", Query: pq.AddPartition()},
		{Name: "PartitionBlocked", Query: pq.PartitionBlocked(part)},
		{Name: "MarkDetaching", Query: pq.MarkDetaching(part)},
		{Name: "DetachPartition", Query: pq.DetachPartition(part)},
		{Name: "FinishDetach", Query: pq.FinishDetach(part)},
		{Name: "CountPartition", Query: pq.CountPartition(part)},
		{Name: "DropPartition", Query: pq.DropPartition(part)},
	}
}

// The server dialects hash keys themselves for a lookup by digest;
// SQLite, without SHA-256, sends them to be hashed.
func TestDigestQueries(t *testing.T) {
	for _, d := range dialects {
		_, ok := d.Queries("t").(inbox.DigestQueries)
		require.Equal(t, d.Name() != "sqlite", ok, dialectName(d))
	}
}

// TestDialectQueriesAreWellFormed checks what NewStore cannot: that every
// statement of every shipped dialect is rendered for the table it was asked
// for, binds only arguments the store knows, and has exactly one argument
// per placeholder.
func TestDialectQueriesAreWellFormed(t *testing.T) {
	const table = "acme_custom"
	for _, d := range dialects {
		t.Run(dialectName(d), func(t *testing.T) {
			other := append(inboxtest.AllQueries(d.Queries("other_table")), partitionQueries(d, "other_table")...)
			for i, q := range append(inboxtest.AllQueries(d.Queries(table)), partitionQueries(d, table)...) {
				require.NotEmpty(t, strings.TrimSpace(q.SQL), q.Name)
				require.NotContains(t, q.SQL, "{{", q.Name)
				require.NotContains(t, q.SQL, "}}", q.Name)
				if q.SQL != other[i].SQL {
					require.Contains(t, q.SQL, table, "%s depends on the table name, so it must name the table", q.Name)
				}
				require.NotRegexp(t, `\binbox\b|\binbox_`, q.SQL, "%s names the default table", q.Name)
				for _, a := range q.Args {
					require.True(t, a > 0 && a < inbox.ArgEnd, "%s binds unknown %v", q.Name, a)
				}
				require.Equal(t, len(q.Args), placeholders(t, d, q.SQL), "%s: one argument per placeholder", q.Name)
				checkBindings(t, q.Name, annotate(d, q.Query))
			}
			_, err := inbox.NewStore(&sql.DB{}, d, inbox.Config{Table: table})
			require.NoError(t, err, "the store accepts the dialect")
		})
	}
}

// placeholders counts the bind parameters of sql, outside string literals
// and quoted identifiers: "?" each, or the highest "$n" (which must then
// all be used).
func placeholders(t *testing.T, d inbox.Dialect, sql string) int {
	t.Helper()
	var code strings.Builder
	var quote rune
	for _, r := range sql {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"' || r == '`':
			quote = r
		default:
			code.WriteRune(r)
		}
	}
	if d.Placeholder(1) == d.Placeholder(2) {
		return strings.Count(code.String(), d.Placeholder(1))
	}
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile(`\$[0-9]+`).FindAllString(code.String(), -1) {
		seen[m] = true
	}
	for i := 1; i <= len(seen); i++ {
		require.True(t, seen[d.Placeholder(i)], "%s unused in %s", d.Placeholder(i), sql)
	}
	return len(seen)
}

// annotate writes each placeholder of q as ":" and the name of the Arg it
// binds, so that the golden files read as what each placeholder is and a
// misordered Args shows at a glance ("attempt = :scope").
func annotate(d inbox.Dialect, q inbox.Query) string {
	if d.Placeholder(1) == d.Placeholder(2) {
		var b strings.Builder
		i := 0
		var quote rune
		for _, r := range q.SQL {
			switch {
			case quote != 0:
				if r == quote {
					quote = 0
				}
			case r == '\'' || r == '"' || r == '`':
				quote = r
			case string(r) == d.Placeholder(1) && i < len(q.Args):
				b.WriteString(":" + q.Args[i].String())
				i++
				continue
			}
			b.WriteRune(r)
		}
		return b.String()
	}
	return regexp.MustCompile(`\$[0-9]+`).ReplaceAllStringFunc(q.SQL, func(m string) string {
		var n int
		_, _ = fmt.Sscanf(m, "$%d", &n)
		if n < 1 || n > len(q.Args) {
			return m
		}
		return ":" + q.Args[n-1].String()
	})
}

var (
	// column = :arg, also inside NULLIF(, COALESCE( and CAST(.
	assignment = regexp.MustCompile("[`\"]?(\\w+)[`\"]?\\s*(?:=|<|>)\\s*(?:COALESCE\\(|NULLIF\\(|CAST\\()*:(\\w+)")
	insert     = regexp.MustCompile(`(?s)INSERT[^(]*\(([^)]*)\)\s*VALUES\s*\((.*)`)
	argRef     = regexp.MustCompile(`:(\w+)`)
)

// checkBindings checks that every placeholder binds the Arg of the column it
// is compared with or stored in.
func checkBindings(t *testing.T, name, sql string) {
	t.Helper()
	// Comparisons that are not with the column's own value.
	other := map[string][]string{
		"status":      {"status", "from_status"},
		"lease_until": {"lease_until", "now"},
		"expires_at":  {"expires_at", "before"},
		"updated_at":  {"updated_at", "before"},
		"created_at":  {"created_at", "before"},
		// Keyset scans continue after a key, and some end at one.
		"scope":     {"scope", "after_scope", "until_scope"},
		"operation": {"operation", "after_operation", "until_operation"},
		"key":       {"key", "after_key", "until_key"},
	}
	for _, m := range assignment.FindAllStringSubmatch(sql, -1) {
		col, arg := m[1], m[2]
		want := other[col]
		if want == nil {
			want = []string{col}
		}
		require.Contains(t, want, arg, "%s: %s = :%s in %s", name, col, arg, sql)
	}
	if m := insert.FindStringSubmatch(sql); m != nil {
		cols := strings.Split(m[1], ",")
		vals := splitTopLevel(m[2]) // up to the parenthesis that closes VALUES (
		require.Len(t, vals, len(cols), "%s: %s", name, sql)
		for i, c := range cols {
			c = strings.Trim(strings.TrimSpace(c), "`\"")
			for _, ref := range argRef.FindAllStringSubmatch(vals[i], -1) {
				want := c
				if c == "applied_at" || c == "logged_at" {
					want = "now"
				}
				require.Equal(t, want, ref[1], "%s: column %s gets :%s in %s", name, c, ref[1], sql)
			}
		}
	}
}

// splitTopLevel splits a VALUES list at the commas outside parentheses and
// literals, up to the parenthesis that closes it.
func splitTopLevel(s string) []string {
	var (
		out   []string
		depth int
		quote bool
		start int
	)
	for i, r := range s {
		switch {
		case r == '\'':
			quote = !quote
		case quote:
		case r == '(':
			depth++
		case r == ')' && depth == 0:
			return append(out, s[start:i])
		case r == ')':
			depth--
		case r == ',' && depth == 0:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// TestDialectGolden pins each dialect's SQL for the default table in
// testdata/<dialect>.golden, so that a change to any statement shows in
// review. Regenerate with: go test ./inbox -run TestDialectGolden -update
func TestDialectGolden(t *testing.T) {
	for _, d := range dialects {
		t.Run(dialectName(d), func(t *testing.T) {
			got := golden(d)
			path := filepath.Join("testdata", dialectName(d)+".golden")
			if *update {
				require.NoError(t, os.MkdirAll("testdata", 0o755))
				require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
			}
			want, err := os.ReadFile(path)
			require.NoError(t, err, "run go test ./inbox -run TestDialectGolden -update")
			require.Equal(t, string(want), got, "the SQL changed: if that was meant, run go test ./inbox -run TestDialectGolden -update")
		})
	}
}

func golden(d inbox.Dialect) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# The SQL of the %s dialect for table \"inbox\". Generated by TestDialectGolden; regenerate with\n", dialectName(d))
	b.WriteString("#   go test ./inbox -run TestDialectGolden -update\n")
	fmt.Fprintf(&b, "# capabilities: %+v\n", d.Capabilities())
	b.WriteString("# Each placeholder is written as the argument it binds (:name).\n")
	for _, q := range append(inboxtest.AllQueries(d.Queries("inbox")), partitionQueries(d, "inbox")...) {
		fmt.Fprintf(&b, "\n-- %s\n%s\n", q.Name, strings.TrimSpace(annotate(d, q.Query)))
	}
	return b.String()
}
