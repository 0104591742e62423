package inboxtest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
)

// runClock checks that leases are judged by the database's clock, not by
// the clock of the worker that looks at them.
func runClock(t *testing.T, h Harness) {
	// Where every client runs on the database's clock there is nothing to
	// measure.
	hasClock := !h.Dialect.Capabilities().SharedClock

	// skewedStore is a store over b's table whose worker clock is off by skew.
	skewedStore := func(t *testing.T, b *bundle, skew, sync time.Duration) *inbox.Store {
		cfg := h.config(b.table)
		cfg.Now = func() time.Time { return time.Now().Add(skew) }
		cfg.ClockSync = sync
		s, err := inbox.NewStore(b.db, h.Dialect, cfg)
		require.NoError(t, err)
		closeStore(t, s)
		return s
	}

	t.Run("SyncClockMeasuresTheOffset", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		s := skewedStore(t, b, -time.Hour, time.Minute) // an hour behind
		require.NoError(t, s.SyncClock(b.ctx))
		off, measured := s.ClockOffset()
		if !hasClock {
			require.False(t, measured, "a dialect whose clients share the database's clock never syncs")
			require.Zero(t, off)
			require.WithinDuration(t, time.Now().Add(-time.Hour), s.Now(), time.Minute)
			return
		}
		require.True(t, measured)
		// The test's database runs on a clock close to this process's.
		require.InDelta(t, float64(time.Hour), float64(off), float64(10*time.Second))
		require.WithinDuration(t, time.Now(), s.Now(), 10*time.Second)
	})

	if !hasClock {
		return // every client shares the database's clock: nothing to sync
	}

	t.Run("ClockIsSyncedInTheBackground", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		s := skewedStore(t, b, 2*time.Hour, time.Minute)
		_ = s.Now() // the first use starts a measurement
		require.Eventually(t, func() bool { _, ok := s.ClockOffset(); return ok }, 10*time.Second, 10*time.Millisecond)
		require.WithinDuration(t, time.Now(), s.Now(), 10*time.Second)
	})

	t.Run("ASlowMeasurementKeepsTheEarlierOne", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		var slow atomic.Bool
		var drift atomic.Int64
		cfg := h.config(b.table)
		cfg.ClockSync = time.Minute
		cfg.Now = func() time.Time {
			if slow.Load() {
				// Every reading a second later: the round trip looks 1 s long.
				return time.Now().Add(time.Duration(drift.Add(int64(time.Second))))
			}
			return time.Now()
		}
		s, err := inbox.NewStore(b.db, h.Dialect, cfg)
		require.NoError(t, err)
		closeStore(t, s)
		require.NoError(t, s.SyncClock(b.ctx))
		first, ok := s.ClockOffset()
		require.True(t, ok)
		slow.Store(true)
		require.NoError(t, s.SyncClock(b.ctx))
		again, _ := s.ClockOffset()
		require.Equal(t, first, again, "a measurement with a 1 s round trip must not replace a good one")
	})

	t.Run("AWorkerAheadDoesNotTakeOverALiveLease", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name     string
			sync     time.Duration
			takeOver bool
		}{
			{"synced", time.Minute, false},
			// The hazard the sync removes: by its own clock the lease is
			// an hour past.
			{"unsynced", -1, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				b := setup(t, h)
				holder := skewedStore(t, b, 0, time.Minute)
				ahead := skewedStore(t, b, time.Hour, tc.sync)
				require.NoError(t, holder.SyncClock(b.ctx))
				require.NoError(t, ahead.SyncClock(b.ctx))
				ctx := context.Background()
				res, err := holder.Reserve(ctx, inbox.ReserveParams{ID: id("charge", "pay-1"), PayloadHash: []byte{1},
					Owner: "holder", Lease: time.Minute})
				require.NoError(t, err)
				require.NotNil(t, res.Lease)

				l, err := ahead.TakeOver(ctx, res.Record, inbox.TakeOverParams{Owner: "ahead", Lease: time.Minute})
				if !tc.takeOver {
					require.ErrorIs(t, err, inbox.ErrIllegalTransition, "by the database's clock the lease is live")
					require.NoError(t, res.Lease.Complete(ctx, inbox.Outcome{}), "the holder keeps its lease")
					return
				}
				require.NoError(t, err)
				require.Equal(t, int64(2), l.Attempt())
				require.ErrorIs(t, res.Lease.Complete(ctx, inbox.Outcome{}), inbox.ErrLeaseLost)
			})
		}
	})
}
