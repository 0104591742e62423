package pgxgroup

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/internal/pipeline"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// The statements a connection keeps prepared are bounded: the least
// recently used is deallocated when the next group begins. And when
// they are all gone behind the session's back (DEALLOCATE ALL), the
// claim is prepared again in place instead of failing the group.
func TestPreparedStatementsAreBoundedAndSurviveDeallocateAll(t *testing.T) {
	t.Parallel()
	testdb.Open(t, testdb.PostgresPGX) // skips, or fails under CI, when PostgreSQL does not answer
	cfg, err := pgx.ParseConfig(testdb.PostgresDSN())
	require.NoError(t, err)
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	s := opener{}.Open(conn).(*session)
	require.NoError(t, s.raw(func(c *pgx.Conn) error {
		require.True(t, stateFor(c).direct)
		stateFor(c).capacity = 4 // BEGIN, COMMIT and two queries
		return nil
	}))
	// prepared lists the queries (not BEGIN and COMMIT, which are
	// prepared too) this package prepared on conn, by their text, through
	// pgconn: no statement of pgx's own cache is involved.
	prepared := func() []string {
		var texts []string
		require.NoError(t, s.raw(func(c *pgx.Conn) error {
			res, err := c.PgConn().Exec(ctx,
				"SELECT statement FROM pg_prepared_statements WHERE name LIKE 'inboxmill\\_%' AND statement LIKE 'SELECT%' ORDER BY statement").ReadAll()
			if err != nil {
				return err
			}
			for _, row := range res[0].Rows {
				texts = append(texts, string(row[0]))
			}
			return nil
		}))
		return texts
	}
	query := func(i int) string { return fmt.Sprintf("SELECT $1::int + %d", i) }
	claim := func(i int) {
		t.Helper()
		var got int
		require.NoError(t, s.BeginQuery(ctx, pipeline.Begin{Query: query(i), Args: []any{1},
			Row: func(row pipeline.Row) error { return row.Scan(&got) }}))
		require.Equal(t, 1+i, got)
		failed, err := s.Commit(ctx)
		require.NoError(t, err)
		require.Equal(t, -1, failed)
	}
	for i := range 5 {
		claim(i)
	}
	// Two kept, and the one evicted by the last prepare, deallocated when
	// the next group begins.
	require.Equal(t, []string{query(2), query(3), query(4)}, prepared())
	claim(3)
	require.Equal(t, []string{query(3), query(4)}, prepared())

	require.NoError(t, s.raw(func(c *pgx.Conn) error {
		_, err := c.PgConn().Exec(ctx, "DEALLOCATE ALL").ReadAll()
		return err
	}))
	require.Empty(t, prepared())
	claim(4)
	require.Equal(t, []string{query(4)}, prepared())
	require.False(t, s.inTx)
}
