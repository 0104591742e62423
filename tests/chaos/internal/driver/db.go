package driver

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	_ "github.com/go-sql-driver/mysql" // registers "mysql"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/mysql"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// database is one database server of a run and the SQL that differs
// between PostgreSQL and MySQL/MariaDB.
type database struct {
	kind string
	dsn  string
	db   *sql.DB
	// partitioned: the inbox tables are postgres.Partitioned ones.
	partitioned bool
	// pipeline: kafka-group's groups run in pgx pipelines.
	pipeline bool
}

func openDatabase(ctx context.Context, kind, dsn, app string) (*database, error) {
	d := &database{kind: kind, dsn: dsn}
	open := dsn
	if kind == wire.Postgres {
		var err error
		if open, err = wire.WithApplicationName(dsn, app); err != nil {
			return nil, err
		}
	}
	db, err := sql.Open(wire.SQLDriver(kind), open)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(8)
	d.db = db
	if err := d.retryTransient(ctx, "connect", func(ctx context.Context) error {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return db.PingContext(pctx)
	}); err != nil {
		db.Close()
		return nil, err
	}
	return d, nil
}

// setupPatience is how long a run's setup waits out a transient database
// error. Every test package shares the server: while others hold most of
// its connections, PostgreSQL refuses new ones ("too many clients", 53300)
// for a few seconds at a time.
const setupPatience = time.Minute

// retryTransient runs f until it succeeds, fails for good, or has failed
// transiently for setupPatience. Only for statements that may run twice
// (a ping, migrations, CREATE ... that a retry finds done).
func (d *database) retryTransient(ctx context.Context, what string, f func(context.Context) error) error {
	deadline := time.Now().Add(setupPatience)
	wait := 100 * time.Millisecond
	for {
		err := f(ctx)
		if err == nil || !d.transient(err) || time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (gave up: %w)", what, err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// transient: err is worth retrying, as the inbox's dialect classifies it.
func (d *database) transient(err error) bool {
	return inbox.IsRetryable(err) || inbox.IsRetryable(d.dialect().Classify(err))
}

func (d *database) dialect() inbox.Dialect {
	if d.kind == wire.MySQL {
		return mysql.Dialect()
	}
	if d.partitioned {
		return postgres.Partitioned(postgres.Partitions{})
	}
	return postgres.Dialect()
}

// quote quotes an identifier.
func (d *database) quote(name string) string {
	if d.kind == wire.MySQL {
		return "`" + name + "`"
	}
	return `"` + name + `"`
}

// effectsDDL creates a business table. No unique constraint on purpose:
// an effect that happened twice is a second row. created_at is when the
// row was written (clock_timestamp, not the transaction's start), the
// effect's time in the history.
func (d *database) effectsDDL(table string) string {
	if d.kind == wire.MySQL {
		return `CREATE TABLE ` + table + ` (event_id varchar(64) NOT NULL, amount integer NOT NULL,
			consumer varchar(64) NOT NULL, created_at timestamp(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB`
	}
	return `CREATE TABLE ` + table + ` (event_id text NOT NULL, amount integer NOT NULL, consumer text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT clock_timestamp())`
}

// epochMicros is an expression for a timestamp column as Unix microseconds.
func (d *database) epochMicros(col string) string {
	if d.kind == wire.MySQL {
		return `CAST(UNIX_TIMESTAMP(` + col + `) * 1000000 AS SIGNED)`
	}
	return `CAST(extract(epoch from ` + col + `) * 1000000 AS bigint)`
}

// queueSchema is watermill-sql's queue of this database, one message per
// fetch: the queue acks everything it fetched in one transaction.
func (d *database) queueSchema() (wsql.SchemaAdapter, wsql.OffsetsAdapter) {
	if d.kind == wire.MySQL {
		return wsql.MySQLQueueSchema{SubscribeBatchSize: 1}, wsql.MySQLQueueOffsetsAdapter{}
	}
	return wsql.PostgreSQLQueueSchema{SubscribeBatchSize: 1}, wsql.PostgreSQLQueueOffsetsAdapter{}
}

// queueIndex keeps a fetch (`WHERE acked = false ORDER BY "offset" LIMIT
// 1`) constant: the schema indexes only "offset", and every fetch would walk
// past all the acked rows, slowing a queue of 30,000 messages to a few dozen
// a second.
func (d *database) queueIndex(table, name string) string {
	if d.kind == wire.MySQL {
		return `CREATE INDEX IF NOT EXISTS ` + name + ` ON ` + table + ` (acked, ` + "`offset`" + `)`
	}
	return `CREATE INDEX IF NOT EXISTS ` + name + ` ON ` + table + ` ("offset") WHERE NOT acked`
}

// resetQueue marks the first half of the acked messages unacked again.
func (d *database) resetQueue(ctx context.Context, table string) (int64, error) {
	off := d.quote("offset")
	var last sql.NullInt64
	if err := d.db.QueryRowContext(ctx, `SELECT max(`+off+`) FROM `+table+` WHERE acked`).Scan(&last); err != nil {
		return 0, err
	}
	if !last.Valid {
		return 0, nil
	}
	// MySQL cannot read the table it updates in a subquery: two statements.
	res, err := d.db.ExecContext(ctx, `UPDATE `+table+` SET acked = false WHERE acked AND `+off+` <= `+
		fmt.Sprint(last.Int64/2))
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// cutConnections ends every database connection of one consumer, as a
// failover or an operator would: pg_terminate_backend by application_name,
// or KILL of the connection IDs the process reported.
func (d *database) cutConnections(ctx context.Context, app string, p *proc) (int, error) {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if d.kind == wire.Postgres {
		rows, err := d.db.QueryContext(qctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app)
		if err != nil {
			return 0, err
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			var ok bool
			if err := rows.Scan(&ok); err != nil {
				return n, err
			}
			if ok {
				n++
			}
		}
		return n, rows.Err()
	}
	ids := p.connIDs()
	if len(ids) == 0 {
		return 0, nil
	}
	list := make([]string, len(ids))
	for i, id := range ids {
		list[i] = fmt.Sprint(id)
	}
	rows, err := d.db.QueryContext(qctx, `SELECT ID FROM information_schema.PROCESSLIST WHERE ID IN (`+strings.Join(list, ",")+`)`)
	if err != nil {
		return 0, err
	}
	var live []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, err
		}
		live = append(live, id)
	}
	rows.Close()
	n := 0
	for _, id := range live {
		// A connection that closed meanwhile: "Unknown thread id".
		if _, err := d.db.ExecContext(qctx, fmt.Sprintf("KILL %d", id)); err == nil {
			n++
		}
	}
	return n, nil
}
