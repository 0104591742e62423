package inbox

import (
	"fmt"
	"io/fs"
	"strings"
	"time"
)

// Dialect is the SQL of one database. It does no I/O: the one [Store] type
// runs what it returns, so its output can be pinned by golden files, and a
// database can be supported out of tree by implementing Dialect against
// this package's exported API and passing the conformance suite in package
// inbox/inboxtest. The dialects shipped are packages of their own
// (inbox/postgres, inbox/mysql, inbox/sqlite), so a program links only the
// driver it uses.
type Dialect interface {
	// Name identifies the dialect in logs and errors, e.g. "postgres".
	Name() string
	// Capabilities tells the store what the database and its driver need.
	Capabilities() Capabilities
	// Migrations holds the schema as NNN_name.up.sql and NNN_name.down.sql
	// files, with every occurrence of the table's name written as the
	// marker {{table}} (see [RenderSQL]).
	Migrations() fs.FS
	// Queries returns the statements for table, an identifier already
	// validated by [NewStore].
	Queries(table string) Queries
	// Placeholder returns the n-th (1-based) bind parameter, "$1" or "?",
	// for callers that write SQL of their own to run on any dialect (tests,
	// tools); the store's own statements carry theirs.
	Placeholder(n int) string
	// TimeArg converts t into the value bound for a time column. Times are
	// scanned back from time.Time, text or integer microseconds.
	TimeArg(t time.Time) any
	// Classify looks at an error of a statement and returns it wrapped
	// with [ErrTransient] when it is this database's error (its driver's
	// error type and code) for something a retry of the transaction may
	// get past — serialization failure, deadlock, lock timeout, busy
	// database, server shutdown — or with [ErrPrepareRefused] when the
	// server refused to prepare a statement; otherwise unchanged. It looks
	// only at driver errors, so it is safe on errors of the caller's own
	// statements in the same transaction: an error of the caller's own
	// making is never mistaken for a transient one.
	Classify(err error) error
}

// Capabilities describe what a database and its driver need from the
// store, so that the store branches on properties rather than on names.
type Capabilities struct {
	// PreferPrepare makes [PrepareAuto] prepare frequent statements once
	// per connection: worth it where the driver otherwise prepares and
	// closes a statement for every call (MySQL) or parses the SQL every
	// time (SQLite).
	PreferPrepare bool
	// ZeroRowsAmbiguous is set where an UPDATE that matched a row but
	// changed no value reports zero rows affected (MySQL without
	// CLIENT_FOUND_ROWS); the store then reads the row back to tell a
	// no-op from a fenced-off write.
	ZeroRowsAmbiguous bool
	// SharedClock is set where every client runs on the database's own
	// clock (SQLite, in process): the store never measures an offset.
	SharedClock bool
	// SingleWriter is set where the database runs one writing transaction
	// at a time (SQLite): more than one group commit coordinator would
	// only queue on its lock, so the middleware runs one by default.
	SingleWriter bool
	// MigrationLock is set where migrating processes must exclude each
	// other with Queries.LockMigrations (DDL that commits implicitly, or
	// runs outside the migration's transaction).
	MigrationLock bool
}

// Query is one statement with the parameters its placeholders bind, in
// placeholder order. The store fills Args from the call's typed inputs, so
// a dialect can order and repeat parameters as its SQL needs.
type Query struct {
	SQL  string
	Args []Arg
}

// RowsQuery is a statement over several records at once, built by the
// dialect for the number of records at hand.
type RowsQuery struct {
	// SQL is the statement.
	SQL string
	// RowArgs name the values of one record. Without Array, SQL has one
	// placeholder for each of them for every record, record after record;
	// with Array, one placeholder each, which binds the values of every
	// record, in order, packed by Array.
	RowArgs []Arg
	// Array packs the values of one RowArg, one per record (what the
	// store binds for a single record: strings, []byte, int64, the
	// dialect's TimeArg, nil for NULL), into one bind value, such as a
	// PostgreSQL array literal for unnest. Nil for dialects that repeat
	// the placeholders.
	Array func(values []any) any
	// Returning is set when the statement returns rows (InsertMany: the
	// scope, operation and key of every record it inserted).
	Returning bool
}

