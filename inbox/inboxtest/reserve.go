package inboxtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/handlers"
	"github.com/inboxmill/inboxmill/inbox"
)

// rw is a reserve-mode test bundle: stores over one table sharing a clock
// that tests move, and an external "provider" that counts effects per
// idempotency key (it does not deduplicate: every call is an effect).
type rw struct {
	*bundle
	clock   *clock
	mu      sync.Mutex
	effects map[string]int
	calls   atomic.Int64
}

func setupReserve(t *testing.T, h Harness) *rw {
	t.Helper()
	b := setup(t, h)
	r := &rw{bundle: b, clock: &clock{}, effects: map[string]int{}}
	// Replace the bundle's store by one on the shared clock.
	cfg := h.config(b.table)
	cfg.Now = r.clock.Now
	store, err := inbox.NewStore(b.db, h.Dialect, cfg)
	require.NoError(t, err)
	closeStore(t, store)
	r.store = store
	return r
}

// dedup returns a reserve-mode middleware with test-friendly defaults.
func (r *rw) dedup(t *testing.T, cfg dedup.Config) *dedup.Deduplicator {
	t.Helper()
	cfg.Mode = dedup.ModeReserve
	if cfg.Key == nil {
		cfg.Key = dedup.KeyFromMetadata("event_id")
	}
	if cfg.Operation == "" {
		cfg.Operation = "charge"
	}
	if cfg.InFlightPoll == 0 {
		cfg.InFlightPoll = 5 * time.Millisecond
	}
	d, err := dedup.New(r.store, cfg)
	require.NoError(t, err)
	return d
}

// charge is the external effect.
func (r *rw) charge(claim dedup.Claim) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.effects[claim.IdempotencyKey]++
}

func (r *rw) totalEffects() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.effects {
		n += c
	}
	return n
}

func (r *rw) record(t *testing.T, key string) *inbox.Record {
	t.Helper()
	rec, err := r.store.Get(r.ctx, r.db, "", "charge", key)
	require.NoError(t, err)
	return rec
}

