package inbox

import (
	"embed"
	"io/fs"
	"regexp"
	"strings"
	"time"
)

// Dialect produces the SQL of one database. It does no I/O: the [Store]
// runs what it returns, so its output can be pinned by golden files and a
// new database can be supported by writing a Dialect and passing the
// conformance suite in package inbox/inboxtest.
type Dialect interface {
	// Name identifies the dialect, e.g. "postgres".
	Name() string
	// Migrations holds the schema as NNN_name.up.sql / NNN_name.down.sql
	// files written for a table called "inbox"; see [Store.Migrate].
	Migrations() fs.FS
	// Queries returns every statement the store runs against table, an
	// identifier already validated by [NewStore].
	Queries(table string) Queries
	// Placeholder returns the n-th (1-based) bind parameter: "$1" or "?".
	Placeholder(n int) string
	// TimeArg converts t into the value bound for a time column. Times are
	// scanned back from time.Time, text or integer microseconds.
	TimeArg(t time.Time) any
	// Classify wraps err with [ErrTransient] when it is this database's
	// error (its driver's error type and code) for something a retry of the
	// transaction may get past — serialization failure, deadlock, lock
	// timeout, busy database, server shutdown — and returns it unchanged
	// otherwise. It looks only at driver errors, so it is safe on errors of
	// the caller's own statements in the same transaction: an error of the
	// caller's own making is never mistaken for a transient one.
	Classify(err error) error
}

// Queries are the statements of one dialect for one table. Bind parameters
// come in the order each field's comment gives.
type Queries struct {
	// Insert adds a record unless its key exists, without failing and
	// without aborting the transaction when it does: rows affected is 1 when
	// inserted and 0 when the key was taken. A concurrent insert of the same
	// key must block until the other transaction ends.
	// Args: scope, operation, key, payload_hash, status, lease_owner,
	// lease_until, correlation_id, error, created_at, updated_at, expires_at.
	Insert string
	// SelectForClaim reads a record after Insert found its key taken. It
	// must see the latest committed row even in a transaction whose snapshot
	// is older (MySQL needs a locking read for that).
	// Args: scope, operation, key. Columns: as Select.
	SelectForClaim string
	// Select reads one record. Args: scope, operation, key. Columns: scope,
	// operation, key, payload_hash, status, attempt, lease_owner,
	// lease_until, result, resource_id, correlation_id, external_ref, error,
	// created_at, updated_at, expires_at.
	Select string
	// Finish moves a record from one status to another, storing the outcome
	// and dropping the lease, only while the attempt matches (fencing).
	// Args: to_status, result, resource_id, external_ref (empty keeps the
	// stored one), error, updated_at, expires_at (NULL keeps the stored
	// one), scope, operation, key, attempt, from_status.
	Finish string
	// TakeOver gives a processing record whose lease expired (or was
	// released) to a new owner as attempt+1, compare-and-set on the attempt.
	// Args: lease_owner, lease_until, updated_at, scope, operation, key,
	// attempt, now.
	TakeOver string
	// ExtendLease moves lease_until of a processing record while the
	// attempt matches. Args: lease_until, updated_at, scope, operation, key,
	// attempt.
	ExtendLease string
	// SelectPending lists pending records, oldest update first.
	// Args: limit. Columns: as Select.
	SelectPending string
	// SelectStale lists processing records whose lease expired (or was
	// released) and that were last updated before a time, oldest first.
	// Args: now, updated_before, limit. Columns: as Select.
	SelectStale string
	// UnfinishedStats counts processing and pending records. Columns:
	// status, count, oldest created_at. Args: none.
	UnfinishedStats string
	// OldestExpired returns the smallest expires_at of a finished record.
	// Columns: expires_at (NULL when none). Args: none.
	OldestExpired string
	// Purge deletes up to limit completed or failed records whose
	// expires_at is before a time, in one short statement. Args: before,
	// limit.
	Purge string
	// Delete removes one record. Args: scope, operation, key.
	Delete string
	// Clock reads the database server's current time as microseconds since
	// the Unix epoch (one BIGINT column), for [Config.ClockSync]. Empty
	// where every client shares the database's clock (SQLite, in process).
	// Args: none.
	Clock string

	// ZeroRowsAmbiguous is set where an UPDATE that matched a row but
	// changed no value reports zero rows affected (MySQL without
	// CLIENT_FOUND_ROWS); the store then reads the row back to tell a no-op
	// from a fenced-off write.
	ZeroRowsAmbiguous bool

	// CreateMigrationsTable creates the table that records applied schema
	// versions, if it does not exist.
	CreateMigrationsTable string
	// SelectMigrations lists applied versions. Columns: version.
	SelectMigrations string
	// SelectMigration counts one applied version. Args: version.
	SelectMigration string
	// InsertMigration records a version. Args: version, name, applied_at.
	InsertMigration string
	// LockMigrations, when not empty, runs on a dedicated connection before
	// migrating and returns one row whose only column is 1 once a lock that
	// excludes other migrating processes is held. Args: lock name.
	LockMigrations string
	// UnlockMigrations releases that lock. Args: lock name.
	UnlockMigrations string
}

//go:embed migrations
var migrationFiles embed.FS

func subFS(dir string) fs.FS {
	sub, err := fs.Sub(migrationFiles, "migrations/"+dir)
	if err != nil {
		// The directory is embedded at build time; this cannot happen.
		panic(err)
	}
	return sub
}

// tableToken matches the identifier the migration files and query templates
// are written for; the configured table name replaces it.
var tableToken = regexp.MustCompile(`\binbox\b|\binbox_`)

// renameTable rewrites SQL written for a table called "inbox" (and its
// constraint and index names "inbox_...") for table.
func renameTable(sql, table string) string {
	if table == "inbox" {
		return sql
	}
	return tableToken.ReplaceAllStringFunc(sql, func(m string) string {
		return table + strings.TrimPrefix(m, "inbox")
	})
}

// columns is the select list shared by every dialect, in Record order.
const columns = `scope, operation, %KEY%, payload_hash, status, attempt, lease_owner, lease_until,
	result, resource_id, correlation_id, external_ref, error, created_at, updated_at, expires_at`

// statuses of records a purge may delete, and of unfinished ones.
const (
	finishedStatuses   = `('completed', 'failed')`
	unfinishedStatuses = `('processing', 'pending')`
)
