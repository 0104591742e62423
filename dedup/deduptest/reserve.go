package deduptest

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
	"github.com/inboxmill/inboxmill/inbox"
)

// rw is a reserve-mode test bundle: a store on a clock that tests move,
// and an external "provider" that counts effects per idempotency key (it
// does not deduplicate: every call is an effect).
type rw struct {
	*bundle
	clock   *clock
	mu      sync.Mutex
	effects map[string]int
	calls   atomic.Int64
}

// clock is the wall clock plus an offset the test moves forward, so that
// leases expire without sleeping.
type clock struct{ offset atomic.Int64 }

func (c *clock) Now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *clock) Advance(d time.Duration) { c.offset.Add(int64(d)) }

func setupReserve(t *testing.T, h Harness) *rw {
	t.Helper()
	c := &clock{}
	return &rw{bundle: setup(t, h, inbox.Config{Now: c.Now}), clock: c, effects: map[string]int{}}
}

// dedup returns a reserve-mode middleware with test-friendly defaults: key
// from metadata "event_id", operation "charge", a 5 ms poll.
func (r *rw) dedup(t *testing.T, cfg dedup.Config, rs dedup.Reserve) *dedup.Deduplicator {
	t.Helper()
	if cfg.Key == nil {
		cfg.Key = dedup.KeyFromMetadata("event_id")
	}
	if cfg.EventTime == nil {
		cfg.EventTime = r.bundle.h.EventTime
	}
	if cfg.Operation == "" {
		cfg.Operation = "charge"
	}
	if rs.InFlightPoll == 0 {
		rs.InFlightPoll = 5 * time.Millisecond
	}
	if rs.Batch == nil {
		rs.Batch = r.bundle.h.Batch
	}
	cfg.Mode = rs
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
	return r.get(t, "charge", key)
}

// fingerprint is the payload hash the middleware's default fingerprint
// gives a delivery of payload.
func fingerprint(t *testing.T, payload string) []byte {
	t.Helper()
	fp, err := dedup.JSONFingerprint()
	require.NoError(t, err)
	h, err := fp(event("any", payload))
	require.NoError(t, err)
	return h
}

