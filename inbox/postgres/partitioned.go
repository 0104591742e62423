package postgres

import (
	"embed"
	"io/fs"
	"slices"
	"strings"

	"github.com/inboxmill/inboxmill/inbox"
)

// Partitions configures a partitioned inbox table: see [inbox.Partitioning]
// for its fields and defaults.
type Partitions = inbox.Partitioning

// Partitioned returns the PostgreSQL dialect of an inbox table partitioned
// by time (PARTITION BY RANGE on the start of each record's bucket), so
// that the purge drops whole partitions rather than deleting rows: a
// partition of a million rows goes in a fraction of a second and writes
// almost no WAL, where a batched DELETE writes hundreds of bytes of WAL a
// row and leaves VACUUM to do.
//
// One record per (scope, operation, key) holds across partitions: a claim
// locks its key's stripe (a row of "<table>_stripes") and looks for the
// key in every partition before it inserts (migration 001 explains why
// the primary key alone would not do). Under READ COMMITTED a claim of a
// key another transaction holds waits and then sees its outcome; under
// REPEATABLE READ or SERIALIZABLE (watermill-sql's consuming transaction)
// a claim whose snapshot predates another's commit of the key fails with
// a serialization error, which is transient: the retry sees the record.
// Each claim probes every partition's primary key, so keep the number of
// partitions moderate (at most [inbox.MaxPartitions]).
//
// The schema differs from [Dialect]'s: an existing table is not turned
// into a partitioned one by migrating. Migrate a new table (another
// Config.Table) and switch over once the old one's records have expired.
func Partitioned(p Partitions) inbox.Dialect { return partitioned{cfg: p.WithDefaults()} }

type partitioned struct {
	dialect
	cfg Partitions
}

//go:embed partitioned/*.sql
var partitionedMigrations embed.FS

func (partitioned) Name() string { return "postgres" }

func (d partitioned) Partitioning() inbox.Partitioning { return d.cfg }

// Migrations are the plain dialect's, with version 1 (the inbox table)
// replaced by the partitioned table's.
func (partitioned) Migrations() fs.FS {
	sub, err := fs.Sub(partitionedMigrations, "partitioned")
	if err != nil {
		panic(err) // embedded at build time
	}
	return overlay{top: sub, base: dialect{}.Migrations()}
}

func (partitioned) Queries(table string) inbox.Queries { return partitionedQueries{queries{t: table}} }

func (partitioned) PartitionQueries(table string) inbox.PartitionQueries {
	return partitionQueries{t: table}
}

// partitionedQueries are the plain dialect's statements, except those that
// insert (which go through the claimable check and bind the bucket) and the
// purge (whose batch is picked by the full primary key).
type partitionedQueries struct{ queries }

func (q partitionedQueries) Insert() inbox.Query {
	// INSERT ... SELECT binds every parameter as text unless cast.
	return q.q(`INSERT INTO "{{table}}" (scope, operation, key, bucket, payload_hash, status, attempt, lease_owner,
	lease_until, correlation_id, error, created_at, updated_at, expires_at)
SELECT $1::text, $2::text, $3::text, $13::timestamptz, $4::bytea, $5::text, 1, NULLIF($6::text, ''),
	$7::timestamptz, NULLIF($8::text, ''), NULLIF($9::text, ''), $10::timestamptz, $11::timestamptz, $12::timestamptz
WHERE "{{table}}_claimable"($1::text, $2::text, $3::text)
ON CONFLICT (scope, operation, key, bucket) DO NOTHING`,
		with(inbox.ArgPayloadHash, inbox.ArgStatus, inbox.ArgLeaseOwner, inbox.ArgLeaseUntil, inbox.ArgCorrelationID,
			inbox.ArgError, inbox.ArgCreatedAt, inbox.ArgUpdatedAt, inbox.ArgExpiresAt, inbox.ArgBucket)...)
}

var partitionedRowArgs = append(append([]inbox.Arg{}, rowArgs...), inbox.ArgBucket)

func (q partitionedQueries) InsertMany(int) inbox.RowsQuery {
	// The claimable check runs on the rows in stripe order (a volatile
	// condition is not pushed into the ordered subquery), so two claiming
	// transactions lock their stripes in one order and cannot deadlock.
	return inbox.RowsQuery{SQL: inbox.MustRenderSQL(`INSERT INTO "{{table}}" (scope, operation, key, bucket, payload_hash,
	status, attempt, correlation_id, error, created_at, updated_at, expires_at, lease_owner, lease_until)
SELECT r.scope, r.operation, r.key, r.bucket, r.payload_hash, r.status, 1, NULLIF(r.correlation_id, ''),
	NULLIF(r.error, ''), r.created_at, r.updated_at, r.expires_at, NULLIF(r.lease_owner, ''), r.lease_until
FROM (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::text[], $7::text[],
		$8::timestamptz[], $9::timestamptz[], $10::timestamptz[], $11::text[], $12::timestamptz[], $13::timestamptz[])
		AS u(scope, operation, key, payload_hash, status, correlation_id, error, created_at, updated_at, expires_at,
			lease_owner, lease_until, bucket)
	ORDER BY "{{table}}_stripe"(u.scope, u.operation, u.key), u.scope, u.operation, u.key) AS r
WHERE "{{table}}_claimable"(r.scope, r.operation, r.key)
ON CONFLICT (scope, operation, key, bucket) DO NOTHING
RETURNING scope, operation, key`, q.t), RowArgs: partitionedRowArgs, Array: arrayLiteral, Returning: true}
}

