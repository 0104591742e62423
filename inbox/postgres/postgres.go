// Package postgres is the inbox dialect of PostgreSQL: its SQL, its schema
// migrations and the classification of its errors. It works with both
// github.com/lib/pq and github.com/jackc/pgx/v5/stdlib and imports
// neither: the program picks its driver.
//
//	db, err := sql.Open("pgx", dsn) // import _ "github.com/jackc/pgx/v5/stdlib"
//	store, err := inbox.NewStore(db, postgres.Dialect(), inbox.Config{})
package postgres

import (
	"context"
	"database/sql/driver"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"time"

	"github.com/inboxmill/inboxmill/inbox"
)

// Dialect returns the PostgreSQL dialect.
func Dialect() inbox.Dialect { return dialect{} }

type dialect struct{}

//go:embed migrations/*.sql
var migrations embed.FS

func (dialect) Name() string { return "postgres" }

func (dialect) Capabilities() inbox.Capabilities {
	// pgx caches prepared statements itself, and named statements do not
	// survive PgBouncer in transaction mode: no preparing by default.
	return inbox.Capabilities{MigrationLock: true}
}

func (dialect) Migrations() fs.FS {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		panic(err) // embedded at build time
	}
	return sub
}

func (dialect) Placeholder(n int) string { return "$" + strconv.Itoa(n) }

func (dialect) TimeArg(t time.Time) any { return t.UTC() }

func (dialect) Queries(table string) inbox.Queries { return queries{t: table} }

// sqlStater is implemented by the errors of lib/pq and pgx.
type sqlStater interface{ SQLState() string }

// safeToRetrier is implemented by pgx's errors (pgconn.SafeToRetry): true
// when the request never reached the server, as when a pooled connection's
// server died and pgx has already closed it ("conn closed").
type safeToRetrier interface{ SafeToRetry() bool }

func (dialect) Classify(err error) error {
	var se sqlStater
	if !errors.As(err, &se) {
		// database/sql's code for a connection the driver found broken: only
		// a database driver returns it, so it is the database's error even
		// when it comes back from a handler's statement (lib/pq, and pgx when
		// it saw the socket close, on a transaction whose server died).
		if errors.Is(err, driver.ErrBadConn) {
			return inbox.Transient(err)
		}
		// Nothing was sent, so nothing happened: retrying is safe. A done
		// context is pgx's reason too, and no retry will change it.
		var sr safeToRetrier
		if errors.As(err, &sr) && sr.SafeToRetry() &&
			!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			return inbox.Transient(err)
		}
		return err
	}
	switch code := se.SQLState(); {
	case code == "40001", // serialization_failure
		code == "40P01",               // deadlock_detected
		code == "55P03",               // lock_not_available
		code == "57P01",               // admin_shutdown (pg_terminate_backend)
		code == "57P02",               // crash_shutdown
		code == "57P03",               // cannot_connect_now
		code == "53300",               // too_many_connections
		code == "25006",               // read_only_sql_transaction: a standby, before failover completes
		strings.HasPrefix(code, "08"): // connection exceptions
		return inbox.Transient(err)
	}
	return err
}

type queries struct{ t string }

func (q queries) q(sql string, args ...inbox.Arg) inbox.Query {
	return inbox.Query{SQL: inbox.MustRenderSQL(sql, q.t), Args: args}
}

// The ID's columns, as placeholders $1..$3 bind them.
var idArgs = []inbox.Arg{inbox.ArgScope, inbox.ArgOperation, inbox.ArgKey}

func with(args ...inbox.Arg) []inbox.Arg { return append(append([]inbox.Arg{}, idArgs...), args...) }

var cols = inbox.RecordColumns("key")

