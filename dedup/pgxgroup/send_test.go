package pgxgroup_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/pgxgroup"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// openPGX opens a pool of its own on the test server, of at most conns
// connections, running mode.
func openPGX(t *testing.T, mode pgx.QueryExecMode, conns int) *sql.DB {
	t.Helper()
	testdb.Open(t, testdb.PostgresPGX) // skips, or fails under CI, when PostgreSQL does not answer
	cfg, err := pgx.ParseConfig(testdb.PostgresDSN())
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = mode
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(conns)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// The callbacks of pgx.QueuedQuery see their results as pgx's own
// batches would give them, whatever the connection's exec mode: with
// pgx's default the group's statements go as one extended-protocol
// batch of this package's own, with the simple protocol (PgBouncer)
// through pgx.SendBatch.
func TestQueuedQueryCallbacksReadTheirResults(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			f := setupOn(t, openPGX(t, mode, 2), dedup.Group{Coordinators: 1, MaxLinger: 5 * time.Second})
			var (
				sum    int
				series []int
				noRows error
				tag    string
			)
			f.act = func(msg *message.Message, tx *pgxgroup.Tx) error {
				tx.Queue("SELECT $1::int + 1", 41).QueryRow(func(r pgx.Row) error { return r.Scan(&sum) })
				tx.Queue("SELECT g FROM generate_series(1, @n) g", pgx.NamedArgs{"n": 3}).Query(func(rows pgx.Rows) error {
					for rows.Next() {
						var g int
						if err := rows.Scan(&g); err != nil {
							return err
						}
						series = append(series, g)
					}
					return rows.Err()
				})
				tx.Queue("SELECT 1 WHERE false").QueryRow(func(r pgx.Row) error {
					var x int
					noRows = r.Scan(&x)
					return nil
				})
				// Rows a callback leaves unread are not the next result's.
				tx.Queue("SELECT generate_series(1, 3)").QueryRow(func(pgx.Row) error { return nil })
				tx.Queue("UPDATE "+f.effects+" SET note = note || '!' WHERE event_id = $1", msg.Metadata.Get("event_id")).
					Exec(func(ct pgconn.CommandTag) error {
						tag = ct.String()
						return nil
					})
				return nil
			}
			require.NoError(t, f.deliver(event("a", "ok")))
			require.Equal(t, 42, sum)
			require.Equal(t, []int{1, 2, 3}, series)
			require.ErrorIs(t, noRows, pgx.ErrNoRows)
			require.Equal(t, "UPDATE 1", tag)
			note, ok := f.effect(t, "a")
			require.True(t, ok)
			require.Equal(t, "ok!", note)

			if mode == pgx.QueryExecModeSimpleProtocol {
				// pgx sends the batch as one query string: a statement
				// the server cannot parse fails it all, and the first
				// member is blamed.
				return
			}
			// A statement the server refuses to prepare fails its member
			// alone, before anything of the group ran.
			f.act = func(msg *message.Message, tx *pgxgroup.Tx) error {
				if msg.Metadata.Get("event_id") == "bad" {
					tx.Queue("SELEC 1")
				}
				return nil
			}
			errs := f.together(t, event("good", "ok"), event("bad", "ok"))
			require.NoError(t, errs[0])
			var pe *pgconn.PgError
			require.ErrorAs(t, errs[1], &pe)
			require.Equal(t, "42601", pe.Code, "a syntax error")
			_, ok = f.effect(t, "good")
			require.True(t, ok)
			_, ok = f.effect(t, "bad")
			require.False(t, ok)
			f.noRecord(t, "bad")

		})
	}
}

// A table changed under a prepared statement ("cached plan must not
// change result type") fails its member once, as it would through pgx's
// own statement cache; the statement is prepared again, and the
// redelivery runs.
func TestStatementPreparedBeforeATableChangedIsPreparedAgain(t *testing.T) {
	t.Parallel()
	f := setupOn(t, openPGX(t, pgx.QueryExecModeCacheStatement, 1), dedup.Group{})
	columns := 0
	f.act = func(msg *message.Message, tx *pgxgroup.Tx) error {
		tx.Queue("SELECT * FROM " + f.effects + " LIMIT 1").Query(func(rows pgx.Rows) error {
			columns = len(rows.FieldDescriptions())
			return nil
		})
		return nil
	}
	require.NoError(t, f.deliver(event("a", "ok")))
	require.Equal(t, 2, columns)
	_, err := f.db.ExecContext(context.Background(), "ALTER TABLE "+f.effects+" ADD COLUMN extra int")
	require.NoError(t, err)

	err = f.deliver(event("b", "ok"))
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "0A000", pe.Code, "cached plan must not change result type")
	f.noRecord(t, "b")
	require.NoError(t, f.deliver(event("b", "ok")))
	require.Equal(t, 3, columns)
	_, ok := f.effect(t, "b")
	require.True(t, ok)
}

// A COMMIT that fails before it runs leaves the transaction open on the
// server: here its prepared statement is gone (the handler deallocated
// every statement). The delivery is nacked with nothing recorded, and the
// pool's only connection, still in that transaction, is not handed to the
// next group (pgx's stdlib discards it), whose delivery and the
// redelivery then take effect once each.
func TestCommitThatNeverRanRecordsNothing(t *testing.T) {
	t.Parallel()
	f := setupOn(t, openPGX(t, pgx.QueryExecModeCacheStatement, 1), dedup.Group{})
	require.NoError(t, f.deliver(event("first", "ok")), "prepares the COMMIT")
	f.act = func(msg *message.Message, tx *pgxgroup.Tx) error {
		// Run at once, after the queued INSERT: only the COMMIT is left.
		_, err := tx.ExecContext(msg.Context(), "DEALLOCATE ALL")
		return err
	}
	err := f.deliver(event("a", "ok"))
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "26000", pe.Code, "the COMMIT's prepared statement does not exist")
	f.noRecord(t, "a")
	_, ok := f.effect(t, "a")
	require.False(t, ok)

	f.act = nil
	require.NoError(t, f.deliver(event("b", "ok")))
	require.NoError(t, f.deliver(event("a", "ok")), "the redelivery")
	for _, key := range []string{"a", "b"} {
		_, ok := f.effect(t, key)
		require.True(t, ok, key)
	}
}
