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

// runBatch checks reserve mode with batches: reservations and
// completions of deliveries in flight together share statements, and
// every guarantee of reserve mode holds for each delivery alone.
func runBatch(t *testing.T, h Harness) {
	// deliverAll runs one delivery of each key at once, all released
	// together, and returns their errors by key.
	deliverAll := func(handler message.HandlerFunc, keys []string) map[string]error {
		var (
			mu   sync.Mutex
			errs = map[string]error{}
			wg   sync.WaitGroup
		)
		start := make(chan struct{})
		for _, k := range keys {
			wg.Go(func() {
				<-start
				_, err := handler(event(k, `{"amount":100}`))
				mu.Lock()
				errs[k] = err
				mu.Unlock()
			})
		}
		close(start)
		wg.Wait()
		return errs
	}
	keys := func(n int) []string {
		ks := make([]string, n)
		for i := range ks {
			ks[i] = fmt.Sprintf("pay-%02d", i)
		}
		return ks
	}

	t.Run("DeliveriesInFlightShareTheirStatementsAndEachRunsOnce", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		const n = 24
		d := r.dedup(t, dedup.Config{}, dedup.Reserve{Lease: time.Minute,
			Batch: &dedup.Batch{MaxLinger: 10 * time.Second, Statements: 1}})
		var started sync.WaitGroup
		started.Add(n)
		handler := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			c, _ := dedup.ClaimFromContext(msg.Context())
			// Every handler runs before any returns: the completions are
			// in flight together.
			started.Done()
			started.Wait()
			r.charge(c)
			return []*message.Message{message.NewMessage("out-"+c.Key, []byte(c.Key))}, nil
		})
		// A transaction holding the first key keeps the first reservation
		// statement waiting, and with it the only statement slot: the
		// other deliveries gather in the next batch.
		blocker, err := r.db.BeginTx(r.ctx, nil)
		require.NoError(t, err)
		_, err = r.store.Claim(r.ctx, blocker, inbox.ClaimParams{ID: inbox.ID{Operation: "charge", Key: "pay-00"},
			PayloadHash: fingerprint(t, `{"amount":100}`)})
		require.NoError(t, err)
		first := make(chan map[string]error, 1)
		go func() { first <- deliverAll(handler, keys(1)) }()
		require.Eventually(t, func() bool { return d.BatchStats().Reservations == 1 }, 10*time.Second, time.Millisecond)
		rest := make(chan map[string]error, 1)
		go func() { rest <- deliverAll(handler, keys(n)[1:]) }()
		require.Eventually(t, func() bool { return d.BatchStats().ReservesWaiting == n-1 }, 10*time.Second, time.Millisecond)
		require.NoError(t, blocker.Rollback())
		for _, errs := range []map[string]error{<-first, <-rest} {
			for k, err := range errs {
				require.NoError(t, err, k)
			}
		}
		for _, k := range keys(n) {
			rec := r.record(t, k)
			require.Equal(t, inbox.StatusCompleted, rec.Status, k)
			require.NotEmpty(t, rec.Result, "%s: the output is stored", k)
			require.Empty(t, rec.LeaseOwner, k)
		}
		require.Equal(t, n, r.totalEffects())
		st := d.BatchStats()
		require.EqualValues(t, n, st.Reservations)
		require.EqualValues(t, n, st.Completions)
		require.EqualValues(t, 2, st.ReserveBatches, "the waiting reservations shared one statement: %+v", st)
		require.EqualValues(t, 1, st.CompleteBatches, "the completions shared one statement: %+v", st)
		require.Zero(t, st.ReservesWaiting+st.CompletesWaiting)

		// Every one again: duplicates, answered with the stored output.
		var dups atomic.Int64
		dupHandler := d.Middleware(func(*message.Message) ([]*message.Message, error) {
			dups.Add(1)
			return nil, nil
		})
		for k, err := range deliverAll(dupHandler, keys(n)) {
			require.NoError(t, err, k)
		}
		require.Zero(t, dups.Load(), "no handler runs for a completed intent")
		require.Equal(t, n, r.totalEffects())
		require.EqualValues(t, n, d.Stats().Duplicates)
	})

	t.Run("AFailedHandlerIsReleasedAloneAndItsRedeliveryRunsIt", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{}, dedup.Reserve{Lease: time.Minute, Batch: &dedup.Batch{MaxLinger: time.Second}})
		var failed atomic.Bool
		handler := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			c, _ := dedup.ClaimFromContext(msg.Context())
			switch c.Key {
			case "pay-03":
				if failed.CompareAndSwap(false, true) {
					return nil, errors.New("provider unavailable")
				}
			case "pay-05":
				return nil, dedup.Permanent(errors.New("card declined"))
			case "pay-07":
				panic("handler bug")
			}
			r.charge(c)
			return nil, nil
		})
		errs := deliverAll(handler, keys(10))
		require.Error(t, errs["pay-03"], "a transient failure is nacked")
		var perm *dedup.PermanentError
		require.ErrorAs(t, errs["pay-05"], &perm)
		var pe *dedup.PanicError
		require.ErrorAs(t, errs["pay-07"], &pe)
		for _, k := range []string{"pay-00", "pay-01", "pay-02", "pay-04", "pay-06", "pay-08", "pay-09"} {
			require.NoError(t, errs[k], k)
			require.Equal(t, inbox.StatusCompleted, r.record(t, k).Status, k)
		}
		rel := r.record(t, "pay-03")
		require.Equal(t, inbox.StatusProcessing, rel.Status, "released, not completed")
		require.True(t, rel.LeaseExpired(r.store.Now()), "released: the redelivery takes it over at once")
		require.Equal(t, inbox.StatusFailed, r.record(t, "pay-05").Status)
		require.Equal(t, 7, r.totalEffects())

		_, err := handler(event("pay-03", `{"amount":100}`))
		require.NoError(t, err)
		rec := r.record(t, "pay-03")
		require.Equal(t, inbox.StatusCompleted, rec.Status)
		require.EqualValues(t, 2, rec.Attempt, "taken over as a new attempt")
		require.Equal(t, 8, r.totalEffects())
	})

	t.Run("ALoneDeliveryDoesNotLinger", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		// A linger no test would wait out: a lone delivery that waited
		// for it would time out below.
		d := r.dedup(t, dedup.Config{}, dedup.Reserve{Lease: time.Minute, Batch: &dedup.Batch{MaxLinger: time.Hour}})
		handler := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			c, _ := dedup.ClaimFromContext(msg.Context())
			r.charge(c)
			return nil, nil
		})
		for i := range 3 {
			msg := event(fmt.Sprintf("lone-%d", i), `{"amount":100}`)
			ctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
			msg.SetContext(ctx)
			done := make(chan error, 1)
			go func() {
				_, err := handler(msg)
				done <- err
			}()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-ctx.Done():
				t.Fatal("a lone delivery waited for a batch to fill")
			}
			cancel()
		}
		require.Equal(t, 3, r.totalEffects())
		st := d.BatchStats()
		require.EqualValues(t, 3, st.ReserveBatches)
		require.EqualValues(t, 3, st.CompleteBatches)
	})

	t.Run("ConcurrentDeliveriesOfOneIntentInOneBatchCallTheHandlerOnce", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{}, dedup.Reserve{Lease: time.Minute, InFlightWait: -1,
			Batch: &dedup.Batch{MaxLinger: time.Second}})
		handler := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			c, _ := dedup.ClaimFromContext(msg.Context())
			r.charge(c)
			return nil, nil
		})
		var (
			wg   sync.WaitGroup
			acks atomic.Int64
			bad  atomic.Int64
		)
		start := make(chan struct{})
		for range 12 {
			wg.Go(func() {
				<-start
				_, err := handler(event("pay-1", `{"amount":100}`))
				switch {
				case err == nil:
					acks.Add(1)
				case !errors.Is(err, dedup.ErrInFlight):
					bad.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		require.Zero(t, bad.Load(), "the others see the intent in flight")
		require.Equal(t, 1, r.totalEffects(), "exactly one handler call")
		require.Positive(t, acks.Load())
		require.Equal(t, inbox.StatusCompleted, r.record(t, "pay-1").Status)
	})

	// rename moves the inbox table out of the store's way and back, so
	// that its statements fail the way a refused statement does.
	rename := func(t *testing.T, r *rw, from, to string) {
		t.Helper()
		_, err := r.db.ExecContext(r.ctx, fmt.Sprintf("ALTER TABLE %s RENAME TO %s", from, to))
		require.NoError(t, err)
	}

	t.Run("AFailedReservationStatementNacksEveryDeliveryInItAndRunsNoHandler", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{}, dedup.Reserve{Lease: time.Minute, Batch: &dedup.Batch{Statements: 1}})
		handler := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			c, _ := dedup.ClaimFromContext(msg.Context())
			r.charge(c)
			return nil, nil
		})
		aside := r.table + "_aside"
		rename(t, r, r.table, aside)
		errs := deliverAll(handler, keys(8))
		rename(t, r, aside, r.table)
		for k, err := range errs {
			require.Error(t, err, "%s: nacked", k)
			require.False(t, errors.Is(err, dedup.ErrPayloadConflict), k)
		}
		require.Zero(t, r.totalEffects(), "no handler ran without its reservation")
		require.Zero(t, r.records(t))

		// The redeliveries find nothing recorded and run once each.
		for k, err := range deliverAll(handler, keys(8)) {
			require.NoError(t, err, k)
		}
		require.Equal(t, 8, r.totalEffects())
	})

	t.Run("AFailedCompletionStatementNacksAndTheTakeoverRunsAgain", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{}, dedup.Reserve{Lease: time.Minute, InFlightWait: -1,
			Batch: &dedup.Batch{Statements: 1}})
		const n = 6
		aside := r.table + "_aside"
		var started sync.WaitGroup
		started.Add(n)
		var once sync.Once
		handler := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			c, _ := dedup.ClaimFromContext(msg.Context())
			r.charge(c)
			if c.Attempt == 1 {
				// Every handler has charged before the table goes: no
				// completion can be recorded.
				started.Done()
				started.Wait()
				once.Do(func() { rename(t, r, r.table, aside) })
			}
			return nil, nil
		})
		errs := deliverAll(handler, keys(n))
		rename(t, r, aside, r.table)
		for k, err := range errs {
			require.Error(t, err, "%s: the outcome was not recorded, so the delivery is nacked", k)
			rec := r.record(t, k)
			require.Equal(t, inbox.StatusProcessing, rec.Status, "%s: still under its lease", k)
			require.False(t, rec.LeaseExpired(r.store.Now()), k)
		}
		require.Equal(t, n, r.totalEffects())

		// Redelivered while the lease holds: held, not run.
		for k, err := range deliverAll(handler, keys(n)) {
			require.ErrorIs(t, err, dedup.ErrInFlight, k)
		}
		// Once it expires, a redelivery takes each over as attempt 2 (the
		// provider sees the same idempotency key) and records it.
		r.clock.Advance(2 * time.Minute)
		for k, err := range deliverAll(handler, keys(n)) {
			require.NoError(t, err, k)
			rec := r.record(t, k)
			require.Equal(t, inbox.StatusCompleted, rec.Status, k)
			require.EqualValues(t, 2, rec.Attempt, k)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		require.Len(t, r.effects, n, "one idempotency key per intent, whatever the attempt")
	})

	t.Run("ATakenOverLeaseDoesNotCompleteInTheBatch", func(t *testing.T) {
		t.Parallel()
		r := setupReserve(t, h)
		d := r.dedup(t, dedup.Config{}, dedup.Reserve{Lease: time.Minute, HeartbeatInterval: -1,
			Batch: &dedup.Batch{MaxLinger: time.Second}})
		slow, release := make(chan struct{}), make(chan struct{})
		handler := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			c, _ := dedup.ClaimFromContext(msg.Context())
			if c.Key == "pay-00" && c.Attempt == 1 {
				close(slow)
				<-release // stalls past its lease
			}
			r.charge(c)
			return nil, nil
		})
		var zombieErr error
		zombieDone := make(chan struct{})
		go func() {
			defer close(zombieDone)
			_, zombieErr = handler(event("pay-00", `{"amount":100}`))
		}()
		<-slow
		r.clock.Advance(2 * time.Minute)
		other := r.dedup(t, dedup.Config{}, dedup.Reserve{Lease: time.Minute, Owner: "other"})
		_, err := other.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			c, _ := dedup.ClaimFromContext(msg.Context())
			r.charge(c)
			return nil, nil
		})(event("pay-00", `{"amount":100}`))
		require.NoError(t, err, "taken over and completed")
		taken := r.record(t, "pay-00")
		require.EqualValues(t, 2, taken.Attempt)

		// The zombie completes in a batch with fresh deliveries.
		fresh := make(chan map[string]error, 1)
		go func() { fresh <- deliverAll(handler, keys(6)[1:]) }()
		close(release)
		<-zombieDone
		require.ErrorIs(t, zombieErr, inbox.ErrLeaseLost, "fenced off")
		for k, err := range <-fresh {
			require.NoError(t, err, k)
			require.Equal(t, inbox.StatusCompleted, r.record(t, k).Status, k)
		}
		require.Equal(t, taken, r.record(t, "pay-00"), "the zombie changed nothing")
	})
}