func (q queries) Insert() inbox.Query {
	// ON CONFLICT DO NOTHING, not a plain INSERT: a unique violation would
	// abort the whole transaction, and with it the caller's work when the
	// claim joins the caller's transaction.
	return q.q(`INSERT INTO "{{table}}" (scope, operation, key, payload_hash, status, attempt, lease_owner,
	lease_until, correlation_id, error, created_at, updated_at, expires_at)
VALUES ($1, $2, $3, $4, $5, 1, NULLIF($6, ''), $7, NULLIF($8, ''), NULLIF($9, ''), $10, $11, $12)
ON CONFLICT (scope, operation, key) DO NOTHING`,
		with(inbox.ArgPayloadHash, inbox.ArgStatus, inbox.ArgLeaseOwner, inbox.ArgLeaseUntil, inbox.ArgCorrelationID,
			inbox.ArgError, inbox.ArgCreatedAt, inbox.ArgUpdatedAt, inbox.ArgExpiresAt)...)
}

func (q queries) SelectForClaim() inbox.Query {
	// Under READ COMMITTED every statement sees the latest commit; under
	// REPEATABLE READ the Insert already failed with a serialization error
	// when the conflicting row was invisible, so a plain read will do.
	return q.Select()
}

func (q queries) Select() inbox.Query {
	return q.q(`SELECT `+cols+` FROM "{{table}}" WHERE scope = $1 AND operation = $2 AND key = $3`, idArgs...)
}

func (q queries) Finish() inbox.Query {
	return q.q(`UPDATE "{{table}}" SET status = $4, result = $5, resource_id = NULLIF($6, ''),
	external_ref = COALESCE(NULLIF($7, ''), external_ref), error = NULLIF($8, ''),
	lease_owner = NULL, lease_until = NULL, updated_at = $9, expires_at = COALESCE($10, expires_at)
WHERE scope = $1 AND operation = $2 AND key = $3 AND attempt = $11 AND status = $12`,
		with(inbox.ArgStatus, inbox.ArgResult, inbox.ArgResourceID, inbox.ArgExternalRef, inbox.ArgError,
			inbox.ArgUpdatedAt, inbox.ArgExpiresAt, inbox.ArgAttempt, inbox.ArgFromStatus)...)
}

func (q queries) TakeOver() inbox.Query {
	return q.q(`UPDATE "{{table}}" SET attempt = attempt + 1, lease_owner = $4, lease_until = $5, updated_at = $6
WHERE scope = $1 AND operation = $2 AND key = $3 AND attempt = $7
	AND status = 'processing' AND (lease_until IS NULL OR lease_until < $8)`,
		with(inbox.ArgLeaseOwner, inbox.ArgLeaseUntil, inbox.ArgUpdatedAt, inbox.ArgAttempt, inbox.ArgNow)...)
}

func (q queries) ExtendLease() inbox.Query {
	return q.q(`UPDATE "{{table}}" SET lease_until = $4, updated_at = $5
WHERE scope = $1 AND operation = $2 AND key = $3 AND attempt = $6 AND status = 'processing'`,
		with(inbox.ArgLeaseUntil, inbox.ArgUpdatedAt, inbox.ArgAttempt)...)
}

func (q queries) SelectPending() inbox.Query {
	return q.q(`SELECT `+cols+` FROM "{{table}}" WHERE status = 'pending' ORDER BY updated_at LIMIT $1`, inbox.ArgLimit)
}

func (q queries) SelectStale() inbox.Query {
	return q.q(`SELECT `+cols+` FROM "{{table}}"
WHERE status = 'processing' AND (lease_until IS NULL OR lease_until < $1) AND updated_at < $2
ORDER BY updated_at LIMIT $3`, inbox.ArgNow, inbox.ArgBefore, inbox.ArgLimit)
}

func (q queries) UnfinishedStats() inbox.Query {
	return q.q(`SELECT status, count(*), min(created_at) FROM "{{table}}" WHERE status IN ` +
		inbox.UnfinishedStatuses + ` GROUP BY status`)
}

func (q queries) OldestExpired() inbox.Query {
	return q.q(`SELECT min(expires_at) FROM "{{table}}" WHERE expires_at IS NOT NULL AND status IN ` + inbox.FinishedStatuses)
}

