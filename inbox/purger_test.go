package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/internal/testkit"
)

// seedExpired inserts n completed records that expired an hour ago.
func seedExpired(t *testing.T, store *inbox.Store, prefix string, n int) {
	t.Helper()
	for i := range n {
		_, err := store.Claim(context.Background(), store.DB(), inbox.ClaimParams{Operation: "op",
			Key: fmt.Sprintf("%s-%d", prefix, i), PayloadHash: []byte("h"), Status: inbox.StatusCompleted,
			ExpiresAt: time.Now().Add(-time.Hour)})
		require.NoError(t, err)
	}
}

func countRecords(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM inbox").Scan(&n))
	return n
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

// TestPurgerStartAndCloseLeaveNoGoroutine is not parallel: it checks that
// Close ends the purger's goroutine.
func TestPurgerStartAndCloseLeaveNoGoroutine(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	store, db := testkit.SQLiteStore(t, inbox.Config{})
	seedExpired(t, store, "old", 5)

	purged := make(chan inbox.PurgeResult, 1)
	p, err := inbox.NewPurger(store, inbox.PurgerConfig{Interval: time.Hour, BatchSize: 2,
		OnPurge: func(r inbox.PurgeResult, err error) {
			if err == nil {
				select {
				case purged <- r:
				default:
				}
			}
		}})
	require.NoError(t, err)
	require.NoError(t, p.Start())
	select {
	case r := <-purged:
		require.EqualValues(t, 5, r.Deleted)
		require.Equal(t, 3, r.Batches)
	case <-time.After(10 * time.Second):
		t.Fatal("the purger did not run")
	}
	require.NoError(t, p.Close())
	require.Error(t, p.Start(), "a closed purger does not start again")
	require.NoError(t, p.Close())

	require.NoError(t, db.Close())
	goleak.VerifyNone(t, ignore)
}

func TestPurgeMaxBatches(t *testing.T) {
	t.Parallel()
	store, db := testkit.SQLiteStore(t, inbox.Config{})
	seedExpired(t, store, "old", 10)
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
	store, db := testkit.SQLiteStore(t, inbox.Config{})
	seedExpired(t, store, "old", 3)
	ctx := context.Background()

	// Nothing expired before two hours ago.
	res, err := store.Purge(ctx, inbox.PurgeParams{Before: time.Now().Add(-2 * time.Hour)})
	require.NoError(t, err)
	require.Zero(t, res.Deleted)
	require.Equal(t, 3, countRecords(t, db))

	// Defaults: now, batches of 1000, the pause of the batch's own length.
	res, err = store.Purge(ctx, inbox.PurgeParams{})
	require.NoError(t, err)
	require.Equal(t, inbox.PurgeResult{Deleted: 3, Batches: 1}, res)
}

func TestPurgeWithoutPause(t *testing.T) {
	t.Parallel()
	store, db := testkit.SQLiteStore(t, inbox.Config{})
	seedExpired(t, store, "old", 20)
	start := time.Now()
	res, err := store.Purge(context.Background(), inbox.PurgeParams{BatchSize: 1, Pause: -1})
	require.NoError(t, err)
	require.Equal(t, inbox.PurgeResult{Deleted: 20, Batches: 21}, res)
	require.Zero(t, countRecords(t, db))
	require.Less(t, time.Since(start), 30*time.Second)
}

func TestPurgeHonoursContext(t *testing.T) {
	t.Parallel()

	t.Run("cancelled before", func(t *testing.T) {
		t.Parallel()
		store, db := testkit.SQLiteStore(t, inbox.Config{})
		seedExpired(t, store, "old", 3)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		res, err := store.Purge(ctx, inbox.PurgeParams{})
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, inbox.PurgeResult{}, res)
		require.Equal(t, 3, countRecords(t, db))
	})

	t.Run("cancelled during the pause", func(t *testing.T) {
		t.Parallel()
		store, db := testkit.SQLiteStore(t, inbox.Config{})
		seedExpired(t, store, "old", 3)
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
		for deadline := time.Now().Add(10 * time.Second); countRecords(t, db) != 2; time.Sleep(time.Millisecond) {
			require.True(t, time.Now().Before(deadline), "the first batch never ran")
		}
		cancel()
		select {
		case r := <-done:
			require.ErrorIs(t, r.err, context.Canceled)
			require.Equal(t, inbox.PurgeResult{Deleted: 1, Batches: 1}, r.res, "what was done is reported")
		case <-time.After(10 * time.Second):
			t.Fatal("the purge ignored its context's cancellation")
		}
		require.Equal(t, 2, countRecords(t, db))
	})
}
