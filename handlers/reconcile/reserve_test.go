package reconcile_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/deduptest"
	"github.com/inboxmill/inboxmill/handlers/reconcile"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// rig is a reserve-mode inbox on one database: a store over a table of its
// own on a clock the test moves, and an external "provider" that counts
// effects per idempotency key (it does not deduplicate: every call is an
// effect).
type rig struct {
	ctx     context.Context
	db      *sql.DB
	store   *inbox.Store
	clock   *inboxtest.Clock
	mu      sync.Mutex
	effects map[string]int
}

func newRig(t *testing.T, kind testdb.Kind, prepare inbox.Prepare) *rig {
	t.Helper()
	r := &rig{ctx: context.Background(), db: testdb.Open(t, kind), clock: &inboxtest.Clock{}, effects: map[string]int{}}
	r.store = inboxtest.NewStore(t, r.db, testdb.Dialect(kind), inbox.Config{Now: r.clock.Now, Prepare: prepare})
	return r
}

// dedup returns a reserve-mode middleware over the rig's store: key from
// metadata "event_id", operation "charge", a 5 ms poll.
func (r *rig) dedup(t *testing.T, cfg dedup.Config, rs dedup.Reserve) *dedup.Deduplicator {
	t.Helper()
	cfg.Key, cfg.Operation = dedup.KeyFromMetadata(deduptest.EventIDKey), "charge"
	if rs.InFlightPoll == 0 {
		rs.InFlightPoll = 5 * time.Millisecond
	}
	cfg.Mode = rs
	d, err := dedup.New(r.store, cfg)
	require.NoError(t, err)
	return d
}

func (r *rig) reconciler(t *testing.T, cfg reconcile.Config) *reconcile.Reconciler {
	t.Helper()
	rc, err := reconcile.New(r.store, cfg)
	require.NoError(t, err)
	return rc
}

// charge is the external effect.
func (r *rig) charge(c dedup.Claim) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.effects[c.IdempotencyKey]++
}

func (r *rig) totalEffects() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.effects {
		n += c
	}
	return n
}

func (r *rig) record(t *testing.T, key string) *inbox.Record {
	t.Helper()
	rec, err := r.store.Get(r.ctx, r.db, inbox.ID{Operation: "charge", Key: key})
	require.NoError(t, err)
	return rec
}

// reserve reserves key as worker owner for a minute, as a reserve-mode
// delivery does before its handler runs, and returns the worker's handle.
func (r *rig) reserve(t *testing.T, key, owner string) *inbox.Lease {
	t.Helper()
	res, err := r.store.Reserve(r.ctx, inbox.ReserveParams{ID: inbox.ID{Operation: "charge", Key: key},
		PayloadHash: []byte(key), Owner: owner, Lease: time.Minute})
	require.NoError(t, err)
	require.NotNil(t, res.Lease, "reserved")
	return res.Lease
}

func event(key, payload string) *message.Message { return deduptest.NewMessage(key, payload) }

// TestSettlesWhatTheMiddlewareLeft runs the reconciler against what
// reserve-mode deliveries leave behind — uncertain outcomes, abandoned
// reservations — on every database and driver, in the default statement
// mode and in the one it leaves out.
func TestSettlesWhatTheMiddlewareLeft(t *testing.T) {
	testdb.EachMode(t, func(t *testing.T, kind testdb.Kind, prepare inbox.Prepare) {
		runSettle(t, func(t *testing.T) *rig { return newRig(t, kind, prepare) })
	})
}

