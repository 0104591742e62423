package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// TestMain fails the tests when a goroutine outlives them: a store the
// command did not close, a console server that did not stop. The one
// meter goroutine sarama's metrics library starts for the whole process
// is not a leak.
func TestMain(m *testing.M) {
	code := m.Run()
	testdb.CloseShared()
	if code == 0 {
		if err := goleak.Find(
			goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
			goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"),
		); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// kinds are the databases every subcommand is tested against. The command
// opens PostgreSQL with pgx; the tests seed it through lib/pq.
var kinds = []testdb.Kind{testdb.SQLite, testdb.PostgresPQ, testdb.MySQL}

// monthAgo is how far back the past store's clock runs.
const monthAgo = 30 * 24 * time.Hour

// env is one inbox table the command is run against, and stores over it
// to seed and check records through.
type env struct {
	kind  testdb.Kind
	dsn   string
	table string
	db    *sql.DB
	// store runs on the real clock; past on a clock a month back, to seed
	// records created (and expired, and leased) long ago.
	store, past *inbox.Store
}

// each runs f against every kind, in parallel.
func each(t *testing.T, f func(t *testing.T, e *env)) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			f(t, setup(t, kind))
		})
	}
}

func setup(t *testing.T, kind testdb.Kind) *env {
	t.Helper()
	e := &env{kind: kind, table: inboxtest.UniqueTable("cli")}
	switch kind {
	case testdb.SQLite:
		e.dsn = filepath.Join(t.TempDir(), "inbox.db")
		e.db = testdb.OpenSQLite(t, e.dsn)
	case testdb.MySQL:
		e.db, e.dsn = testdb.Open(t, kind), testdb.MySQLDSN()
	default:
		e.db, e.dsn = testdb.Open(t, kind), testdb.PostgresDSN()
	}
	e.store = inboxtest.NewStore(t, e.db, testdb.Dialect(kind), inbox.Config{Table: e.table})
	var err error
	e.past, err = inbox.NewStore(e.db, testdb.Dialect(kind), inbox.Config{Table: e.table,
		Now: func() time.Time { return time.Now().Add(-monthAgo) }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.past.Close() })
	return e
}

// result is what one run of the command did.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// run runs the command against e's table.
func (e *env) run(t *testing.T, args ...string) result {
	t.Helper()
	return runCmd(t, append(args, "--dsn", e.dsn, "--table", e.table)...)
}

// ok runs the command against e's table and requires exit status 0.
func (e *env) ok(t *testing.T, args ...string) string {
	t.Helper()
	r := e.run(t, args...)
	require.Equal(t, exitOK, r.code, r.String())
	return r.stdout
}

// runCmd runs the command with args as given.
func runCmd(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return runCtx(ctx, args...)
}

func runCtx(ctx context.Context, args ...string) result {
	var stdout, stderr bytes.Buffer
	code := run(ctx, args, strings.NewReader(""), &stdout, &stderr)
	return result{code, stdout.String(), stderr.String()}
}

// decode parses a json output.
func decode[T any](t *testing.T, out string) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal([]byte(out), &v), out)
	return v
}

func hash(id inbox.ID) []byte {
	h := sha256.Sum256([]byte(id.Key))
	return h[:]
}

func id(op, key string) inbox.ID { return inbox.ID{Operation: op, Key: key} }

// completed claims id as completed with the messages as its stored output,
// kept for a week.
func (e *env) completed(t *testing.T, rid inbox.ID, msgs ...*message.Message) *inbox.Record {
	t.Helper()
	ctx := context.Background()
	tx, err := e.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	res, err := e.store.Claim(ctx, tx, inbox.ClaimParams{ID: rid, PayloadHash: hash(rid), Retention: 7 * 24 * time.Hour,
		CorrelationID: "corr-" + rid.Key})
	require.NoError(t, err)
	require.True(t, res.Claimed)
	if len(msgs) > 0 {
		out, err := dedup.EncodeOutput(msgs)
		require.NoError(t, err)
		require.NoError(t, e.store.SaveOutput(ctx, tx, res.Record, out))
	}
	require.NoError(t, tx.Commit())
	return e.get(t, rid)
}

// expired claims id a month ago, kept for a day: a purge deletes it.
func (e *env) expired(t *testing.T, rid inbox.ID, status inbox.Status) {
	t.Helper()
	_, err := e.past.Claim(context.Background(), e.db, inbox.ClaimParams{ID: rid, PayloadHash: hash(rid),
		Status: status, Retention: 24 * time.Hour})
	require.NoError(t, err)
}

// live reserves id under an hour's lease.
func (e *env) live(t *testing.T, rid inbox.ID) *inbox.Lease {
	t.Helper()
	res, err := e.store.Reserve(context.Background(), inbox.ReserveParams{ID: rid, PayloadHash: hash(rid),
		Owner: "worker-live", Lease: time.Hour, Retention: 7 * 24 * time.Hour})
	require.NoError(t, err)
	require.NotNil(t, res.Lease)
	return res.Lease
}

// abandoned reserves id a month ago under a minute's lease, long expired:
// its worker is gone.
func (e *env) abandoned(t *testing.T, rid inbox.ID) *inbox.Record {
	t.Helper()
	res, err := e.past.Reserve(context.Background(), inbox.ReserveParams{ID: rid, PayloadHash: hash(rid),
		Owner: "worker-gone", Lease: time.Minute, Retention: 7 * 24 * time.Hour})
	require.NoError(t, err)
	require.NotNil(t, res.Lease)
	return e.get(t, rid)
}

// pending reserves id and pends it: the effect's outcome is unknown.
func (e *env) pending(t *testing.T, rid inbox.ID, past bool) *inbox.Record {
	t.Helper()
	s := e.store
	if past {
		s = e.past
	}
	res, err := s.Reserve(context.Background(), inbox.ReserveParams{ID: rid, PayloadHash: hash(rid),
		Owner: "worker-1", Lease: time.Minute, Retention: 7 * 24 * time.Hour})
	require.NoError(t, err)
	require.NoError(t, res.Lease.Pend(context.Background(), "psp-"+rid.Key, "provider timed out"))
	return e.get(t, rid)
}

func (e *env) get(t *testing.T, rid inbox.ID) *inbox.Record {
	t.Helper()
	rec, err := e.store.Get(context.Background(), e.db, rid)
	require.NoError(t, err)
	return rec
}

func (e *env) gone(t *testing.T, rid inbox.ID) {
	t.Helper()
	_, err := e.store.Get(context.Background(), e.db, rid)
	require.ErrorIs(t, err, inbox.ErrNotFound)
}

// audit lists e's audit trail, newest first.
func (e *env) audit(t *testing.T) []inbox.AuditEntry {
	t.Helper()
	entries, _, err := e.store.ListAudit(context.Background(), inbox.AuditFilter{Limit: 1000})
	require.NoError(t, err)
	return entries
}
