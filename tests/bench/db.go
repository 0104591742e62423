package main

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/mysql"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
	"github.com/inboxmill/inboxmill/tests/testdb" // DSNs (and their environment overrides), drivers, table names
)

// dialect is one database as the benchmark reaches it.
type dialect struct {
	name   string // pg, mysql, sqlite: the BENCH lines' dialect field
	driver string
	inbox  inbox.Dialect
}

var dialects = []dialect{
	{name: "pg", driver: "pgx", inbox: postgres.Dialect()},
	{name: "mysql", driver: "mysql", inbox: mysql.Dialect()},
	{name: "sqlite", driver: "sqlite", inbox: sqlite.Dialect()},
}

func dialectByName(name string) (dialect, bool) {
	for _, d := range dialects {
		if d.name == name {
			return d, true
		}
	}
	return dialect{}, false
}

func (d dialect) ph(n int) string { return d.inbox.Placeholder(n) }

func (d dialect) serverDSN() string {
	if d.name == "mysql" {
		return testdb.MySQLDSN()
	}
	return testdb.PostgresDSN()
}

// bench holds a run's options, output and results.
type bench struct {
	opts      options
	out, log  io.Writer
	sqliteDir string
	results   []result
	// rounds are the rounds behind each result that had several, in the
	// order they ran, by roundKey.
	rounds map[string][]result
	purges []purgeResult
}

func newBench(o options, stdout, stderr io.Writer) (*bench, error) {
	dir, err := os.MkdirTemp("", "inboxmill-bench-")
	if err != nil {
		return nil, err
	}
	// The log takes writes from this process's goroutines and from the
	// child processes' output copiers at once; so may the output.
	return &bench{opts: o, out: &lockedWriter{w: stdout}, log: &lockedWriter{w: stderr}, sqliteDir: dir}, nil
}

// lockedWriter serializes writes to w, which need not be safe for
// concurrent use (a bytes.Buffer in tests).
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (b *bench) close() { _ = os.RemoveAll(b.sqliteDir) }

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "bench: "+format+"\n", args...)
}

// ping fails early, and clearly, when a server is down.
func (b *bench) ping(ctx context.Context, d dialect) error {
	if d.name == "sqlite" {
		return nil
	}
	db, err := sql.Open(d.driver, d.serverDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		return fmt.Errorf("%s is unreachable (INBOXMILL_POSTGRES_DSN / INBOXMILL_MYSQL_DSN, or leave it out with --dialects): %w",
			d.name, err)
	}
	return nil
}

// fixture is one measurement's database handle and tables. Every table has
// a unique name and is dropped by close; a SQLite measurement gets a file of
// its own.
type fixture struct {
	d       dialect
	db      *sql.DB
	file    string
	tables  []string
	effects string // the business table: one row per executed handler
	insert  string // INSERT INTO effects (event_id, amount)
	prepare inbox.Prepare
	group   dedup.Group // inboxmill_group's settings
	batch   dedup.Batch // inboxmill_reserve_batch's settings
	logf    func(format string, args ...any)
	// cleanups run at close, before the tables are dropped.
	cleanups []func(ctx context.Context)
}

