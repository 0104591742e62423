package inboxtest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
)

// seed inserts n records in multi-row statements, for volume tests.
func (b *bundle) seed(t *testing.T, prefix string, n int, status inbox.Status, expires time.Time) {
	t.Helper()
	const perStmt = 500
	d := b.h.Dialect
	keyCol := b.keyColumn()
	now := time.Now()
	for start := 0; start < n; start += perStmt {
		end := min(start+perStmt, n)
		var (
			sb   strings.Builder
			args []any
		)
		fmt.Fprintf(&sb, "INSERT INTO %s (scope, operation, %s, payload_hash, status, attempt, created_at, updated_at, expires_at) VALUES ",
			b.table, keyCol)
		for i := start; i < end; i++ {
			if i > start {
				sb.WriteString(", ")
			}
			p := len(args)
			fmt.Fprintf(&sb, "(%s, %s, %s, %s, %s, 1, %s, %s, %s)", d.Placeholder(p+1), d.Placeholder(p+2),
				d.Placeholder(p+3), d.Placeholder(p+4), d.Placeholder(p+5), d.Placeholder(p+6), d.Placeholder(p+7),
				d.Placeholder(p+8))
			args = append(args, "", "op", fmt.Sprintf("%s-%d", prefix, i), hash("x"), string(status),
				d.TimeArg(now), d.TimeArg(now), d.TimeArg(expires))
		}
		_, err := b.db.ExecContext(b.ctx, sb.String(), args...)
		require.NoError(t, err)
	}
}

func (b *bundle) countStatus(t *testing.T, status inbox.Status) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRowContext(b.ctx, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE status = %s",
		b.table, b.ph(1)), string(status)).Scan(&n))
	return n
}

