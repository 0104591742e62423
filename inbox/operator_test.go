package inbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/inbox/mysql"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// TestMySQLOperatorScansUseIndexes checks that the operator tools' scans
// read MySQL's indexes as ranges: the keyset continuation of List and
// FindByDigest (spelled out, because MariaDB does not turn a row-value
// comparison into a range), and the audit listing by record and by
// action. Without that every page would read the table from its start.
func TestMySQLOperatorScansUseIndexes(t *testing.T) {
	db := testdb.Open(t, testdb.MySQL)
	ctx := context.Background()
	store := inboxtest.NewStore(t, db, mysql.Dialect(), inbox.Config{})
	table := store.Table()
	digits := "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4" +
		" UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)"
	_, err := db.ExecContext(ctx, "INSERT INTO "+table+
		" (scope, operation, `key`, payload_hash, status, created_at, updated_at)\n"+
		"SELECT CONCAT('s', n % 10), CONCAT('op', n % 7), LPAD(n, 5, '0'), 'h', 'completed', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)\n"+
		"FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS n FROM "+
		digits+" a, "+digits+" b, "+digits+" c, "+digits+" e) g")
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, "INSERT INTO "+table+"_audit (audit_id, logged_at, actor, action, scope, operation, `key`, reason, affected)\n"+
		"SELECT LPAD(HEX(n), 24, '0'), UTC_TIMESTAMP(6), 'a', ELT(1 + n % 3, 'resolve', 'forget', 'purge'),\n"+
		"\tCONCAT('s', n % 10), CONCAT('op', n % 7), LPAD(n, 5, '0'), 'r', 1\n"+
		"FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS n FROM "+
		digits+" a, "+digits+" b, "+digits+" c, "+digits+" e) g")
	require.NoError(t, err)
	for _, tbl := range []string{table, table + "_audit"} {
		_, err = db.ExecContext(ctx, "ANALYZE TABLE "+tbl)
		require.NoError(t, err)
	}

	q := mysql.Dialect().Queries(table)
	s, o, k := "s5", "op3", "05000"
	for name, c := range map[string]struct {
		query string
		args  []any
		index string
	}{
		"ListRecords": {q.ListRecords().SQL,
			[]any{s, s, s, o, o, k, "", "", "", "", 0, "", nil, nil, 0, 51}, "PRIMARY"},
		"ListRecords by operation": {q.ListRecords().SQL,
			[]any{s, s, s, o, o, k, "", "", "op1", "op1", 0, "", nil, nil, 0, 51}, "PRIMARY"},
		"ListRecords by scope": {q.ListRecords().SQL,
			[]any{s, s, s, o, o, k, "", "", "", "", 1, "s7", nil, nil, 0, 51}, "PRIMARY"},
		"SelectKeys":              {q.SelectKeys().SQL, []any{s, s, s, o, o, k, "", "", 1000}, "PRIMARY"},
		"SelectKeys by operation": {q.SelectKeys().SQL, []any{s, s, s, o, o, k, "op1", "op1", 1000}, "PRIMARY"},
		"ListAudit by record": {q.ListAudit().SQL,
			[]any{"op3", "s5", "op3", "05000", "", "", "", "", 51}, table + "_audit_record_idx"},
		"ListAudit by action": {q.ListAudit().SQL,
			[]any{"", "", "", "", "forget", "forget", "000000000000000000000fff", "000000000000000000000fff", 51},
			table + "_audit_action_idx"},
		"ListAudit": {q.ListAudit().SQL,
			[]any{"", "", "", "", "", "", "000000000000000000000fff", "000000000000000000000fff", 51}, "PRIMARY"},
	} {
		rows, err := db.QueryContext(ctx, "EXPLAIN "+c.query, c.args...)
		require.NoError(t, err, name)
		plans := explain(t, rows)
		require.Len(t, plans, 1, name)
		require.Equal(t, c.index, plans[0]["key"], "%s: %v", name, plans[0])
		require.Contains(t, []string{"range", "ref"}, plans[0]["type"], "%s: %v", name, plans[0])
		require.NotContains(t, plans[0]["Extra"], "filesort", "%s: %v", name, plans[0])
	}

	// A status filter may rather read the status index when few records
	// are in that status (none is pending here) and sort them.

	// And the store pages through them.
	var n int
	page := inbox.Filter{Operation: "op3", Limit: 333}
	for {
		p, err := store.List(ctx, page)
		require.NoError(t, err)
		n += len(p.Records)
		if p.Next == "" {
			break
		}
		page.After = p.Next
	}
	require.Equal(t, 1429, n, "10,000 keys, one in 7 of op3")
	rec, err := store.FindByDigest(ctx, inbox.ID{Scope: "s9", Operation: "op3", Key: "09999"}.Digest(), "")
	require.NoError(t, err)
	require.Equal(t, "09999", rec.Key)
}

