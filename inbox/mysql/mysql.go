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
	"strings"
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

func (q queries) ResultLimit() inbox.Query {
	// max_allowed_packet bounds one packet. Bound as a parameter of a
	// server-side prepared statement (the driver's default, and every
	// statement the store prepares) the result is sent in packets of its
	// own, and may take the whole packet less inbox.ResultMargin for the
	// rest of the statement. With interpolateParams=true the driver writes
	// it into the statement's text instead, escaped, up to twice its size:
	// half the packet. The sample result bound here tells which: the
	// driver interpolates a []byte as a _binary literal, whose CHARSET is
	// 'binary'; bound, it is a string of the connection's character set.
	return q.q("SELECT CAST(@@max_allowed_packet AS SIGNED) DIV IF(CHARSET(?) = 'binary', 2, 1) - 65536",
		inbox.ArgResult)
}

func (q queries) Savepoint(name string) inbox.Query { return q.q("SAVEPOINT " + name) }
func (q queries) ReleaseSavepoint(name string) inbox.Query {
	return q.q("RELEASE SAVEPOINT " + name)
}
func (q queries) RollbackToSavepoint(name string) inbox.Query {
	return q.q("ROLLBACK TO SAVEPOINT " + name)
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

func (q queries) MissingTables() inbox.Query {
	return q.q("SELECT t.name FROM (SELECT '{{table}}' AS name UNION ALL SELECT '{{table}}_audit') AS t\n" +
		"WHERE NOT EXISTS (SELECT 1 FROM information_schema.tables\n" +
		"\tWHERE table_schema = DATABASE() AND table_name = t.name)")
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

// The operator tools' statements. Optional filters are written as
// "(? = '' OR column = ?)", so that one static statement serves every
// combination; a parameter a statement compares twice is bound twice.

// In the scans below, every value compared with scope, operation or key
// is cast to binary, as those VARBINARY columns are: compared with a
// string of the connection's character set, MariaDB still uses the
// primary key for the range, but no longer sees that it delivers the
// ORDER BY once a filter makes a key column constant, and sorts every
// remaining row for each page.

// afterKey continues a keyset scan after a primary key. MariaDB does not
// turn a row-value comparison into an index range, so it is spelled out,
// led by a range on scope that it does use.
const afterKey = "scope >= CAST(? AS BINARY) AND (scope > CAST(? AS BINARY) OR (scope = CAST(? AS BINARY) AND\n" +
	"\t(operation > CAST(? AS BINARY) OR (operation = CAST(? AS BINARY) AND `key` > CAST(? AS BINARY)))))"

var afterArgs = []inbox.Arg{inbox.ArgAfterScope, inbox.ArgAfterScope, inbox.ArgAfterScope, inbox.ArgAfterOperation,
	inbox.ArgAfterOperation, inbox.ArgAfterKey}

// byOperation keeps one operation's records when the parameter is not "".
const byOperation = "(? = '' OR operation = CAST(? AS BINARY))"

func (q queries) ListRecords() inbox.Query {
	return q.q("SELECT "+cols+" FROM `{{table}}`\n"+
		"WHERE "+afterKey+"\n"+
		"\tAND (? = '' OR status = ?) AND "+byOperation+" AND (? = 0 OR scope = CAST(? AS BINARY))\n"+
		"\tAND (? IS NULL OR created_at < ?) AND attempt > ?\n"+
		"ORDER BY scope, operation, `key` LIMIT ?",
		append(append([]inbox.Arg{}, afterArgs...), inbox.ArgStatus, inbox.ArgStatus, inbox.ArgOperation,
			inbox.ArgOperation, inbox.ArgByScope, inbox.ArgScope, inbox.ArgBefore, inbox.ArgBefore, inbox.ArgAttempt,
			inbox.ArgLimit)...)
}

func (q queries) ListRecordsBy(o inbox.ListOrder) inbox.Query {
	after, cmp, dir := inbox.ArgAfterTime, ">", ""
	if o.Column == inbox.OrderByAttempt {
		after = inbox.ArgAfterAttempt
	}
	if o.Desc {
		cmp, dir = "<", " DESC"
	}
	col := string(o.Column)
	// No index serves this order: the row-value comparison costs nothing
	// that the sort does not already.
	return q.q("SELECT "+cols+" FROM `{{table}}`\n"+
		"WHERE (? = 0 OR ("+col+", scope, operation, `key`) "+cmp+" (?, CAST(? AS BINARY), CAST(? AS BINARY), CAST(? AS BINARY)))\n"+
		"\tAND (? = '' OR status = ?) AND "+byOperation+" AND (? = 0 OR scope = CAST(? AS BINARY))\n"+
		"\tAND (? IS NULL OR created_at < ?) AND attempt > ?\n"+
		"ORDER BY "+col+dir+", scope"+dir+", operation"+dir+", `key`"+dir+" LIMIT ?",
		inbox.ArgAfterSet, after, inbox.ArgAfterScope, inbox.ArgAfterOperation, inbox.ArgAfterKey, inbox.ArgStatus,
		inbox.ArgStatus, inbox.ArgOperation, inbox.ArgOperation, inbox.ArgByScope, inbox.ArgScope, inbox.ArgBefore,
		inbox.ArgBefore, inbox.ArgAttempt, inbox.ArgLimit)
}

func (q queries) SelectKeys() inbox.Query {
	return q.q("SELECT scope, operation, `key` FROM `{{table}}`\n"+
		"WHERE "+afterKey+" AND "+byOperation+"\n"+
		"ORDER BY scope, operation, `key` LIMIT ?",
		append(append([]inbox.Arg{}, afterArgs...), inbox.ArgOperation, inbox.ArgOperation, inbox.ArgLimit)...)
}

func (q queries) KeyAt() inbox.Query {
	return q.q("SELECT scope, operation, `key` FROM `{{table}}`\n"+
		"WHERE "+afterKey+" AND "+byOperation+"\n"+
		"ORDER BY scope, operation, `key` LIMIT 1 OFFSET ?",
		append(append([]inbox.Arg{}, afterArgs...), inbox.ArgOperation, inbox.ArgOperation, inbox.ArgOffset)...)
}

// untilKey is afterKey's other end: the keys up to and including one,
// written out so that the range optimizer bounds an index scan with it.
const untilKey = "scope <= CAST(? AS BINARY) AND (scope < CAST(? AS BINARY) OR (scope = CAST(? AS BINARY) AND\n" +
	"\t(operation < CAST(? AS BINARY) OR (operation = CAST(? AS BINARY) AND `key` <= CAST(? AS BINARY)))))"

var untilArgs = []inbox.Arg{inbox.ArgUntilScope, inbox.ArgUntilScope, inbox.ArgUntilScope, inbox.ArgUntilOperation,
	inbox.ArgUntilOperation, inbox.ArgUntilKey}

// digestSQL is ID.Digest of a row: scope, operation and key (VARBINARY:
// the bytes the store wrote), each followed by a NUL byte, hashed; the
// first 16 hex characters.
const digestSQL = "LEFT(SHA2(CONCAT(scope, CHAR(0), operation, CHAR(0), `key`, CHAR(0)), 256), 16)"

func (q queries) SelectDigest() inbox.Query {
	args := append(append([]inbox.Arg{}, afterArgs...), untilArgs...)
	return q.q("SELECT scope, operation, `key` FROM `{{table}}`\n"+
		"WHERE "+afterKey+"\n\tAND "+untilKey+"\n\tAND "+byOperation+" AND "+digestSQL+" = ?\n"+
		"ORDER BY scope, operation, `key`",
		append(args, inbox.ArgOperation, inbox.ArgOperation, inbox.ArgDigest)...)
}

func (q queries) CountByOperation() inbox.Query {
	return q.q("SELECT operation, status, COUNT(*) FROM `{{table}}` GROUP BY operation, status")
}

func (q queries) CountByUpdated() inbox.Query {
	return q.q("SELECT status, FLOOR(TIMESTAMPDIFF(MICROSECOND, ?, updated_at) / ?) AS bucket, COUNT(*) FROM `{{table}}`\n"+
		"WHERE updated_at >= ? AND updated_at < ? GROUP BY status, bucket",
		inbox.ArgSince, inbox.ArgWidth, inbox.ArgSince, inbox.ArgBefore)
}

func (q queries) OldestPending() inbox.Query {
	return q.q("SELECT " + cols + " FROM `{{table}}` WHERE status = 'pending' ORDER BY created_at LIMIT 1")
}

func (q queries) OldestExpiredLease() inbox.Query {
	return q.q("SELECT "+cols+" FROM `{{table}}`\n"+
		"WHERE status = 'processing' AND (lease_until IS NULL OR lease_until < ?) ORDER BY created_at LIMIT 1", inbox.ArgNow)
}

func (q queries) OldestCreated() inbox.Query {
	return q.q("SELECT MIN(created_at) FROM `{{table}}` WHERE ? = '' OR operation = ?", inbox.ArgOperation, inbox.ArgOperation)
}

func (q queries) CountPurgeable() inbox.Query {
	return q.q("SELECT COUNT(*) FROM `{{table}}` WHERE expires_at < ? AND status IN "+inbox.FinishedStatuses,
		inbox.ArgBefore)
}

func (q queries) SelectForUpdate() inbox.Query {
	return q.q("SELECT "+cols+" FROM `{{table}}`"+where+" FOR UPDATE", idArgs...)
}

// Resolve always changes status (from pending or processing to completed
// or failed), so its rows affected is exact even without CLIENT_FOUND_ROWS.
func (q queries) Resolve() inbox.Query {
	return q.q("UPDATE `{{table}}` SET status = ?, external_ref = COALESCE(NULLIF(?, ''), external_ref),\n"+
		"\terror = NULLIF(?, ''), lease_owner = NULL, lease_until = NULL, updated_at = ?, expires_at = ?"+
		where+" AND attempt = ? AND status = ?\n"+
		"\tAND (status = 'pending' OR lease_until IS NULL OR lease_until < ?)",
		append([]inbox.Arg{inbox.ArgStatus, inbox.ArgExternalRef, inbox.ArgError, inbox.ArgUpdatedAt, inbox.ArgExpiresAt},
			withID(inbox.ArgAttempt, inbox.ArgFromStatus, inbox.ArgNow)...)...)
}

func (q queries) Forget() inbox.Query {
	return q.q("DELETE FROM `{{table}}`"+where+" AND attempt = ? AND status = ?\n"+
		"\tAND (status <> 'processing' OR lease_until IS NULL OR lease_until < ?)",
		withID(inbox.ArgAttempt, inbox.ArgFromStatus, inbox.ArgNow)...)
}

func (q queries) InsertAudit() inbox.Query {
	return q.q("INSERT INTO `{{table}}_audit` (audit_id, logged_at, actor, action, scope, operation, `key`,\n"+
		"\tstatus_before, attempt_before, status_after, reason, before_json, affected)\n"+
		"VALUES (?, ?, ?, ?, ?, ?, ?, NULLIF(?, ''), ?, NULLIF(?, ''), ?, NULLIF(?, ''), ?)",
		inbox.ArgAuditID, inbox.ArgNow, inbox.ArgActor, inbox.ArgAction, inbox.ArgScope, inbox.ArgOperation,
		inbox.ArgKey, inbox.ArgStatusBefore, inbox.ArgAttemptBefore, inbox.ArgStatusAfter, inbox.ArgReason,
		inbox.ArgBeforeJSON, inbox.ArgAffected)
}

func (q queries) UpdateAuditCount() inbox.Query {
	return q.q("UPDATE `{{table}}_audit` SET affected = ? WHERE audit_id = ?", inbox.ArgAffected, inbox.ArgAuditID)
}

func (q queries) ListAudit() inbox.Query {
	return q.q("SELECT audit_id, logged_at, actor, action, scope, operation, `key`, status_before, attempt_before,\n"+
		"\tstatus_after, reason, before_json, affected FROM `{{table}}_audit`\n"+
		"WHERE (? = '' OR (scope = CAST(? AS BINARY) AND operation = CAST(? AS BINARY) AND `key` = CAST(? AS BINARY)))\n"+
		"\tAND (? = '' OR action = ?)\n"+
		"\tAND (? = '' OR audit_id < ?)\n"+
		"ORDER BY audit_id DESC LIMIT ?",
		inbox.ArgOperation, inbox.ArgScope, inbox.ArgOperation, inbox.ArgKey, inbox.ArgAction, inbox.ArgAction,
		inbox.ArgAuditID, inbox.ArgAuditID, inbox.ArgLimit)
}

// The statements over several records repeat one row's placeholders per
// record. MySQL has no RETURNING, so the store reads the records first
// (SelectMany, a plain read that takes no gap locks) and inserts the rest.

func (q queries) InsertMany(rows int) inbox.RowsQuery {
	// INSERT IGNORE skips a taken key and, like Insert, waits on a key
	// another transaction holds; the store has sorted the rows by key.
	return inbox.RowsQuery{SQL: q.q("INSERT IGNORE INTO `{{table}}` (scope, operation, `key`, payload_hash, status, attempt,\n" +
		"\tcorrelation_id, error, created_at, updated_at, expires_at, lease_owner, lease_until)\nVALUES " +
		repeatRow("(?, ?, ?, ?, ?, 1, NULLIF(?, ''), NULLIF(?, ''), ?, ?, ?, NULLIF(?, ''), ?)", rows)).SQL,
		RowArgs: []inbox.Arg{inbox.ArgScope, inbox.ArgOperation, inbox.ArgKey, inbox.ArgPayloadHash, inbox.ArgStatus,
			inbox.ArgCorrelationID, inbox.ArgError, inbox.ArgCreatedAt, inbox.ArgUpdatedAt, inbox.ArgExpiresAt,
			inbox.ArgLeaseOwner, inbox.ArgLeaseUntil}}
}

// FinishMany joins the table with a derived table of the rows' values
// (one SELECT per record, UNION ALL: portable between MariaDB and MySQL,
// whose VALUES constructors differ). It returns nothing; the store
// counts the rows changed, and a status change always changes the row.
func (q queries) FinishMany(rows int) inbox.RowsQuery {
	first := "SELECT ? AS scope, ? AS operation, ? AS `key`, ? AS status, ? AS result, ? AS resource_id,\n" +
		"\t? AS external_ref, ? AS error, ? AS updated_at, ? AS expires_at, ? AS attempt, ? AS from_status"
	rest := strings.Repeat("\n\tUNION ALL SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?", max(rows, 1)-1)
	return inbox.RowsQuery{SQL: q.q("UPDATE `{{table}}` AS t JOIN (" + first + rest + ") AS r\n" +
		"\tON t.scope = r.scope AND t.operation = r.operation AND t.`key` = r.`key`\n" +
		"\tAND t.attempt = r.attempt AND t.status = r.from_status\n" +
		"SET t.status = r.status, t.result = r.result, t.resource_id = NULLIF(r.resource_id, ''),\n" +
		"\tt.external_ref = COALESCE(NULLIF(r.external_ref, ''), t.external_ref), t.error = NULLIF(r.error, ''),\n" +
		"\tt.lease_owner = NULL, t.lease_until = NULL, t.updated_at = r.updated_at,\n" +
		"\tt.expires_at = COALESCE(r.expires_at, t.expires_at)").SQL,
		RowArgs: []inbox.Arg{inbox.ArgScope, inbox.ArgOperation, inbox.ArgKey, inbox.ArgStatus, inbox.ArgResult,
			inbox.ArgResourceID, inbox.ArgExternalRef, inbox.ArgError, inbox.ArgUpdatedAt, inbox.ArgExpiresAt,
			inbox.ArgAttempt, inbox.ArgFromStatus}}
}

func (q queries) SelectMany(rows int) inbox.RowsQuery {
	// A disjunction of primary-key lookups, which MariaDB reads as one
	// range per key (it does not always for a row-value IN list).
	cond := strings.Repeat(" OR (scope = ? AND operation = ? AND `key` = ?)", max(rows, 1))[len(" OR "):]
	return inbox.RowsQuery{SQL: q.q("SELECT " + cols + " FROM `{{table}}` WHERE " + cond).SQL, RowArgs: idArgs}
}

// repeatRow joins rows copies of row with ", ".
func repeatRow(row string, rows int) string {
	return strings.Repeat(", "+row, max(rows, 1))[len(", "):]
}