// MissingTables looks for the stripes table too.
func (q partitionedQueries) MissingTables() inbox.Query {
	return q.missingTables("{{table}}", "{{table}}_audit", "{{table}}_stripes")
}

func (q partitionedQueries) Purge() inbox.Query {
	return q.q(`DELETE FROM "{{table}}" WHERE (scope, operation, key, bucket) IN (
	SELECT scope, operation, key, bucket FROM "{{table}}"
	WHERE expires_at < $1 AND status IN `+inbox.FinishedStatuses+`
	LIMIT $2 FOR UPDATE SKIP LOCKED)`, inbox.ArgBefore, inbox.ArgLimit)
}

type partitionQueries struct{ t string }

func (q partitionQueries) q(sql string, args ...inbox.Arg) inbox.Query {
	return inbox.Query{SQL: inbox.MustRenderSQL(sql, q.t), Args: args}
}

// detachMark is the comment a partition gets before it is detached: a
// table detached by the store and not dropped yet is recognised by it, and
// a table an operator detached to keep is left alone.
const detachMark = "inboxmill: detached for dropping"

func (q partitionQueries) ListPartitions() inbox.Query {
	// The bounds are read from the partition's bound expression, whose
	// times are printed in the session's time zone with their offset.
	return q.q(`SELECT c.relname::text,
	CASE WHEN i.inhrelid IS NOT NULL AND NOT i.inhdetachpending
		THEN (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]::timestamptz END,
	CASE WHEN i.inhrelid IS NOT NULL AND NOT i.inhdetachpending
		THEN (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz END,
	i.inhrelid IS NULL OR i.inhdetachpending
FROM pg_class c
LEFT JOIN pg_inherits i ON i.inhrelid = c.oid AND i.inhparent = '"{{table}}"'::regclass
WHERE c.relkind = 'r' AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = '"{{table}}"'::regclass)
	AND (i.inhrelid IS NOT NULL
		OR (left(c.relname, length('{{table}}_p')) = '{{table}}_p'
			AND obj_description(c.oid, 'pg_class') = '` + detachMark + `'))
ORDER BY 2 NULLS LAST, 1`)
}

func (q partitionQueries) AddPartition() inbox.Query {
	return q.q(`SELECT "{{table}}_add_partition"($1, $2, $3)`, inbox.ArgName, inbox.ArgBucket, inbox.ArgBucketEnd)
}

func (q partitionQueries) PartitionBlocked(name string) inbox.Query {
	return inbox.Query{SQL: `SELECT 1 FROM "` + name + `"
WHERE status IN ` + inbox.UnfinishedStatuses + ` OR expires_at IS NULL OR expires_at >= $1 LIMIT 1`,
		Args: []inbox.Arg{inbox.ArgBefore}}
}

func (q partitionQueries) MarkDetaching(name string) inbox.Query {
	return inbox.Query{SQL: `COMMENT ON TABLE "` + name + `" IS '` + detachMark + `'`}
}

func (q partitionQueries) DetachPartition(name string) inbox.Query {
	return q.q(`ALTER TABLE "{{table}}" DETACH PARTITION "` + name + `" CONCURRENTLY`)
}

func (q partitionQueries) FinishDetach(name string) inbox.Query {
	return q.q(`ALTER TABLE "{{table}}" DETACH PARTITION "` + name + `" FINALIZE`)
}

func (q partitionQueries) CountPartition(name string) inbox.Query {
	return inbox.Query{SQL: `SELECT count(*) FROM "` + name + `"`}
}

func (q partitionQueries) DropPartition(name string) inbox.Query {
	return inbox.Query{SQL: `DROP TABLE "` + name + `"`}
}

// overlay is an fs.FS of the files of top, and those of base that top
// does not have.
type overlay struct{ top, base fs.FS }

func (o overlay) Open(name string) (fs.File, error) {
	if f, err := o.top.Open(name); err == nil {
		return f, nil
	}
	return o.base.Open(name)
}

func (o overlay) ReadDir(name string) ([]fs.DirEntry, error) {
	top, err := fs.ReadDir(o.top, name)
	if err != nil {
		return nil, err
	}
	base, err := fs.ReadDir(o.base, name)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, e := range top {
		seen[e.Name()] = true
	}
	out := top
	for _, e := range base {
		if !seen[e.Name()] {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return out, nil
}

var _ inbox.PartitionedDialect = partitioned{}
