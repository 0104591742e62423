package inbox

import (
	"errors"
	"io/fs"
	"strings"
	"time"
)

// SQLite returns the SQLite dialect, written for the pure-Go driver
// modernc.org/sqlite. It is the embedded default: no server to run.
//
// SQLite allows one writer at a time. Open the database so that writers
// queue instead of failing, and so that a transaction takes the write lock
// when it begins rather than when it first writes (an upgrade from reader to
// writer cannot wait and fails at once when another writer got there first):
//
//	file:inbox.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate
//
// [SQLiteDSN] builds that DSN.
func SQLite() Dialect { return sqliteDialect{} }

// SQLiteDSN returns a modernc.org/sqlite DSN for the database file at path
// with the settings the inbox needs: a 10 s busy timeout, WAL journaling, and
// transactions that take the write lock at BEGIN.
func SQLiteDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
}

type sqliteDialect struct{}

func (sqliteDialect) Name() string           { return "sqlite" }
func (sqliteDialect) Migrations() fs.FS      { return subFS("sqlite") }
func (sqliteDialect) Placeholder(int) string { return "?" }

// TimeArg stores microseconds since the epoch; see the migration's comment.
func (sqliteDialect) TimeArg(t time.Time) any { return t.UnixMicro() }

func (sqliteDialect) Queries(table string) Queries {
	cols := strings.ReplaceAll(columns, "%KEY%", `"key"`)
	where := ` WHERE scope = ? AND operation = ? AND "key" = ?`
	q := Queries{
		Insert: `INSERT INTO inbox (scope, operation, "key", payload_hash, status, attempt, lease_owner,
	lease_until, correlation_id, error, created_at, updated_at, expires_at)
VALUES (?, ?, ?, ?, ?, 1, NULLIF(?, ''), ?, NULLIF(?, ''), NULLIF(?, ''), ?, ?, ?)
ON CONFLICT (scope, operation, "key") DO NOTHING`,
		// SQLite has one writer at a time: once Insert ran, this transaction
		// holds the write lock and reads the latest data.
		SelectForClaim: `SELECT ` + cols + ` FROM inbox` + where,
		Select:         `SELECT ` + cols + ` FROM inbox` + where,
		Finish: `UPDATE inbox SET status = ?, result = ?, resource_id = NULLIF(?, ''),
	external_ref = COALESCE(NULLIF(?, ''), external_ref), error = NULLIF(?, ''),
	lease_owner = NULL, lease_until = NULL, updated_at = ?, expires_at = COALESCE(?, expires_at)` + where + ` AND attempt = ? AND status = ?`,
		TakeOver: `UPDATE inbox SET attempt = attempt + 1, lease_owner = ?, lease_until = ?, updated_at = ?` + where +
			` AND attempt = ? AND status = 'processing' AND (lease_until IS NULL OR lease_until < ?)`,
		ExtendLease:   `UPDATE inbox SET lease_until = ?, updated_at = ?` + where + ` AND attempt = ? AND status = 'processing'`,
		SelectPending: `SELECT ` + cols + ` FROM inbox WHERE status = 'pending' ORDER BY updated_at LIMIT ?`,
		SelectStale: `SELECT ` + cols + ` FROM inbox
WHERE status = 'processing' AND (lease_until IS NULL OR lease_until < ?) AND updated_at < ?
ORDER BY updated_at LIMIT ?`,
		UnfinishedStats: `SELECT status, COUNT(*), MIN(created_at) FROM inbox WHERE status IN ` + unfinishedStatuses + ` GROUP BY status`,
		OldestExpired:   `SELECT MIN(expires_at) FROM inbox WHERE expires_at IS NOT NULL AND status IN ` + finishedStatuses,
		// DELETE ... LIMIT is a compile-time option of SQLite; a row-value
		// IN over the primary key works everywhere.
		Purge: `DELETE FROM inbox WHERE (scope, operation, "key") IN (
	SELECT scope, operation, "key" FROM inbox
	WHERE expires_at < ? AND status IN ` + finishedStatuses + ` LIMIT ?)`,
		Delete: `DELETE FROM inbox` + where,

		CreateMigrationsTable: `CREATE TABLE IF NOT EXISTS inbox_migrations (
	version    INTEGER NOT NULL PRIMARY KEY,
	name       TEXT    NOT NULL,
	applied_at INTEGER NOT NULL
)`,
		SelectMigrations: `SELECT version FROM inbox_migrations ORDER BY version`,
		SelectMigration:  `SELECT COUNT(*) FROM inbox_migrations WHERE version = ?`,
		InsertMigration:  `INSERT INTO inbox_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
		// No lock statement: SQLite serializes writers and its DDL is
		// transactional, so a second process's migration transaction either
		// waits and then sees the version applied, or fails on the version's
		// primary key and rolls back whole.
	}
	return q.rename(table)
}

// sqliteCoder is implemented by modernc.org/sqlite's *Error.
type sqliteCoder interface{ Code() int }

func (sqliteDialect) Classify(err error) error {
	if err == nil {
		return nil
	}
	var ce sqliteCoder
	if errors.As(err, &ce) {
		switch ce.Code() & 0xff { // primary result code
		case 5, // SQLITE_BUSY
			6: // SQLITE_LOCKED
			return transient(err)
		}
		return err
	}
	return err
}