func runReserve(t *testing.T, h Harness) {
	t.Run("CrashAfterReserveIsTakenOverAndTheZombieIsFenced", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		started, release := make(chan struct{}), make(chan struct{})
		zombie := r.dedup(t, dedup.Config{Lease: time.Minute, HeartbeatInterval: -1, Owner: "worker-a"})
		zombieDone := make(chan error, 1)
		go func() {
			_, err := zombie.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				close(started)
				<-release // the worker "crashed": it never gets further until the test lets it
				return nil, nil
			})(event("pay-1", `{"amount":100}`))
			zombieDone <- err
		}()
		<-started
		rec := r.record(t, "pay-1")
		require.Equal(t, inbox.StatusProcessing, rec.Status)
		require.Equal(t, "worker-a", rec.LeaseOwner)
		require.EqualValues(t, 1, rec.Attempt)

		// Before the lease expires a redelivery waits, then nacks.
		b := r.dedup(t, dedup.Config{Lease: time.Minute, Owner: "worker-b", InFlightWait: -1})
		var attempts []int64
		h := func(msg *message.Message) ([]*message.Message, error) {
			c, _ := dedup.ClaimFromContext(msg.Context())
			attempts = append(attempts, c.Attempt)
			r.charge(c)
			return nil, nil
		}
		_, err := b.Middleware(h)(event("pay-1", `{"amount":100}`))
		require.ErrorIs(t, err, dedup.ErrInFlight)
		require.True(t, dedup.IsRetryable(err))
		require.Empty(t, attempts)

		// After it expires, the redelivery takes over as attempt 2.
		r.clock.Advance(2 * time.Minute)
		_, err = b.Middleware(h)(event("pay-1", `{"amount":100}`))
		require.NoError(t, err)
		require.Equal(t, []int64{2}, attempts)
		require.EqualValues(t, 1, b.Stats().Takeovers)
		rec = r.record(t, "pay-1")
		require.Equal(t, inbox.StatusCompleted, rec.Status)
		require.EqualValues(t, 2, rec.Attempt)

		// The zombie wakes up: its outcome is refused and changes nothing.
		close(release)
		err = <-zombieDone
		require.ErrorIs(t, err, dedup.ErrLeaseLost)
		require.Equal(t, rec, r.record(t, "pay-1"))
		err = r.store.Finish(r.ctx, r.db, inbox.FinishParams{Operation: "charge", Key: "pay-1", Attempt: 1,
			To: inbox.StatusFailed, Error: "late"})
		require.ErrorIs(t, err, inbox.ErrLeaseLost)
		require.Equal(t, rec, r.record(t, "pay-1"))
	})

	t.Run("ConcurrentDeliveriesOfOneIntentCallTheHandlerOnce", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{Lease: time.Minute})
		h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			r.calls.Add(1)
			c, _ := dedup.ClaimFromContext(msg.Context())
			time.Sleep(30 * time.Millisecond) // a slow provider call
			r.charge(c)
			return nil, nil
		})
		const n = 16
		var (
			wg  sync.WaitGroup
			bad atomic.Int64
		)
		start := make(chan struct{})
		for range n {
			wg.Go(func() {
				<-start
				for {
					_, err := h(event("pay-1", `{"amount":100}`))
					if err == nil {
						return
					}
					if !dedup.IsRetryable(err) {
						bad.Add(1)
						return
					}
				}
			})
		}
		close(start)
		wg.Wait()
		require.Zero(t, bad.Load(), "only retryable errors")
		require.EqualValues(t, 1, r.calls.Load(), "exactly one handler call")
		require.Equal(t, 1, r.totalEffects())
		require.EqualValues(t, n-1, d.Stats().Duplicates)
	})

	t.Run("UncertainOutcomeIsPendingUntilReconciled", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{InFlightWait: -1})
		var seen []dedup.Claim
		h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			c, _ := dedup.ClaimFromContext(msg.Context())
			seen = append(seen, c)
			r.charge(c) // the charge went through, the answer was lost
			return nil, dedup.Uncertain(context.DeadlineExceeded, "ch_123")
		})
		_, err := h(event("pay-1", `{"amount":100}`))
		require.ErrorIs(t, err, dedup.ErrPending)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.True(t, dedup.IsRetryable(err))
		rec := r.record(t, "pay-1")
		require.Equal(t, inbox.StatusPending, rec.Status)
		require.Equal(t, "ch_123", rec.ExternalRef)
		require.NotEmpty(t, rec.Error)
		require.True(t, rec.LeaseUntil.IsZero())

		for range 3 { // redeliveries never re-execute
			_, err = h(event("pay-1", `{"amount":100}`))
			require.ErrorIs(t, err, dedup.ErrPending)
		}
		require.Len(t, seen, 1)

		var asked []*inbox.Record
		rc, err := handlers.NewReconciler(r.store, handlers.ReconcilerConfig{
			Resolve: func(_ context.Context, rec *inbox.Record) (handlers.Resolution, error) {
				asked = append(asked, rec)
				require.Equal(t, seen[0].IdempotencyKey, dedup.IdempotencyKeyOf(rec))
				return handlers.Resolution{Verdict: handlers.Succeeded, ResourceID: "charge-9"}, nil
			},
		})
		require.NoError(t, err)
		rep, err := rc.RunOnce(r.ctx)
		require.NoError(t, err)
		require.Equal(t, 1, rep.Resolved[handlers.Succeeded])
		require.Len(t, asked, 1)
		require.Equal(t, "ch_123", asked[0].ExternalRef)
		rec = r.record(t, "pay-1")
		require.Equal(t, inbox.StatusCompleted, rec.Status)
		require.Equal(t, "charge-9", rec.ResourceID)
		require.Equal(t, "ch_123", rec.ExternalRef)

		_, err = h(event("pay-1", `{"amount":100}`))
		require.NoError(t, err, "after reconciliation a redelivery is a duplicate")
		require.Len(t, seen, 1)
		require.Equal(t, 1, r.totalEffects())
	})

	t.Run("PendingCanBeAckedAndReleasedForARetry", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{InFlightWait: -1, AckPending: true})
		var attempts []int64
		var keys []string
		h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			c, _ := dedup.ClaimFromContext(msg.Context())
			attempts = append(attempts, c.Attempt)
			keys = append(keys, c.IdempotencyKey)
			if c.Attempt == 1 {
				return nil, dedup.Uncertain(errors.New("connection reset"), "")
			}
			r.charge(c)
			return nil, nil
		})
		_, err := h(event("pay-1", `{}`))
		require.NoError(t, err, "AckPending acks the uncertain delivery")
		require.EqualValues(t, 1, d.Stats().Pending)
		_, err = h(event("pay-1", `{}`))
		require.NoError(t, err)
		require.Equal(t, []int64{1}, attempts)

		rc, err := handlers.NewReconciler(r.store, handlers.ReconcilerConfig{
			Resolve: func(context.Context, *inbox.Record) (handlers.Resolution, error) {
				return handlers.Resolution{Verdict: handlers.NotHappened}, nil
			},
		})
		require.NoError(t, err)
		rep, err := rc.RunOnce(r.ctx)
		require.NoError(t, err)
		require.Equal(t, 1, rep.Resolved[handlers.NotHappened])
		require.Equal(t, inbox.StatusProcessing, r.record(t, "pay-1").Status)

		_, err = h(event("pay-1", `{}`))
		require.NoError(t, err)
		require.Equal(t, []int64{1, 2}, attempts, "released: the next delivery runs it as attempt 2")
		require.Equal(t, keys[0], keys[1], "with the same idempotency key")
		require.Equal(t, inbox.StatusCompleted, r.record(t, "pay-1").Status)
	})

	t.Run("PermanentFailureIsStoredAndNotRerun", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{})
		declined := errors.New("card declined")
		h := d.Middleware(func(*message.Message) ([]*message.Message, error) {
			r.calls.Add(1)
			return nil, dedup.Permanent(declined)
		})
		_, err := h(event("pay-1", `{}`))
		require.ErrorIs(t, err, declined)
		require.True(t, dedup.IsPoison(err))
		rec := r.record(t, "pay-1")
		require.Equal(t, inbox.StatusFailed, rec.Status)
		require.Contains(t, rec.Error, "card declined")
		for range 2 {
			_, err = h(event("pay-1", `{}`))
			require.NoError(t, err, "a failed intent's duplicates are acked")
		}
		require.EqualValues(t, 1, r.calls.Load())
		st := d.Stats()
		require.EqualValues(t, 1, st.Failed)
		require.EqualValues(t, 2, st.Duplicates)
	})

	t.Run("TransientErrorReleasesForAnImmediateTakeover", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{Lease: time.Hour, InFlightWait: -1})
		boom := errors.New("503 from provider")
		h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			if r.calls.Add(1) == 1 {
				return nil, boom
			}
			return nil, nil
		})
		_, err := h(event("pay-1", `{}`))
		require.ErrorIs(t, err, boom)
		rec := r.record(t, "pay-1")
		require.Equal(t, inbox.StatusProcessing, rec.Status)
		require.True(t, rec.LeaseUntil.IsZero(), "released")
		require.Contains(t, rec.Error, "503")
		_, err = h(event("pay-1", `{}`))
		require.NoError(t, err, "no waiting for the hour-long lease")
		require.EqualValues(t, 2, r.calls.Load())
		require.EqualValues(t, 1, d.Stats().Takeovers)
		require.EqualValues(t, 2, r.record(t, "pay-1").Attempt)
	})

	t.Run("HeartbeatKeepsALongHandlerFromBeingTakenOver", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{Lease: 300 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond})
		other := r.dedup(t, dedup.Config{Lease: 300 * time.Millisecond, InFlightWait: -1})
		running := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := d.Middleware(func(*message.Message) ([]*message.Message, error) {
				r.calls.Add(1)
				close(running)
				time.Sleep(time.Second) // over three leases long
				return nil, nil
			})(event("pay-1", `{}`))
			done <- err
		}()
		<-running
		for range 6 {
			time.Sleep(120 * time.Millisecond)
			_, err := other.Middleware(func(*message.Message) ([]*message.Message, error) {
				r.calls.Add(1)
				return nil, nil
			})(event("pay-1", `{}`))
			if err == nil {
				break // the long handler finished: a duplicate
			}
			require.ErrorIs(t, err, dedup.ErrInFlight, "the lease stays live while the handler runs")
		}
		require.NoError(t, <-done)
		require.EqualValues(t, 1, r.calls.Load())
		require.Zero(t, other.Stats().Takeovers)
	})

	t.Run("NoTransactionIsOpenWhileTheHandlerRuns", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{HeartbeatInterval: -1})
		_, err := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			if _, ok := dedup.TxFromContext(msg.Context()); ok {
				return nil, errors.New("a transaction is in the handler's context")
			}
			// Were the reservation's transaction open, it would hold the
			// record's row lock (SQLite: the write lock) and this write from
			// another connection would wait until the timeout.
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			_, err := r.db.ExecContext(ctx, fmt.Sprintf("UPDATE %s SET error = %s WHERE operation = %s",
				r.table, r.ph(1), r.ph(2)), "touched", "charge")
			return nil, err
		})(event("pay-1", `{}`))
		require.NoError(t, err)
	})

	t.Run("ReconcilerResolvesAbandonedReservations", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		// Two workers reserved and died; no redelivery came back.
		for _, k := range []string{"pay-1", "pay-2"} {
			_, err := r.store.Claim(r.ctx, r.db, inbox.ClaimParams{Operation: "charge", Key: k, PayloadHash: hash(k),
				LeaseOwner: "dead", LeaseUntil: r.clock.Now().Add(time.Minute)})
			require.NoError(t, err)
		}
		rc, err := handlers.NewReconciler(r.store, handlers.ReconcilerConfig{
			StaleAfter: 10 * time.Minute,
			Resolve: func(_ context.Context, rec *inbox.Record) (handlers.Resolution, error) {
				require.EqualValues(t, 2, rec.Attempt, "taken over before being resolved")
				if rec.Key == "pay-1" {
					return handlers.Resolution{Verdict: handlers.Succeeded, ExternalRef: "ch_1"}, nil
				}
				return handlers.Resolution{Verdict: handlers.Unresolved}, nil
			},
		})
		require.NoError(t, err)
		rep, err := rc.RunOnce(r.ctx)
		require.NoError(t, err)
		require.Zero(t, rep.Examined, "live leases are not touched")

		r.clock.Advance(time.Hour)
		rep, err = rc.RunOnce(r.ctx)
		require.NoError(t, err)
		require.Equal(t, 2, rep.Examined)
		require.Equal(t, 1, rep.Resolved[handlers.Succeeded])
		require.Equal(t, inbox.StatusCompleted, r.record(t, "pay-1").Status)
		require.Equal(t, inbox.StatusPending, r.record(t, "pay-2").Status, "unknown outcome: pending, not failed")

		// The dead worker cannot finish what was taken from it.
		err = r.store.Finish(r.ctx, r.db, inbox.FinishParams{Operation: "charge", Key: "pay-2", Attempt: 1,
			To: inbox.StatusCompleted})
		require.ErrorIs(t, err, inbox.ErrLeaseLost)
		st, err := r.store.Stats(r.ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, st.Pending)
		require.False(t, st.OldestPending.IsZero())
	})

	t.Run("IntentPendingLongerThanItsRetentionIsNotPurgedWhenResolved", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{InFlightWait: -1, Retention: time.Hour})
		h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			c, _ := dedup.ClaimFromContext(msg.Context())
			r.charge(c)
			return nil, dedup.Uncertain(context.DeadlineExceeded, "")
		})
		_, err := h(event("pay-1", `{}`))
		require.ErrorIs(t, err, dedup.ErrPending)
		r.clock.Advance(2 * time.Hour) // pending for longer than the retention
		rc, err := handlers.NewReconciler(r.store, handlers.ReconcilerConfig{
			Resolve: func(context.Context, *inbox.Record) (handlers.Resolution, error) {
				return handlers.Resolution{Verdict: handlers.Succeeded, Result: []byte(`{"receipt":"not dedup output"}`)}, nil
			},
		})
		require.NoError(t, err)
		_, err = rc.RunOnce(r.ctx)
		require.NoError(t, err)
		res, err := r.store.Purge(r.ctx, inbox.PurgeParams{})
		require.NoError(t, err)
		require.Zero(t, res.Deleted, "resolution renewed the expiry")
		_, err = h(event("pay-1", `{}`))
		require.NoError(t, err, "a duplicate, acked even though the stored result is not replayable output")
		require.Equal(t, 1, r.totalEffects())
	})

	t.Run("ReconcilerPagesPastUnresolvedRecords", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		for _, k := range []string{"old-a", "old-b", "new-c"} {
			_, err := r.store.Claim(r.ctx, r.db, inbox.ClaimParams{Operation: "charge", Key: k, PayloadHash: hash(k)})
			require.NoError(t, err)
			require.NoError(t, r.store.Finish(r.ctx, r.db, inbox.FinishParams{Operation: "charge", Key: k, Attempt: 1,
				To: inbox.StatusPending, Error: "timeout"}))
			r.clock.Advance(time.Second)
		}
		asked := map[string]int{}
		rc, err := handlers.NewReconciler(r.store, handlers.ReconcilerConfig{BatchSize: 2,
			Resolve: func(_ context.Context, rec *inbox.Record) (handlers.Resolution, error) {
				asked[rec.Key]++
				r.clock.Advance(time.Millisecond)
				if rec.Key == "new-c" {
					return handlers.Resolution{Verdict: handlers.Succeeded}, nil
				}
				return handlers.Resolution{Verdict: handlers.Unresolved}, nil
			},
		})
		require.NoError(t, err)
		for range 2 {
			_, err := rc.RunOnce(r.ctx)
			require.NoError(t, err)
		}
		require.Equal(t, 1, asked["new-c"], "a newer record is reached although older ones stay unresolved")
		require.Equal(t, inbox.StatusCompleted, r.record(t, "new-c").Status)
		rec := r.record(t, "old-a")
		require.Equal(t, inbox.StatusPending, rec.Status)
		require.Equal(t, "timeout", rec.Error, "touching an unresolved record keeps what it stored")
	})

	t.Run("LostLeaseCancelsTheHandlersContext", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{Lease: time.Minute, HeartbeatInterval: 10 * time.Millisecond})
		running := make(chan struct{})
		cause := make(chan error, 1)
		done := make(chan error, 1)
		go func() {
			_, err := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				close(running)
				<-msg.Context().Done()
				cause <- context.Cause(msg.Context())
				return nil, msg.Context().Err()
			})(event("pay-1", `{}`))
			done <- err
		}()
		<-running
		// Another worker takes the intent over (as after a long pause of
		// this one): the heartbeat finds out and cancels the handler.
		r.clock.Advance(2 * time.Minute)
		ok, err := r.store.TakeOver(r.ctx, r.db, inbox.TakeOverParams{Operation: "charge", Key: "pay-1", Attempt: 1,
			LeaseOwner: "other", LeaseUntil: r.clock.Now().Add(time.Minute)})
		require.NoError(t, err)
		require.True(t, ok)
		select {
		case c := <-cause:
			require.ErrorIs(t, c, dedup.ErrLeaseLost)
		case <-time.After(30 * time.Second):
			t.Fatal("the handler's context was not cancelled")
		}
		require.ErrorIs(t, <-done, dedup.ErrLeaseLost)
		require.Equal(t, "other", r.record(t, "pay-1").LeaseOwner)
	})
}
