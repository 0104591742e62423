package pgxgroup_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/pgxgroup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// fixture is a pipelined middleware over a fresh inbox and an effects
// table whose event_id is unique, and whose note must not be "bad".
type fixture struct {
	db      *sql.DB
	store   *inbox.Store
	effects string
	d       *dedup.Deduplicator
	mu      sync.Mutex
	calls   map[string]int
	// act runs in the handler after it queued its effect.
	act func(msg *message.Message, tx *pgxgroup.Tx) error
}

func setup(t testing.TB, g dedup.Group) *fixture {
	t.Helper()
	return setupOn(t, testdb.Open(t, testdb.PostgresPGX), g)
}

// setupOn is setup on a database of the test's own.
func setupOn(t testing.TB, db *sql.DB, g dedup.Group) *fixture {
	t.Helper()
	table := testdb.UniqueName("pgxg")
	f := &fixture{db: db, effects: table + "_effects", calls: map[string]int{}}
	store, err := inbox.NewStore(db, testdb.Dialect(testdb.PostgresPGX), inbox.Config{Table: table})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, store.Migrate(ctx))
	_, err = db.ExecContext(ctx, "CREATE TABLE "+f.effects+" (event_id text PRIMARY KEY, note text CHECK (note <> 'bad'))")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+f.effects)
		_ = store.MigrateDown(context.Background(), 0)
		_ = store.Close()
	})
	f.store = store
	g.Pipeline = pgxgroup.Pipeline()
	f.d, err = dedup.New(store, dedup.Config{
		Key:       dedup.KeyFromMetadata("event_id"),
		Operation: "effect",
		Mode:      dedup.Transactional{Group: &g},
		Logger:    watermill.NopLogger{},
	})
	require.NoError(t, err)
	return f
}

func (f *fixture) handler(msg *message.Message) ([]*message.Message, error) {
	tx, ok := pgxgroup.FromContext(msg.Context())
	if !ok {
		return nil, errors.New("no group transaction")
	}
	key := msg.Metadata.Get("event_id")
	f.mu.Lock()
	f.calls[key]++
	f.mu.Unlock()
	tx.Queue("INSERT INTO "+f.effects+" (event_id, note) VALUES ($1, $2)", key, string(msg.Payload))
	if f.act != nil {
		if err := f.act(msg, tx); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

func (f *fixture) deliver(msg *message.Message) error {
	_, err := f.d.Middleware(f.handler)(msg)
	return err
}

func event(key, note string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(note))
	msg.Metadata.Set("event_id", key)
	return msg
}

func (f *fixture) effect(t *testing.T, key string) (string, bool) {
	t.Helper()
	var note string
	err := f.db.QueryRowContext(context.Background(), "SELECT note FROM "+f.effects+" WHERE event_id = $1", key).Scan(&note)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false
	}
	require.NoError(t, err)
	return note, true
}

func (f *fixture) noRecord(t *testing.T, key string) {
	t.Helper()
	_, err := f.store.Get(context.Background(), f.db, inbox.ID{Operation: "effect", Key: key})
	require.ErrorIs(t, err, inbox.ErrNotFound, key)
}

// together delivers msgs at once while the only coordinator is held, so
// that they form one group, and returns each delivery's error.
func (f *fixture) together(t *testing.T, msgs ...*message.Message) []error {
	t.Helper()
	started, unblock := make(chan struct{}), make(chan struct{})
	act := f.act
	f.act = func(msg *message.Message, tx *pgxgroup.Tx) error {
		if msg.Metadata.Get("event_id") == "blocker" {
			close(started)
			<-unblock
			return nil
		}
		if act != nil {
			return act(msg, tx)
		}
		return nil
	}
	blocked := make(chan error, 1)
	go func() { blocked <- f.deliver(event("blocker", "x")) }()
	<-started
	errs := make([]error, len(msgs))
	var wg sync.WaitGroup
	for i, msg := range msgs {
		wg.Go(func() { errs[i] = f.deliver(msg) })
		require.Eventually(t, func() bool { return f.d.GroupStats().Waiting == i+1 }, 10*time.Second, time.Millisecond)
	}
	close(unblock)
	wg.Wait()
	require.NoError(t, <-blocked)
	f.act = act
	return errs
}