func (q queries) Purge() inbox.Query {
	// PostgreSQL has no DELETE ... LIMIT; the batch is picked by primary
	// key, skipping rows a claim holds so that a purge never waits on one.
	return q.q(`DELETE FROM "{{table}}" WHERE (scope, operation, key) IN (
	SELECT scope, operation, key FROM "{{table}}"
	WHERE expires_at < $1 AND status IN `+inbox.FinishedStatuses+`
	LIMIT $2 FOR UPDATE SKIP LOCKED)`, inbox.ArgBefore, inbox.ArgLimit)
}

func (q queries) Delete() inbox.Query {
	return q.q(`DELETE FROM "{{table}}" WHERE scope = $1 AND operation = $2 AND key = $3`, idArgs...)
}

func (q queries) Clock() inbox.Query {
	return q.q(`SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint`)
}

func (q queries) ResultLimit() inbox.Query {
	// A bytea value is at most 1 GiB, and a driver that binds it as text
	// (lib/pq) sends it hex-encoded, twice its size plus "\x", as the
	// server sends it back to such a driver: half of 1 GiB, less
	// inbox.ResultMargin.
	return q.q(`SELECT CAST(536870912 - 65536 AS bigint)`)
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
	version    integer     PRIMARY KEY,
	name       text        NOT NULL,
	applied_at timestamptz NOT NULL
)`)
}

func (q queries) MigrationsTableExists() inbox.Query {
	return q.q(`SELECT count(*) FROM pg_catalog.pg_tables
WHERE schemaname = current_schema() AND tablename = '{{table}}_migrations'`)
}

func (q queries) MissingTables() inbox.Query { return q.missingTables("{{table}}", "{{table}}_audit") }

// missingTables lists which of tables (names, with the table marker) are
// not in the current schema; pg_tables has partitioned tables too.
func (q queries) missingTables(tables ...string) inbox.Query {
	return q.q(`SELECT t.name FROM (VALUES ('` + strings.Join(tables, `'), ('`) + `')) AS t(name)
WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = current_schema() AND tablename = t.name)`)
}

func (q queries) SelectMigrations() inbox.Query {
	return q.q(`SELECT version FROM "{{table}}_migrations" ORDER BY version`)
}

func (q queries) SelectMigration() inbox.Query {
	return q.q(`SELECT count(*) FROM "{{table}}_migrations" WHERE version = $1`, inbox.ArgVersion)
}

func (q queries) InsertMigration() inbox.Query {
	return q.q(`INSERT INTO "{{table}}_migrations" (version, name, applied_at) VALUES ($1, $2, $3)`,
		inbox.ArgVersion, inbox.ArgName, inbox.ArgNow)
}

func (q queries) DropMigrationsTable() inbox.Query {
	return q.q(`DROP TABLE IF EXISTS "{{table}}_migrations"`)
}

func (q queries) DeleteMigration() inbox.Query {
	return q.q(`DELETE FROM "{{table}}_migrations" WHERE version = $1`, inbox.ArgVersion)
}

// A session-level advisory lock: held across the per-version
// transactions, released by UnlockMigrations or when the connection ends.
func (q queries) LockMigrations() inbox.Query {
	return q.q(`SELECT 1 FROM (SELECT pg_advisory_lock(hashtextextended($1, 0))) AS l`, inbox.ArgLockName)
}

func (q queries) UnlockMigrations() inbox.Query {
	return q.q(`SELECT 1 FROM (SELECT pg_advisory_unlock(hashtextextended($1, 0))) AS l`, inbox.ArgLockName)
}

// The operator tools' statements. Optional filters are written as
// "(param = '' OR column = param)", so that one static statement serves
// every combination; the casts give PostgreSQL the parameters' types where
// a NULL or a comparison with a literal would leave them unknown.

func (q queries) ListRecords() inbox.Query {
	return q.q(`SELECT `+cols+` FROM "{{table}}"
WHERE (scope, operation, key) > ($1, $2, $3)
	AND ($4::text = '' OR status = $4::text)
	AND ($5::text = '' OR operation = $5::text)
	AND ($6::integer = 0 OR scope = $7::text)
	AND ($8::timestamptz IS NULL OR created_at < $8::timestamptz)
	AND attempt > $9