// TestOperatorActionsNeedTheAuditTable: on a table migrated to a version
// before the audit table, Validate says so and the operator actions fail
// without changing the record (their transaction rolls back).
func TestOperatorActionsNeedTheAuditTable(t *testing.T) {
	for _, kind := range testdb.All {
		t.Run(string(kind), func(t *testing.T) { operatorActionsNeedTheAuditTable(t, kind) })
	}
}

func operatorActionsNeedTheAuditTable(t *testing.T, kind testdb.Kind) {
	{
		db := testdb.Open(t, kind)
		ctx := context.Background()
		store := inboxtest.NewStore(t, db, testdb.Dialect(kind), inbox.Config{})
		ms, err := store.Migrations()
		require.NoError(t, err)
		require.NoError(t, store.MigrateDown(ctx, ms[len(ms)-2].Version))
		se := new(inbox.SchemaError)
		require.ErrorAs(t, store.Validate(ctx), &se)
		require.Equal(t, []int{ms[len(ms)-1].Version}, se.Missing)

		k := inbox.ID{Operation: "op", Key: fmt.Sprint(time.Now().UnixNano())}
		res, err := store.Reserve(ctx, inbox.ReserveParams{ID: k, PayloadHash: []byte("h"), Owner: "w", Lease: time.Minute})
		require.NoError(t, err)
		require.NoError(t, res.Lease.Pend(ctx, "", "timeout"))
		before, err := store.Get(ctx, db, k)
		require.NoError(t, err)
		_, _, err = store.Resolve(ctx, inbox.ResolveParams{ID: k, To: inbox.StatusCompleted,
			Actor: inbox.Actor{Name: "a", Reason: "r"}})
		require.Error(t, err)
		_, err = store.Forget(ctx, inbox.ForgetParams{ID: k, Actor: inbox.Actor{Name: "a", Reason: "r"}})
		require.Error(t, err)
		after, err := store.Get(ctx, db, k)
		require.NoError(t, err)
		require.Equal(t, before, after, "no change without its audit entry")

		require.NoError(t, store.Migrate(ctx))
		require.NoError(t, store.Validate(ctx))
		_, err = store.Forget(ctx, inbox.ForgetParams{ID: k, Actor: inbox.Actor{Name: "a", Reason: "r"}})
		require.NoError(t, err)
	}
}

