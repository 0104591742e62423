// Package mysql is the inbox dialect of MySQL and MariaDB, for
// github.com/go-sql-driver/mysql: its SQL, its schema migrations and the
// classification of its errors. It is the only inboxmill package that
// imports a driver, for the driver's error type.
//
// The DSN should set parseTime=true; times are read correctly without it
// too, as long as loc is UTC (the driver's default).
//
//	db, err := sql.Open("mysql", "user@tcp(host:3306)/db?parseTime=true")
//	store, err := inbox.NewStore(db, mysql.Dialect(), inbox.Config{})
package mysql

import (
	"embed"
	"errors"
	"io/fs"
	"time"

	driver "github.com/go-sql-driver/mysql"

	"github.com/inboxmill/inboxmill/inbox"
)

// Dialect returns the MySQL / MariaDB dialect.
func Dialect() inbox.Dialect { return dialect{} }

type dialect struct{}

//go:embed migrations/*.sql
var migrations embed.FS

func (dialect) Name() string { return "mysql" }

func (dialect) Capabilities() inbox.Capabilities {
	return inbox.Capabilities{
		// The driver prepares, executes and closes a statement for every
		// parameterized call unless it is prepared once.
		PreferPrepare: true,
		// Without CLIENT_FOUND_ROWS an UPDATE that changes no value
		// reports 0 rows.
		ZeroRowsAmbiguous: true,
		// DDL commits implicitly, so transactions cannot keep two
		// migrating processes apart; a named lock can.
		MigrationLock: true,
	}
}

func (dialect) Migrations() fs.FS {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		panic(err) // embedded at build time
	}
	return sub
}

func (dialect) Placeholder(int) string { return "?" }

func (dialect) TimeArg(t time.Time) any { return t.UTC() }

func (dialect) Queries(table string) inbox.Queries { return queries{t: table} }

func (dialect) Classify(err error) error {
	var me *driver.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case 1213, // ER_LOCK_DEADLOCK (also Galera's certification failure)
			1205, // ER_LOCK_WAIT_TIMEOUT
			1020, // ER_CHECKREAD: record changed since last read
			1047, // ER_UNKNOWN_COM_ERROR: a Galera node outside the primary component
			1927, // ER_CONNECTION_KILLED (MariaDB)
			1053, // ER_SERVER_SHUTDOWN
			1040, // ER_CON_COUNT_ERROR
			2006, // CR_SERVER_GONE_ERROR
			2013: // CR_SERVER_LOST
			return inbox.Transient(err)
		case 1461: // ER_MAX_PREPARED_STMT_COUNT_REACHED
			return inbox.PrepareRefused(err)
		}
		return err
	}
	if errors.Is(err, driver.ErrInvalidConn) {
		return inbox.Transient(err)
	}
	return err
}

type queries struct{ t string }

func (q queries) q(sql string, args ...inbox.Arg) inbox.Query {
	return inbox.Query{SQL: inbox.MustRenderSQL(sql, q.t), Args: args}
}

var (
	cols   = inbox.RecordColumns("`key`")
	idArgs = []inbox.Arg{inbox.ArgScope, inbox.ArgOperation, inbox.ArgKey}
)

const where = " WHERE scope = ? AND operation = ? AND `key` = ?"

// withID is the ID's args followed by args: the order of the placeholders
// in where followed by the conditions a statement adds after it.
func withID(args ...inbox.Arg) []inbox.Arg { return append(append([]inbox.Arg{}, idArgs...), args...) }

func (q queries) Insert() inbox.Query {
	// INSERT IGNORE reports 0 rows affected for a taken key whatever
	// CLIENT_FOUND_ROWS says (that flag only changes UPDATE counts), and a
	// concurrent insert of the same key waits on its row lock.
	return q.q("INSERT IGNORE INTO `{{table}}` (scope, operation, `key`, payload_hash, status, attempt, lease_owner,\n"+
		"\tlease_until, correlation_id, error, created_at, updated_at, expires_at)\n"+
		"VALUES (?, ?, ?, ?, ?, 1, NULLIF(?, ''), ?, NULLIF(?, ''), NULLIF(?, ''), ?, ?, ?)",
		inbox.ArgScope, inbox.ArgOperation, inbox.ArgKey, inbox.ArgPayloadHash, inbox.ArgStatus, inbox.ArgLeaseOwner,
		inbox.ArgLeaseUntil, inbox.ArgCorrelationID, inbox.ArgError, inbox.ArgCreatedAt, inbox.ArgUpdatedAt,
		inbox.ArgExpiresAt)
}

func (q queries) SelectForClaim() inbox.Query {
	// A locking read: under REPEATABLE READ a plain SELECT reads the
	// transaction's snapshot, which may predate the row that made the
	// INSERT IGNORE a no-op.
	return q.q("SELECT "+cols+" FROM `{{table}}`"+where+" LOCK IN SHARE MODE", idArgs...)
}

func (q queries) Select() inbox.Query {
	return q.q("SELECT "+cols+" FROM `{{table}}`"+where, idArgs...)
}

func (q queries) Finish() inbox.Query {
	return q.q("UPDATE `{{table}}` SET status = ?, result = ?, resource_id = NULLIF(?, ''),\n"+
		"\texternal_ref = COALESCE(NULLIF(?, ''), external_ref), error = NULLIF(?, ''),\n"+
		"\tlease_owner = NULL, lease_until = NULL, updated_at = ?, expires_at = COALESCE(?, expires_at)"+
		where+" AND attempt = ? AND status = ?",
		append([]inbox.Arg{inbox.ArgStatus, inbox.ArgResult, inbox.ArgResourceID, inbox.ArgExternalRef, inbox.ArgError,
			inbox.ArgUpdatedAt, inbox.ArgExpiresAt}, withID(inbox.ArgAttempt, inbox.ArgFromStatus)...)...)
}

