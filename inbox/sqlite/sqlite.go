// Package sqlite is the inbox dialect of SQLite, written for the pure-Go
// driver modernc.org/sqlite (which it does not import: the program does).
// It is the embedded default: no server to run.
//
// SQLite allows one writer at a time. Open the database so that writers
// queue instead of failing, and so that a transaction takes the write lock
// when it begins rather than when it first writes (an upgrade from reader
// to writer cannot wait and fails at once when another writer got there
// first); [DSN] builds such a DSN:
//
//	db, err := sql.Open("sqlite", sqlite.DSN("inbox.db")) // import _ "modernc.org/sqlite"
//	store, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{})
package sqlite

import (
	"embed"
	"errors"
	"io/fs"
	"strings"
	"time"

	"github.com/inboxmill/inboxmill/inbox"
)

// Dialect returns the SQLite dialect.
func Dialect() inbox.Dialect { return dialect{} }

// DSN returns a modernc.org/sqlite DSN for the database file at path with
// the settings the inbox needs: a 10 s busy timeout, WAL journaling, and
// transactions that take the write lock at BEGIN.
//
// The first connection to a new file switches it to WAL journaling, and
// connections opened at the same moment may find the file busy without
// waiting (SQLITE_BUSY, "database is locked"): ping the *sql.DB once
// before using it from several goroutines.
func DSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
}

type dialect struct{}

//go:embed migrations/*.sql
var migrations embed.FS

func (dialect) Name() string { return "sqlite" }

func (dialect) Capabilities() inbox.Capabilities {
	return inbox.Capabilities{
		// Unprepared statements are parsed again on every call.
		PreferPrepare: true,
		// Every client runs in the database's process, on its clock.
		SharedClock: true,
		// One writer at a time, whoever asks.
		SingleWriter: true,
		// No lock: SQLite serializes writers and its DDL is transactional,
		// so a second process's migration transaction either waits and then
		// sees the version applied, or fails on the version's primary key
		// and rolls back whole.
	}
}

func (dialect) Migrations() fs.FS {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		panic(err) // embedded at build time
	}
	return sub
}

// TimeArg stores microseconds since the epoch; see the migration's comment.
func (dialect) Placeholder(int) string { return "?" }

func (dialect) TimeArg(t time.Time) any { return t.UnixMicro() }

func (dialect) Queries(table string) inbox.Queries { return queries{t: table} }

// sqliteCoder is implemented by modernc.org/sqlite's *Error.
type sqliteCoder interface{ Code() int }

func (dialect) Classify(err error) error {
	var ce sqliteCoder
	if errors.As(err, &ce) {
		switch ce.Code() & 0xff { // primary result code
		case 5, // SQLITE_BUSY
			6: // SQLITE_LOCKED
			return inbox.Transient(err)
		}
	}
	return err
}

type queries struct{ t string }

func (q queries) q(sql string, args ...inbox.Arg) inbox.Query {
	return inbox.Query{SQL: inbox.MustRenderSQL(sql, q.t), Args: args}
}

var (
	cols   = inbox.RecordColumns(`"key"`)
	idArgs = []inbox.Arg{inbox.ArgScope, inbox.ArgOperation, inbox.ArgKey}
)

const where = ` WHERE scope = ? AND operation = ? AND "key" = ?`

// withID is the ID's args followed by args: the order of the placeholders
// in where followed by the conditions a statement adds after it.
func withID(args ...inbox.Arg) []inbox.Arg { return append(append([]inbox.Arg{}, idArgs...), args...) }

func (q queries) Insert() inbox.Query {
	return q.q(`INSERT INTO "{{table}}" (scope, operation, "key", payload_hash, status, attempt, lease_owner,
	lease_until, correlation_id, error, created_at, updated_at, expires_at)
VALUES (?, ?, ?, ?, ?, 1, NULLIF(?, ''), ?, NULLIF(?, ''), NULLIF(?, ''), ?, ?, ?)
ON CONFLICT (scope, operation, "key") DO NOTHING`,
		inbox.ArgScope, inbox.ArgOperation, inbox.ArgKey, inbox.ArgPayloadHash, inbox.ArgStatus, inbox.ArgLeaseOwner,
		inbox.ArgLeaseUntil, inbox.ArgCorrelationID, inbox.ArgError, inbox.ArgCreatedAt, inbox.ArgUpdatedAt,
		inbox.ArgExpiresAt)
}

