package dedup_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// dryRunClock is a settable inbox.Config.Now.
type dryRunClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *dryRunClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *dryRunClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type dryRunBundle struct {
	db      *sql.DB
	store   *inbox.Store
	clock   *dryRunClock
	handled int
	// run delivers a message through the middleware, as a router would.
	run func(msg *message.Message) error
}

// setupDryRun returns a migrated store of kind in a table of its own, whose
// clock the test moves, and a middleware with the given retention in front
// of a handler that counts its runs.
func setupDryRun(t *testing.T, kind testdb.Kind, retention time.Duration) *dryRunBundle {
	t.Helper()
	db := testdb.Open(t, kind)
	b := &dryRunBundle{db: db, clock: &dryRunClock{now: time.Now().UTC().Truncate(time.Second)}}
	table := testdb.UniqueName("dryrun")
	store, err := inbox.NewStore(db, testdb.Dialect(kind), inbox.Config{Table: table, Now: b.clock.Now})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(context.Background()))
	t.Cleanup(func() {
		for _, tbl := range inbox.TableNames(table) {
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tbl)
		}
	})
	b.store = store
	d := dryRunDedup(t, store, retention)
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		b.handled++
		return nil, nil
	})
	b.run = func(msg *message.Message) error {
		_, err := h(msg)
		return err
	}
	return b
}

func dryRunDedup(t *testing.T, store *inbox.Store, retention time.Duration) *dedup.Deduplicator {
	t.Helper()
	d, err := dedup.New(store, dedup.Config{
		Key:          dedup.KeyFromMetadata("event_id"),
		Scope:        dedup.ScopeFromMetadata("tenant_id"),
		Operation:    "ship_order",
		IgnoreFields: []string{"sent_at"},
		Retention:    retention,
	})
	require.NoError(t, err)
	return d
}

func dryRunMsg(eventID, payload string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
	if eventID != "" {
		msg.Metadata.Set("event_id", eventID)
	}
	msg.Metadata.Set("tenant_id", "shop-1")
	return msg
}

// TestDryRunClassifies checks every class on every database, against what
// the middleware then does with the same message.
func TestDryRunClassifies(t *testing.T) {
	for _, kind := range testdb.All {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setupDryRun(t, kind, time.Hour)
			d := dryRunDedup(t, b.store, time.Hour)

			require.NoError(t, b.run(dryRunMsg("evt-1", `{"order":1,"sent_at":"a"}`)))
			now := b.clock.Now()

			cases := []struct {
				name      string
				msg       *message.Message
				published time.Time
				want      dedup.DryRunClass
				wantErr   error
				executes  bool
			}{
				{"unseen key", dryRunMsg("evt-2", `{"order":2}`), now, dedup.DryRunNew, nil, true},
				{"unseen key, publication time unknown", dryRunMsg("evt-3", `{"order":3}`), time.Time{}, dedup.DryRunNew, nil, true},
				{"unseen key, published before the retention window", dryRunMsg("evt-4", `{"order":4}`),
					now.Add(-2 * time.Hour), dedup.DryRunExpired, nil, true},
				{"same payload, ignored field differs", dryRunMsg("evt-1", `{"sent_at":"b","order":1}`), now,
					dedup.DryRunDuplicate, nil, false},
				{"recorded key published long ago: the record decides", dryRunMsg("evt-1", `{"order":1}`),
					now.Add(-48 * time.Hour), dedup.DryRunDuplicate, nil, false},
				{"key reused for another payload", dryRunMsg("evt-1", `{"order":99}`), now,
					dedup.DryRunConflict, dedup.ErrPayloadConflict, false},
				{"no key", dryRunMsg("", `{"order":5}`), now, dedup.DryRunInvalid, dedup.ErrMissingKey, false},
				{"key with a NUL byte", dryRunMsg("evt-\x00", `{"order":6}`), now, dedup.DryRunInvalid, dedup.ErrInvalidKey, false},
			}
			for _, c := range cases {
				res, err := d.DryRun(ctx, c.msg, c.published)
				require.NoError(t, err, c.name)
				require.Equal(t, c.want, res.Class, c.name)
				require.Equal(t, "ship_order", res.Operation, c.name)
				if c.wantErr != nil {
					require.ErrorIs(t, res.Err, c.wantErr, c.name)
				} else {
					require.NoError(t, res.Err, c.name)
				}
				if c.want == dedup.DryRunInvalid {
					require.Empty(t, res.Key, c.name)
					continue
				}
				require.Equal(t, "shop-1", res.Scope, c.name)
				require.Equal(t, c.msg.Metadata.Get("event_id"), res.Key, c.name)
				require.Equal(t, inbox.ID{Scope: "shop-1", Operation: "ship_order", Key: res.Key}.Digest(), res.KeyDigest, c.name)
				require.NotEmpty(t, res.PayloadHash, c.name)
				require.Equal(t, c.want != dedup.DryRunNew && c.want != dedup.DryRunExpired, res.Record != nil, c.name)
			}

			// The middleware agrees: the messages predicted to run, run.
			for _, c := range cases {
				before := b.handled
				err := b.run(c.msg.Copy())
				require.Equal(t, c.executes, b.handled > before, c.name)
				if c.wantErr != nil {
					require.ErrorIs(t, err, c.wantErr, c.name)
				}
			}
		})
	}
}

