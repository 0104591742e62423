package inbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

// expiredStore returns a SQLite store on a clock of its own holding n
// completed records that expired an hour ago, and its database.
func expiredStore(t *testing.T, n int) (*inbox.Store, *sql.DB, *testkit.Clock) {
	t.Helper()
	clk := &testkit.Clock{}
	store, db := testkit.SQLiteStore(t, inbox.Config{Now: clk.Now})
	seedExpired(t, store, clk, "old", n)
	return store, db, clk
}

// seedExpired claims n records kept for a minute and moves clk past their
// expiry by an hour.
func seedExpired(t *testing.T, store *inbox.Store, clk *testkit.Clock, prefix string, n int) {
	t.Helper()
	for i := range n {
		_, err := store.Claim(context.Background(), store.DB(), inbox.ClaimParams{
			ID: inbox.ID{Operation: "op", Key: fmt.Sprintf("%s-%d", prefix, i)}, PayloadHash: []byte("h"), Retention: time.Minute})
		require.NoError(t, err)
	}
	clk.Advance(time.Minute + time.Hour)
}

func countRecords(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM inbox").Scan(&n))
	return n
}

// lines is an slog handler's output, safe for the purger's goroutine.
type lines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func TestNewPurgerRejectsInvalidConfig(t *testing.T) {
	t.Parallel()
	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	tests := []struct {
		name  string
		store *inbox.Store
		cfg   inbox.PurgerConfig
		want  []string
	}{
		{name: "nil store", cfg: inbox.PurgerConfig{}, want: []string{"store is nil"}},
		{name: "negative Interval", store: store, cfg: inbox.PurgerConfig{Interval: -time.Second}, want: []string{"Interval -1s is negative"}},
		{name: "negative BatchSize", store: store, cfg: inbox.PurgerConfig{BatchSize: -1}, want: []string{"BatchSize -1 is negative"}},
		{name: "everything", cfg: inbox.PurgerConfig{Interval: -1, BatchSize: -2},
			want: []string{"store is nil", "Interval -1ns", "BatchSize -2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := inbox.NewPurger(tt.store, tt.cfg)
			require.Nil(t, p)
			require.ErrorIs(t, err, inbox.ErrInvalidConfig)
			for _, w := range tt.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}

	p, err := inbox.NewPurger(store, inbox.PurgerConfig{})
	require.NoError(t, err, "the zero config is valid")
	require.NotNil(t, p)
}

func TestPurgerCloseWithoutStart(t *testing.T) {
	t.Parallel()
	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	p, err := inbox.NewPurger(store, inbox.PurgerConfig{})
	require.NoError(t, err)
	require.NoError(t, p.Close())
	require.NoError(t, p.Close())
}

// purgedOnce returns an OnPurge that reports each successful purge on the
// channel it returns, without blocking the purger.
func purgedOnce() (func(inbox.PurgeResult, error), chan inbox.PurgeResult) {
	ch := make(chan inbox.PurgeResult, 16)
	return func(r inbox.PurgeResult, err error) {
		if err == nil {
			select {
			case ch <- r:
			default:
			}
		}
	}, ch
}

func waitPurge(t *testing.T, ch chan inbox.PurgeResult) inbox.PurgeResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("the purger did not run")
		return inbox.PurgeResult{}
	}
}

// TestPurgerStartCloseRestartLeaveNoGoroutine is not parallel: it checks
// that Close ends the purger's goroutine, through every way of running it.
func TestPurgerStartCloseRestartLeaveNoGoroutine(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	store, db, clk := expiredStore(t, 5)
	onPurge, purged := purgedOnce()
	p, err := inbox.NewPurger(store, inbox.PurgerConfig{Interval: time.Hour, BatchSize: 2, OnPurge: onPurge})
	require.NoError(t, err)

	require.NoError(t, p.Start())
	require.Equal(t, inbox.PurgeResult{Deleted: 5, Batches: 3}, waitPurge(t, purged))
	<-p.Running()
	err = p.Start()
	require.Error(t, err)
	require.Contains(t, err.Error(), "already running")
	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "Close is idempotent")

	// A closed purger starts again.
	seedExpired(t, store, clk, "again", 3)
	require.NoError(t, p.Start())
	require.Equal(t, inbox.PurgeResult{Deleted: 3, Batches: 2}, waitPurge(t, purged))
	require.NoError(t, p.Close())

	// Run blocks until its context ends, and leaves it ready to run again.
	seedExpired(t, store, clk, "run", 1)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- p.Run(ctx) }()
	require.Equal(t, inbox.PurgeResult{Deleted: 1, Batches: 1}, waitPurge(t, purged))
	require.Error(t, p.Run(context.Background()), "running twice")
	cancel()
	require.NoError(t, <-ran)

	// Close ends a Run as well.
	go func() { ran <- p.Run(context.Background()) }()
	waitPurge(t, purged)
	require.NoError(t, p.Close())
	require.NoError(t, <-ran)
	require.Zero(t, countRecords(t, db))

	require.NoError(t, store.Close())
	require.NoError(t, db.Close())
	goleak.VerifyNone(t, ignore)
}