// SelectForClaim is a plain read: SQLite has one writer at a time, so once
// the Insert ran the transaction holds the write lock and reads the latest
// data.
func (q queries) SelectForClaim() inbox.Query { return q.Select() }

func (q queries) Select() inbox.Query {
	return q.q(`SELECT `+cols+` FROM "{{table}}"`+where, idArgs...)
}

func (q queries) Finish() inbox.Query {
	return q.q(`UPDATE "{{table}}" SET status = ?, result = ?, resource_id = NULLIF(?, ''),
	external_ref = COALESCE(NULLIF(?, ''), external_ref), error = NULLIF(?, ''),
	lease_owner = NULL, lease_until = NULL, updated_at = ?, expires_at = COALESCE(?, expires_at)`+where+
		` AND attempt = ? AND status = ?`,
		append([]inbox.Arg{inbox.ArgStatus, inbox.ArgResult, inbox.ArgResourceID, inbox.ArgExternalRef, inbox.ArgError,
			inbox.ArgUpdatedAt, inbox.ArgExpiresAt}, withID(inbox.ArgAttempt, inbox.ArgFromStatus)...)...)
}

func (q queries) TakeOver() inbox.Query {
	return q.q(`UPDATE "{{table}}" SET attempt = attempt + 1, lease_owner = ?, lease_until = ?, updated_at = ?`+where+
		` AND attempt = ? AND status = 'processing' AND (lease_until IS NULL OR lease_until < ?)`,
		append([]inbox.Arg{inbox.ArgLeaseOwner, inbox.ArgLeaseUntil, inbox.ArgUpdatedAt},
			withID(inbox.ArgAttempt, inbox.ArgNow)...)...)
}

func (q queries) ExtendLease() inbox.Query {
	return q.q(`UPDATE "{{table}}" SET lease_until = ?, updated_at = ?`+where+` AND attempt = ? AND status = 'processing'`,
		append([]inbox.Arg{inbox.ArgLeaseUntil, inbox.ArgUpdatedAt}, withID(inbox.ArgAttempt)...)...)
}

func (q queries) SelectPending() inbox.Query {
	return q.q(`SELECT `+cols+` FROM "{{table}}" WHERE status = 'pending' ORDER BY updated_at LIMIT ?`, inbox.ArgLimit)
}

func (q queries) SelectStale() inbox.Query {
	return q.q(`SELECT `+cols+` FROM "{{table}}"
WHERE status = 'processing' AND (lease_until IS NULL OR lease_until < ?) AND updated_at < ?
ORDER BY updated_at LIMIT ?`, inbox.ArgNow, inbox.ArgBefore, inbox.ArgLimit)
}

func (q queries) UnfinishedStats() inbox.Query {
	return q.q(`SELECT status, COUNT(*), MIN(created_at) FROM "{{table}}" WHERE status IN ` +
		inbox.UnfinishedStatuses + ` GROUP BY status`)
}

func (q queries) OldestExpired() inbox.Query {
	return q.q(`SELECT MIN(expires_at) FROM "{{table}}" WHERE expires_at IS NOT NULL AND status IN ` + inbox.FinishedStatuses)
}

func (q queries) Purge() inbox.Query {
	// DELETE ... LIMIT is a compile-time option of SQLite; a row-value IN
	// over the primary key works everywhere.
	return q.q(`DELETE FROM "{{table}}" WHERE (scope, operation, "key") IN (
	SELECT scope, operation, "key" FROM "{{table}}"
	WHERE expires_at < ? AND status IN `+inbox.FinishedStatuses+` LIMIT ?)`, inbox.ArgBefore, inbox.ArgLimit)
}

func (q queries) Delete() inbox.Query { return q.q(`DELETE FROM "{{table}}"`+where, idArgs...) }

// Clock is never used (Capabilities.SharedClock) but answers correctly.
func (q queries) Clock() inbox.Query {
	return q.q(`SELECT CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)`)
}

