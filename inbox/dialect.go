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
	// Classify wraps err with [ErrTransient] when retrying the transaction
	// may succeed, and returns it unchanged otherwise. It is also useful for
	// errors of the caller's own statements in the same transaction.
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
	// lease_until, correlation_id, created_at, updated_at, expires_at.
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
	// Complete marks the record completed with its result, only while the
	// attempt matches. Args: result, resource_id, external_ref, updated_at,
	// scope, operation, key, attempt.
	Complete string
	// Delete removes one record. Args: scope, operation, key.
	Delete string

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
