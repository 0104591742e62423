package horizon

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"time"
)

// SQLDialect is the database of a [SQLQueue].
type SQLDialect int

// The databases of watermill-sql's schemas.
const (
	PostgreSQL SQLDialect = iota + 1
	MySQL
)

// Querier is what a [SQLQueue] reads through: *sql.DB, *sql.Conn and
// *sql.Tx satisfy it.
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// SQLQueue is the Source of a watermill-sql messages table on PostgreSQL
// or MySQL: any of its schemas (the default ones and the queue ones), all
// of which have a created_at column set when a row is published.
//
// What a replay can reach there is every row still in the table: a new
// consumer group (or a reset of the offsets table) reads the table from
// its first row. watermill-sql deletes nothing by itself, so unless
// something does the horizon is forever — a row published a year ago is
// delivered to a new consumer group today — whatever the table holds now;
// the report states the age of the oldest row for scale. Say what deletes
// rows with Retention (a job of your own) or DeleteOnAck (the queue
// schemas' offsets adapters with DeleteOnAck, which delete a row once it
// is acked: only rows not yet acked can come again).
type SQLQueue struct {
	// DB reads the table. Required.
	DB Querier
	// Dialect is PostgreSQL or MySQL. Required.
	Dialect SQLDialect
	// Table is the messages table, as watermill-sql names it: "watermill_"
	// and the topic (see [WatermillTable]). Letters, digits, "_" and "-"
	// only. Required.
	Table string
	// Retention is how long rows are kept by a job of yours that deletes
	// older ones. The horizon is then Retention, or the oldest row's age
	// when that is older (the job is behind). Defaults to 0: nothing
	// deletes rows, the horizon is forever.
	Retention time.Duration
	// DeleteOnAck says that acked rows are deleted (watermill-sql's
	// PostgreSQLQueueOffsetsAdapter or MySQLQueueOffsetsAdapter with
	// DeleteOnAck). The horizon is then the age of the oldest row: an
	// acked message cannot come again, one not yet acked can.
	DeleteOnAck bool
}

// WatermillTable is the messages table watermill-sql's schemas use for
// topic: "watermill_" + topic.
func WatermillTable(topic string) string { return "watermill_" + topic }

var tableName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Horizon reads the age of the oldest row by the database's clock and
// applies the settings.
func (q SQLQueue) Horizon(ctx context.Context) (Horizon, error) {
	if err := q.validate(); err != nil {
		return Horizon{}, err
	}
	h := Horizon{Name: "table " + q.Table, Oldest: -1}
	oldest, err := q.oldest(ctx)
	if err != nil {
		return Horizon{}, fmt.Errorf("horizon: read the oldest row of %s: %w", q.Table, err)
	}
	h.Oldest = oldest
	seen := "the table is empty"
	if oldest >= 0 {
		seen = "the oldest row is " + FormatDuration(oldest.Round(time.Minute)) + " old"
	}
	switch {
	case q.DeleteOnAck:
		h.Age = max(oldest, 0)
		h.Note = "rows are deleted on ack; " + seen
	case q.Retention > 0:
		h.Age = max(q.Retention, oldest)
		h.Note = "rows are deleted after " + FormatDuration(q.Retention) + "; " + seen
	default:
		h.Age = Forever
		h.Note = "no row is deleted, a new consumer group reads them all; " + seen
	}
	return h, nil
}

func (q SQLQueue) validate() error {
	var errs []error
	if q.DB == nil {
		errs = append(errs, errors.New("horizon: SQLQueue.DB is nil"))
	}
	if q.Dialect != PostgreSQL && q.Dialect != MySQL {
		errs = append(errs, fmt.Errorf("horizon: SQLQueue.Dialect %d is neither PostgreSQL nor MySQL", q.Dialect))
	}
	if !tableName.MatchString(q.Table) {
		errs = append(errs, fmt.Errorf("horizon: SQLQueue.Table %q is not a watermill-sql table name", q.Table))
	}
	if q.Retention < 0 {
		errs = append(errs, fmt.Errorf("horizon: SQLQueue.Retention %v is negative", q.Retention))
	}
	if q.Retention > 0 && q.DeleteOnAck {
		errs = append(errs, errors.New("horizon: give at most one of SQLQueue.Retention and DeleteOnAck"))
	}
	return errors.Join(errs...)
}

// oldest returns the age of the oldest row, by the database's clock so
// that the application's clock does not matter; -1 when the table is
// empty. On PostgreSQL the default schema's created_at is a timestamp
// without time zone, written as the session's local time: the cast reads
// it in the same zone.
func (q SQLQueue) oldest(ctx context.Context) (time.Duration, error) {
	var query string
	switch q.Dialect {
	case PostgreSQL:
		query = `SELECT (extract(epoch FROM (now() - min(created_at)::timestamptz)) * 1000000)::bigint FROM "` +
			q.Table + `"`
	case MySQL:
		query = "SELECT TIMESTAMPDIFF(MICROSECOND, MIN(created_at), CURRENT_TIMESTAMP(6)) FROM `" + q.Table + "`"
	}
	var us sql.NullInt64
	if err := q.DB.QueryRowContext(ctx, query).Scan(&us); err != nil {
		return 0, err
	}
	if !us.Valid {
		return -1, nil
	}
	return max(time.Duration(us.Int64)*time.Microsecond, 0), nil
}