func runSettle(t *testing.T, setup func(t *testing.T) *rig) {
	t.Run("UncertainOutcomeIsPendingUntilReconciled", func(t *testing.T) {
		t.Parallel()
		r := setup(t)
		d := r.dedup(t, dedup.Config{}, dedup.Reserve{InFlightWait: -1})
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
		rc := r.reconciler(t, reconcile.Config{
			Resolve: func(_ context.Context, rec *inbox.Record) (reconcile.Resolution, error) {
				asked = append(asked, rec)
				require.Equal(t, seen[0].IdempotencyKey, rec.IdempotencyKey())
				return reconcile.Resolution{Verdict: reconcile.Succeeded, ResourceID: "charge-9"}, nil
			},
		})
		rep, err := rc.RunOnce(r.ctx)
		require.NoError(t, err)
		require.Equal(t, 1, rep.Resolved[reconcile.Succeeded])
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
		r := setup(t)
		d := r.dedup(t, dedup.Config{}, dedup.Reserve{InFlightWait: -1, AckPending: true})
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

		rc := r.reconciler(t, reconcile.Config{
			Resolve: func(context.Context, *inbox.Record) (reconcile.Resolution, error) {
				return reconcile.Resolution{Verdict: reconcile.NotHappened}, nil
			},
		})
		rep, err := rc.RunOnce(r.ctx)
		require.NoError(t, err)
		require.Equal(t, 1, rep.Resolved[reconcile.NotHappened])
		require.Equal(t, inbox.StatusProcessing, r.record(t, "pay-1").Status)

		_, err = h(event("pay-1", `{}`))
		require.NoError(t, err)
		require.Equal(t, []int64{1, 2}, attempts, "released: the next delivery runs it as attempt 2")
		require.Equal(t, keys[0], keys[1], "with the same idempotency key")
		require.Equal(t, inbox.StatusCompleted, r.record(t, "pay-1").Status)
		require.Equal(t, 1, r.totalEffects())
	})

	t.Run("ReconcilerResolvesAbandonedReservations", func(t *testing.T) {
		t.Parallel()
		r := setup(t)
		// Two workers reserved and died; no redelivery came back.
		dead := map[string]*inbox.Lease{}
		for _, k := range []string{"pay-1", "pay-2"} {
			dead[k] = r.reserve(t, k, "dead")
		}
		rc := r.reconciler(t, reconcile.Config{
			StaleAfter: 10 * time.Minute,
			Resolve: func(_ context.Context, rec *inbox.Record) (reconcile.Resolution, error) {
				require.EqualValues(t, 2, rec.Attempt, "taken over before being resolved")
				if rec.Key == "pay-1" {
					return reconcile.Resolution{Verdict: reconcile.Succeeded, ExternalRef: "ch_1"}, nil
				}
				return reconcile.Resolution{Verdict: reconcile.Unresolved}, nil
			},
		})
		rep, err := rc.RunOnce(r.ctx)
		require.NoError(t, err)
		require.Zero(t, rep.Examined, "live leases are not touched")

		r.clock.Advance(time.Hour)
		rep, err = rc.RunOnce(r.ctx)
		require.NoError(t, err)
		require.Equal(t, 2, rep.Examined)
		require.Equal(t, 1, rep.Resolved[reconcile.Succeeded])
		require.Equal(t, inbox.StatusCompleted, r.record(t, "pay-1").Status)
		require.Equal(t, "ch_1", r.record(t, "pay-1").ExternalRef)
		require.Equal(t, inbox.StatusPending, r.record(t, "pay-2").Status, "unknown outcome: pending, not failed")

		// The dead workers cannot finish what was taken from them.
		for k, lease := range dead {
			before := r.record(t, k)
			require.ErrorIs(t, lease.Complete(r.ctx, inbox.Outcome{}), inbox.ErrLeaseLost, k)
			require.Equal(t, before, r.record(t, k), k)
		}
		st, err := r.store.Stats(r.ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, st.Pending)
		require.False(t, st.OldestPending.IsZero())
	})

	t.Run("AbandonedReservationThatDidNotHappenRunsAgain", func(t *testing.T) {
		t.Parallel()
		r := setup(t)
		// No heartbeat: the worker's process is about to die.
		d := r.dedup(t, dedup.Config{}, dedup.Reserve{InFlightWait: -1, HeartbeatInterval: -1})
		started, crash := make(chan struct{}), make(chan struct{})
		crashed := make(chan error, 1)
		go func() {
			// The worker reserves, and its process "dies" in the handler:
			// nothing of it renews the lease, and in the end its context
			// ends.
			ctx, cancel := context.WithCancel(context.Background())
			msg := event("pay-1", `{}`)
			msg.SetContext(ctx)
			_, err := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				close(started)
				<-crash
				cancel()
				return nil, msg.Context().Err()
			})(msg)
			crashed <- err
		}()
		<-started
		r.clock.Advance(time.Hour) // the lease ran out long ago
		rc := r.reconciler(t, reconcile.Config{StaleAfter: time.Minute,
			Resolve: func(_ context.Context, rec *inbox.Record) (reconcile.Resolution, error) {
				require.Equal(t, inbox.StatusProcessing, rec.Status)
				return reconcile.Resolution{Verdict: reconcile.NotHappened, Error: "no charge at the provider"}, nil
			}})
		rep, err := rc.RunOnce(r.ctx)
		require.NoError(t, err)
		require.Equal(t, 1, rep.Resolved[reconcile.NotHappened])
		close(crash)
		require.ErrorIs(t, <-crashed, dedup.ErrLeaseLost, "the worker's late outcome is refused")

		var attempts []int64
		_, err = d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			c, _ := dedup.ClaimFromContext(msg.Context())
			attempts = append(attempts, c.Attempt)
			r.charge(c)
			return nil, nil
		})(event("pay-1", `{}`))
		require.NoError(t, err, "the released intent is taken over at once by a redelivery")
		require.Equal(t, []int64{3}, attempts, "after the worker's attempt 1 and the reconciler's attempt 2")
		require.Equal(t, inbox.StatusCompleted, r.record(t, "pay-1").Status)
		require.Equal(t, 1, r.totalEffects())
	})

	t.Run("IntentPendingLongerThanItsRetentionIsNotPurgedWhenResolved", func(t *testing.T) {
		t.Parallel()
		r := setup(t)
		d := r.dedup(t, dedup.Config{Retention: time.Hour}, dedup.Reserve{InFlightWait: -1})
		h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			c, _ := dedup.ClaimFromContext(msg.Context())
			r.charge(c)
			return nil, dedup.Uncertain(context.DeadlineExceeded, "")
		})
		_, err := h(event("pay-1", `{}`))
		require.ErrorIs(t, err, dedup.ErrPending)
		r.clock.Advance(2 * time.Hour) // pending for longer than the retention
		res, err := r.store.Purge(r.ctx, inbox.PurgeParams{})
		require.NoError(t, err)
		require.Zero(t, res.Deleted, "a pending record is never purged")
		rc := r.reconciler(t, reconcile.Config{
			Resolve: func(context.Context, *inbox.Record) (reconcile.Resolution, error) {
				return reconcile.Resolution{Verdict: reconcile.Succeeded, Result: []byte(`{"receipt":"not dedup output"}`)}, nil
			},
		})
		_, err = rc.RunOnce(r.ctx)
		require.NoError(t, err)
		res, err = r.store.Purge(r.ctx, inbox.PurgeParams{})
		require.NoError(t, err)
		require.Zero(t, res.Deleted, "resolution renewed the expiry")
		rec := r.record(t, "pay-1")
		require.True(t, rec.ExpiresAt.After(r.clock.Now().Add(30*time.Minute)), "kept for its retention from the resolution")
		_, err = h(event("pay-1", `{}`))
		require.NoError(t, err, "a duplicate, acked even though the stored result is not replayable output")
		require.Equal(t, 1, r.totalEffects())

		r.clock.Advance(2 * time.Hour)
		res, err = r.store.Purge(r.ctx, inbox.PurgeParams{})
		require.NoError(t, err)
		require.EqualValues(t, 1, res.Deleted, "and purged once its retention has passed")
	})

	t.Run("ReconcilerPagesPastUnresolvedRecords", func(t *testing.T) {
		t.Parallel()
		r := setup(t)
		for _, k := range []string{"old-a", "old-b", "new-c"} {
			require.NoError(t, r.reserve(t, k, "w").Pend(r.ctx, "", "timeout"))
			r.clock.Advance(time.Second)
		}
		asked := map[string]int{}
		rc := r.reconciler(t, reconcile.Config{BatchSize: 2,
			Resolve: func(_ context.Context, rec *inbox.Record) (reconcile.Resolution, error) {
				asked[rec.Key]++
				r.clock.Advance(time.Millisecond)
				if rec.Key == "new-c" {
					return reconcile.Resolution{Verdict: reconcile.Succeeded}, nil
				}
				return reconcile.Resolution{Verdict: reconcile.Unresolved}, nil
			},
		})
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

	t.Run("ARecordSettledMeanwhileIsLeftAlone", func(t *testing.T) {
		t.Parallel()
		// Two reconcilers load the same pending record; the second records
		// its verdict first. The first one's verdict, even the same one,
		// no longer applies: the record moved on since it was loaded.
		for _, v := range []reconcile.Verdict{reconcile.Succeeded, reconcile.Failed, reconcile.NotHappened} {
			r := setup(t)
			require.NoError(t, r.reserve(t, "pay-1", "w").Pend(r.ctx, "", "timeout"))
			verdict := func(context.Context, *inbox.Record) (reconcile.Resolution, error) {
				return reconcile.Resolution{Verdict: v, Error: "the same verdict"}, nil
			}
			second := r.reconciler(t, reconcile.Config{Resolve: verdict})
			var secondRep reconcile.Report
			first := r.reconciler(t, reconcile.Config{MaxTries: 1,
				Resolve: func(ctx context.Context, rec *inbox.Record) (reconcile.Resolution, error) {
					var err error
					secondRep, err = second.RunOnce(ctx)
					require.NoError(t, err)
					return verdict(ctx, rec)
				}})
			rep, err := first.RunOnce(r.ctx)
			require.NoError(t, err, v)
			require.Equal(t, 1, secondRep.Resolved[v], v)
			require.Equal(t, 1, rep.Examined, v)
			require.Empty(t, rep.Resolved, "%v: recorded by the other reconciler, not by this one: %+v", v, rep)
			require.Zero(t, rep.Unresolved, "%v: nor left pending by this pass: %+v", v, rep)
			require.Zero(t, rep.GaveUp, v)
		}
	})

	t.Run("ConcurrentReconcilersSettleEachRecordOnce", func(t *testing.T) {
		t.Parallel()
		r := setup(t)
		const n = 12
		for i := range n {
			require.NoError(t, r.reserve(t, "pay-"+string(rune('a'+i)), "w").Pend(r.ctx, "", "timeout"))
		}
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			reps []reconcile.Report
			errs []error
		)
		for range 3 {
			rc := r.reconciler(t, reconcile.Config{BatchSize: n,
				Resolve: func(context.Context, *inbox.Record) (reconcile.Resolution, error) {
					return reconcile.Resolution{Verdict: reconcile.Succeeded}, nil
				}})
			wg.Go(func() {
				rep, err := rc.RunOnce(r.ctx)
				mu.Lock()
				defer mu.Unlock()
				reps = append(reps, rep)
				errs = append(errs, err)
			})
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
		succeeded, unresolved := 0, 0
		for _, rep := range reps {
			succeeded += rep.Resolved[reconcile.Succeeded]
			unresolved += rep.Unresolved
		}
		require.Equal(t, n, succeeded, "every record was settled by exactly one reconciler: %+v", reps)
		require.Zero(t, unresolved, "a record another reconciler settled is not left unresolved: %+v", reps)
		st, err := r.store.Stats(r.ctx)
		require.NoError(t, err)
		require.Zero(t, st.Pending)
	})
}