func runReserve(t *testing.T, h Harness) {
	t.Run("CrashAfterReserveIsTakenOverAndTheZombieIsFenced", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		started, release := make(chan struct{}), make(chan struct{})
		zombie := r.dedup(t, dedup.Config{}, dedup.Reserve{Lease: time.Minute, HeartbeatInterval: -1, Owner: "worker-a"})
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
		stale := r.record(t, "pay-1")
		require.Equal(t, inbox.StatusProcessing, stale.Status)
		require.Equal(t, "worker-a", stale.LeaseOwner)
		require.EqualValues(t, 1, stale.Attempt)

		// Before the lease expires a redelivery waits, then nacks.
		b := r.dedup(t, dedup.Config{}, dedup.Reserve{Lease: time.Minute, Owner: "worker-b", InFlightWait: -1})
		var attempts []int64
		charge := func(msg *message.Message) ([]*message.Message, error) {
			c, _ := dedup.ClaimFromContext(msg.Context())
			attempts = append(attempts, c.Attempt)
			r.charge(c)
			return nil, nil
		}
		_, err := b.Middleware(charge)(event("pay-1", `{"amount":100}`))
		require.ErrorIs(t, err, dedup.ErrInFlight)
		require.True(t, dedup.IsRetryable(err))
		require.Empty(t, attempts)

		// After it expires, the redelivery takes over as attempt 2.
		r.clock.Advance(2 * time.Minute)
		_, err = b.Middleware(charge)(event("pay-1", `{"amount":100}`))
		require.NoError(t, err)
		require.Equal(t, []int64{2}, attempts)
		require.EqualValues(t, 1, b.Stats().Takeovers)
		rec := r.record(t, "pay-1")
		require.Equal(t, inbox.StatusCompleted, rec.Status)
		require.EqualValues(t, 2, rec.Attempt)

		// The zombie wakes up: its outcome is refused and changes nothing.
		close(release)
		err = <-zombieDone
		require.ErrorIs(t, err, dedup.ErrLeaseLost)
		require.Equal(t, rec, r.record(t, "pay-1"))
		// Nor can anything holding its view of the record take it back.
		_, err = r.store.TakeOver(r.ctx, stale, inbox.TakeOverParams{Owner: "worker-a", Lease: time.Minute})
		require.ErrorIs(t, err, inbox.ErrLeaseLost)
		require.Equal(t, rec, r.record(t, "pay-1"))
		require.Equal(t, 1, r.totalEffects())
	})

	t.Run("ConcurrentDeliveriesOfOneIntentCallTheHandlerOnce", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{}, dedup.Reserve{Lease: time.Minute})
		handler := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
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
					_, err := handler(event("pay-1", `{"amount":100}`))
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

	t.Run("ExpiredLeaseIsTakenOverByExactlyOneOfConcurrentRedeliveries", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		// A worker reserved the intent and died.
		res, err := r.store.Reserve(r.ctx, inbox.ReserveParams{ID: inbox.ID{Operation: "charge", Key: "pay-1"},
			PayloadHash: fingerprint(t, `{"amount":100}`), Owner: "dead", Lease: time.Minute})
		require.NoError(t, err)
		require.NotNil(t, res.Lease)
		r.clock.Advance(2 * time.Minute)

		d := r.dedup(t, dedup.Config{}, dedup.Reserve{Lease: time.Minute})
		var (
			mu       sync.Mutex
			attempts []int64
		)
		rep := Redeliver(t, d, func(msg *message.Message) ([]*message.Message, error) {
			c, _ := dedup.ClaimFromContext(msg.Context())
			mu.Lock()
			attempts = append(attempts, c.Attempt)
			mu.Unlock()
			r.charge(c)
			return nil, nil
		}, event("pay-1", `{"amount":100}`), Times(h.Concurrency), Concurrently(), UntilAcked(100))
		require.Equal(t, h.Concurrency, rep.Acked, "%v", rep)
		for _, err := range rep.Errors() {
			require.True(t, dedup.IsRetryable(err), "only retryable refusals on the way: %v", err)
		}
		require.Equal(t, 1, rep.Runs, "%v", rep)
		require.Equal(t, []int64{2}, attempts)
		require.EqualValues(t, 1, d.Stats().Takeovers, "exactly one delivery took the expired lease over")
		require.Equal(t, 1, r.totalEffects())
		rec := r.record(t, "pay-1")
		require.Equal(t, inbox.StatusCompleted, rec.Status)
		require.EqualValues(t, 2, rec.Attempt)

		// The dead worker's handle is fenced off.
		require.ErrorIs(t, res.Lease.Complete(r.ctx, inbox.Outcome{}), inbox.ErrLeaseLost)
		require.Equal(t, rec, r.record(t, "pay-1"))
	})

	t.Run("UncertainOutcomeIsPendingAndNeverReExecuted", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{}, dedup.Reserve{InFlightWait: -1})
		var seen []dedup.Claim
		charge := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			c, _ := dedup.ClaimFromContext(msg.Context())
			seen = append(seen, c)
			r.charge(c) // the charge went through, the answer was lost
			return nil, dedup.Uncertain(context.DeadlineExceeded, "ch_123")
		})
		_, err := charge(event("pay-1", `{"amount":100}`))
		require.ErrorIs(t, err, dedup.ErrPending)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.True(t, dedup.IsRetryable(err))
		require.False(t, dedup.IsPoison(err))
		rec := r.record(t, "pay-1")
		require.Equal(t, inbox.StatusPending, rec.Status)
		require.Equal(t, "ch_123", rec.ExternalRef)
		require.NotEmpty(t, rec.Error)
		require.True(t, rec.LeaseUntil.IsZero())
		require.Equal(t, seen[0].IdempotencyKey, rec.IdempotencyKey(), "the record is found by the key the handler sent")

		for range 3 { // redeliveries never re-execute
			_, err = charge(event("pay-1", `{"amount":100}`))
			require.ErrorIs(t, err, dedup.ErrPending)
		}
		r.clock.Advance(24 * time.Hour)
		_, err = charge(event("pay-1", `{"amount":100}`))
		require.ErrorIs(t, err, dedup.ErrPending, "a pending intent has no lease to expire")
		require.Len(t, seen, 1)

		// Settled through the store's fenced handle (what a reconciler does).
		pending, err := r.store.FencePending(r.record(t, "pay-1"))
		require.NoError(t, err)
		require.NoError(t, pending.Complete(r.ctx, inbox.Outcome{ResourceID: "charge-9"}))
		rec = r.record(t, "pay-1")
		require.Equal(t, inbox.StatusCompleted, rec.Status)
		require.Equal(t, "charge-9", rec.ResourceID)
		require.Equal(t, "ch_123", rec.ExternalRef)

		_, err = charge(event("pay-1", `{"amount":100}`))
		require.NoError(t, err, "once settled a redelivery is a duplicate")
		require.Len(t, seen, 1)
		require.Equal(t, 1, r.totalEffects())
		st := d.Stats()
		require.EqualValues(t, 5, st.Pending)
		require.EqualValues(t, 1, st.Duplicates)
	})

	t.Run("AckedPendingIntentReleasedRunsAgainWithTheSameKey", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{}, dedup.Reserve{InFlightWait: -1, AckPending: true})
		var (
			attempts []int64
			keys     []string
		)
		charge := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			c, _ := dedup.ClaimFromContext(msg.Context())
			attempts = append(attempts, c.Attempt)
			keys = append(keys, c.IdempotencyKey)
			if c.Attempt == 1 {
				return nil, dedup.Uncertain(errors.New("connection reset"), "")
			}
			r.charge(c)
			return nil, nil
		})
		_, err := charge(event("pay-1", `{}`))
		require.NoError(t, err, "AckPending acks the uncertain delivery")
		_, err = charge(event("pay-1", `{}`))
		require.NoError(t, err, "and its redeliveries")
		require.Equal(t, []int64{1}, attempts)
		require.EqualValues(t, 2, d.Stats().Pending)

		// The effect did not happen: released, the intent runs again.
		pending, err := r.store.FencePending(r.record(t, "pay-1"))
		require.NoError(t, err)
		require.NoError(t, pending.Release(r.ctx, "not found at the provider"))
		require.Equal(t, inbox.StatusProcessing, r.record(t, "pay-1").Status)

		_, err = charge(event("pay-1", `{}`))
		require.NoError(t, err)
		require.Equal(t, []int64{1, 2}, attempts, "released: the next delivery runs it as attempt 2")
		require.Equal(t, keys[0], keys[1], "with the same idempotency key")
		require.Equal(t, inbox.StatusCompleted, r.record(t, "pay-1").Status)
		require.Equal(t, 1, r.totalEffects())
	})

	t.Run("PermanentFailureIsStoredAndNotRerun", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{}, dedup.Reserve{})
		declined := errors.New("card declined")
		charge := d.Middleware(func(*message.Message) ([]*message.Message, error) {
			r.calls.Add(1)
			return nil, dedup.Permanent(declined)
		})
		_, err := charge(event("pay-1", `{}`))
		require.ErrorIs(t, err, declined)
		require.True(t, dedup.IsPoison(err))
		rec := r.record(t, "pay-1")
		require.Equal(t, inbox.StatusFailed, rec.Status)
		require.Contains(t, rec.Error, "card declined")
		for range 2 {
			_, err = charge(event("pay-1", `{}`))
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
		d := r.dedup(t, dedup.Config{}, dedup.Reserve{Lease: time.Hour, InFlightWait: -1})
		boom := errors.New("503 from provider")
		charge := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			if r.calls.Add(1) == 1 {
				return nil, boom
			}
			return nil, nil
		})
		_, err := charge(event("pay-1", `{}`))
		require.ErrorIs(t, err, boom)
		rec := r.record(t, "pay-1")
		require.Equal(t, inbox.StatusProcessing, rec.Status)
		require.True(t, rec.LeaseUntil.IsZero(), "released")
		require.Contains(t, rec.Error, "503")
		_, err = charge(event("pay-1", `{}`))
		require.NoError(t, err, "no waiting for the hour-long lease")
		require.EqualValues(t, 2, r.calls.Load())
		require.EqualValues(t, 1, d.Stats().Takeovers)
		require.EqualValues(t, 2, r.record(t, "pay-1").Attempt)
	})

	t.Run("HeartbeatKeepsALongHandlerFromBeingTakenOver", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		const lease = time.Minute
		d := r.dedup(t, dedup.Config{}, dedup.Reserve{Lease: lease, HeartbeatInterval: 10 * time.Millisecond})
		other := r.dedup(t, dedup.Config{}, dedup.Reserve{Lease: lease, InFlightWait: -1})
		running, finish := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := d.Middleware(func(*message.Message) ([]*message.Message, error) {
				r.calls.Add(1)
				close(running)
				<-finish // runs until the test has seen it outlive several leases
				return nil, nil
			})(event("pay-1", `{}`))
			done <- err
		}()
		<-running
		otherCall := func(*message.Message) ([]*message.Message, error) {
			r.calls.Add(1)
			return nil, nil
		}
		// Each round the store's clock moves by three quarters of a lease,
		// once a heartbeat has extended the lease from the clock's present:
		// four rounds are three leases, which only the heartbeat survives.
		for round := range 4 {
			now := r.clock.Now()
			waitFor(t, fmt.Sprintf("a heartbeat in round %d", round), func() (bool, error) {
				rec, err := r.store.Get(r.ctx, r.db, inbox.ID{Operation: "charge", Key: "pay-1"})
				if err != nil {
					return false, err
				}
				return !rec.LeaseUntil.Before(now.Add(lease).Truncate(time.Millisecond)), nil
			})
			r.clock.Advance(lease * 3 / 4)
			_, err := other.Middleware(otherCall)(event("pay-1", `{}`))
			require.ErrorIs(t, err, dedup.ErrInFlight, "round %d: the lease stays live while the handler runs", round)
		}
		close(finish)
		require.NoError(t, <-done)
		_, err := other.Middleware(otherCall)(event("pay-1", `{}`))
		require.NoError(t, err, "the long handler finished: a duplicate")
		require.EqualValues(t, 1, r.calls.Load())
		require.Zero(t, other.Stats().Takeovers)
		require.Equal(t, inbox.StatusCompleted, r.record(t, "pay-1").Status)
		require.EqualValues(t, 1, r.record(t, "pay-1").Attempt)
	})

	t.Run("NoTransactionIsOpenWhileTheHandlerRuns", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{}, dedup.Reserve{HeartbeatInterval: -1})
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
		require.Equal(t, inbox.StatusCompleted, r.record(t, "pay-1").Status)
	})

	t.Run("LostLeaseCancelsTheHandlersContext", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{}, dedup.Reserve{Lease: time.Minute, HeartbeatInterval: 10 * time.Millisecond})
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
		// this one): the heartbeat finds out and cancels the handler. Until
		// then the heartbeat may extend the lease again between the clock's
		// move and the take-over, which is then refused; move on further.
		var lease *inbox.Lease
		waitFor(t, "a take-over", func() (bool, error) {
			r.clock.Advance(2 * time.Minute)
			var err error
			lease, err = r.store.TakeOver(r.ctx, r.record(t, "pay-1"), inbox.TakeOverParams{Owner: "other", Lease: time.Hour})
			if errors.Is(err, inbox.ErrIllegalTransition) || errors.Is(err, inbox.ErrLeaseLost) {
				return false, err
			}
			require.NoError(t, err)
			return true, nil
		})
		require.EqualValues(t, 2, lease.Attempt())
		select {
		case c := <-cause:
			require.ErrorIs(t, c, dedup.ErrLeaseLost)
		case <-time.After(30 * time.Second):
			t.Fatal("the handler's context was not cancelled")
		}
		require.ErrorIs(t, <-done, dedup.ErrLeaseLost)
		rec := r.record(t, "pay-1")
		require.Equal(t, "other", rec.LeaseOwner)
		require.Equal(t, inbox.StatusProcessing, rec.Status, "the loser recorded nothing")
		require.NoError(t, lease.Complete(r.ctx, inbox.Outcome{}), "the winner still holds it")
	})
}

// waitFor polls cond until it holds, and fails t when it has not held
// within a generous limit (a bound on a hang, not a timing assertion).
func waitFor(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (last error: %v)", what, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