// Query returns q as a plain query with one Arg per placeholder: RowArgs
// once when Array packs them, rows times otherwise. Tools and tests use it
// to check and print the statement.
func (q RowsQuery) Query(rows int) Query {
	n := rows
	if q.Array != nil {
		n = 1
	}
	args := make([]Arg, 0, n*len(q.RowArgs))
	for range n {
		args = append(args, q.RowArgs...)
	}
	return Query{SQL: q.SQL, Args: args}
}

// Arg names a value the store can bind. Which args a query may use is
// stated on each method of [Queries].
type Arg int

const (
	ArgScope Arg = iota + 1
	ArgOperation
	ArgKey
	ArgPayloadHash
	// ArgStatus is the status a statement writes.
	ArgStatus
	// ArgFromStatus is the status a transition requires.
	ArgFromStatus
	ArgAttempt
	ArgLeaseOwner
	// ArgLeaseUntil is NULL for no lease.
	ArgLeaseUntil
	// ArgResult is NULL for none.
	ArgResult
	// ArgResourceID, ArgCorrelationID, ArgExternalRef and ArgError are ""
	// for none; the dialect stores them as NULL.
	ArgResourceID
	ArgCorrelationID
	ArgExternalRef
	ArgError
	ArgCreatedAt
	ArgUpdatedAt
	// ArgExpiresAt is NULL for never (in an insert) or for keep the stored
	// one (in a transition).
	ArgExpiresAt
	// ArgNow is the store's current time, by the database's clock.
	ArgNow
	// ArgBefore is the bound of a time comparison (purge, stale scans).
	ArgBefore
	ArgLimit
	ArgVersion
	// ArgName is a migration's name.
	ArgName
	// ArgLockName names the lock that keeps migrating processes apart.
	ArgLockName
	// ArgByScope is 1 when a listing keeps only the records of ArgScope,
	// 0 when it keeps every scope.
	ArgByScope
	// ArgAfterScope, ArgAfterOperation and ArgAfterKey are the primary key
	// a keyset scan continues after; all "" to start at the beginning
	// (every record's key sorts after it: operation and key are never
	// empty).
	ArgAfterScope
	ArgAfterOperation
	ArgAfterKey
	// ArgAuditID identifies an audit entry: text that sorts in time order.
	// In a listing it is the entry to continue after ("" for the newest).
	ArgAuditID
	// ArgActor and ArgReason are who took an operator action and why.
	ArgActor
	ArgReason
	// ArgAction is an audit entry's action: "resolve", "forget" or
	// "purge" ("" for any, in a listing).
	ArgAction
	// ArgStatusBefore, ArgAttemptBefore and ArgStatusAfter are the
	// record's status and attempt before an operator action and its status
	// after; the statuses are "" for none (stored as NULL).
	ArgStatusBefore
	ArgAttemptBefore
	ArgStatusAfter
	// ArgBeforeJSON is the JSON snapshot of the record before an operator
	// action; "" for none (stored as NULL).
	ArgBeforeJSON
	// ArgAffected is how many records an operator action affected.
	ArgAffected
	// ArgBucket is the start of a record's bucket in a partitioned table
	// (see [Partitioning]), and ArgBucketEnd the end of a partition's.
	ArgBucket
	ArgBucketEnd
	// ArgAfterSet is 1 when an ordered listing (Queries.ListRecordsBy)
	// continues after a row, 0 when it starts at the beginning. The row is
	// ArgAfterTime or ArgAfterAttempt — its order column's value, a time
	// or the attempt; NULL and 0 at the beginning — then ArgAfterScope,
	// ArgAfterOperation and ArgAfterKey.
	ArgAfterSet
	ArgAfterTime
	ArgAfterAttempt
	// ArgSince is the start of a window of time (with ArgBefore its end),
	// and ArgWidth the width of one of its buckets, in microseconds.
	ArgSince
	ArgWidth
	// ArgOffset is how many rows a statement skips.
	ArgOffset
	// ArgUntilScope, ArgUntilOperation and ArgUntilKey are the primary key
	// a keyset scan ends at, inclusive.
	ArgUntilScope
	ArgUntilOperation
	ArgUntilKey
	// ArgDigest is an [ID.Digest]: 16 lowercase hex characters.
	ArgDigest
	argEnd
)