func TestQueuedStatementThatFailsNacksOnlyItsMember(t *testing.T) {
	t.Parallel()
	f := setup(t, dedup.Group{Coordinators: 1, MaxLinger: 5 * time.Second})
	errs := f.together(t, event("a", "ok"), event("b", "bad"), event("c", "ok"))
	require.NoError(t, errs[0])
	require.NoError(t, errs[2])
	var pe *pgconn.PgError
	require.ErrorAs(t, errs[1], &pe, "the member's own statement error")
	require.Equal(t, "23514", pe.Code, "check_violation")
	for _, k := range []string{"a", "c"} {
		note, ok := f.effect(t, k)
		require.True(t, ok, k)
		require.Equal(t, "ok", note)
	}
	_, ok := f.effect(t, "b")
	require.False(t, ok)
	f.noRecord(t, "b")
	f.mu.Lock()
	require.Equal(t, 2, f.calls["a"], "rolled back with b's failure and run again without it")
	f.mu.Unlock()

	// Redelivered with a payload its statement accepts, it runs clean.
	require.NoError(t, f.deliver(event("b", "fixed")))
	note, ok := f.effect(t, "b")
	require.True(t, ok)
	require.Equal(t, "fixed", note)
}

func TestCallbackErrorFailsItsMemberAndCommitWaitsForCallbacks(t *testing.T) {
	t.Parallel()
	f := setup(t, dedup.Group{Coordinators: 1, MaxLinger: 5 * time.Second})
	refused := errors.New("not one row")
	var seen sync.Map
	f.act = func(msg *message.Message, tx *pgxgroup.Tx) error {
		key := msg.Metadata.Get("event_id")
		// Updates nothing for "x": the callback refuses it.
		want := "UPDATE " + f.effects + " SET note = note || '!' WHERE event_id = $1 AND $1 <> 'x'"
		tx.Queue(want, key).Exec(func(ct pgconn.CommandTag) error {
			seen.Store(key, ct.RowsAffected())
			if ct.RowsAffected() != 1 {
				return refused
			}
			return nil
		})
		return nil
	}
	errs := f.together(t, event("w", "ok"), event("x", "ok"), event("y", "ok"))
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], refused)
	require.NoError(t, errs[2])
	for _, k := range []string{"w", "y"} {
		note, ok := f.effect(t, k)
		require.True(t, ok)
		require.Equal(t, "ok!", note, "the queued statements ran in order")
	}
	_, ok := f.effect(t, "x")
	require.False(t, ok, "the member a callback refused committed nothing")
	f.noRecord(t, "x")
	n, _ := seen.Load("x")
	require.EqualValues(t, 0, n)
}

func TestStatementRunAtOnceSeesWhatTheGroupQueued(t *testing.T) {
	t.Parallel()
	f := setup(t, dedup.Group{Coordinators: 1, MaxLinger: 5 * time.Second})
	counts := map[string]int{}
	var mu sync.Mutex
	f.act = func(msg *message.Message, tx *pgxgroup.Tx) error {
		key := msg.Metadata.Get("event_id")
		if key != "r2" {
			return nil
		}
		var n int
		// After r1's and its own queued inserts have been sent.
		if err := tx.QueryRowContext(msg.Context(),
			"SELECT count(*) FROM "+f.effects+" WHERE event_id IN ('r1', 'r2')").Scan(&n); err != nil {
			return err
		}
		mu.Lock()
		counts[key] = n
		mu.Unlock()
		return nil
	}
	errs := f.together(t, event("r1", "ok"), event("r2", "ok"), event("r3", "ok"))
	for i, err := range errs {
		require.NoError(t, err, i)
	}
	require.Equal(t, 2, counts["r2"])
	for _, k := range []string{"r1", "r2", "r3"} {
		_, ok := f.effect(t, k)
		require.True(t, ok, k)
	}
}

func TestEarlierMemberFailingWhenSentEarlyIsTheOneNacked(t *testing.T) {
	t.Parallel()
	f := setup(t, dedup.Group{Coordinators: 1, MaxLinger: 5 * time.Second})
	f.act = func(msg *message.Message, tx *pgxgroup.Tx) error {
		if msg.Metadata.Get("event_id") != "reader" {
			return nil
		}
		// Sends "bad"'s failing insert first: its member is to blame.
		_, err := tx.ExecContext(msg.Context(), "SELECT 1")
		return err
	}
	errs := f.together(t, event("bad", "bad"), event("reader", "ok"), event("after", "ok"))
	var pe *pgconn.PgError
	require.ErrorAs(t, errs[0], &pe)
	require.NoError(t, errs[1], "the member that sent the statements is not the one nacked")
	require.NoError(t, errs[2])
	for _, k := range []string{"reader", "after"} {
		_, ok := f.effect(t, k)
		require.True(t, ok, k)
	}
	f.noRecord(t, "bad")
}