ORDER BY scope, operation, key LIMIT $10`,
		inbox.ArgAfterScope, inbox.ArgAfterOperation, inbox.ArgAfterKey, inbox.ArgStatus, inbox.ArgOperation,
		inbox.ArgByScope, inbox.ArgScope, inbox.ArgBefore, inbox.ArgAttempt, inbox.ArgLimit)
}

// orderBy returns the column of o, its type and the arg of its value in
// a cursor, and the comparison and direction o pages with.
func orderBy(o inbox.ListOrder) (col, typ string, after inbox.Arg, cmp, dir string) {
	col, typ, after = string(o.Column), "timestamptz", inbox.ArgAfterTime
	if o.Column == inbox.OrderByAttempt {
		typ, after = "bigint", inbox.ArgAfterAttempt
	}
	cmp, dir = ">", ""
	if o.Desc {
		cmp, dir = "<", " DESC"
	}
	return col, typ, after, cmp, dir
}

func (q queries) ListRecordsBy(o inbox.ListOrder) inbox.Query {
	col, typ, after, cmp, dir := orderBy(o)
	return q.q(`SELECT `+cols+` FROM "{{table}}"
WHERE ($1::integer = 0 OR (`+col+`, scope, operation, key) `+cmp+` ($2::`+typ+`, $3::text, $4::text, $5::text))
	AND ($6::text = '' OR status = $6::text)
	AND ($7::text = '' OR operation = $7::text)
	AND ($8::integer = 0 OR scope = $9::text)
	AND ($10::timestamptz IS NULL OR created_at < $10::timestamptz)
	AND attempt > $11
ORDER BY `+col+dir+`, scope`+dir+`, operation`+dir+`, key`+dir+` LIMIT $12`,
		inbox.ArgAfterSet, after, inbox.ArgAfterScope, inbox.ArgAfterOperation, inbox.ArgAfterKey, inbox.ArgStatus,
		inbox.ArgOperation, inbox.ArgByScope, inbox.ArgScope, inbox.ArgBefore, inbox.ArgAttempt, inbox.ArgLimit)
}

func (q queries) SelectKeys() inbox.Query {
	return q.q(`SELECT scope, operation, key FROM "{{table}}"
WHERE (scope, operation, key) > ($1, $2, $3) AND ($4::text = '' OR operation = $4::text)
ORDER BY scope, operation, key LIMIT $5`,
		inbox.ArgAfterScope, inbox.ArgAfterOperation, inbox.ArgAfterKey, inbox.ArgOperation, inbox.ArgLimit)
}

func (q queries) KeyAt() inbox.Query {
	return q.q(`SELECT scope, operation, key FROM "{{table}}"
WHERE (scope, operation, key) > ($1, $2, $3) AND ($4::text = '' OR operation = $4::text)
ORDER BY scope, operation, key OFFSET $5 LIMIT 1`,
		inbox.ArgAfterScope, inbox.ArgAfterOperation, inbox.ArgAfterKey, inbox.ArgOperation, inbox.ArgOffset)
}

// digestSQL is ID.Digest of a row: scope, operation and key as UTF-8,
// each followed by a NUL byte, hashed; the first 8 bytes.
const digestSQL = `substr(sha256(convert_to(scope, 'UTF8') || '\x00'::bytea || convert_to(operation, 'UTF8') ||
	'\x00'::bytea || convert_to(key, 'UTF8') || '\x00'::bytea), 1, 8)`

func (q queries) SelectDigest() inbox.Query {
	// Bounded by the limit: PostgreSQL's B-tree ends a scan at a row
	// comparison only by its first column, and scope is mostly one value,
	// so an upper bound (scope, operation, key) <= (…) would read on to
	// the end of the index.
	return q.q(`SELECT scope, operation, key FROM (SELECT scope, operation, key FROM "{{table}}"
	WHERE (scope, operation, key) > ($1, $2, $3) AND ($4::text = '' OR operation = $4::text)
	ORDER BY scope, operation, key LIMIT $5) AS page