var argNames = [...]string{"", "scope", "operation", "key", "payload_hash", "status", "from_status", "attempt",
	"lease_owner", "lease_until", "result", "resource_id", "correlation_id", "external_ref", "error",
	"created_at", "updated_at", "expires_at", "now", "before", "limit", "version", "name", "lock_name",
	"by_scope", "after_scope", "after_operation", "after_key", "audit_id", "actor", "reason", "action",
	"status_before", "attempt_before", "status_after", "before_json", "affected", "bucket", "bucket_end",
	"after_set", "after_time", "after_attempt", "since", "width", "offset", "until_scope", "until_operation",
	"until_key", "digest"}

func (a Arg) String() string {
	if a > 0 && a < argEnd {
		return argNames[a]
	}
	return fmt.Sprintf("Arg(%d)", int(a))
}

// DigestQueries is implemented by the [Queries] of a database that
// computes SHA-256 itself. A lookup by digest ([Store.FindByDigest]) then
// hashes the keys on the server, a page of keys at a time, and reads back
// only the match; without it the store reads every key and hashes it.
type DigestQueries interface {
	// KeyAt returns the primary key (scope, operation, key columns) that
	// comes ArgOffset keys after the first key after the ArgAfterScope,
	// ArgAfterOperation, ArgAfterKey key (ArgOffset 0: the first after
	// it), in primary-key order, among the records of operation
	// ArgOperation ("" for any); no row when there are not that many.
	// Args: those.
	KeyAt() Query
	// SelectDigest returns the keys (scope, operation, key columns) of
	// one page whose [ID.Digest] is ArgDigest, in primary-key order. The
	// page is the ArgLimit keys after the ArgAfterScope,
	// ArgAfterOperation, ArgAfterKey key, in primary-key order, among the
	// records of operation ArgOperation ("" for any); the last of them is
	// the ArgUntilScope, ArgUntilOperation, ArgUntilKey key (KeyAt found
	// it), so a statement can bound the page by either, whichever its
	// database scans faster. The digest is the first 8 bytes, in
	// lowercase hex, of the SHA-256 of scope, a NUL byte, operation, a NUL
	// byte, key and a NUL byte, each as the bytes the store wrote (UTF-8).
	// Args: those.
	SelectDigest() Query
}

