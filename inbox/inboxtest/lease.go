package inboxtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
)

// reserve reserves key for owner and returns the lease, which it must get.
func (b *bundle) reserve(t *testing.T, key inbox.ID, owner string, lease, retention time.Duration) *inbox.Lease {
	t.Helper()
	res, err := b.store.Reserve(b.ctx, inbox.ReserveParams{ID: key, PayloadHash: hash("x"), Owner: owner, Lease: lease,
		Retention: retention})
	require.NoError(t, err)
	require.NotNil(t, res.Lease, "the key was free")
	return res.Lease
}

// pending reserves key and pends it, and returns the pending record.
func (b *bundle) pending(t *testing.T, key inbox.ID, retention time.Duration) *inbox.Record {
	t.Helper()
	l := b.reserve(t, key, "w1", time.Minute, retention)
	require.NoError(t, l.Pend(b.ctx, "ref-1", "timeout"))
	rec := b.get(t, key)
	require.Equal(t, inbox.StatusPending, rec.Status)
	return rec
}

// runLease checks the reserve/lease life-cycle: every transition, the
// fencing that keeps a worker that lost its lease from writing, and the
// lease predicates against the SQL that applies them.
func runLease(t *testing.T, h Harness) {
	t.Run("ReserveThenComplete", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		k := id("charge", "pay-1")
		res, err := b.store.Reserve(b.ctx, inbox.ReserveParams{ID: k, PayloadHash: hash("x"), Owner: "w1",
			Lease: time.Minute, CorrelationID: "corr-1", Retention: time.Hour})
		require.NoError(t, err)
		l := res.Lease
		require.NotNil(t, l)
		require.Equal(t, k, l.ID())
		require.Equal(t, int64(1), l.Attempt())
		require.Equal(t, "w1", l.Owner())
		require.WithinDuration(t, usec(clk.Now()).Add(time.Minute), l.Until(), 0)
		require.Equal(t, inbox.StatusProcessing, res.Record.Status)
		require.Equal(t, "w1", res.Record.LeaseOwner)

		// Another delivery finds the record held.
		dup, err := b.store.Reserve(b.ctx, inbox.ReserveParams{ID: k, PayloadHash: hash("x"), Owner: "w2", Lease: time.Minute})
		require.NoError(t, err)
		require.Nil(t, dup.Lease)
		require.Equal(t, inbox.StatusProcessing, dup.Record.Status)
		require.Equal(t, "w1", dup.Record.LeaseOwner)
		require.False(t, dup.Record.LeaseExpired(b.store.Now()))
		_, err = b.store.Reserve(b.ctx, inbox.ReserveParams{ID: k, PayloadHash: hash("y"), Owner: "w2", Lease: time.Minute})
		require.ErrorIs(t, err, inbox.ErrPayloadConflict)

		clk.Advance(10 * time.Second)
		require.NoError(t, l.Complete(b.ctx, inbox.Outcome{Result: []byte("receipt"), ResourceID: "order-9", ExternalRef: "ch_1"}))
		rec := b.get(t, k)
		require.Equal(t, inbox.StatusCompleted, rec.Status)
		require.Equal(t, []byte("receipt"), rec.Result)
		require.Equal(t, "order-9", rec.ResourceID)
		require.Equal(t, "ch_1", rec.ExternalRef)
		require.Equal(t, "corr-1", rec.CorrelationID)
		require.Equal(t, int64(1), rec.Attempt)
		require.Empty(t, rec.LeaseOwner)
		require.True(t, rec.LeaseUntil.IsZero())
		require.WithinDuration(t, usec(clk.Now()), rec.UpdatedAt, 0)
		require.True(t, rec.Status.Finished())

		require.ErrorIs(t, l.Complete(b.ctx, inbox.Outcome{}), inbox.ErrIllegalTransition, "the lease ended")
		require.ErrorIs(t, l.Extend(b.ctx, time.Minute), inbox.ErrIllegalTransition)
		require.Equal(t, rec, b.get(t, k))

		again, err := b.store.Reserve(b.ctx, inbox.ReserveParams{ID: k, PayloadHash: hash("x"), Owner: "w2", Lease: time.Minute})
		require.NoError(t, err)
		require.Nil(t, again.Lease, "a completed intent is a duplicate")
		require.Equal(t, []byte("receipt"), again.Record.Result)
	})

	t.Run("ALargeResultPastTheDeadlineIsRecordedWithoutIt", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		_, err := b.store.ResultLimit(b.ctx, b.db) // read while there is time
		require.NoError(t, err)
		reserve := func(key string) *inbox.Lease {
			res, err := b.store.Reserve(b.ctx, inbox.ReserveParams{ID: id("charge", key), PayloadHash: hash("x"),
				Owner: "w1", Lease: time.Minute})
			require.NoError(t, err)
			require.NotNil(t, res.Lease)
			return res.Lease
		}
		// The write of a large result ran out of the caller's time (a
		// deadline already past stands for a write that took too long):
		// the effect happened, so its completion is recorded without the
		// result, in time of its own.
		past, cancel := context.WithDeadline(b.ctx, time.Now().Add(-time.Second))
		defer cancel()
		require.NoError(t, reserve("big").Complete(past, inbox.Outcome{Result: make([]byte, 2<<20)}))
		rec := b.get(t, id("charge", "big"))
		require.Equal(t, inbox.StatusCompleted, rec.Status)
		require.Empty(t, rec.Result)
		require.Contains(t, rec.Error, "outcome not storable")
		require.Empty(t, rec.LeaseOwner)

		// A small one is no cheaper to leave out: past the deadline it is
		// not recorded, and the lease stays for a redelivery to take over.
		require.ErrorIs(t, reserve("small").Complete(past, inbox.Outcome{Result: []byte("receipt")}), context.DeadlineExceeded)
		require.Equal(t, inbox.StatusProcessing, b.get(t, id("charge", "small")).Status)
	})

	t.Run("ReserveThenFail", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		k := id("charge", "pay-1")
		l := b.reserve(t, k, "w1", time.Minute, time.Hour)
		clk.Advance(time.Second)
		require.NoError(t, l.Fail(b.ctx, "card declined"))
		rec := b.get(t, k)
		require.Equal(t, inbox.StatusFailed, rec.Status)
		require.Equal(t, "card declined", rec.Error)
		require.Nil(t, rec.Result)
		require.Empty(t, rec.LeaseOwner)
		require.WithinDuration(t, usec(clk.Now()).Add(time.Hour), rec.ExpiresAt, 0)
		require.ErrorIs(t, l.Pend(b.ctx, "", ""), inbox.ErrIllegalTransition)
		require.Equal(t, rec, b.get(t, k))
	})

	t.Run("ReserveThenPend", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		k := id("charge", "pay-1")
		l := b.reserve(t, k, "w1", time.Minute, time.Hour)
		created := usec(clk.Now())
		clk.Advance(time.Second)
		require.NoError(t, l.Pend(b.ctx, "ref-9", "timeout"))
		rec := b.get(t, k)
		require.Equal(t, inbox.StatusPending, rec.Status)
		require.Equal(t, "ref-9", rec.ExternalRef)
		require.Equal(t, "timeout", rec.Error)
		require.Empty(t, rec.LeaseOwner)
		require.True(t, rec.LeaseUntil.IsZero())
		require.WithinDuration(t, created.Add(time.Hour), rec.ExpiresAt, 0, "pending keeps the expiry: it is renewed when settled")
		require.False(t, rec.Status.Finished())
		require.ErrorIs(t, l.Extend(b.ctx, time.Minute), inbox.ErrIllegalTransition)

		dup, err := b.store.Reserve(b.ctx, inbox.ReserveParams{ID: k, PayloadHash: hash("x"), Owner: "w2", Lease: time.Minute})
		require.NoError(t, err)
		require.Nil(t, dup.Lease, "nothing re-executes a pending intent")
		require.Equal(t, inbox.StatusPending, dup.Record.Status)
		_, err = b.store.TakeOver(b.ctx, dup.Record, inbox.TakeOverParams{Owner: "w2", Lease: time.Minute})
		require.ErrorIs(t, err, inbox.ErrIllegalTransition)

		pending, err := b.store.ListPending(b.ctx, 10)
		require.NoError(t, err)
		require.Len(t, pending, 1)
		require.Equal(t, rec, pending[0])
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.Equal(t, inbox.Stats{Pending: 1, OldestPending: st.OldestPending}, st)
		require.WithinDuration(t, created, st.OldestPending, 0)
	})

	t.Run("ReserveThenRelease", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		k := id("charge", "pay-1")
		l := b.reserve(t, k, "w1", time.Minute, time.Hour)
		require.NoError(t, l.Release(b.ctx, "request never sent"))
		rec := b.get(t, k)
		require.Equal(t, inbox.StatusProcessing, rec.Status)
		require.Equal(t, int64(1), rec.Attempt)
		require.Equal(t, "request never sent", rec.Error)
		require.Empty(t, rec.LeaseOwner)
		require.True(t, rec.LeaseUntil.IsZero())
		require.True(t, rec.LeaseExpired(b.store.Now()), "a released lease may be taken over at once")
		require.ErrorIs(t, l.Complete(b.ctx, inbox.Outcome{}), inbox.ErrIllegalTransition)

		stale, err := b.store.ListStale(b.ctx, clk.Now().Add(time.Second), 10)
		require.NoError(t, err)
		require.Equal(t, []*inbox.Record{rec}, stale)

		next, err := b.store.TakeOver(b.ctx, rec, inbox.TakeOverParams{Owner: "w2", Lease: time.Minute})
		require.NoError(t, err)
		require.Equal(t, int64(2), next.Attempt())
		require.Equal(t, "w2", next.Owner())
		taken := b.get(t, k)
		require.Equal(t, int64(2), taken.Attempt)
		require.Equal(t, "w2", taken.LeaseOwner)
		require.WithinDuration(t, next.Until(), taken.LeaseUntil, 0)
		require.NoError(t, next.Complete(b.ctx, inbox.Outcome{Result: []byte("done")}))
		require.Equal(t, inbox.StatusCompleted, b.get(t, k).Status)
	})

	t.Run("IllegalTransitionsAreRefused", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))

		// Complete through a lease that already ended.
		l := b.reserve(t, id("op", "failed"), "w1", time.Minute, 0)
		require.NoError(t, l.Fail(b.ctx, "no"))
		require.ErrorIs(t, l.Complete(b.ctx, inbox.Outcome{Result: []byte("late")}), inbox.ErrIllegalTransition)
		failed := b.get(t, id("op", "failed"))
		require.Equal(t, inbox.StatusFailed, failed.Status)
		require.Nil(t, failed.Result)

		// A finished record can be neither taken over nor fenced as pending.
		_, err := b.store.TakeOver(b.ctx, failed, inbox.TakeOverParams{Owner: "w2", Lease: time.Minute})
		require.ErrorIs(t, err, inbox.ErrIllegalTransition)
		_, err = b.store.FencePending(failed)
		require.ErrorIs(t, err, inbox.ErrIllegalTransition)

		// A processing record is not pending.
		l = b.reserve(t, id("op", "processing"), "w1", time.Minute, 0)
		_, err = b.store.FencePending(b.get(t, id("op", "processing")))
		require.ErrorIs(t, err, inbox.ErrIllegalTransition)
		require.ErrorIs(t, l.Extend(b.ctx, 0), inbox.ErrInvalidConfig)
		require.ErrorIs(t, l.Extend(b.ctx, -time.Second), inbox.ErrInvalidConfig)
		require.NoError(t, l.Extend(b.ctx, time.Minute), "a refused call leaves the lease alive")

		// A pending record's handle holds no lease to extend.
		p, err := b.store.FencePending(b.pending(t, id("op", "pending"), 0))
		require.NoError(t, err)
		require.Empty(t, p.Owner())
		require.True(t, p.Until().IsZero())
		require.ErrorIs(t, p.Extend(b.ctx, time.Minute), inbox.ErrIllegalTransition)
		require.Equal(t, inbox.StatusPending, b.get(t, id("op", "pending")).Status)

		// Leases come from Reserve, not from a transactional claim.
		_, err = b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id("op", "claimed"), PayloadHash: hash("x"),
			Status: inbox.StatusProcessing})
		require.ErrorIs(t, err, inbox.ErrIllegalTransition)

		// Unusable lease parameters.
		for name, p := range map[string]inbox.ReserveParams{
			"no owner":    {ID: id("op", "x"), PayloadHash: hash("x"), Lease: time.Minute},
			"NUL owner":   {ID: id("op", "x"), PayloadHash: hash("x"), Owner: "w\x00", Lease: time.Minute},
			"no lease":    {ID: id("op", "x"), PayloadHash: hash("x"), Owner: "w1"},
			"negative":    {ID: id("op", "x"), PayloadHash: hash("x"), Owner: "w1", Lease: -time.Minute},
			"invalid key": {ID: id("op", ""), PayloadHash: hash("x"), Owner: "w1", Lease: time.Minute},
		} {
			_, err := b.store.Reserve(b.ctx, p)
			require.Error(t, err, name)
			require.True(t, errors.Is(err, inbox.ErrInvalidConfig) || errors.Is(err, inbox.ErrInvalidKey), "%s: %v", name, err)
		}
		_, err = b.store.TakeOver(b.ctx, b.get(t, id("op", "processing")), inbox.TakeOverParams{Owner: "w2"})
		require.ErrorIs(t, err, inbox.ErrInvalidConfig)
		_, err = b.store.Get(b.ctx, b.db, id("op", "x"))
		require.ErrorIs(t, err, inbox.ErrNotFound)
	})

	t.Run("AZombieLeaseIsFencedAfterTakeOver", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		other := b.newStore(t, onClock(clk)) // another worker
		k := id("charge", "pay-1")
		zombie := b.reserve(t, k, "w1", time.Minute, time.Hour)

		clk.Advance(2 * time.Minute) // w1 stalled past its lease
		dup, err := other.Reserve(b.ctx, inbox.ReserveParams{ID: k, PayloadHash: hash("x"), Owner: "w2", Lease: time.Minute})
		require.NoError(t, err)
		require.Nil(t, dup.Lease)
		require.True(t, dup.Record.LeaseExpired(other.Now()))
		fresh, err := other.TakeOver(b.ctx, dup.Record, inbox.TakeOverParams{Owner: "w2", Lease: time.Minute})
		require.NoError(t, err)
		require.Equal(t, int64(2), fresh.Attempt())
		taken := b.get(t, k)

		require.ErrorIs(t, zombie.Extend(b.ctx, time.Minute), inbox.ErrLeaseLost)
		require.ErrorIs(t, zombie.Complete(b.ctx, inbox.Outcome{Result: []byte("zombie")}), inbox.ErrLeaseLost)
		require.Equal(t, taken, b.get(t, k), "the zombie changed nothing")
		require.ErrorIs(t, zombie.Fail(b.ctx, "zombie"), inbox.ErrIllegalTransition, "a lost lease has ended")

		require.NoError(t, fresh.Complete(b.ctx, inbox.Outcome{Result: []byte("fresh")}))
		rec := b.get(t, k)
		require.Equal(t, []byte("fresh"), rec.Result)
		require.Equal(t, int64(2), rec.Attempt)
	})

	t.Run("OfTwoTakeOversOfOneReadExactlyOneWins", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		workers := []*inbox.Store{b.store, b.newStore(t, onClock(clk))}
		k := id("charge", "pay-1")
		b.reserve(t, k, "w0", time.Minute, 0)
		clk.Advance(2 * time.Minute)
		read := b.get(t, k)

		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			wins   []*inbox.Lease
			others []error
		)
		for i := range h.Concurrency {
			wg.Go(func() {
				rec := *read // each worker read the same record
				l, err := workers[i%len(workers)].TakeOver(b.ctx, &rec, inbox.TakeOverParams{Owner: fmt.Sprintf("w%d", i+1), Lease: time.Minute})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					wins = append(wins, l)
				case !errors.Is(err, inbox.ErrLeaseLost):
					others = append(others, err)
				}
			})
		}
		wg.Wait()
		require.Empty(t, others, "the losers learn that they lost")
		require.Len(t, wins, 1)
		rec := b.get(t, k)
		require.Equal(t, int64(2), rec.Attempt)
		require.Equal(t, wins[0].Owner(), rec.LeaseOwner)
	})

	t.Run("TakeOverOfALiveLeaseIsRefused", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		k := id("charge", "pay-1")
		holder := b.reserve(t, k, "w1", time.Minute, 0)
		clk.Advance(30 * time.Second)
		rec := b.get(t, k)
		_, err := b.store.TakeOver(b.ctx, rec, inbox.TakeOverParams{Owner: "w2", Lease: time.Minute})
		require.ErrorIs(t, err, inbox.ErrIllegalTransition)
		require.Equal(t, rec, b.get(t, k))

		// The statement checks the lease too: a reader whose copy is stale
		// (the holder extended its lease since) loses.
		clk.Advance(time.Minute)
		expired := b.get(t, k)
		require.True(t, expired.LeaseExpired(b.store.Now()))
		require.NoError(t, holder.Extend(b.ctx, time.Minute), "a late heartbeat of the holder")
		_, err = b.store.TakeOver(b.ctx, expired, inbox.TakeOverParams{Owner: "w2", Lease: time.Minute})
		require.ErrorIs(t, err, inbox.ErrLeaseLost)
		rec = b.get(t, k)
		require.Equal(t, "w1", rec.LeaseOwner)
		require.Equal(t, int64(1), rec.Attempt)
		require.NoError(t, holder.Complete(b.ctx, inbox.Outcome{}))
	})

	t.Run("ExtendMovesTheLease", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		k := id("charge", "pay-1")
		l := b.reserve(t, k, "w1", time.Minute, 0)
		clk.Advance(50 * time.Second)
		require.NoError(t, l.Extend(b.ctx, 2*time.Minute))
		require.WithinDuration(t, usec(clk.Now()).Add(2*time.Minute), l.Until(), 0)
		rec := b.get(t, k)
		require.WithinDuration(t, l.Until(), rec.LeaseUntil, 0)
		require.WithinDuration(t, usec(clk.Now()), rec.UpdatedAt, 0)
		require.Equal(t, int64(1), rec.Attempt)

		clk.Advance(90 * time.Second) // past the first lease, within the extension
		rec = b.get(t, k)
		require.False(t, rec.LeaseExpired(b.store.Now()))
		_, err := b.store.TakeOver(b.ctx, rec, inbox.TakeOverParams{Owner: "w2", Lease: time.Minute})
		require.ErrorIs(t, err, inbox.ErrIllegalTransition)
		require.NoError(t, l.Extend(b.ctx, time.Minute), "Extend does not end the lease")
		require.NoError(t, l.Complete(b.ctx, inbox.Outcome{}))
	})

	t.Run("FencePendingThenAConcurrentChangeLosesTheHandle", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))

		// Two reconcilers read one pending record and settle it the same
		// way: only the first one's write happens. (On MySQL the second
		// statement matches no row, and reading the record back finds the
		// values it would have written: the fence must still tell.)
		k := id("charge", "settled")
		read := b.pending(t, k, time.Hour)
		first, err := b.store.FencePending(read)
		require.NoError(t, err)
		second, err := b.store.FencePending(read)
		require.NoError(t, err)
		require.Equal(t, k, first.ID())
		require.Equal(t, read.Attempt, first.Attempt())
		require.NoError(t, first.Complete(b.ctx, inbox.Outcome{Result: []byte("settled")}))
		settled := b.get(t, k)
		require.Equal(t, inbox.StatusCompleted, settled.Status)
		require.ErrorIs(t, second.Complete(b.ctx, inbox.Outcome{Result: []byte("settled")}), inbox.ErrLeaseLost)
		require.Equal(t, settled, b.get(t, k))

		// One releases it (the effect did not happen), the other, reading
		// it as pending still, fails it.
		k = id("charge", "released")
		read = b.pending(t, k, time.Hour)
		first, err = b.store.FencePending(read)
		require.NoError(t, err)
		second, err = b.store.FencePending(read)
		require.NoError(t, err)
		clk.Advance(time.Second)
		require.NoError(t, first.Release(b.ctx, "provider has no such charge"))
		released := b.get(t, k)
		require.Equal(t, inbox.StatusProcessing, released.Status)
		require.True(t, released.LeaseExpired(b.store.Now()))
		require.ErrorIs(t, second.Fail(b.ctx, "declined"), inbox.ErrLeaseLost)
		require.Equal(t, released, b.get(t, k))
	})

	t.Run("PendOnAPendingHandleKeepsTheOutcome", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		k := inbox.ID{Scope: "s", Operation: "pend-op", Key: "pay-1"}
		b.pending(t, k, time.Hour)
		clk.Advance(time.Second)
		b.pending(t, id("pend-op", "newer"), 0)
		list, err := b.store.ListPending(b.ctx, 10)
		require.NoError(t, err)
		require.Len(t, list, 2)
		require.Equal(t, k, list[0].ID, "least recently updated first")
		// A pending record may carry what is known of its outcome (written
		// by an operator, say).
		_, err = b.db.ExecContext(b.ctx, fmt.Sprintf("UPDATE %s SET result = %s, resource_id = %s WHERE scope = 's'",
			b.table, b.ph(1), b.ph(2)), []byte("partial"), "order-9")
		require.NoError(t, err)
		before := b.get(t, k)

		clk.Advance(time.Minute)
		p, err := b.store.FencePending(before)
		require.NoError(t, err)
		require.NoError(t, p.Pend(b.ctx, "", ""))
		after := b.get(t, k)
		require.Equal(t, inbox.StatusPending, after.Status)
		require.Equal(t, before.Attempt, after.Attempt)
		require.Equal(t, []byte("partial"), after.Result)
		require.Equal(t, "order-9", after.ResourceID)
		require.Equal(t, "timeout", after.Error)
		require.Equal(t, "ref-1", after.ExternalRef)
		require.WithinDuration(t, before.ExpiresAt, after.ExpiresAt, 0)
		require.WithinDuration(t, usec(clk.Now()), after.UpdatedAt, 0)
		require.True(t, after.UpdatedAt.After(before.UpdatedAt))

		// Scans in update order now page past it.
		list, err = b.store.ListPending(b.ctx, 10)
		require.NoError(t, err)
		require.Len(t, list, 2)
		require.Equal(t, "newer", list[0].Key)
		require.Equal(t, after, list[1])
		list, err = b.store.ListPending(b.ctx, 1)
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.Equal(t, "newer", list[0].Key)

		// A reason and a reference replace the stored ones.
		clk.Advance(time.Minute)
		p, err = b.store.FencePending(after)
		require.NoError(t, err)
		require.NoError(t, p.Pend(b.ctx, "ref-2", "still unknown"))
		again := b.get(t, k)
		require.Equal(t, "still unknown", again.Error)
		require.Equal(t, "ref-2", again.ExternalRef)
		require.Equal(t, []byte("partial"), again.Result)
		require.Equal(t, "order-9", again.ResourceID)
	})

	t.Run("CompleteAndFailRenewTheExpiry", func(t *testing.T) {
		// A record finishing late is kept for its retention from when it
		// finishes, so that an intent pending for longer than its retention
		// is not purged, and run again, the moment it is resolved.
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))

		l := b.reserve(t, id("op", "late"), "w1", time.Minute, time.Hour)
		clk.Advance(3 * time.Hour)
		rec := b.get(t, id("op", "late"))
		require.False(t, rec.Purgeable(b.store.Now()), "an unfinished record is never purgeable")
		require.NoError(t, l.Complete(b.ctx, inbox.Outcome{}))
		rec = b.get(t, id("op", "late"))
		require.WithinDuration(t, usec(clk.Now()).Add(time.Hour), rec.ExpiresAt, 0)
		require.False(t, rec.Purgeable(b.store.Now()))
		res, err := b.store.Purge(b.ctx, inbox.PurgeParams{})
		require.NoError(t, err)
		require.Zero(t, res.Deleted)

		// After a take-over, the retention is the record's own.
		b.reserve(t, id("op", "taken"), "w1", time.Minute, 2*time.Hour)
		clk.Advance(5 * time.Minute)
		rec = b.get(t, id("op", "taken"))
		require.Equal(t, 2*time.Hour, rec.Retention())
		l, err = b.store.TakeOver(b.ctx, rec, inbox.TakeOverParams{Owner: "w2", Lease: time.Minute})
		require.NoError(t, err)
		clk.Advance(time.Minute)
		require.NoError(t, l.Fail(b.ctx, "no"))
		require.WithinDuration(t, usec(clk.Now()).Add(2*time.Hour), b.get(t, id("op", "taken")).ExpiresAt, 0)

		// Settled long after it was pended.
		p, err := b.store.FencePending(b.pending(t, id("op", "pended"), time.Hour))
		require.NoError(t, err)
		clk.Advance(5 * time.Hour)
		require.NoError(t, p.Complete(b.ctx, inbox.Outcome{}))
		require.WithinDuration(t, usec(clk.Now()).Add(time.Hour), b.get(t, id("op", "pended")).ExpiresAt, 0)

		// A record kept forever stays so.
		l = b.reserve(t, id("op", "forever"), "w1", time.Minute, 0)
		require.NoError(t, l.Complete(b.ctx, inbox.Outcome{}))
		rec = b.get(t, id("op", "forever"))
		require.True(t, rec.ExpiresAt.IsZero())
		require.Zero(t, rec.Retention())
		clk.Advance(100 * 24 * time.Hour)
		require.False(t, rec.Purgeable(b.store.Now()))
		res, err = b.store.Purge(b.ctx, inbox.PurgeParams{})
		require.NoError(t, err)
		require.EqualValues(t, 3, res.Deleted, "all but the one kept forever")
		require.Equal(t, 1, b.records(t))
	})

	t.Run("LeaseBoundaryAgreesWithSQL", func(t *testing.T) {
		// A lease that runs until exactly now is live: Record.LeaseExpired,
		// the take-over statement and the stale scan agree, also when the
		// clock reads a fraction of a microsecond past it, which the
		// databases do not keep.
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		k := id("charge", "pay-1")
		b.reserve(t, k, "w1", time.Minute, 0)
		rec := b.get(t, k)

		clk.Set(rec.LeaseUntil.Add(400 * time.Nanosecond))
		require.False(t, rec.LeaseExpired(b.store.Now()))
		require.False(t, rec.LeaseExpired(clk.Now()))
		_, err := b.store.TakeOver(b.ctx, rec, inbox.TakeOverParams{Owner: "w2", Lease: time.Minute})
		require.ErrorIs(t, err, inbox.ErrIllegalTransition)
		stale, err := b.store.ListStale(b.ctx, clk.Now().Add(time.Hour), 10)
		require.NoError(t, err)
		require.Empty(t, stale, "the stale scan sees the lease live")
		// The statement, too, holds the lease live: a caller that believes
		// it released is refused by the database.
		forged := *rec
		forged.LeaseUntil = time.Time{}
		require.True(t, forged.LeaseExpired(b.store.Now()))
		_, err = b.store.TakeOver(b.ctx, &forged, inbox.TakeOverParams{Owner: "w2", Lease: time.Minute})
		require.ErrorIs(t, err, inbox.ErrLeaseLost)
		require.Equal(t, rec, b.get(t, k))

		// A microsecond later it has expired, for all of them.
		clk.Set(rec.LeaseUntil.Add(time.Microsecond))
		require.True(t, rec.LeaseExpired(b.store.Now()))
		stale, err = b.store.ListStale(b.ctx, clk.Now().Add(time.Hour), 10)
		require.NoError(t, err)
		require.Equal(t, []*inbox.Record{rec}, stale)
		l, err := b.store.TakeOver(b.ctx, rec, inbox.TakeOverParams{Owner: "w2", Lease: time.Minute})
		require.NoError(t, err)
		require.Equal(t, int64(2), l.Attempt())
	})

	t.Run("ScansAndStats", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		start := usec(clk.Now())
		// Stale: a lease that ran out long ago.
		b.reserve(t, id("op", "stale"), "w1", time.Minute, 0)
		clk.Advance(time.Second)
		// Expired lately: updated after the stale scan's bound.
		b.reserve(t, id("op", "recent"), "w1", time.Minute, 0)
		clk.Advance(time.Minute)
		b.pending(t, id("op", "pending"), 0)
		live := b.reserve(t, id("op", "live"), "w1", time.Hour, 0)
		_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id("op", "done"), PayloadHash: hash("x"), Retention: time.Minute})
		require.NoError(t, err)
		clk.Advance(5 * time.Minute)

		stale, err := b.store.ListStale(b.ctx, start.Add(time.Second), 10)
		require.NoError(t, err)
		require.Len(t, stale, 1)
		require.Equal(t, "stale", stale[0].Key)
		stale, err = b.store.ListStale(b.ctx, usec(clk.Now()), 10)
		require.NoError(t, err)
		require.Len(t, stale, 2, "not the live lease")
		require.Equal(t, "stale", stale[0].Key, "oldest update first")
		require.Equal(t, "recent", stale[1].Key)

		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.EqualValues(t, 3, st.Processing)
		require.EqualValues(t, 1, st.Pending)
		require.WithinDuration(t, start.Add(time.Second+time.Minute), st.OldestPending, 0)
		require.WithinDuration(t, start.Add(time.Second+2*time.Minute), st.OldestExpired, 0)
		require.NoError(t, live.Complete(b.ctx, inbox.Outcome{}))
	})
}
