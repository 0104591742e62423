package horizon_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup/horizon"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// queue is a watermill-sql messages table on a real database.
type queue struct {
	kind   testdb.Kind
	db     *sql.DB
	schema wsql.SchemaAdapter
	topic  string
	src    horizon.SQLQueue
}

func newQueue(t *testing.T, kind testdb.Kind, schema wsql.SchemaAdapter, topic string) *queue {
	t.Helper()
	db := testdb.Open(t, kind)
	q := &queue{kind: kind, db: db, schema: schema, topic: topic}
	q.src = horizon.SQLQueue{DB: db, Dialect: horizon.PostgreSQL, Table: horizon.WatermillTable(topic)}
	if kind == testdb.MySQL {
		q.src.Dialect = horizon.MySQL
	}
	t.Cleanup(func() {
		_, _ = db.Exec("DROP TABLE IF EXISTS " + q.src.Table)
		_, _ = db.Exec("DROP TABLE IF EXISTS watermill_offsets_" + topic)
	})
	// The first publish creates the table; the test starts with it empty.
	q.publish(t, 1)
	_, err := db.Exec("DELETE FROM " + q.src.Table)
	require.NoError(t, err)
	return q
}

func (q *queue) publish(t *testing.T, n int) {
	t.Helper()
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(q.db), wsql.PublisherConfig{SchemaAdapter: q.schema,
		AutoInitializeSchema: true}, watermill.NopLogger{})
	require.NoError(t, err)
	for i := range n {
		require.NoError(t, pub.Publish(q.topic, message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"n":%d}`, i))))
	}
}

// age moves every row's created_at back by d, as if it was published that
// long ago.
func (q *queue) age(t *testing.T, d time.Duration) {
	t.Helper()
	stmt := fmt.Sprintf(`UPDATE "%s" SET created_at = created_at - make_interval(secs => %d)`, q.src.Table, int(d.Seconds()))
	if q.kind == testdb.MySQL {
		stmt = fmt.Sprintf("UPDATE `%s` SET created_at = created_at - INTERVAL %d SECOND", q.src.Table, int(d.Seconds()))
	}
	_, err := q.db.Exec(stmt)
	require.NoError(t, err)
}

func (q *queue) horizon(t *testing.T, edit func(*horizon.SQLQueue)) horizon.Horizon {
	t.Helper()
	src := q.src
	edit(&src)
	h, err := src.Horizon(context.Background())
	require.NoError(t, err)
	return h
}

// TestSQLQueue reads the horizon of watermill-sql tables on PostgreSQL and
// MariaDB, in the default schema (created_at without time zone on
// PostgreSQL) and the queue schema (with time zone).
func TestSQLQueue(t *testing.T) {
	for _, kind := range []testdb.Kind{testdb.PostgresPGX, testdb.MySQL} {
		schemas := map[string]wsql.SchemaAdapter{"default": wsql.DefaultPostgreSQLSchema{}, "queue": wsql.PostgreSQLQueueSchema{}}
		if kind == testdb.MySQL {
			schemas = map[string]wsql.SchemaAdapter{"default": wsql.DefaultMySQLSchema{}, "queue": wsql.MySQLQueueSchema{}}
		}
		for name, schema := range schemas {
			t.Run(string(kind)+"/"+name, func(t *testing.T) {
				t.Parallel()
				q := newQueue(t, kind, schema, testdb.UniqueName("orders"))
				keep := func(*horizon.SQLQueue) {}

				// Empty: nothing deletes rows, so the horizon is forever all the same.
				h := q.horizon(t, keep)
				require.Equal(t, horizon.Forever, h.Age)
				require.Equal(t, time.Duration(-1), h.Oldest)
				require.Contains(t, h.Note, "the table is empty")
				h = q.horizon(t, func(s *horizon.SQLQueue) { s.DeleteOnAck = true })
				require.Zero(t, h.Age, "deleted on ack, an empty table has nothing to deliver again")

				// Rows published ten days ago, by the database's clock.
				q.publish(t, 2)
				q.age(t, 10*day)
				q.publish(t, 1) // and one now

				h = q.horizon(t, keep)
				require.Equal(t, horizon.Forever, h.Age)
				require.InDelta(t, float64(10*day), float64(h.Oldest), float64(time.Minute))
				rep := horizon.Compare(h, 7*day)
				require.False(t, rep.Safe)
				require.Equal(t, "the inbox keeps records for 7d but table "+q.src.Table+" keeps messages forever (no row is deleted, "+
					"a new consumer group reads them all; the oldest row is 10d old): messages older than 7d would run again", rep.Message)
				require.True(t, horizon.Compare(h, horizon.Forever).Safe)

				// A cleanup job of 30 days: the horizon is 30 days.
				h = q.horizon(t, func(s *horizon.SQLQueue) { s.Retention = 30 * day })
				require.Equal(t, 30*day, h.Age)
				require.True(t, horizon.Compare(h, 30*day).Safe)
				require.False(t, horizon.Compare(h, 7*day).Safe)
				// A job of 3 days that is behind: the oldest row is the horizon.
				h = q.horizon(t, func(s *horizon.SQLQueue) { s.Retention = 3 * day })
				require.InDelta(t, float64(10*day), float64(h.Age), float64(time.Minute))
				require.False(t, horizon.Compare(h, 7*day).Safe)
				// Deleted on ack: the rows left are those not acked yet, ten days old.
				h = q.horizon(t, func(s *horizon.SQLQueue) { s.DeleteOnAck = true })
				require.InDelta(t, float64(10*day), float64(h.Age), float64(time.Minute))
				require.Contains(t, h.Note, "rows are deleted on ack; the oldest row is 10d old")
				rep, err := horizon.Check(context.Background(), q.src, 7*day)
				require.NoError(t, err)
				require.False(t, rep.Safe)
			})
		}
	}
}

func TestSQLQueueValidates(t *testing.T) {
	db := testdb.Open(t, testdb.PostgresPGX)
	for name, q := range map[string]horizon.SQLQueue{
		"no db":       {Dialect: horizon.PostgreSQL, Table: "watermill_orders"},
		"no dialect":  {DB: db, Table: "watermill_orders"},
		"bad table":   {DB: db, Dialect: horizon.PostgreSQL, Table: `orders"; DROP TABLE x; --`},
		"empty table": {DB: db, Dialect: horizon.PostgreSQL},
		"negative":    {DB: db, Dialect: horizon.PostgreSQL, Table: "watermill_orders", Retention: -time.Second},
		"both":        {DB: db, Dialect: horizon.MySQL, Table: "watermill_orders", Retention: time.Hour, DeleteOnAck: true},
	} {
		_, err := q.Horizon(context.Background())
		require.Error(t, err, name)
	}
	// A table that does not exist is an error, not an empty horizon.
	_, err := horizon.SQLQueue{DB: db, Dialect: horizon.PostgreSQL, Table: testdb.UniqueName("watermill_none")}.
		Horizon(context.Background())
	require.ErrorContains(t, err, "read the oldest row")
}