// Queries are the statements of one dialect for one table, one method
// each, so that a dialect lacking a statement the store needs does not
// compile. The columns a record query returns are [RecordColumns], in that
// order.
type Queries interface {
	// Insert adds a record unless its key exists, without failing and
	// without aborting the transaction when it does: rows affected is 1
	// when inserted and 0 when the key was taken. A concurrent insert of
	// the same key must block until the other transaction ends. attempt is
	// 1. Args: the ID, payload hash, status, lease owner and until,
	// correlation ID, error, created, updated and expires at.
	Insert() Query
	// SelectForClaim reads a record after Insert found its key taken. It
	// must see the latest committed row even in a transaction whose
	// snapshot is older (MySQL needs a locking read for that). Args: the ID.
	SelectForClaim() Query
	// Select reads one record. Args: the ID.
	Select() Query
	// Finish moves a record from ArgFromStatus to ArgStatus while its
	// attempt is ArgAttempt (fencing), storing result, resource ID, error
	// and updated at, keeping the stored external ref when ArgExternalRef
	// is "" and the stored expiry when ArgExpiresAt is NULL, and dropping
	// the lease.
	Finish() Query
	// TakeOver gives a processing record whose lease expired (lease_until
	// NULL or before ArgNow) to a new owner as attempt+1, compare-and-set
	// on ArgAttempt. Args: the ID, attempt, lease owner and until, updated
	// at, now.
	TakeOver() Query
	// ExtendLease moves lease_until of a processing record while its
	// attempt matches. Args: the ID, attempt, lease until, updated at.
	ExtendLease() Query
	// SelectPending lists pending records, least recently updated first.
	// Args: limit.
	SelectPending() Query
	// SelectStale lists processing records whose lease expired by ArgNow
	// and that were last updated before ArgBefore, oldest update first.
	// Args: now, before, limit.
	SelectStale() Query
	// UnfinishedStats counts processing and pending records. Columns:
	// status, count, oldest created_at.
	UnfinishedStats() Query
	// OldestExpired returns the smallest expires_at of a finished record
	// (NULL when none).
	OldestExpired() Query
	// Purge deletes up to ArgLimit finished records whose expires_at is
	// before ArgBefore, in one short statement that never waits long on a
	// row a claim holds.
	Purge() Query
	// Delete removes one record. Args: the ID.
	Delete() Query
	// Clock reads the database server's current time as microseconds since
	// the Unix epoch (one BIGINT column), for [Config.ClockSync].
	Clock() Query
	// ResultLimit returns one row whose only column (BIGINT) is the size,
	// in bytes, of the largest result the Finish statement stores on this
	// connection: the database's limit on one value or one statement
	// (MySQL's max_allowed_packet), less a margin for the rest of the
	// statement. It may bind ArgResult, a short sample result the store
	// sends as SQL text with arguments, the way a caller's transaction
	// sends a result, so that the statement can tell how the driver sends
	// one (MySQL's driver either binds it or, with interpolateParams,
	// escapes it into the text). See [Store.ResultLimit].
	ResultLimit() Query
	// Savepoint, ReleaseSavepoint and RollbackToSavepoint set, release and
	// roll back to the savepoint named name, which [Store.WithSavepoint]
	// puts around work in a caller's transaction. The store chooses name
	// (a plain identifier) and never gives two savepoints the same one, so
	// that a savepoint set inside another is a level of its own: MySQL
	// replaces a savepoint by a new one of the same name, where PostgreSQL
	// and SQLite stack them.
	Savepoint(name string) Query
	ReleaseSavepoint(name string) Query
	RollbackToSavepoint(name string) Query

	// CreateMigrationsTable creates "<table>_migrations", which records
	// applied schema versions, if it does not exist.
	CreateMigrationsTable() Query
	// MigrationsTableExists returns one row whose only column counts the
	// tables named "<table>_migrations" in the current schema (0 or 1).
	MigrationsTableExists() Query
	// MissingTables lists the tables the dialect's migrations create,
	// "<table>_migrations" aside, that do not exist in the current schema:
	// one column, the table's name; no row when all exist. [Store.Validate]
	// runs it once every version is recorded, to notice a table dropped
	// outside the migrations.
	MissingTables() Query
	// SelectMigrations lists applied versions. Columns: version.
	SelectMigrations() Query
	// SelectMigration counts one applied version. Args: version.
	SelectMigration() Query
	// InsertMigration records a version. Args: version, name, now.
	InsertMigration() Query
	// DeleteMigration forgets a version. Args: version.
	DeleteMigration() Query
	// DropMigrationsTable drops "<table>_migrations" if it exists: what
	// MigrateDown(ctx, 0) does last, leaving nothing of the inbox behind.
	DropMigrationsTable() Query
	// LockMigrations runs on a dedicated connection before migrating when
	// Capabilities.MigrationLock is set, and returns one row whose only
	// column is 1 once a lock excluding other migrating processes is held.
	// Args: lock name.
	LockMigrations() Query
	// UnlockMigrations releases that lock. Args: lock name.
	UnlockMigrations() Query

	// The statements of the operator tools. They run rarely, on the
	// store's own database; scans may read the whole table.

	// ListRecords lists records in primary-key order (scope, operation,
	// key) after the key ArgAfterScope, ArgAfterOperation, ArgAfterKey,
	// keeping those whose status is ArgStatus ("" for any), whose
	// operation is ArgOperation ("" for any), whose scope is ArgScope
	// when ArgByScope is 1, created before ArgBefore (NULL for any time)
	// and whose attempt is above ArgAttempt. Args: those, and limit.
	ListRecords() Query
	// ListRecordsBy lists records as ListRecords does, with the same
	// filters and their args, in order o — one of [ListOrders] — and then
	// by primary key, every column descending when o.Desc: "ORDER BY
	// created_at DESC, scope DESC, operation DESC, key DESC". When
	// ArgAfterSet is 1 it continues after the row (o's column, scope,
	// operation, key) = (ArgAfterTime or ArgAfterAttempt, ArgAfterScope,
	// ArgAfterOperation, ArgAfterKey): greater than it, or less with
	// o.Desc. Args: those, the filters' as ListRecords binds them, and
	// limit.
	ListRecordsBy(o ListOrder) Query
	// SelectKeys lists the primary keys (scope, operation, key columns)
	// after the key ArgAfterScope, ArgAfterOperation, ArgAfterKey, in
	// primary-key order, of operation ArgOperation ("" for any). Args:
	// those, and limit.
	SelectKeys() Query
	// CountByOperation counts the records by operation and status.
	// Columns: operation, status, count.
	CountByOperation() Query
	// CountByUpdated counts the records last updated at or after ArgSince
	// and before ArgBefore, by status and bucket: floor((updated_at -
	// ArgSince) / ArgWidth), ArgWidth in microseconds, an integer from 0.
	// It may read the whole table (updated_at has no index of its own).
	// Columns: status, bucket, count. Args: those (ArgSince as often as
	// the SQL needs it).
	CountByUpdated() Query
	// OldestPending returns the least recently created pending record (no
	// row when none).
	OldestPending() Query
	// OldestExpiredLease returns the least recently created processing
	// record whose lease expired (lease_until NULL or before ArgNow); no
	// row when none. Args: now.
	OldestExpiredLease() Query
	// CountPurgeable counts the finished records whose expires_at is
	// before ArgBefore: what a purge then deletes. Args: before.
	CountPurgeable() Query
	// OldestCreated returns the smallest created_at of the records of
	// operation ArgOperation ("" for every operation); NULL when there is
	// none. It may read the whole table (created_at has no index): it runs
	// once per operator request, such as a replay's dry run. Args:
	// operation, operation.
	OldestCreated() Query
	// SelectForUpdate reads one record inside a transaction and keeps
	// other writers off it until the transaction ends (a row lock; SQLite,
	// which has one writer at a time, reads plainly). Args: the ID.
	SelectForUpdate() Query
	// Resolve moves a record at attempt ArgAttempt in status
	// ArgFromStatus to ArgStatus, unless it is processing under a lease
	// that runs until ArgNow or later: the WHERE clause has "status =
	// 'pending' OR lease_until IS NULL OR lease_until < now". It drops the
	// lease, stores the error (NULL for ""), the external ref unless
	// ArgExternalRef is "" (keeping the stored one), updated at, and
	// expires at as given (NULL: never). Args: those, and the ID.
	Resolve() Query
	// Forget deletes a record at attempt ArgAttempt in status
	// ArgFromStatus unless it is processing under a lease that runs until
	// ArgNow or later. Args: the ID, attempt, from status, now.
	Forget() Query
	// InsertAudit adds an entry to "<table>_audit". Args: audit ID, now
	// (the entry's time), actor, action, the ID (the record's; all ""
	// for none), status before, attempt before, status after, reason,
	// before JSON and affected.
	InsertAudit() Query
	// UpdateAuditCount sets the affected count of an audit entry (a
	// purge's running total). Args: affected, audit ID.
	UpdateAuditCount() Query
	// InsertMany is Insert for rows records at once (1 or more), in one
	// statement, for [Store.ClaimMany]. It inserts the records in the
	// order given (the store sorts them by primary key, so that two
	// transactions claiming overlapping sets lock rows in one order and
	// cannot deadlock each other), skips every key that is taken without
	// failing, and waits on a key another transaction holds. With
	// Returning it returns the scope, operation and key of each record it
	// inserted; without, the store reads the records first with
	// SelectMany and checks rows affected. RowArgs: those of Insert, the
	// lease owner and until included ([Store.ReserveMany] inserts
	// processing records with it).
	InsertMany(rows int) RowsQuery
	// FinishMany is Finish for rows records at once (1 or more), in one
	// statement, for [Store.CompleteMany]: each record moves only while
	// its own ArgAttempt and ArgFromStatus hold, and the others are left
	// as they are without failing the statement. With Returning it
	// returns the scope, operation and key of each record it moved;
	// without, the store counts rows affected and reads the records when
	// fewer moved. RowArgs: the ID, status, result, resource ID, external
	// ref, error, updated at, expires at, attempt and from status.
	FinishMany(rows int) RowsQuery
	// SelectMany reads the records of rows IDs, for [Store.ClaimMany]: in
	// any order, nothing for an ID without one. It must see the latest
	// committed rows where it follows InsertMany in a transaction
	// (Returning); where it comes first it may read the transaction's
	// snapshot, and must take no locks (a locking read of missing keys
	// takes gap locks on MySQL, which deadlock two claiming transactions).
	// RowArgs: the ID.
	SelectMany(rows int) RowsQuery

	// ListAudit lists audit entries, newest (greatest audit ID) first,
	// older than ArgAuditID ("" for the newest), of the record ArgScope,
	// ArgOperation, ArgKey when ArgOperation is not "" (every entry when
	// it is), of action ArgAction ("" for any). Columns: audit ID, time,
	// actor, action, scope, operation, key, status before, attempt
	// before, status after, reason, before JSON, affected. Args: those,
	// and limit.
	ListAudit() Query
}