func TestPurgerLogs(t *testing.T) {
	t.Parallel()
	store, db, _ := expiredStore(t, 4)
	var out lines
	onPurge, purged := purgedOnce()
	var failures atomic.Int64
	p, err := inbox.NewPurger(store, inbox.PurgerConfig{Interval: time.Hour, Logger: slog.New(slog.NewTextHandler(&out, nil)),
		OnPurge: func(r inbox.PurgeResult, err error) {
			if err != nil {
				failures.Add(1)
			}
			onPurge(r, err)
		}})
	require.NoError(t, err)
	require.NoError(t, p.Start())
	waitPurge(t, purged)
	require.NoError(t, p.Close())
	require.Contains(t, out.String(), "inboxmill: purged expired records")
	require.Contains(t, out.String(), "table=inbox deleted=4 batches=1")

	// A failing purge is logged as an error and reported to OnPurge.
	_, err = db.Exec("DROP TABLE inbox")
	require.NoError(t, err)
	require.NoError(t, p.Start())
	testkit.WaitFor(t, 30*time.Second, "a failed purge", func() (bool, error) { return failures.Load() > 0, nil })
	require.NoError(t, p.Close())
	require.Contains(t, out.String(), "level=ERROR msg=\"inboxmill: purge failed\"")
}

func TestPurgeMaxBatches(t *testing.T) {
	t.Parallel()
	store, db, _ := expiredStore(t, 10)
	ctx := context.Background()

	res, err := store.Purge(ctx, inbox.PurgeParams{BatchSize: 3, MaxBatches: 2, Pause: -1})
	require.NoError(t, err)
	require.Equal(t, inbox.PurgeResult{Deleted: 6, Batches: 2}, res)
	require.Equal(t, 4, countRecords(t, db))

	res, err = store.Purge(ctx, inbox.PurgeParams{BatchSize: 3, MaxBatches: 5, Pause: -1})
	require.NoError(t, err)
	require.Equal(t, inbox.PurgeResult{Deleted: 4, Batches: 2}, res, "stops at the first short batch")
	require.Zero(t, countRecords(t, db))

	res, err = store.Purge(ctx, inbox.PurgeParams{BatchSize: 3, MaxBatches: 5, Pause: -1})
	require.NoError(t, err)
	require.Equal(t, inbox.PurgeResult{Deleted: 0, Batches: 1}, res)
}

func TestPurgeBeforeAndDefaults(t *testing.T) {
	t.Parallel()
	store, db, clk := expiredStore(t, 3)
	ctx := context.Background()

	// Nothing expired before two hours ago.
	res, err := store.Purge(ctx, inbox.PurgeParams{Before: clk.Now().Add(-2 * time.Hour)})
	require.NoError(t, err)
	require.Zero(t, res.Deleted)
	require.Equal(t, 3, countRecords(t, db))

	// Defaults: the store's now, batches of 1000, the pause of the batch's
	// own length.
	res, err = store.Purge(ctx, inbox.PurgeParams{})
	require.NoError(t, err)
	require.Equal(t, inbox.PurgeResult{Deleted: 3, Batches: 1}, res)
}

func TestPurgeWithoutPause(t *testing.T) {
	t.Parallel()
	store, db, _ := expiredStore(t, 20)
	res, err := store.Purge(context.Background(), inbox.PurgeParams{BatchSize: 1, Pause: -1})
	require.NoError(t, err)
	require.Equal(t, inbox.PurgeResult{Deleted: 20, Batches: 21}, res)
	require.Zero(t, countRecords(t, db))
}

func TestPurgeHonoursContext(t *testing.T) {
	t.Parallel()

	t.Run("cancelled before", func(t *testing.T) {
		t.Parallel()
		store, db, _ := expiredStore(t, 3)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		res, err := store.Purge(ctx, inbox.PurgeParams{})
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, inbox.PurgeResult{}, res)
		require.Equal(t, 3, countRecords(t, db))
	})

	t.Run("cancelled during the pause", func(t *testing.T) {
		t.Parallel()
		store, db, _ := expiredStore(t, 3)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		type result struct {
			res inbox.PurgeResult
			err error
		}
		done := make(chan result, 1)
		go func() {
			res, err := store.Purge(ctx, inbox.PurgeParams{BatchSize: 1, Pause: time.Hour})
			done <- result{res, err}
		}()
		// Wait for the first batch; the purge then rests for an hour.
		testkit.WaitFor(t, 30*time.Second, "the first batch", func() (bool, error) { return countRecords(t, db) == 2, nil })
		cancel()
		select {
		case r := <-done:
			require.ErrorIs(t, r.err, context.Canceled)
			require.Equal(t, inbox.PurgeResult{Deleted: 1, Batches: 1}, r.res, "what was done is reported")
		case <-time.After(30 * time.Second):
			t.Fatal("the purge ignored its context's cancellation")
		}
		require.Equal(t, 2, countRecords(t, db))
	})
}
