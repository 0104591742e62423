// Package testkit holds the helpers this module's own tests share: a
// recording watermill logger, a clock the tests move forward, migrated
// SQLite inbox stores, and free ports for scratch servers. It is for tests only (_test.go files); nothing else
// in the module may import it, and it makes no promise of compatibility.
//
// The real databases themselves are opened by package testdb.
package testkit

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// Clock is inboxtest.Clock: the wall clock plus an offset tests move.
type Clock = inboxtest.Clock

// SQLiteStore returns an inbox store over a new SQLite file in t.TempDir()
// (opened with sqlite.DSN), migrated, and its database. The store and
// the database are closed when the test ends; closing the database earlier,
// as a test checking for leaked goroutines does, is fine.
func SQLiteStore(t testing.TB, cfg inbox.Config) (*inbox.Store, *sql.DB) {
	t.Helper()
	db := testdb.Open(t, testdb.SQLite)
	return MigratedStore(t, db, sqlite.Dialect(), cfg), db
}

// MigratedStore returns a store over db in dialect d, migrated, and closes
// the store (not db) when the test ends.
func MigratedStore(t testing.TB, db *sql.DB, d inbox.Dialect, cfg inbox.Config) *inbox.Store {
	t.Helper()
	store, err := inbox.NewStore(db, d, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	require.NoError(t, store.Migrate(context.Background()))
	return store
}

// LogEntry is one line a [Logger] recorded.
type LogEntry struct {
	// Level is "error", "info", "debug" or "trace".
	Level string
	Msg   string
	// Err is the error passed to Error; nil at the other levels.
	Err error
	// Fields are the line's fields, with those of the With calls that made
	// the logger.
	Fields watermill.LogFields
}

func (e LogEntry) String() string {
	return fmt.Sprintf("%s %s err=%v %v", e.Level, e.Msg, e.Err, e.Fields)
}

// Logger is a watermill.LoggerAdapter that records every line, at every
// level. The loggers its With returns record into the same list. It is safe
// for concurrent use. Make one with [NewLogger].
type Logger struct {
	rec  *record
	with watermill.LogFields
}

type record struct {
	mu      sync.Mutex
	entries []LogEntry
}

var _ watermill.LoggerAdapter = (*Logger)(nil)

// NewLogger returns a Logger that has recorded nothing yet.
func NewLogger() *Logger { return &Logger{rec: &record{}} }

func (l *Logger) log(level, msg string, err error, fields watermill.LogFields) {
	l.rec.mu.Lock()
	defer l.rec.mu.Unlock()
	l.rec.entries = append(l.rec.entries, LogEntry{Level: level, Msg: msg, Err: err, Fields: l.with.Add(fields)})
}

// Error records a line at level "error".
func (l *Logger) Error(msg string, err error, fields watermill.LogFields) {
	l.log("error", msg, err, fields)
}

// Info records a line at level "info".
func (l *Logger) Info(msg string, fields watermill.LogFields) { l.log("info", msg, nil, fields) }

// Debug records a line at level "debug".
func (l *Logger) Debug(msg string, fields watermill.LogFields) { l.log("debug", msg, nil, fields) }

// Trace records a line at level "trace".
func (l *Logger) Trace(msg string, fields watermill.LogFields) { l.log("trace", msg, nil, fields) }

// With returns a logger that adds fields to every line it records into l's
// list.
func (l *Logger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return &Logger{rec: l.rec, with: l.with.Add(fields)}
}

// Entries returns a copy of every line recorded so far, oldest first.
func (l *Logger) Entries() []LogEntry {
	l.rec.mu.Lock()
	defer l.rec.mu.Unlock()
	return append([]LogEntry(nil), l.rec.entries...)
}

// At returns the lines recorded so far at level, oldest first.
func (l *Logger) At(level string) []LogEntry {
	var out []LogEntry
	for _, e := range l.Entries() {
		if e.Level == level {
			out = append(out, e)
		}
	}
	return out
}

// WaitFor polls cond every 50 ms until it holds, and fails t with what and
// cond's last error when it has not held within limit.
func WaitFor(t testing.TB, limit time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (last error: %v)", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// MainWithLeakCheck is a TestMain that fails a passing test binary when a
// goroutine outlives its tests (a heartbeat or a background loop that was
// not stopped). The shared server databases are closed first, so that
// their drivers' connection goroutines end with them.
func MainWithLeakCheck(m *testing.M) {
	code := m.Run()
	testdb.CloseShared()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener")); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