func TestManyConcurrentDeliveriesWithDuplicatesHaveOneEffectEach(t *testing.T) {
	t.Parallel()
	f := setup(t, dedup.Group{Coordinators: 2})
	const keys, copies = 200, 3
	var wg sync.WaitGroup
	errs := make(chan error, keys*copies)
	sem := make(chan struct{}, 32)
	for i := range keys * copies {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs <- f.deliver(event(fmt.Sprintf("k%d", i%keys), "ok"))
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		// The effects table's primary key would refuse a second effect;
		// the middleware must never get that far.
		require.NoError(t, err)
	}
	var n int
	require.NoError(t, f.db.QueryRowContext(context.Background(), "SELECT count(*) FROM "+f.effects).Scan(&n))
	require.Equal(t, keys, n)
	st := f.d.Stats()
	require.EqualValues(t, keys, st.Executed)
	require.EqualValues(t, keys*(copies-1), st.Duplicates)
	gs := f.d.GroupStats()
	require.Positive(t, gs.Groups)
}

func TestIsolationLevelIsTheConfiguredOne(t *testing.T) {
	t.Parallel()
	db := testdb.Open(t, testdb.PostgresPGX)
	table := testdb.UniqueName("pgxg")
	store, err := inbox.NewStore(db, testdb.Dialect(testdb.PostgresPGX), inbox.Config{Table: table})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(context.Background()))
	t.Cleanup(func() { _ = store.MigrateDown(context.Background(), 0); _ = store.Close() })
	d, err := dedup.New(store, dedup.Config{
		Key:       dedup.KeyFromMetadata("event_id"),
		Operation: "iso",
		Mode: dedup.Transactional{
			TxOptions: &sql.TxOptions{Isolation: sql.LevelSerializable},
			Group:     &dedup.Group{Pipeline: pgxgroup.Pipeline()},
		},
		Logger: watermill.NopLogger{},
	})
	require.NoError(t, err)
	var level string
	_, err = d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := pgxgroup.FromContext(msg.Context())
		return nil, tx.QueryRowContext(msg.Context(), "SHOW transaction_isolation").Scan(&level)
	})(event("iso", "x"))
	require.NoError(t, err)
	require.Equal(t, "serializable", level)
}

func TestRefusesAStoreItCannotPipeline(t *testing.T) {
	t.Parallel()
	for _, kind := range []testdb.Kind{testdb.PostgresPQ, testdb.MySQL, testdb.SQLite} {
		t.Run(string(kind), func(t *testing.T) {
			store, err := inbox.NewStore(testdb.Open(t, kind), testdb.Dialect(kind), inbox.Config{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = store.Close() })
			_, err = dedup.New(store, dedup.Config{
				Key:  dedup.KeyFromMetadata("event_id"),
				Mode: dedup.Transactional{Group: &dedup.Group{Pipeline: pgxgroup.Pipeline()}},
			})
			require.ErrorIs(t, err, dedup.ErrInvalidConfig)
			require.ErrorIs(t, err, pgxgroup.ErrNotPgx)
		})
	}
}

func TestFromContextOutsideAPipelinedGroup(t *testing.T) {
	_, ok := pgxgroup.FromContext(context.Background())
	require.False(t, ok)
}

// pgx.QueuedQuery is what Queue returns: its callbacks are pgx's own.
var _ = func(tx *pgxgroup.Tx) *pgx.QueuedQuery { return tx.Queue("SELECT 1") }

func TestPermanentErrorFromACallbackIsRecorded(t *testing.T) {
	t.Parallel()
	f := setup(t, dedup.Group{Coordinators: 1, MaxLinger: 5 * time.Second})
	refused := errors.New("refused for good")
	f.act = func(msg *message.Message, tx *pgxgroup.Tx) error {
		if msg.Metadata.Get("event_id") == "p" {
			tx.Queue("SELECT 1").Exec(func(pgconn.CommandTag) error { return dedup.Permanent(refused) })
		}
		return nil
	}
	errs := f.together(t, event("o", "ok"), event("p", "ok"))
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], refused)
	require.True(t, dedup.IsPoison(errs[1]), "a permanent failure goes to the poison queue")
	rec, err := f.store.Get(context.Background(), f.db, inbox.ID{Operation: "effect", Key: "p"})
	require.NoError(t, err)
	require.Equal(t, inbox.StatusFailed, rec.Status)
	_, ok := f.effect(t, "p")
	require.False(t, ok, "its statements were rolled back")

	// Its redelivery is acked without running the handler.
	f.act = nil
	require.NoError(t, f.deliver(event("p", "ok")))
	f.mu.Lock()
	require.Equal(t, 1, f.calls["p"])
	f.mu.Unlock()
}