// TestPostgresOperatorScansUseIndexes is TestMySQLOperatorScansUseIndexes
// for PostgreSQL: each page of a scan reads an index from the cursor on,
// in index order, with no sort.
func TestPostgresOperatorScansUseIndexes(t *testing.T) {
	db := testdb.Open(t, testdb.PostgresPGX)
	ctx := context.Background()
	store := inboxtest.NewStore(t, db, postgres.Dialect(), inbox.Config{})
	table := store.Table()
	_, err := db.ExecContext(ctx, `INSERT INTO "`+table+`" (scope, operation, key, payload_hash, status, created_at, updated_at)
SELECT 's' || (n % 10), 'op' || (n % 7), lpad(n::text, 5, '0'), 'h', 'completed', now(), now()
FROM generate_series(0, 9999) AS n`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO "`+table+`_audit" (audit_id, logged_at, actor, action, scope, operation, key, reason, affected)
SELECT lpad(to_hex(n), 24, '0'), now(), 'a', (ARRAY['resolve', 'forget', 'purge'])[1 + n % 3],
	's' || (n % 10), 'op' || (n % 7), lpad(n::text, 5, '0'), 'r', 1
FROM generate_series(0, 9999) AS n`)
	require.NoError(t, err)
	for _, tbl := range []string{table, table + "_audit"} {
		_, err = db.ExecContext(ctx, `ANALYZE "`+tbl+`"`)
		require.NoError(t, err)
	}
	q := postgres.Dialect().Queries(table)
	var never *time.Time
	for name, c := range map[string]struct {
		query string
		args  []any
		index string
	}{
		"ListRecords":              {q.ListRecords().SQL, []any{"s5", "op3", "05000", "", "", 0, "", never, 0, 51}, table + "_pkey"},
		"ListRecords by operation": {q.ListRecords().SQL, []any{"s5", "op3", "05000", "", "op1", 0, "", never, 0, 51}, table + "_pkey"},
		"ListRecords by scope":     {q.ListRecords().SQL, []any{"s5", "op3", "05000", "", "", 1, "s7", never, 0, 51}, table + "_pkey"},
		"SelectKeys":               {q.SelectKeys().SQL, []any{"s5", "op3", "05000", "op1", 51}, table + "_pkey"},
		"ListAudit by record":      {q.ListAudit().SQL, []any{"op3", "s5", "05000", "", "", 51}, table + "_audit_record_idx"},
		// A third of the entries: walking the primary key is as good.
		"ListAudit by action": {q.ListAudit().SQL, []any{"", "", "", "forget", "000000000000000000000fff", 51},
			table + "_audit_(action_idx|pkey)"},
		"ListAudit": {q.ListAudit().SQL, []any{"", "", "", "", "000000000000000000000fff", 51}, table + "_audit_pkey"},
	} {
		var plan []string
		rows, err := db.QueryContext(ctx, "EXPLAIN "+c.query, c.args...)
		require.NoError(t, err, name)
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			plan = append(plan, line)
		}
		require.NoError(t, rows.Err())
		text := strings.Join(plan, "\n")
		require.Regexp(t, "using "+c.index+" ", text, "%s", name)
		require.NotContains(t, text, "Sort", "%s:\n%s", name, text)
		require.NotContains(t, text, "Seq Scan", "%s:\n%s", name, text)
	}
}

// unlocked is a dialect whose SelectForUpdate takes no row lock, so that
// an operator action reads the record, checks it and writes it with a
// worker free to move it in between: what is left to keep them apart is
// the fence in the statement's WHERE clause.
type unlocked struct{ inbox.Dialect }

func (d unlocked) Queries(table string) inbox.Queries {
	return unlockedQueries{d.Dialect.Queries(table)}
}

type unlockedQueries struct{ inbox.Queries }

func (q unlockedQueries) SelectForUpdate() inbox.Query { return q.Select() }

// TestOperatorFenceWithoutRowLock races Resolve and Forget against a
// worker's TakeOver with the row lock taken away: exactly one still wins,
// and the audit entry exists exactly when the operator's change does.
func TestOperatorFenceWithoutRowLock(t *testing.T) {
	for _, kind := range testdb.All {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			db := testdb.Open(t, kind)
			ctx := context.Background()
			var clock inboxtest.Clock
			store := inboxtest.NewStore(t, db, unlocked{testdb.Dialect(kind)}, inbox.Config{Now: clock.Now})
			worker, err := inbox.NewStore(db, testdb.Dialect(kind), inbox.Config{Table: store.Table(), Now: clock.Now})
			require.NoError(t, err)
			t.Cleanup(func() { _ = worker.Close() })
			actor := inbox.Actor{Name: "alice", Reason: "r"}
			wins := map[string]int{}
			for i := range 40 {
				k := inbox.ID{Operation: "op", Key: fmt.Sprint(i)}
				res, err := worker.Reserve(ctx, inbox.ReserveParams{ID: k, PayloadHash: []byte("h"), Owner: "w1",
					Lease: time.Minute, Retention: time.Hour})
				require.NoError(t, err)
				clock.Advance(2 * time.Minute)
				rec := res.Record
				var opErr, takeErr error
				start := make(chan struct{})
				done := make(chan struct{})
				go func() {
					<-start
					time.Sleep(time.Duration(i%5) * 100 * time.Microsecond)
					_, takeErr = worker.TakeOver(ctx, rec, inbox.TakeOverParams{Owner: "w2", Lease: time.Minute})
					close(done)
				}()
				close(start)
				if i%2 == 0 {
					_, _, opErr = store.Resolve(ctx, inbox.ResolveParams{ID: k, To: inbox.StatusCompleted, Attempt: 1, Actor: actor})
				} else {
					_, opErr = store.Forget(ctx, inbox.ForgetParams{ID: k, Attempt: 1, Actor: actor})
				}
				<-done
				require.True(t, (opErr == nil) != (takeErr == nil), "exactly one wins: operator %v, take over %v", opErr, takeErr)
				entries, _, err := store.ListAudit(ctx, inbox.AuditFilter{Record: &k})
				require.NoError(t, err)
				if opErr == nil {
					wins["operator"]++
					require.ErrorIs(t, takeErr, inbox.ErrLeaseLost)
					require.Len(t, entries, 1)
				} else {
					wins["worker"]++
					require.ErrorIs(t, opErr, inbox.ErrLeaseLost, "the operator saw attempt 1")
					require.Empty(t, entries)
					now, err := store.Get(ctx, db, k)
					require.NoError(t, err)
					require.Equal(t, int64(2), now.Attempt)
				}
			}
			t.Logf("wins: %v", wins)
		})
	}
}