// RecordColumns is the select list of every query that returns records,
// with the key column quoted by the dialect (key is reserved in MySQL).
func RecordColumns(quotedKey string) string {
	return `scope, operation, ` + quotedKey + `, payload_hash, status, attempt, lease_owner, lease_until,
	result, resource_id, correlation_id, external_ref, error, created_at, updated_at, expires_at`
}

// Status lists for SQL text, so that every dialect writes the same sets.
const (
	FinishedStatuses   = `('completed', 'failed')`
	UnfinishedStatuses = `('processing', 'pending')`
)

// TableMarker is what migration files and query templates write where the
// table's name goes.
const TableMarker = "{{table}}"

// RenderSQL puts table in place of every [TableMarker] in sql. A marker
// left unreplaced, or a stray "{{", is a mistake in the template and is
// reported rather than sent to the database.
func RenderSQL(sql, table string) (string, error) {
	out := strings.ReplaceAll(sql, TableMarker, table)
	if i := strings.Index(out, "{{"); i >= 0 {
		end := min(i+24, len(out))
		return "", fmt.Errorf("inbox: SQL template has an unknown marker near %q", out[i:end])
	}
	return out, nil
}

// MustRenderSQL is RenderSQL for templates written into a dialect's code,
// where a bad marker is a programming error.
func MustRenderSQL(sql, table string) string {
	out, err := RenderSQL(sql, table)
	if err != nil {
		panic(err)
	}
	return out
}
