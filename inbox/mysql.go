package inbox

import (
	"errors"
	"io/fs"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// MySQL returns the MySQL / MariaDB dialect for github.com/go-sql-driver/mysql.
//
// The DSN should set parseTime=true; times are read correctly without it too,
// as long as loc is UTC (the driver's default).
func MySQL() Dialect { return mysqlDialect{} }

type mysqlDialect struct{}

func (mysqlDialect) Name() string            { return "mysql" }
func (mysqlDialect) Migrations() fs.FS       { return subFS("mysql") }
func (mysqlDialect) Placeholder(int) string  { return "?" }
func (mysqlDialect) TimeArg(t time.Time) any { return t.UTC() }

func (mysqlDialect) Queries(table string) Queries {
	cols := strings.ReplaceAll(columns, "%KEY%", "`key`")
	where := " WHERE scope = ? AND operation = ? AND `key` = ?"
	q := Queries{
		// INSERT IGNORE reports 0 rows affected for a taken key whatever
		// CLIENT_FOUND_ROWS says (that flag only changes UPDATE counts), and a
		// concurrent insert of the same key waits on its row lock.
		Insert: "INSERT IGNORE INTO inbox (scope, operation, `key`, payload_hash, status, attempt, lease_owner,\n" +
			"\tlease_until, correlation_id, error, created_at, updated_at, expires_at)\n" +
			"VALUES (?, ?, ?, ?, ?, 1, NULLIF(?, ''), ?, NULLIF(?, ''), NULLIF(?, ''), ?, ?, ?)",
		// A locking read: under REPEATABLE READ a plain SELECT reads the
		// transaction's snapshot, which may predate the row that made the
		// INSERT IGNORE above a no-op.
		SelectForClaim: "SELECT " + cols + " FROM inbox" + where + " LOCK IN SHARE MODE",
		Select:         "SELECT " + cols + " FROM inbox" + where,
		Finish: "UPDATE inbox SET status = ?, result = ?, resource_id = NULLIF(?, ''),\n" +
			"\texternal_ref = COALESCE(NULLIF(?, ''), external_ref), error = NULLIF(?, ''),\n" +
			"\tlease_owner = NULL, lease_until = NULL, updated_at = ?, expires_at = COALESCE(?, expires_at)" +
			where + " AND attempt = ? AND status = ?",
		TakeOver: "UPDATE inbox SET attempt = attempt + 1, lease_owner = ?, lease_until = ?, updated_at = ?" +
			where + " AND attempt = ? AND status = 'processing' AND (lease_until IS NULL OR lease_until < ?)",
		ExtendLease: "UPDATE inbox SET lease_until = ?, updated_at = ?" + where + " AND attempt = ? AND status = 'processing'",
		// SelectPending, SelectStale and UnfinishedStats read the index
		// inbox_status_updated_idx (status, updated_at) of migration 2: in
		// status order, then oldest update first, so the scans need no sort.
		// It is on updated_at rather than lease_until because MySQL has no
		// partial index: finished rows are in it too, and by updated_at they
		// are added at the end of their status's range instead of at random.
		SelectPending: "SELECT " + cols + " FROM inbox WHERE status = 'pending' ORDER BY updated_at LIMIT ?",
		SelectStale: "SELECT " + cols + " FROM inbox\n" +
			"WHERE status = 'processing' AND (lease_until IS NULL OR lease_until < ?) AND updated_at < ?\n" +
			"ORDER BY updated_at LIMIT ?",
		UnfinishedStats: "SELECT status, COUNT(*), MIN(created_at) FROM inbox WHERE status IN " + unfinishedStatuses + " GROUP BY status",
		Clock:           "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))",
		OldestExpired:   "SELECT MIN(expires_at) FROM inbox WHERE expires_at IS NOT NULL AND status IN " + finishedStatuses,
		// One short autocommit statement per batch; the expires_at index
		// keeps it to the rows it deletes. Unlike PostgreSQL's SKIP LOCKED
		// it waits on rows a claim holds, for at most the claim's duration.
		Purge:             "DELETE FROM inbox WHERE expires_at < ? AND status IN " + finishedStatuses + " ORDER BY expires_at LIMIT ?",
		Delete:            "DELETE FROM inbox" + where,
		ZeroRowsAmbiguous: true,

		CreateMigrationsTable: "CREATE TABLE IF NOT EXISTS inbox_migrations (\n" +
			"\tversion    INT          NOT NULL PRIMARY KEY,\n" +
			"\tname       VARCHAR(255) NOT NULL,\n" +
			"\tapplied_at DATETIME(6)  NOT NULL\n" +
			") ENGINE = InnoDB DEFAULT CHARSET = utf8mb4",
		SelectMigrations: "SELECT version FROM inbox_migrations ORDER BY version",
		SelectMigration:  "SELECT COUNT(*) FROM inbox_migrations WHERE version = ?",
		InsertMigration:  "INSERT INTO inbox_migrations (version, name, applied_at) VALUES (?, ?, ?)",
		// MySQL DDL commits implicitly, so transactions cannot keep two
		// migrating processes apart; a named lock can. GET_LOCK returns 0 on
		// timeout and NULL on error, both of which Migrate reports.
		LockMigrations:   "SELECT COALESCE(GET_LOCK(?, 600), 0)",
		UnlockMigrations: "SELECT COALESCE(RELEASE_LOCK(?), 0)",
	}
	return q.rename(table)
}

func (mysqlDialect) Classify(err error) error {
	if err == nil {
		return nil
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case 1213, // ER_LOCK_DEADLOCK
			1205, // ER_LOCK_WAIT_TIMEOUT
			1020, // ER_CHECKREAD: record changed since last read
			1927, // ER_CONNECTION_KILLED (MariaDB)
			1053, // ER_SERVER_SHUTDOWN
			1040, // ER_CON_COUNT_ERROR
			2006, // CR_SERVER_GONE_ERROR
			2013: // CR_SERVER_LOST
			return transient(err)
		}
		return err
	}
	if errors.Is(err, mysql.ErrInvalidConn) {
		return transient(err)
	}
	return err
}