// newFixture opens a dedicated *sql.DB with conns connections and creates
// the business table.
func (b *bench) newFixture(ctx context.Context, d dialect, prefix string, conns int) (*fixture, error) {
	f := &fixture{d: d, prepare: b.opts.prepare, group: b.opts.group, batch: b.opts.batch, logf: b.logf}
	dsn := ""
	if d.name == "sqlite" {
		f.file = filepath.Join(b.sqliteDir, testdb.UniqueName(prefix)+".db")
		dsn = sqlite.DSN(f.file)
	} else {
		dsn = d.serverDSN()
	}
	db, err := sql.Open(d.driver, dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	f.db = db
	f.effects = testdb.UniqueName("bench_effects")
	if err := f.exec(ctx, "CREATE TABLE "+f.effects+" (event_id VARCHAR(255) NOT NULL, amount INTEGER NOT NULL)"); err != nil {
		f.close()
		return nil, err
	}
	f.tables = append(f.tables, f.effects)
	f.insert = fmt.Sprintf("INSERT INTO %s (event_id, amount) VALUES (%s, %s)", f.effects, d.ph(1), d.ph(2))
	return f, nil
}

func (f *fixture) exec(ctx context.Context, query string, args ...any) error {
	_, err := f.db.ExecContext(ctx, query, args...)
	return err
}

// newStore creates and migrates an inbox table of its own.
func (f *fixture) newStore(ctx context.Context) (*inbox.Store, error) {
	store, err := inbox.NewStore(f.db, f.d.inbox, inbox.Config{Table: testdb.UniqueName("bench_inbox"), Prepare: f.prepare})
	if err != nil {
		return nil, err
	}
	f.tables = append(f.tables, inbox.TableNames(store.Table())...)
	return store, store.Migrate(ctx)
}

// count returns the rows of table.
func (f *fixture) count(ctx context.Context, table string) (int64, error) {
	var n int64
	err := f.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&n)
	return n, err
}

// expectRows fails when table does not hold exactly want rows: a benchmark
// that lost or doubled effects measured something else.
func (f *fixture) expectRows(ctx context.Context, table string, want int) error {
	n, err := f.count(ctx, table)
	if err != nil {
		return err
	}
	if n != int64(want) {
		return fmt.Errorf("%s holds %d rows, want %d", table, n, want)
	}
	return nil
}