WHERE `+digestSQL+` = decode($6::text, 'hex')
ORDER BY scope, operation, key`,
		inbox.ArgAfterScope, inbox.ArgAfterOperation, inbox.ArgAfterKey, inbox.ArgOperation, inbox.ArgLimit, inbox.ArgDigest)
}

func (q queries) CountByOperation() inbox.Query {
	return q.q(`SELECT operation, status, count(*) FROM "{{table}}" GROUP BY operation, status`)
}

func (q queries) CountByUpdated() inbox.Query {
	// The bucket is computed in a subquery: grouped by its output name
	// in one statement, PostgreSQL 15 refused the statement on the
	// partitioned table (42803, updated_at must appear in the GROUP BY).
	return q.q(`SELECT status, bucket, count(*) FROM (
	SELECT status, floor(extract(epoch FROM updated_at - $1::timestamptz) * 1000000 / $2::bigint)::bigint AS bucket
	FROM "{{table}}" WHERE updated_at >= $1::timestamptz AND updated_at < $3::timestamptz
) AS window_rows GROUP BY status, bucket`,
		inbox.ArgSince, inbox.ArgWidth, inbox.ArgBefore)
}

func (q queries) OldestPending() inbox.Query {
	return q.q(`SELECT ` + cols + ` FROM "{{table}}" WHERE status = 'pending' ORDER BY created_at LIMIT 1`)
}

func (q queries) OldestExpiredLease() inbox.Query {
	return q.q(`SELECT `+cols+` FROM "{{table}}"
WHERE status = 'processing' AND (lease_until IS NULL OR lease_until < $1) ORDER BY created_at LIMIT 1`, inbox.ArgNow)
}

func (q queries) OldestCreated() inbox.Query {
	return q.q(`SELECT min(created_at) FROM "{{table}}" WHERE $1::text = '' OR operation = $2::text`, inbox.ArgOperation, inbox.ArgOperation)
}

func (q queries) CountPurgeable() inbox.Query {
	return q.q(`SELECT count(*) FROM "{{table}}" WHERE expires_at < $1 AND status IN `+inbox.FinishedStatuses,
		inbox.ArgBefore)
}

func (q queries) SelectForUpdate() inbox.Query {
	return q.q(`SELECT `+cols+` FROM "{{table}}" WHERE scope = $1 AND operation = $2 AND key = $3 FOR UPDATE`, idArgs...)
}

func (q queries) Resolve() inbox.Query {
	return q.q(`UPDATE "{{table}}" SET status = $4, external_ref = COALESCE(NULLIF($5, ''), external_ref),
	error = NULLIF($6, ''), lease_owner = NULL, lease_until = NULL, updated_at = $7, expires_at = $8
WHERE scope = $1 AND operation = $2 AND key = $3 AND attempt = $9 AND status = $10
	AND (status = 'pending' OR lease_until IS NULL OR lease_until < $11)`,
		with(inbox.ArgStatus, inbox.ArgExternalRef, inbox.ArgError, inbox.ArgUpdatedAt, inbox.ArgExpiresAt,
			inbox.ArgAttempt, inbox.ArgFromStatus, inbox.ArgNow)...)
}

func (q queries) Forget() inbox.Query {
	return q.q(`DELETE FROM "{{table}}" WHERE scope = $1 AND operation = $2 AND key = $3 AND attempt = $4 AND status = $5
	AND (status <> 'processing' OR lease_until IS NULL OR lease_until < $6)`,
		with(inbox.ArgAttempt, inbox.ArgFromStatus, inbox.ArgNow)...)
}

func (q queries) InsertAudit() inbox.Query {
	return q.q(`INSERT INTO "{{table}}_audit" (audit_id, logged_at, actor, action, scope, operation, key,
	status_before, attempt_before, status_after, reason, before_json, affected)