func (q queries) ResultLimit() inbox.Query {
	// SQLITE_MAX_LENGTH (1e9 bytes in the default build, which
	// modernc.org/sqlite keeps) bounds a value and a whole row; SQL cannot
	// read the connection's limit, so this is the build's default, less
	// inbox.ResultMargin.
	return q.q(`SELECT 1000000000 - 65536`)
}

func (q queries) Savepoint(name string) inbox.Query { return q.q("SAVEPOINT " + name) }
func (q queries) ReleaseSavepoint(name string) inbox.Query {
	return q.q("RELEASE SAVEPOINT " + name)
}
func (q queries) RollbackToSavepoint(name string) inbox.Query {
	return q.q("ROLLBACK TO SAVEPOINT " + name)
}

func (q queries) CreateMigrationsTable() inbox.Query {
	return q.q(`CREATE TABLE IF NOT EXISTS "{{table}}_migrations" (
	version    INTEGER NOT NULL PRIMARY KEY,
	name       TEXT    NOT NULL,
	applied_at INTEGER NOT NULL
)`)
}

func (q queries) MigrationsTableExists() inbox.Query {
	return q.q(`SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '{{table}}_migrations'`)
}

func (q queries) MissingTables() inbox.Query {
	return q.q(`SELECT t.name FROM (SELECT '{{table}}' AS name UNION ALL SELECT '{{table}}_audit') AS t
WHERE NOT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND sqlite_master.name = t.name)`)
}

func (q queries) SelectMigrations() inbox.Query {
	return q.q(`SELECT version FROM "{{table}}_migrations" ORDER BY version`)
}

func (q queries) SelectMigration() inbox.Query {
	return q.q(`SELECT COUNT(*) FROM "{{table}}_migrations" WHERE version = ?`, inbox.ArgVersion)
}

func (q queries) InsertMigration() inbox.Query {
	return q.q(`INSERT INTO "{{table}}_migrations" (version, name, applied_at) VALUES (?, ?, ?)`,
		inbox.ArgVersion, inbox.ArgName, inbox.ArgNow)
}

func (q queries) DropMigrationsTable() inbox.Query {
	return q.q(`DROP TABLE IF EXISTS "{{table}}_migrations"`)
}

func (q queries) DeleteMigration() inbox.Query {
	return q.q(`DELETE FROM "{{table}}_migrations" WHERE version = ?`, inbox.ArgVersion)
}

// LockMigrations and UnlockMigrations are not run (no
// Capabilities.MigrationLock); they answer 1 as the contract asks.
func (q queries) LockMigrations() inbox.Query   { return q.q(`SELECT 1`) }
func (q queries) UnlockMigrations() inbox.Query { return q.q(`SELECT 1`) }

// The operator tools' statements. Optional filters are written as
// "(? = '' OR column = ?)", so that one static statement serves every
// combination; a parameter a statement compares twice is bound twice.

// afterKey continues a keyset scan after a primary key: a row-value
// comparison, which SQLite turns into a range of the primary key.
const afterKey = `(scope, operation, "key") > (?, ?, ?)`

var afterArgs = []inbox.Arg{inbox.ArgAfterScope, inbox.ArgAfterOperation, inbox.ArgAfterKey}