// awaitRows waits up to a minute for table to hold want rows.
func (f *fixture) awaitRows(ctx context.Context, table string, want int) error {
	deadline := time.Now().Add(time.Minute)
	for {
		n, err := f.count(ctx, table)
		if err != nil || n >= int64(want) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// close drops the fixture's tables (also after a cancelled run) and closes
// the database.
func (f *fixture) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range f.cleanups {
		c(ctx)
	}
	for _, t := range f.tables {
		_ = f.exec(ctx, "DROP TABLE IF EXISTS "+t)
	}
	_ = f.db.Close()
	if f.file != "" {
		for _, suffix := range []string{"", "-wal", "-shm"} {
			_ = os.Remove(f.file + suffix)
		}
	}
}

// seedRows says what rows seed adds besides their number.
type seedRows struct {
	// keys is how their keys are made (see keyOrder.seedKey).
	keys keyOrder
	// origin is the Unix millisecond of uuidv7 keys' row 0: row n's key
	// carries origin + n, so that the seeded keys sort in row order and
	// before every key made after origin + the last row.
	origin int64
	// expiredTo: rows 1 … expiredTo expired in the past, row n two days
	// ago plus n ms and created (and updated) seven days before that, so
	// that rows expire in row order as they would in a table filled over
	// time. Later rows are created now and expire in seven days.
	expiredTo int64
	// bulk puts every row in one statement, in no particular order: for
	// bulkLoad on MariaDB, where InnoDB sorts every index itself.
	bulk bool
	// bucket, when set, is the SQL of a partitioned inbox's bucket column
	// for the live rows (PostgreSQL only), over the row source's columns,
	// and expiredBucket that of the expired rows; unset, a partitioned
	// table puts rows in the current bucket.
	bucket, expiredBucket string
}

// seed adds the rows from+1 … to to an inbox table through q with
// server-side generation, in statements of at most a million rows, as
// completed records of operation "bench" with keys as rows says:
// random-looking ones (an MD5 of the row number; random bytes on SQLite)
// spread over the whole key index like random event IDs, uuidv7 ones sort
// in row order. Each statement inserts its rows in key order (unless
// bulk), which keeps the load from being a random-I/O crawl. settle then
// makes the table ready to be measured.
func (f *fixture) seed(ctx context.Context, q execer, table string, from, to int64, rows seedRows, progress func(done int64)) error {
	chunk, order := int64(1_000_000), "\nORDER BY 3"
	if rows.bulk {
		chunk, order = max(to-from, 1), ""
	}
	now := time.Now().UTC()
	key := rows.keys.seedKey(f.d.name)
	// when picks an expired row's value or a live row's.
	when := func(expired, live string) string {
		if rows.expiredTo <= from {
			return live
		}
		return fmt.Sprintf("CASE WHEN n <= %d THEN %s ELSE %s END", rows.expiredTo, expired, live)
	}
	for lo := from + 1; lo <= to; lo += chunk {
		hi := min(lo+chunk-1, to)
		var err error
		switch f.d.name {
		case "pg":
			created := when("now() - interval '9 days' + n * interval '1 millisecond'", "now()")
			expires := when("now() - interval '2 days' + n * interval '1 millisecond'", "now() + interval '7 days'")
			bucketCol, bucket := "", ""
			if rows.bucket != "" || rows.expiredBucket != "" {
				bucketCol, bucket = ", bucket", ", "+when(cmp.Or(rows.expiredBucket, "now()"), cmp.Or(rows.bucket, "now()"))
			}
			_, err = q.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s (scope, operation, key, payload_hash, status, attempt,
	created_at, updated_at, expires_at%s)
SELECT '', 'bench', %s, sha256(('seed-' || n)::bytea), 'completed', 1, %s, %s, %s%s
FROM (SELECT g AS n, lpad(to_hex(%d::bigint + g), 12, '0') AS h, md5('seed-' || g) AS m
	FROM generate_series($1::bigint, $2::bigint) AS g) AS s%s`, table, bucketCol, key, created, created, expires, bucket,
				rows.origin, order), lo, hi)
		case "mysql":
			created := when("UTC_TIMESTAMP(6) - INTERVAL 9 DAY + INTERVAL n * 1000 MICROSECOND", "UTC_TIMESTAMP(6)")
			expires := when("UTC_TIMESTAMP(6) - INTERVAL 2 DAY + INTERVAL n * 1000 MICROSECOND", "UTC_TIMESTAMP(6) + INTERVAL 7 DAY")
			// The sequence engine's table seq_<lo>_to_<hi> generates the numbers.
			_, err = q.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (scope, operation, `key`, payload_hash, status, attempt,\n"+
				"\tcreated_at, updated_at, expires_at)\n"+
				"SELECT '', 'bench', %s, UNHEX(SHA2(CONCAT('seed-', n), 256)), 'completed', 1, %s, %s, %s\n"+
				"FROM (SELECT seq AS n, LPAD(LOWER(HEX(%d + seq)), 12, '0') AS h, MD5(CONCAT('seed-', seq)) AS m\n"+
				"\tFROM seq_%d_to_%d) AS s%s", table, key, created, created, expires, rows.origin, lo, hi, order))
		case "sqlite":
			// Microseconds since the epoch.
			day := int64(24 * time.Hour / time.Microsecond)
			us := now.UnixMicro()
			created := when(fmt.Sprintf("%d + n * 1000", us-9*day), strconv.FormatInt(us, 10))
			expires := when(fmt.Sprintf("%d + n * 1000", us-2*day), strconv.FormatInt(us+7*day, 10))
			// MATERIALIZED: m is random and used more than once.
			_, err = q.ExecContext(ctx, fmt.Sprintf(`WITH RECURSIVE g(n) AS (SELECT ? UNION ALL SELECT n + 1 FROM g WHERE n < ?),
s AS MATERIALIZED (SELECT n, printf('%%012x', %d + n) AS h, lower(hex(randomblob(16))) AS m FROM g)
INSERT INTO %s (scope, operation, "key", payload_hash, status, attempt, created_at, updated_at, expires_at)
SELECT '', 'bench', %s, randomblob(32), 'completed', 1, %s, %s, %s
FROM s%s`, rows.origin, table, key, created, created, expires, order), lo, hi)
		}
		if err != nil {
			return fmt.Errorf("seed rows %d to %d: %w", lo, hi, err)
		}
		progress(hi)
	}
	return nil
}

// execer is a *sql.DB or a *sql.Tx.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// bulkLoad runs fill, which seeds an empty table through q, with bulk set
// where one statement should insert every row. On MariaDB that statement
// runs with unique and foreign key checks off, which makes InnoDB build the
// empty table's indexes by sorting (its bulk insert, MariaDB 10.6 and
// later) instead of inserting row by row into indexes that are in another
// order than the rows, as expires_at is for random keys (see
// docs/benchmarks.md). Only for rows whose keys are unique by construction.
func (f *fixture) bulkLoad(ctx context.Context, fill func(q execer, bulk bool) error) (err error) {
	if f.d.name != "mysql" {
		return fill(f.db, false)
	}
	conn, err := f.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET SESSION unique_checks = 0, foreign_key_checks = 0"); err != nil {
		return err
	}
	defer func() {
		// The connection goes back to the pool: checks on again, or gone.
		if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), "SET SESSION unique_checks = 1, foreign_key_checks = 1"); rerr != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			err = errors.Join(err, rerr)
		}
	}()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fill(tx, true); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// settle makes a freshly seeded table ready to be measured: statistics,
// and no checkpoint or purge of the load left pending. undoBefore is
// undoBacklog's reading from before the load.
func (f *fixture) settle(ctx context.Context, table string, undoBefore int64) error {
	var finish []string
	switch f.d.name {
	case "pg":
		// Vacuum and statistics now rather than by an autovacuum in the
		// middle of a measurement (or never, where it is off); the
		// checkpoint keeps the load's writes out of the measurement.
		finish = []string{"VACUUM (ANALYZE) " + table, "CHECKPOINT"}
	case "mysql":
		finish = []string{"ANALYZE TABLE " + table}
	case "sqlite":
		finish = []string{"PRAGMA wal_checkpoint(TRUNCATE)"}
	}
	for _, q := range finish {
		// CHECKPOINT needs a superuser; without one the measurement is only
		// noisier.
		if err := f.exec(ctx, q); err != nil && !(f.d.name == "pg" && q == "CHECKPOINT") {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	if f.d.name == "mysql" {
		// InnoDB's purge threads go over what the load's transactions left
		// in the undo log (MariaDB resets the inserted rows' transaction
		// IDs); wait for them rather than measure beside them.
		start := time.Now()
		settled, err := f.awaitUndoPurged(ctx, undoBefore, 10*time.Minute)
		if err != nil {
			return err
		}
		if !settled {
			f.logf("%s: InnoDB's history list still above %d after %v; measuring anyway", table, undoBefore,
				time.Since(start).Round(time.Second))
		}
	}
	return nil
}

// undoBacklog is InnoDB's history list length: the committed transactions
// whose undo log the purge threads have yet to go over (server-wide). 0 on
// PostgreSQL and SQLite.
func (f *fixture) undoBacklog(ctx context.Context) (int64, error) {
	if f.d.name != "mysql" {
		return 0, nil
	}
	return f.globalStatus(ctx, "INNODB_HISTORY_LIST_LENGTH")
}

// awaitUndoPurged waits until the history list is back to at most target,
// or timeout passed, and reports whether it got there. The list is server-wide: other clients' transactions are in it too.
func (f *fixture) awaitUndoPurged(ctx context.Context, target int64, timeout time.Duration) (settled bool, err error) {
	deadline := time.Now().Add(timeout)
	for {
		n, err := f.undoBacklog(ctx)
		if err != nil || n <= target {
			return err == nil, err
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// globalStatus reads one of MariaDB's numeric server status variables.
func (f *fixture) globalStatus(ctx context.Context, name string) (int64, error) {
	var n int64
	err := f.db.QueryRowContext(ctx,
		"SELECT CAST(VARIABLE_VALUE AS SIGNED) FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = ?", name).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("status %s: %w", name, err)
	}
	return n, nil
}