VALUES ($1, $2, $3, $4, $5, $6, $7, NULLIF($8, ''), $9, NULLIF($10, ''), $11, NULLIF($12, ''), $13)`,
		inbox.ArgAuditID, inbox.ArgNow, inbox.ArgActor, inbox.ArgAction, inbox.ArgScope, inbox.ArgOperation,
		inbox.ArgKey, inbox.ArgStatusBefore, inbox.ArgAttemptBefore, inbox.ArgStatusAfter, inbox.ArgReason,
		inbox.ArgBeforeJSON, inbox.ArgAffected)
}

func (q queries) UpdateAuditCount() inbox.Query {
	return q.q(`UPDATE "{{table}}_audit" SET affected = $1 WHERE audit_id = $2`, inbox.ArgAffected, inbox.ArgAuditID)
}

func (q queries) ListAudit() inbox.Query {
	return q.q(`SELECT audit_id, logged_at, actor, action, scope, operation, key, status_before, attempt_before,
	status_after, reason, before_json, affected FROM "{{table}}_audit"
WHERE ($1::text = '' OR (scope = $2 AND operation = $1::text AND key = $3))
	AND ($4::text = '' OR action = $4::text)
	AND ($5::text = '' OR audit_id < $5::text)
ORDER BY audit_id DESC LIMIT $6`,
		inbox.ArgOperation, inbox.ArgScope, inbox.ArgKey, inbox.ArgAction, inbox.ArgAuditID, inbox.ArgLimit)
}

// The statements over several records bind one array per column, which
// unnest turns back into rows: one statement text whatever the number of
// records. The arrays are sent as array literals in text, which both
// lib/pq and pgx pass through unchanged, and cast on the server.

var rowArgs = []inbox.Arg{inbox.ArgScope, inbox.ArgOperation, inbox.ArgKey, inbox.ArgPayloadHash, inbox.ArgStatus,
	inbox.ArgCorrelationID, inbox.ArgError, inbox.ArgCreatedAt, inbox.ArgUpdatedAt, inbox.ArgExpiresAt,
	inbox.ArgLeaseOwner, inbox.ArgLeaseUntil}

func (q queries) InsertMany(rows int) inbox.RowsQuery {
	if rows == 1 {
		// One row binds its values as they are: no arrays to build and
		// parse, the commonest group of all.
		return inbox.RowsQuery{SQL: inbox.MustRenderSQL(`INSERT INTO "{{table}}" (scope, operation, key, payload_hash, status, attempt,
	correlation_id, error, created_at, updated_at, expires_at, lease_owner, lease_until)
VALUES ($1::text, $2::text, $3::text, $4::bytea, $5::text, 1, NULLIF($6::text, ''), NULLIF($7::text, ''),
	$8::timestamptz, $9::timestamptz, $10::timestamptz, NULLIF($11::text, ''), $12::timestamptz)
ON CONFLICT (scope, operation, key) DO NOTHING
RETURNING scope, operation, key`, q.t), RowArgs: rowArgs, Returning: true}
	}
	// ORDER BY the primary key: rows are inserted, and their keys locked,
	// in one order in every transaction, so two claiming transactions wait
	// for each other instead of deadlocking.
	return inbox.RowsQuery{SQL: inbox.MustRenderSQL(`INSERT INTO "{{table}}" (scope, operation, key, payload_hash, status, attempt,
	correlation_id, error, created_at, updated_at, expires_at, lease_owner, lease_until)
SELECT r.scope, r.operation, r.key, r.payload_hash, r.status, 1, NULLIF(r.correlation_id, ''), NULLIF(r.error, ''),
	r.created_at, r.updated_at, r.expires_at, NULLIF(r.lease_owner, ''), r.lease_until
FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::text[], $7::text[],
	$8::timestamptz[], $9::timestamptz[], $10::timestamptz[], $11::text[], $12::timestamptz[])
	AS r(scope, operation, key, payload_hash, status, correlation_id, error, created_at, updated_at, expires_at,
		lease_owner, lease_until)
