package inbox

import (
	"errors"
	"io/fs"
	"strconv"
	"strings"
	"time"
)

// Postgres returns the PostgreSQL dialect. It works with both
// github.com/lib/pq and github.com/jackc/pgx/v5/stdlib.
func Postgres() Dialect { return postgres{} }

type postgres struct{}

func (postgres) Name() string             { return "postgres" }
func (postgres) Migrations() fs.FS        { return subFS("postgres") }
func (postgres) Placeholder(n int) string { return "$" + strconv.Itoa(n) }
func (postgres) TimeArg(t time.Time) any  { return t.UTC() }

func (postgres) Queries(table string) Queries {
	cols := strings.ReplaceAll(columns, "%KEY%", "key")
	q := Queries{
		// ON CONFLICT DO NOTHING, not a plain INSERT: a unique violation would
		// abort the whole transaction, and with it the caller's work when the
		// claim joins the caller's transaction.
		Insert: `INSERT INTO inbox (scope, operation, key, payload_hash, status, attempt, lease_owner,
	lease_until, correlation_id, error, created_at, updated_at, expires_at)
VALUES ($1, $2, $3, $4, $5, 1, NULLIF($6, ''), $7, NULLIF($8, ''), NULLIF($9, ''), $10, $11, $12)
ON CONFLICT (scope, operation, key) DO NOTHING`,
		// Under READ COMMITTED every statement sees the latest commit; under
		// REPEATABLE READ the Insert above already failed with a serialization
		// error when the conflicting row was invisible, so a plain read will do.
		SelectForClaim: `SELECT ` + cols + ` FROM inbox WHERE scope = $1 AND operation = $2 AND key = $3`,
		Select:         `SELECT ` + cols + ` FROM inbox WHERE scope = $1 AND operation = $2 AND key = $3`,
		Finish: `UPDATE inbox SET status = $1, result = $2, resource_id = NULLIF($3, ''),
	external_ref = COALESCE(NULLIF($4, ''), external_ref), error = NULLIF($5, ''),
	lease_owner = NULL, lease_until = NULL, updated_at = $6, expires_at = COALESCE($7, expires_at)
WHERE scope = $8 AND operation = $9 AND key = $10 AND attempt = $11 AND status = $12`,
		TakeOver: `UPDATE inbox SET attempt = attempt + 1, lease_owner = $1, lease_until = $2, updated_at = $3
WHERE scope = $4 AND operation = $5 AND key = $6 AND attempt = $7
	AND status = 'processing' AND (lease_until IS NULL OR lease_until < $8)`,
		ExtendLease: `UPDATE inbox SET lease_until = $1, updated_at = $2
WHERE scope = $3 AND operation = $4 AND key = $5 AND attempt = $6 AND status = 'processing'`,
		SelectPending: `SELECT ` + cols + ` FROM inbox WHERE status = 'pending' ORDER BY updated_at LIMIT $1`,
		SelectStale: `SELECT ` + cols + ` FROM inbox
WHERE status = 'processing' AND (lease_until IS NULL OR lease_until < $1) AND updated_at < $2
ORDER BY updated_at LIMIT $3`,
		UnfinishedStats: `SELECT status, count(*), min(created_at) FROM inbox WHERE status IN ` + unfinishedStatuses + ` GROUP BY status`,
		Clock:           `SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint`,
		OldestExpired:   `SELECT min(expires_at) FROM inbox WHERE expires_at IS NOT NULL AND status IN ` + finishedStatuses,
		// PostgreSQL has no DELETE ... LIMIT; the batch is picked by primary
		// key, skipping rows a claim holds so that a purge never waits on one.
		Purge: `DELETE FROM inbox WHERE (scope, operation, key) IN (
	SELECT scope, operation, key FROM inbox
	WHERE expires_at < $1 AND status IN ` + finishedStatuses + `
	LIMIT $2 FOR UPDATE SKIP LOCKED)`,
		Delete: `DELETE FROM inbox WHERE scope = $1 AND operation = $2 AND key = $3`,

		CreateMigrationsTable: `CREATE TABLE IF NOT EXISTS inbox_migrations (
	version    integer     PRIMARY KEY,
	name       text        NOT NULL,
	applied_at timestamptz NOT NULL
)`,
		SelectMigrations: `SELECT version FROM inbox_migrations ORDER BY version`,
		SelectMigration:  `SELECT count(*) FROM inbox_migrations WHERE version = $1`,
		InsertMigration:  `INSERT INTO inbox_migrations (version, name, applied_at) VALUES ($1, $2, $3)`,
		// A session-level advisory lock: held across the per-migration
		// transactions, released by UnlockMigrations or when the connection ends.
		LockMigrations:   `SELECT 1 FROM (SELECT pg_advisory_lock(hashtextextended($1, 0))) AS l`,
		UnlockMigrations: `SELECT 1 FROM (SELECT pg_advisory_unlock(hashtextextended($1, 0))) AS l`,
	}
	return q.rename(table)
}

// sqlStater is implemented by the errors of lib/pq and pgx.
type sqlStater interface{ SQLState() string }

func (postgres) Classify(err error) error {
	if err == nil {
		return nil
	}
	var se sqlStater
	if errors.As(err, &se) {
		code := se.SQLState()
		switch {
		case code == "40001", // serialization_failure
			code == "40P01",               // deadlock_detected
			code == "55P03",               // lock_not_available
			code == "57P01",               // admin_shutdown (pg_terminate_backend)
			code == "57P02",               // crash_shutdown
			code == "57P03",               // cannot_connect_now
			code == "53300",               // too_many_connections
			strings.HasPrefix(code, "08"): // connection exceptions
			return transient(err)
		}
		return err
	}
	return err
}

func (q Queries) rename(table string) Queries {
	for _, s := range []*string{&q.Insert, &q.SelectForClaim, &q.Select, &q.Finish, &q.TakeOver, &q.ExtendLease,
		&q.SelectPending, &q.SelectStale, &q.UnfinishedStats, &q.OldestExpired, &q.Purge, &q.Delete,
		&q.CreateMigrationsTable, &q.SelectMigrations, &q.SelectMigration, &q.InsertMigration} {
		*s = renameTable(*s, table)
	}
	return q
}