// TestDryRunExpiredRecord: a record past its expires_at is still in the
// table, but the next purge deletes it, so the message is reported as older
// than the retention window; once purged, the same holds through the
// message's publication time.
func TestDryRunExpiredRecord(t *testing.T) {
	ctx := context.Background()
	b := setupDryRun(t, testdb.SQLite, time.Hour)
	d := dryRunDedup(t, b.store, time.Hour)
	published := b.clock.Now()
	msg := dryRunMsg("evt-1", `{"order":1}`)
	require.NoError(t, b.run(msg))

	b.clock.Add(30 * time.Minute)
	res, err := d.DryRun(ctx, msg, published)
	require.NoError(t, err)
	require.Equal(t, dedup.DryRunDuplicate, res.Class)

	b.clock.Add(time.Hour)
	res, err = d.DryRun(ctx, msg, published)
	require.NoError(t, err)
	require.Equal(t, dedup.DryRunExpired, res.Class)
	require.NotNil(t, res.Record)

	purged, err := b.store.Purge(ctx, inbox.PurgeParams{})
	require.NoError(t, err)
	require.EqualValues(t, 1, purged.Deleted)
	res, err = d.DryRun(ctx, msg, published)
	require.NoError(t, err)
	require.Equal(t, dedup.DryRunExpired, res.Class)
	require.Nil(t, res.Record)

	// A purge never deletes an unfinished record, whatever its expires_at:
	// a replay finds it, so it is no older than the window.
	_, err = b.store.Reserve(ctx, inbox.ReserveParams{ID: inbox.ID{Scope: "shop-1", Operation: "ship_order", Key: "running"},
		PayloadHash: dryRunFingerprint(t, `{"order":2}`), Owner: "worker", Lease: time.Hour, Retention: time.Minute})
	require.NoError(t, err)
	b.clock.Add(2 * time.Minute) // past its expires_at
	running, err := b.store.Get(ctx, b.db, inbox.ID{Scope: "shop-1", Operation: "ship_order", Key: "running"})
	require.NoError(t, err)
	require.True(t, running.ExpiresAt.Before(b.clock.Now()))
	res, err = d.DryRun(ctx, dryRunMsg("running", `{"order":2}`), published)
	require.NoError(t, err)
	require.Equal(t, dedup.DryRunDuplicate, res.Class)

	// Kept forever: nothing is ever older than the window.
	forever := dryRunDedup(t, b.store, -1)
	res, err = forever.DryRun(ctx, msg, published.Add(-1000*time.Hour))
	require.NoError(t, err)
	require.Equal(t, dedup.DryRunNew, res.Class)
}

// TestDryRunWritesNothing: a dry run of new, duplicate and conflicting
// messages leaves the table, the stats and the handler untouched.
func TestDryRunWritesNothing(t *testing.T) {
	ctx := context.Background()
	b := setupDryRun(t, testdb.SQLite, 0)
	require.NoError(t, b.run(dryRunMsg("evt-1", `{"order":1}`)))
	d := dryRunDedup(t, b.store, 0)
	for _, msg := range []*message.Message{
		dryRunMsg("evt-1", `{"order":1}`), dryRunMsg("evt-1", `{"order":2}`),
		dryRunMsg("evt-2", `{"order":2}`), dryRunMsg("", `{}`),
	} {
		_, err := d.DryRun(ctx, msg, time.Now())
		require.NoError(t, err)
	}
	var n int
	require.NoError(t, b.db.QueryRow("SELECT COUNT(*) FROM "+b.store.Table()).Scan(&n))
	require.Equal(t, 1, n)
	require.Equal(t, dedup.Stats{}, d.Stats())
	require.Equal(t, 1, b.handled)
}

// TestDryRunNeedsOperation: outside a router, without Config.Operation,
// there is no operation to look records up by; that is a configuration
// error, not an invalid message.
func TestDryRunNeedsOperation(t *testing.T) {
	b := setupDryRun(t, testdb.SQLite, 0)
	d, err := dedup.New(b.store, dedup.Config{Key: dedup.KeyFromMetadata("event_id")})
	require.NoError(t, err)
	_, err = d.DryRun(context.Background(), dryRunMsg("evt-1", `{}`), time.Time{})
	require.ErrorIs(t, err, dedup.ErrInvalidConfig)
}

