package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/mysql"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
	"github.com/inboxmill/inboxmill/internal/testdb" // DSNs (and their environment overrides), drivers, table names
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
}

func newBench(o options, stdout, stderr io.Writer) (*bench, error) {
	dir, err := os.MkdirTemp("", "inboxmill-bench-")
	if err != nil {
		return nil, err
	}
	return &bench{opts: o, out: stdout, log: stderr, sqliteDir: dir}, nil
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
}

// newFixture opens a dedicated *sql.DB with conns connections and creates
// the business table.
func (b *bench) newFixture(ctx context.Context, d dialect, prefix string, conns int) (*fixture, error) {
	f := &fixture{d: d, prepare: b.opts.prepare, group: b.opts.group}
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

// seed adds the rows from+1 … to to an inbox table with server-side
// generation, in statements of at most a million rows, as completed records
// of operation "bench" with random-looking keys (an MD5 of the row number;
// random bytes on SQLite) so that they spread over the whole key index like
// real event IDs. Each statement inserts its rows in key order, which keeps
// the load from being a random-I/O crawl. It then makes the table ready to
// be measured: statistics, and no checkpoint of the load left pending.
func (f *fixture) seed(ctx context.Context, table string, from, to int64, progress func(done int64)) error {
	const chunk = 1_000_000
	now := time.Now().UTC()
	for lo := from + 1; lo <= to; lo += chunk {
		hi := min(lo+chunk-1, to)
		var err error
		switch f.d.name {
		case "pg":
			err = f.exec(ctx, `INSERT INTO `+table+` (scope, operation, key, payload_hash, status, attempt,
	created_at, updated_at, expires_at)
SELECT '', 'bench', 'evt-' || md5('seed-' || g), sha256(('seed-' || g)::bytea), 'completed', 1,
	now(), now(), now() + interval '7 days'
FROM generate_series($1::bigint, $2::bigint) AS g
ORDER BY 3`, lo, hi)
		case "mysql":
			// The sequence engine's table seq_<lo>_to_<hi> generates the numbers.
			err = f.exec(ctx, fmt.Sprintf("INSERT INTO %s (scope, operation, `key`, payload_hash, status, attempt,\n"+
				"\tcreated_at, updated_at, expires_at)\n"+
				"SELECT '', 'bench', CONCAT('evt-', MD5(CONCAT('seed-', seq))), UNHEX(SHA2(CONCAT('seed-', seq), 256)),\n"+
				"\t'completed', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 7 DAY\n"+
				"FROM seq_%d_to_%d ORDER BY 3", table, lo, hi))
		case "sqlite":
			us := now.UnixMicro()
			err = f.exec(ctx, `WITH RECURSIVE g(n) AS (SELECT ? UNION ALL SELECT n + 1 FROM g WHERE n < ?)
INSERT INTO `+table+` (scope, operation, "key", payload_hash, status, attempt, created_at, updated_at, expires_at)
SELECT '', 'bench', 'evt-' || lower(hex(randomblob(16))), randomblob(32), 'completed', 1, ?, ?, ?
FROM g ORDER BY 3`, lo, hi, us, us, now.Add(7*24*time.Hour).UnixMicro())
		}
		if err != nil {
			return fmt.Errorf("seed rows %d to %d: %w", lo, hi, err)
		}
		progress(hi)
	}
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
	return nil
}
