// Package testdb opens the real databases the tests run against. It is
// this module's test harness, shared by the tests of every package (which
// is why it sits under tests/ and not under internal/, whose packages
// import nothing of the module): not an API, and without any promise of
// compatibility.
//
// PostgreSQL and MySQL/MariaDB are reached at INBOXMILL_POSTGRES_DSN and
// INBOXMILL_MYSQL_DSN (defaults: the local servers scripts/test.sh checks).
// When a server does not answer, a test is skipped on a developer's machine
// and fails when the CI environment variable is set: CI must never pass by
// skipping the tests that matter.
//
// INBOXMILL_TEST_LIGHT=1 (scripts/test.sh --light) skips every server
// database without trying it, so that a light run uses SQLite alone even
// where servers answer. CI ignores it: with CI set the servers are used,
// or their tests fail.
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // registers "mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	_ "github.com/lib/pq"              // registers "postgres"
	_ "modernc.org/sqlite"             // registers "sqlite"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/mysql"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

// Kind names a database and driver combination.
type Kind string

const (
	SQLite      Kind = "sqlite"
	PostgresPQ  Kind = "postgres-pq"
	PostgresPGX Kind = "postgres-pgx"
	MySQL       Kind = "mysql"
)

// All is every kind, in the order tests run them.
var All = []Kind{SQLite, PostgresPQ, PostgresPGX, MySQL}

const (
	defaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	defaultMySQLDSN    = "root@tcp(127.0.0.1:3306)/test?parseTime=true"
)

// PostgresDSN is the PostgreSQL the tests use.
func PostgresDSN() string { return envOr("INBOXMILL_POSTGRES_DSN", defaultPostgresDSN) }

// MySQLDSN is the MySQL/MariaDB the tests use.
func MySQLDSN() string { return envOr("INBOXMILL_MYSQL_DSN", defaultMySQLDSN) }

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Dialect returns the inbox dialect for kind.
func Dialect(kind Kind) inbox.Dialect {
	switch kind {
	case SQLite:
		return sqlite.Dialect()
	case MySQL:
		return mysql.Dialect()
	default:
		return postgres.Dialect()
	}
}

var (
	mu     sync.Mutex
	shared = map[Kind]*sql.DB{}
	failed = map[Kind]error{}
)

// Open returns a database of the given kind. Server databases are shared by
// the whole test binary (tests isolate themselves by table name); SQLite is a
// new file in t.TempDir().
func Open(t testing.TB, kind Kind) *sql.DB {
	t.Helper()
	if kind == SQLite {
		return OpenSQLite(t, filepath.Join(t.TempDir(), "inbox.db"))
	}
	if Light() {
		t.Skipf("%s: a light run (INBOXMILL_TEST_LIGHT, scripts/test.sh --light) uses no database server", kind)
	}
	mu.Lock()
	defer mu.Unlock()
	if db, ok := shared[kind]; ok {
		return db
	}
	if err, ok := failed[kind]; ok {
		unreachable(t, kind, err)
	}
	driver, dsn := "postgres", PostgresDSN()
	switch kind {
	case PostgresPGX:
		driver = "pgx"
	case MySQL:
		driver, dsn = "mysql", MySQLDSN()
	}
	db, err := sql.Open(driver, dsn)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = db.PingContext(ctx)
		cancel()
	}
	if err != nil {
		failed[kind] = err
		unreachable(t, kind, err)
	}
	// Every test package is a binary of its own, and `go test ./...` runs
	// as many at once as there are cores, all against one server whose
	// max_connections (100 by default) other work shares too: each binary
	// gets a small pool per kind (pq and pgx reach the same PostgreSQL).
	// Concurrency tests still race 32 deliveries; they queue for these.
	n := MaxConns()
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	shared[kind] = db
	return db
}

func unreachable(t testing.TB, kind Kind, err error) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is unreachable and CI is set, so this test fails instead of skipping: %v", kind, err)
	}
	t.Skipf("%s is unreachable (set CI=1 to fail instead): %v", kind, err)
}

// Light reports whether this is a light run: INBOXMILL_TEST_LIGHT set and
// CI not, since CI must never pass by skipping.
func Light() bool { return os.Getenv("INBOXMILL_TEST_LIGHT") != "" && os.Getenv("CI") == "" }

// MaxConns is the pool size of each shared server database in one test
// binary: INBOXMILL_TEST_MAX_CONNS, default 10.
func MaxConns() int {
	if v, err := strconv.Atoi(os.Getenv("INBOXMILL_TEST_MAX_CONNS")); err == nil && v > 0 {
		return v
	}
	return 10
}

// OpenSQLite opens (creating) the SQLite file at path with sqlite.DSN.
func OpenSQLite(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", sqlite.DSN(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	// One connection switches a new file to WAL before tests open more
	// at once (see sqlite.DSN).
	if err := db.Ping(); err != nil {
		t.Fatal(err)
	}
	return db
}

// OpenSQLiteUnopened is OpenSQLite without the first connection: the file
// at path is not created until something uses the database, for tests of
// what happens when it does not exist yet.
func OpenSQLiteUnopened(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", sqlite.DSN(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// UniqueName returns prefix plus a random suffix, a valid identifier for a
// per-test table.
func UniqueName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// EachMode runs f as a parallel subtest for every kind in All, in the
// default statement mode (prepared on MySQL and SQLite, text on
// PostgreSQL) and once more in the mode that default leaves out:
// PrepareAlways on both PostgreSQL drivers, PrepareNever on SQLite and
// MySQL. Subtests are named after the kind, plus "/prepare-<mode>".
func EachMode(t *testing.T, f func(t *testing.T, kind Kind, prepare inbox.Prepare)) {
	other := map[Kind]inbox.Prepare{
		PostgresPQ:  inbox.PrepareAlways,
		PostgresPGX: inbox.PrepareAlways,
		SQLite:      inbox.PrepareNever,
		MySQL:       inbox.PrepareNever,
	}
	for _, kind := range All {
		for _, prepare := range []inbox.Prepare{inbox.PrepareAuto, other[kind]} {
			name := string(kind)
			if prepare != inbox.PrepareAuto {
				name += "/prepare-" + prepare.String()
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				f(t, kind, prepare)
			})
		}
	}
}

// CloseShared closes the server databases Open shares across the test
// binary, so that a leak check after the tests does not find their
// drivers' connection goroutines. Open after it opens new ones.
func CloseShared() {
	mu.Lock()
	defer mu.Unlock()
	for k, db := range shared {
		_ = db.Close()
		delete(shared, k)
	}
}