// TestDryRunReportsDatabaseErrors: a store that cannot be read is an error,
// never a guess.
func TestDryRunReportsDatabaseErrors(t *testing.T) {
	b := setupDryRun(t, testdb.SQLite, 0)
	d := dryRunDedup(t, b.store, 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := d.DryRun(ctx, dryRunMsg("evt-1", `{}`), time.Time{})
	require.Error(t, err)

	_, err = b.db.Exec("DROP TABLE " + b.store.Table())
	require.NoError(t, err)
	_, err = d.DryRun(context.Background(), dryRunMsg("evt-1", `{}`), time.Time{})
	require.Error(t, err)
}

// TestDryRunReportPredictsTheRange: within a range, the first message of a
// key a replay would run claims it; later ones are duplicates or conflicts.
func TestDryRunReportPredictsTheRange(t *testing.T) {
	ctx := context.Background()
	b := setupDryRun(t, testdb.SQLite, time.Hour)
	d := dryRunDedup(t, b.store, time.Hour)
	require.NoError(t, b.run(dryRunMsg("done", `{"n":0}`)))
	// A reserve-mode intent still running.
	_, err := b.store.Reserve(ctx, inbox.ReserveParams{ID: inbox.ID{Scope: "shop-1", Operation: "ship_order", Key: "running"},
		PayloadHash: dryRunFingerprint(t, `{"n":9}`), Owner: "worker", Lease: time.Hour})
	require.NoError(t, err)
	now := b.clock.Now()
	old := now.Add(-2 * time.Hour)

	stream := []struct {
		msg       *message.Message
		published time.Time
		want      dedup.DryRunClass
	}{
		{dryRunMsg("done", `{"n":0}`), now, dedup.DryRunDuplicate},
		{dryRunMsg("a", `{"n":1}`), now, dedup.DryRunNew},
		{dryRunMsg("a", `{"n":1,"sent_at":"later"}`), now, dedup.DryRunDuplicate},
		{dryRunMsg("a", `{"n":2}`), now, dedup.DryRunConflict},
		{dryRunMsg("b", `{"n":3}`), old, dedup.DryRunExpired},
		{dryRunMsg("b", `{"n":3}`), now, dedup.DryRunDuplicate},
		{dryRunMsg("done", `{"n":5}`), now, dedup.DryRunConflict},
		{dryRunMsg("", `{"n":6}`), now, dedup.DryRunInvalid},
		{dryRunMsg("running", `{"n":9}`), now, dedup.DryRunDuplicate},
	}
	var r dedup.DryRunReport
	for i, s := range stream {
		res, err := d.DryRun(ctx, s.msg, s.published)
		require.NoError(t, err)
		require.Equal(t, s.want, r.Add(res), "message %d", i)
	}
	require.Equal(t, int64(len(stream)), r.Messages)
	require.Equal(t, "messages=9 new=1 duplicate=4 conflict=2 invalid=1 expired=1 unfinished=1", r.String())
	require.EqualValues(t, 2, r.WouldExecute())

	// The middleware agrees: exactly the predicted messages run.
	before := b.handled
	for _, s := range stream {
		_ = b.run(s.msg)
	}
	require.Equal(t, int(r.WouldExecute()), b.handled-before)
}

func dryRunFingerprint(t *testing.T, payload string) []byte {
	t.Helper()
	f, err := dedup.JSONFingerprint("sent_at")
	require.NoError(t, err)
	h, err := f(message.NewMessage("", []byte(payload)))
	require.NoError(t, err)
	return h
}

// A topic about to be replayed: one event was processed, one was not, and
// one event ID was reused for another order. The dry run says so without
// running or writing anything.
func ExampleDeduplicator_DryRun() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inboxmill-dryrun")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", sqlite.DSN(filepath.Join(dir, "dryrun.db")))
	defer db.Close()
	store, _ := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{})
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	d, _ := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "ship_order"})
	handler := d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })

	msg := func(id, payload string) *message.Message {
		m := message.NewMessage(watermill.NewUUID(), []byte(payload))
		m.Metadata.Set("event_id", id)
		return m
	}
	_, _ = handler(msg("evt-1", `{"order":"o-1"}`)) // processed before the replay

	var report dedup.DryRunReport
	for _, m := range []*message.Message{
		msg("evt-1", `{"order":"o-1"}`),
		msg("evt-2", `{"order":"o-2"}`),
		msg("evt-1", `{"order":"o-9"}`),
	} {
		res, err := d.DryRun(ctx, m, time.Now())
		if err != nil {
			panic(err)
		}
		fmt.Println(m.Metadata.Get("event_id"), report.Add(res))
	}
	fmt.Println(report.String())
	fmt.Println("handler runs in a replay:", report.WouldExecute())
	// Output:
	// evt-1 duplicate
	// evt-2 new
	// evt-1 conflict
	// messages=3 new=1 duplicate=1 conflict=1 invalid=0 expired=0
	// handler runs in a replay: 1
}