// runPurge checks that purging deletes expired finished records only, in
// batches that let claims through, and agrees with Record.Purgeable.
func runPurge(t *testing.T, h Harness) {
	t.Run("PurgeNeverRemovesUnfinishedRecords", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		past, future := time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
		b.seed(t, "done-old", 30, inbox.StatusCompleted, past)
		b.seed(t, "failed-old", 20, inbox.StatusFailed, past)
		b.seed(t, "done-new", 7, inbox.StatusCompleted, future)
		b.seed(t, "processing-old", 5, inbox.StatusProcessing, past)
		b.seed(t, "pending-old", 3, inbox.StatusPending, past)
		// A record kept forever (no expires_at) is never purged.
		_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id("op", "forever"), PayloadHash: hash("x")})
		require.NoError(t, err)

		res, err := b.store.Purge(b.ctx, inbox.PurgeParams{BatchSize: 16})
		require.NoError(t, err)
		require.EqualValues(t, 50, res.Deleted)
		require.Equal(t, 4, res.Batches, "16+16+16+2")
		require.Equal(t, 8, b.countStatus(t, inbox.StatusCompleted))
		require.Zero(t, b.countStatus(t, inbox.StatusFailed))
		require.Equal(t, 5, b.countStatus(t, inbox.StatusProcessing))
		require.Equal(t, 3, b.countStatus(t, inbox.StatusPending))

		res, err = b.store.Purge(b.ctx, inbox.PurgeParams{})
		require.NoError(t, err)
		require.Zero(t, res.Deleted)

		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.EqualValues(t, 5, st.Processing)
		require.EqualValues(t, 3, st.Pending)
		require.WithinDuration(t, future, st.OldestExpired, time.Second)
	})

	t.Run("PurgeOfManyRowsLetsClaimsThrough", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		n := 100_000
		if raceEnabled {
			n = 20_000
		}
		b.seed(t, "old", n, inbox.StatusCompleted, time.Now().Add(-time.Hour))

		var (
			purging     atomic.Bool
			during      atomic.Int64
			maxLatency  atomic.Int64
			claimErrors []error
			wg          sync.WaitGroup
		)
		stop := make(chan struct{})
		purging.Store(true)
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id("op", fmt.Sprintf("new-%d", i)),
					PayloadHash: hash("x"), Retention: time.Hour})
				if err != nil {
					claimErrors = append(claimErrors, err)
					return
				}
				if lat := int64(time.Since(start)); lat > maxLatency.Load() {
					maxLatency.Store(lat)
				}
				if purging.Load() {
					during.Add(1)
				}
			}
		})
		start := time.Now()
		res, err := b.store.Purge(b.ctx, inbox.PurgeParams{BatchSize: 1000})
		elapsed := time.Since(start)
		purging.Store(false)
		close(stop)
		wg.Wait()
		require.NoError(t, err)
		require.Empty(t, claimErrors)
		require.EqualValues(t, n, res.Deleted)
		require.GreaterOrEqual(t, res.Batches, n/1000)
		require.Positive(t, during.Load(), "claims went through while the purge ran")
		require.Zero(t, b.countStatus(t, inbox.StatusProcessing))
		t.Logf("purged %d rows in %d batches in %v (%.1f ms a batch); %d claims meanwhile, slowest %.1f ms",
			res.Deleted, res.Batches, elapsed, float64(elapsed.Milliseconds())/float64(res.Batches),
			during.Load(), float64(maxLatency.Load())/1e6)
	})

	t.Run("PurgerRunsAndStops", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		results := make(chan inbox.PurgeResult, 10)
		p, err := inbox.NewPurger(b.store, inbox.PurgerConfig{Interval: time.Hour, BatchSize: 3,
			OnPurge: func(r inbox.PurgeResult, err error) {
				if err == nil {
					results <- r
				}
			}})
		require.NoError(t, err)
		purged := func(want int64) {
			t.Helper()
			select {
			case r := <-results:
				require.Equal(t, want, r.Deleted)
			case <-time.After(30 * time.Second):
				t.Fatal("the purger did not run")
			}
		}

		b.seed(t, "old", 10, inbox.StatusCompleted, time.Now().Add(-time.Hour))
		require.NoError(t, p.Start())
		require.Error(t, p.Start(), "started twice")
		purged(10)
		require.NoError(t, p.Close())
		require.NoError(t, p.Close())

		// It starts again after Close, and runs as a blocking Run too.
		b.seed(t, "again", 4, inbox.StatusFailed, time.Now().Add(-time.Hour))
		require.NoError(t, p.Start())
		purged(4)
		require.NoError(t, p.Close())

		b.seed(t, "run", 2, inbox.StatusCompleted, time.Now().Add(-time.Hour))
		ctx, cancel := context.WithCancel(b.ctx)
		defer cancel()
		ran := make(chan error, 1)
		go func() { ran <- p.Run(ctx) }()
		purged(2)
		<-p.Running()
		require.Error(t, p.Start(), "Run is running")
		cancel()
		require.NoError(t, <-ran)
		require.Zero(t, b.records(t))
	})

	t.Run("PurgeBoundaryAgreesWithPurgeable", func(t *testing.T) {
		// A record that expires exactly now is kept: Record.Purgeable and
		// the purge statement agree, also when the time passed reads a
		// fraction of a microsecond past it, which the databases do not
		// keep.
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id("op", "k"), PayloadHash: hash("x"), Retention: time.Hour})
		require.NoError(t, err)
		rec := b.get(t, id("op", "k"))

		clk.Set(rec.ExpiresAt.Add(400 * time.Nanosecond))
		for _, now := range []time.Time{b.store.Now(), clk.Now()} {
			require.False(t, rec.Purgeable(now), "%v", now)
			res, err := b.store.Purge(b.ctx, inbox.PurgeParams{Before: now})
			require.NoError(t, err)
			require.Zero(t, res.Deleted, "%v", now)
		}
		res, err := b.store.Purge(b.ctx, inbox.PurgeParams{}) // the store's now
		require.NoError(t, err)
		require.Zero(t, res.Deleted)
		require.Equal(t, rec, b.get(t, id("op", "k")))

		clk.Set(rec.ExpiresAt.Add(time.Microsecond))
		require.True(t, rec.Purgeable(b.store.Now()))
		res, err = b.store.Purge(b.ctx, inbox.PurgeParams{})
		require.NoError(t, err)
		require.EqualValues(t, 1, res.Deleted)
		require.Zero(t, b.records(t))
	})
}