ORDER BY r.scope, r.operation, r.key
ON CONFLICT (scope, operation, key) DO NOTHING
RETURNING scope, operation, key`, q.t), RowArgs: rowArgs, Array: arrayLiteral, Returning: true}
}

// finishManyArgs are FinishMany's RowArgs, in the order of its arrays.
var finishManyArgs = []inbox.Arg{inbox.ArgScope, inbox.ArgOperation, inbox.ArgKey, inbox.ArgStatus, inbox.ArgResult,
	inbox.ArgResourceID, inbox.ArgExternalRef, inbox.ArgError, inbox.ArgUpdatedAt, inbox.ArgExpiresAt,
	inbox.ArgAttempt, inbox.ArgFromStatus}

func (q queries) FinishMany(int) inbox.RowsQuery {
	return inbox.RowsQuery{SQL: finishMany(q.t), RowArgs: finishManyArgs, Array: arrayLiteral, Returning: true}
}

// finishMany is Finish over unnest'ed arrays, for the plain and the
// partitioned table alike (the fencing columns are the same).
func finishMany(table string) string {
	return inbox.MustRenderSQL(`UPDATE "{{table}}" AS t SET status = r.status, result = r.result,
	resource_id = NULLIF(r.resource_id, ''), external_ref = COALESCE(NULLIF(r.external_ref, ''), t.external_ref),
	error = NULLIF(r.error, ''), lease_owner = NULL, lease_until = NULL, updated_at = r.updated_at,
	expires_at = COALESCE(r.expires_at, t.expires_at)
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[], $7::text[], $8::text[],
	$9::timestamptz[], $10::timestamptz[], $11::bigint[], $12::text[])
	AS r(scope, operation, key, status, result, resource_id, external_ref, error, updated_at, expires_at,
		attempt, from_status)
WHERE t.scope = r.scope AND t.operation = r.operation AND t.key = r.key
	AND t.attempt = r.attempt AND t.status = r.from_status
RETURNING t.scope, t.operation, t.key`, table)
}

func (q queries) SelectMany(rows int) inbox.RowsQuery {
	if rows == 1 {
		return inbox.RowsQuery{SQL: inbox.MustRenderSQL(`SELECT `+qualified+` FROM "{{table}}" AS t
WHERE t.scope = $1 AND t.operation = $2 AND t.key = $3`, q.t), RowArgs: idArgs}
	}
	return inbox.RowsQuery{SQL: inbox.MustRenderSQL(`SELECT `+qualified+` FROM "{{table}}" AS t
JOIN unnest($1::text[], $2::text[], $3::text[]) AS r(scope, operation, key)
	ON t.scope = r.scope AND t.operation = r.operation AND t.key = r.key`, q.t),
		RowArgs: idArgs, Array: arrayLiteral}
}

// qualified is the record columns of the table aliased t.
var qualified = "t." + strings.ReplaceAll(strings.Join(strings.Fields(cols), " "), ", ", ", t.")

// arrayLiteral writes values as a PostgreSQL array literal: every element
// double-quoted with backslashes and quotes escaped, bytea in hex form,
// times in RFC 3339 with microseconds, nil as NULL.
func arrayLiteral(values []any) any {
	var b []byte
	// Room for most columns' elements without growing: a key, a digest.
	b = make([]byte, 0, 2+len(values)*40)
	b = append(b, '{')
	for i, v := range values {
		if i > 0 {
			b = append(b, ',')
		}
		switch v := v.(type) {
		case nil:
			b = append(b, "NULL"...)
			continue
		case string:
			b = appendQuoted(b, v)
			continue
		case []byte:
			// Hex digits and a backslash, which the quoting doubles.
			b = append(b, `"\\x`...)
			b = hex.AppendEncode(b, v)
			b = append(b, '"')
			continue
		case time.Time:
			b = append(b, '"')
			b = v.UTC().AppendFormat(b, "2006-01-02T15:04:05.999999Z07:00")
			b = append(b, '"')
			continue
		case int64:
			b = append(b, '"')
			b = strconv.AppendInt(b, v, 10)
		case int:
			b = append(b, '"')
			b = strconv.AppendInt(b, int64(v), 10)
		default:
			panic(fmt.Sprintf("postgres: no array element for %T", v))
		}
		b = append(b, '"')
	}
	b = append(b, '}')
	return string(b)
}

// appendQuoted appends s double-quoted, with quotes and backslashes
// escaped, as an array literal's element.
func appendQuoted(b []byte, s string) []byte {
	b = append(b, '"')
	if !strings.ContainsAny(s, `"\`) {
		b = append(b, s...)
		return append(b, '"')
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return append(b, '"')
}