func (q queries) TakeOver() inbox.Query {
	return q.q("UPDATE `{{table}}` SET attempt = attempt + 1, lease_owner = ?, lease_until = ?, updated_at = ?"+
		where+" AND attempt = ? AND status = 'processing' AND (lease_until IS NULL OR lease_until < ?)",
		append([]inbox.Arg{inbox.ArgLeaseOwner, inbox.ArgLeaseUntil, inbox.ArgUpdatedAt},
			withID(inbox.ArgAttempt, inbox.ArgNow)...)...)
}

func (q queries) ExtendLease() inbox.Query {
	return q.q("UPDATE `{{table}}` SET lease_until = ?, updated_at = ?"+where+" AND attempt = ? AND status = 'processing'",
		append([]inbox.Arg{inbox.ArgLeaseUntil, inbox.ArgUpdatedAt}, withID(inbox.ArgAttempt)...)...)
}

// SelectPending, SelectStale and UnfinishedStats read the index
// <table>_status_updated_idx (status, updated_at) of migration 2: in status
// order, then oldest update first, so the scans need no sort. It is on
// updated_at rather than lease_until because MySQL has no partial index:
// finished rows are in it too, and by updated_at they are added at the end
// of their status's range instead of at random.

func (q queries) SelectPending() inbox.Query {
	return q.q("SELECT "+cols+" FROM `{{table}}` WHERE status = 'pending' ORDER BY updated_at LIMIT ?", inbox.ArgLimit)
}

func (q queries) SelectStale() inbox.Query {
	return q.q("SELECT "+cols+" FROM `{{table}}`\n"+
		"WHERE status = 'processing' AND (lease_until IS NULL OR lease_until < ?) AND updated_at < ?\n"+
		"ORDER BY updated_at LIMIT ?", inbox.ArgNow, inbox.ArgBefore, inbox.ArgLimit)
}

func (q queries) UnfinishedStats() inbox.Query {
	return q.q("SELECT status, COUNT(*), MIN(created_at) FROM `{{table}}` WHERE status IN " +
		inbox.UnfinishedStatuses + " GROUP BY status")
}

func (q queries) OldestExpired() inbox.Query {
	return q.q("SELECT MIN(expires_at) FROM `{{table}}` WHERE expires_at IS NOT NULL AND status IN " + inbox.FinishedStatuses)
}

func (q queries) Purge() inbox.Query {
	// One short autocommit statement per batch; the expires_at index keeps
	// it to the rows it deletes. Unlike PostgreSQL's SKIP LOCKED it waits
	// on rows a claim holds, for at most the claim's duration.
	return q.q("DELETE FROM `{{table}}` WHERE expires_at < ? AND status IN "+inbox.FinishedStatuses+
		" ORDER BY expires_at LIMIT ?", inbox.ArgBefore, inbox.ArgLimit)
}

func (q queries) Delete() inbox.Query { return q.q("DELETE FROM `{{table}}`"+where, idArgs...) }

func (q queries) Clock() inbox.Query {
	// UTC_TIMESTAMP, not NOW(): immune to the session's time zone.
	return q.q("SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))")
}

func (q queries) Savepoint() inbox.Query        { return q.q("SAVEPOINT inboxmill_attempt") }
func (q queries) ReleaseSavepoint() inbox.Query { return q.q("RELEASE SAVEPOINT inboxmill_attempt") }
func (q queries) RollbackToSavepoint() inbox.Query {
	return q.q("ROLLBACK TO SAVEPOINT inboxmill_attempt")
}

func (q queries) CreateMigrationsTable() inbox.Query {
	return q.q("CREATE TABLE IF NOT EXISTS `{{table}}_migrations` (\n" +
		"\tversion    INT          NOT NULL PRIMARY KEY,\n" +
		"\tname       VARCHAR(255) NOT NULL,\n" +
		"\tapplied_at DATETIME(6)  NOT NULL\n" +
		") ENGINE = InnoDB DEFAULT CHARSET = utf8mb4")
}

func (q queries) MigrationsTableExists() inbox.Query {
	return q.q("SELECT COUNT(*) FROM information_schema.tables\n" +
		"WHERE table_schema = DATABASE() AND table_name = '{{table}}_migrations'")
}

func (q queries) SelectMigrations() inbox.Query {
	return q.q("SELECT version FROM `{{table}}_migrations` ORDER BY version")
}

func (q queries) SelectMigration() inbox.Query {
	return q.q("SELECT COUNT(*) FROM `{{table}}_migrations` WHERE version = ?", inbox.ArgVersion)
}

func (q queries) InsertMigration() inbox.Query {
	return q.q("INSERT INTO `{{table}}_migrations` (version, name, applied_at) VALUES (?, ?, ?)",
		inbox.ArgVersion, inbox.ArgName, inbox.ArgNow)
}

func (q queries) DropMigrationsTable() inbox.Query {
	return q.q("DROP TABLE IF EXISTS `{{table}}_migrations`")
}

func (q queries) DeleteMigration() inbox.Query {
	return q.q("DELETE FROM `{{table}}_migrations` WHERE version = ?", inbox.ArgVersion)
}

// GET_LOCK returns 0 on timeout and NULL on error, both of which Migrate
// reports.
func (q queries) LockMigrations() inbox.Query {
	return q.q("SELECT COALESCE(GET_LOCK(?, 600), 0)", inbox.ArgLockName)
}

func (q queries) UnlockMigrations() inbox.Query {
	return q.q("SELECT COALESCE(RELEASE_LOCK(?), 0)", inbox.ArgLockName)
}