func (q queries) ListRecords() inbox.Query {
	return q.q(`SELECT `+cols+` FROM "{{table}}"
WHERE `+afterKey+`
	AND (? = '' OR status = ?) AND (? = '' OR operation = ?) AND (? = 0 OR scope = ?)
	AND (? IS NULL OR created_at < ?) AND attempt > ?
ORDER BY scope, operation, "key" LIMIT ?`,
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
	return q.q(`SELECT `+cols+` FROM "{{table}}"
WHERE (? = 0 OR (`+col+`, scope, operation, "key") `+cmp+` (?, ?, ?, ?))
	AND (? = '' OR status = ?) AND (? = '' OR operation = ?) AND (? = 0 OR scope = ?)
	AND (? IS NULL OR created_at < ?) AND attempt > ?
ORDER BY `+col+dir+`, scope`+dir+`, operation`+dir+`, "key"`+dir+` LIMIT ?`,
		inbox.ArgAfterSet, after, inbox.ArgAfterScope, inbox.ArgAfterOperation, inbox.ArgAfterKey, inbox.ArgStatus,
		inbox.ArgStatus, inbox.ArgOperation, inbox.ArgOperation, inbox.ArgByScope, inbox.ArgScope, inbox.ArgBefore,
		inbox.ArgBefore, inbox.ArgAttempt, inbox.ArgLimit)
}

func (q queries) SelectKeys() inbox.Query {
	return q.q(`SELECT scope, operation, "key" FROM "{{table}}"
WHERE `+afterKey+` AND (? = '' OR operation = ?)
ORDER BY scope, operation, "key" LIMIT ?`,
		append(append([]inbox.Arg{}, afterArgs...), inbox.ArgOperation, inbox.ArgOperation, inbox.ArgLimit)...)
}

func (q queries) CountByOperation() inbox.Query {
	return q.q(`SELECT operation, status, COUNT(*) FROM "{{table}}" GROUP BY operation, status`)
}

func (q queries) CountByUpdated() inbox.Query {
	// Times are integer microseconds: the division is an integer's, which
	// is the floor for the window's non-negative offsets.
	return q.q(`SELECT status, (updated_at - ?) / ? AS bucket, COUNT(*) FROM "{{table}}"
WHERE updated_at >= ? AND updated_at < ? GROUP BY status, bucket`,
		inbox.ArgSince, inbox.ArgWidth, inbox.ArgSince, inbox.ArgBefore)
}

func (q queries) OldestPending() inbox.Query {
	return q.q(`SELECT ` + cols + ` FROM "{{table}}" WHERE status = 'pending' ORDER BY created_at LIMIT 1`)
}

func (q queries) OldestExpiredLease() inbox.Query {
	return q.q(`SELECT `+cols+` FROM "{{table}}"
WHERE status = 'processing' AND (lease_until IS NULL OR lease_until < ?) ORDER BY created_at LIMIT 1`, inbox.ArgNow)
}

func (q queries) OldestCreated() inbox.Query {
	return q.q(`SELECT MIN(created_at) FROM "{{table}}" WHERE ? = '' OR operation = ?`, inbox.ArgOperation, inbox.ArgOperation)
}

func (q queries) CountPurgeable() inbox.Query {
	return q.q(`SELECT COUNT(*) FROM "{{table}}" WHERE expires_at < ? AND status IN `+inbox.FinishedStatuses,
		inbox.ArgBefore)
}

// SelectForUpdate is a plain read: SQLite has one writer at a time, and a
// transaction begun as the DSN asks (_txlock=immediate) holds the write
// lock from its start.
func (q queries) SelectForUpdate() inbox.Query { return q.Select() }

func (q queries) Resolve() inbox.Query {
	return q.q(`UPDATE "{{table}}" SET status = ?, external_ref = COALESCE(NULLIF(?, ''), external_ref),
	error = NULLIF(?, ''), lease_owner = NULL, lease_until = NULL, updated_at = ?, expires_at = ?`+where+
		` AND attempt = ? AND status = ?
	AND (status = 'pending' OR lease_until IS NULL OR lease_until < ?)`,
		append([]inbox.Arg{inbox.ArgStatus, inbox.ArgExternalRef, inbox.ArgError, inbox.ArgUpdatedAt, inbox.ArgExpiresAt},
			withID(inbox.ArgAttempt, inbox.ArgFromStatus, inbox.ArgNow)...)...)
}

func (q queries) Forget() inbox.Query {
	return q.q(`DELETE FROM "{{table}}"`+where+` AND attempt = ? AND status = ?
	AND (status <> 'processing' OR lease_until IS NULL OR lease_until < ?)`,
		withID(inbox.ArgAttempt, inbox.ArgFromStatus, inbox.ArgNow)...)
}

func (q queries) InsertAudit() inbox.Query {
	return q.q(`INSERT INTO "{{table}}_audit" (audit_id, logged_at, actor, action, scope, operation, "key",
	status_before, attempt_before, status_after, reason, before_json, affected)
VALUES (?, ?, ?, ?, ?, ?, ?, NULLIF(?, ''), ?, NULLIF(?, ''), ?, NULLIF(?, ''), ?)`,
		inbox.ArgAuditID, inbox.ArgNow, inbox.ArgActor, inbox.ArgAction, inbox.ArgScope, inbox.ArgOperation,
		inbox.ArgKey, inbox.ArgStatusBefore, inbox.ArgAttemptBefore, inbox.ArgStatusAfter, inbox.ArgReason,
		inbox.ArgBeforeJSON, inbox.ArgAffected)
}

func (q queries) UpdateAuditCount() inbox.Query {
	return q.q(`UPDATE "{{table}}_audit" SET affected = ? WHERE audit_id = ?`, inbox.ArgAffected, inbox.ArgAuditID)
}

func (q queries) ListAudit() inbox.Query {
	return q.q(`SELECT audit_id, logged_at, actor, action, scope, operation, "key", status_before, attempt_before,
	status_after, reason, before_json, affected FROM "{{table}}_audit"
WHERE (? = '' OR (scope = ? AND operation = ? AND "key" = ?))
	AND (? = '' OR action = ?)
	AND (? = '' OR audit_id < ?)
ORDER BY audit_id DESC LIMIT ?`,
		inbox.ArgOperation, inbox.ArgScope, inbox.ArgOperation, inbox.ArgKey, inbox.ArgAction, inbox.ArgAction,
		inbox.ArgAuditID, inbox.ArgAuditID, inbox.ArgLimit)
}

// The statements over several records repeat one row's placeholders per
// record.

func (q queries) InsertMany(rows int) inbox.RowsQuery {
	return inbox.RowsQuery{SQL: q.q(`INSERT INTO "{{table}}" (scope, operation, "key", payload_hash, status, attempt,
	correlation_id, error, created_at, updated_at, expires_at, lease_owner, lease_until)
VALUES ` + strings.Repeat(`, (?, ?, ?, ?, ?, 1, NULLIF(?, ''), NULLIF(?, ''), ?, ?, ?, NULLIF(?, ''), ?)`, max(rows, 1))[2:] + `
ON CONFLICT (scope, operation, "key") DO NOTHING
RETURNING scope, operation, "key"`).SQL,
		RowArgs: []inbox.Arg{inbox.ArgScope, inbox.ArgOperation, inbox.ArgKey, inbox.ArgPayloadHash, inbox.ArgStatus,
			inbox.ArgCorrelationID, inbox.ArgError, inbox.ArgCreatedAt, inbox.ArgUpdatedAt, inbox.ArgExpiresAt,
			inbox.ArgLeaseOwner, inbox.ArgLeaseUntil},
		Returning: true}
}

// FinishMany is Finish joined with a VALUES list (UPDATE FROM, SQLite
// 3.33; RETURNING, 3.35), whose columns are column1, column2, and so on.
func (q queries) FinishMany(rows int) inbox.RowsQuery {
	return inbox.RowsQuery{SQL: q.q(`UPDATE "{{table}}" SET status = r.column4, result = r.column5,
	resource_id = NULLIF(r.column6, ''), external_ref = COALESCE(NULLIF(r.column7, ''), external_ref),
	error = NULLIF(r.column8, ''), lease_owner = NULL, lease_until = NULL, updated_at = r.column9,
	expires_at = COALESCE(r.column10, expires_at)
FROM (VALUES ` + strings.Repeat(`, (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, max(rows, 1))[2:] + `) AS r
WHERE scope = r.column1 AND operation = r.column2 AND "key" = r.column3
	AND attempt = r.column11 AND status = r.column12
RETURNING scope, operation, "key"`).SQL,
		RowArgs: []inbox.Arg{inbox.ArgScope, inbox.ArgOperation, inbox.ArgKey, inbox.ArgStatus, inbox.ArgResult,
			inbox.ArgResourceID, inbox.ArgExternalRef, inbox.ArgError, inbox.ArgUpdatedAt, inbox.ArgExpiresAt,
			inbox.ArgAttempt, inbox.ArgFromStatus},
		Returning: true}
}

// SelectMany is a plain read: once InsertMany ran, the transaction holds
// the write lock and reads the latest data.
func (q queries) SelectMany(rows int) inbox.RowsQuery {
	cond := strings.Repeat(` OR (scope = ? AND operation = ? AND "key" = ?)`, max(rows, 1))[len(" OR "):]
	return inbox.RowsQuery{SQL: q.q(`SELECT ` + cols + ` FROM "{{table}}" WHERE ` + cond).SQL, RowArgs: idArgs}
}
