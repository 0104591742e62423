package inboxtest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
)

// runReserveMany checks the reservation and the completion of several
// intents in one statement each, which reserve mode's batches build on.
func runReserveMany(t *testing.T, h Harness) {
	t.Run("ReserveManyLeasesFreshKeysAndAnswersTakenOnes", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		done := b.reserve(t, id("op", "done"), "w0", time.Minute, 0)
		require.NoError(t, done.Complete(b.ctx, inbox.Outcome{Result: []byte("earlier")}))
		b.reserve(t, id("op", "held"), "w0", time.Minute, 0)
		rp := func(key, payload string) inbox.ReserveParams {
			return inbox.ReserveParams{ID: id("op", key), PayloadHash: hash(payload), Owner: "w1", Lease: time.Minute}
		}
		ps := []inbox.ReserveParams{
			rp("fresh-b", "p"),
			rp("done", "x"),
			rp("held", "x"),
			rp("done", "other"), // a conflict
			rp("fresh-a", "p"),
			rp("", "p"),           // invalid key
			rp("fresh-b", "p"),    // the same key again
			rp("fresh-b", "else"), // the same key, another payload
			{ID: id("op", "no-owner"), PayloadHash: hash("p"), Lease: time.Minute},
		}
		ps[0].CorrelationID, ps[0].Retention = "corr-1", time.Hour
		res, err := b.store.ReserveMany(b.ctx, ps)
		require.NoError(t, err)
		require.Len(t, res, len(ps))

		l := res[0].Lease
		require.NotNil(t, l)
		require.NoError(t, res[0].Err)
		require.Equal(t, ps[0].ID, l.ID())
		require.Equal(t, int64(1), l.Attempt())
		require.Equal(t, "w1", l.Owner())
		require.WithinDuration(t, usec(clk.Now()).Add(time.Minute), l.Until(), 0)
		rec := b.get(t, ps[0].ID)
		require.Equal(t, inbox.StatusProcessing, rec.Status, "committed as soon as the call returns")
		require.Equal(t, "w1", rec.LeaseOwner)
		require.True(t, rec.LeaseUntil.Equal(l.Until()))
		require.Equal(t, "corr-1", rec.CorrelationID)
		require.Equal(t, rec, res[0].Record, "the returned record is the stored one")
		require.False(t, rec.LeaseExpired(b.store.Now()), "another delivery waits for it")

		require.Nil(t, res[1].Lease)
		require.NoError(t, res[1].Err)
		require.Equal(t, inbox.StatusCompleted, res[1].Record.Status)
		require.Equal(t, []byte("earlier"), res[1].Record.Result)
		require.Nil(t, res[2].Lease)
		require.NoError(t, res[2].Err)
		require.Equal(t, "w0", res[2].Record.LeaseOwner, "held by the live lease of another worker")
		require.ErrorIs(t, res[3].Err, inbox.ErrPayloadConflict)
		require.NotNil(t, res[4].Lease)
		require.ErrorIs(t, res[5].Err, inbox.ErrInvalidKey)
		require.Nil(t, res[6].Lease, "a key's second occurrence follows the first")
		require.NoError(t, res[6].Err)
		require.Same(t, res[0].Record, res[6].Record)
		require.ErrorIs(t, res[7].Err, inbox.ErrPayloadConflict)
		require.ErrorIs(t, res[8].Err, inbox.ErrInvalidConfig, "a reservation needs an owner")
		require.Nil(t, res[8].Lease)
		require.Equal(t, 4, b.records(t))

		// The leases are Reserve's: they complete, and fence.
		clk.Advance(time.Second)
		require.NoError(t, l.Complete(b.ctx, inbox.Outcome{Result: []byte("r")}))
		require.Equal(t, inbox.StatusCompleted, b.get(t, ps[0].ID).Status)

		none, err := b.store.ReserveMany(b.ctx, nil)
		require.NoError(t, err)
		require.Empty(t, none)
		_, err = b.store.ReserveMany(b.ctx, make([]inbox.ReserveParams, inbox.MaxClaimMany+1))
		require.Error(t, err)
	})

	// Workers reserving overlapping sets of keys, each in its own order,
	// at once: every key gets exactly one lease.
	t.Run("ConcurrentReserveManyOfOverlappingSetsLeasesEachKeyOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		const workers, keys, per = 8, 24, 12
		var (
			mu     sync.Mutex
			leased = map[string]int{}
			wg     sync.WaitGroup
		)
		errs := make(chan error, workers)
		for w := range workers {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(w), 2))
				var ps []inbox.ReserveParams
				for _, k := range r.Perm(keys)[:per] {
					ps = append(ps, inbox.ReserveParams{ID: id("op", fmt.Sprintf("k%02d", k)), PayloadHash: hash("p"),
						Owner: fmt.Sprintf("w%d", w), Lease: time.Minute})
				}
				res, err := b.store.ReserveMany(b.ctx, ps)
				for try := 0; inbox.IsRetryable(err) && try < 20; try++ {
					res, err = b.store.ReserveMany(b.ctx, ps)
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				defer mu.Unlock()
				for i, r := range res {
					if r.Err != nil {
						errs <- r.Err
						return
					}
					if r.Lease != nil {
						leased[ps[i].ID.Key]++
					} else if r.Record == nil || r.Record.Status != inbox.StatusProcessing {
						errs <- fmt.Errorf("key %s: neither leased nor held: %+v", ps[i].ID.Key, r.Record)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		for k, n := range leased {
			require.Equal(t, 1, n, "key %s leased %d times", k, n)
		}
		require.Equal(t, b.records(t), len(leased))
	})

	t.Run("CompleteManyCompletesEachLeaseFencedByItsOwnAttempt", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		a := b.reserve(t, id("op", "a"), "w1", time.Minute, time.Hour)
		c := b.reserve(t, id("op", "c"), "w1", time.Minute, 0)
		zombie := b.reserve(t, id("op", "z"), "w1", time.Second, 0)
		ended := b.reserve(t, id("op", "e"), "w1", time.Minute, 0)
		big := b.reserve(t, id("op", "big"), "w1", time.Minute, 0)
		require.NoError(t, ended.Fail(b.ctx, "gave up"))
		clk.Advance(2 * time.Second)
		rec := b.get(t, id("op", "z"))
		fresh, err := b.store.TakeOver(b.ctx, rec, inbox.TakeOverParams{Owner: "w2", Lease: time.Minute})
		require.NoError(t, err)
		taken := b.get(t, id("op", "z"))

		clk.Advance(time.Second)
		large := bytes.Repeat([]byte("L"), 100<<10)
		errs := b.store.CompleteMany(b.ctx, []inbox.Completion{
			{Lease: c, Outcome: inbox.Outcome{Result: []byte("rc"), ResourceID: "res-c", ExternalRef: "ref-c"}},
			{Lease: zombie, Outcome: inbox.Outcome{Result: []byte("zombie")}},
			{Lease: a, Outcome: inbox.Outcome{Result: []byte("ra")}},
			{Lease: ended, Outcome: inbox.Outcome{}},
			{Lease: a, Outcome: inbox.Outcome{Result: []byte("twice")}},
			{Lease: big, Outcome: inbox.Outcome{Result: large}},
			{Lease: nil},
		})
		require.Len(t, errs, 7)
		require.NoError(t, errs[0])
		require.ErrorIs(t, errs[1], inbox.ErrLeaseLost, "taken over: fenced off")
		require.NoError(t, errs[2])
		require.ErrorIs(t, errs[3], inbox.ErrIllegalTransition, "the lease ended before")
		require.ErrorIs(t, errs[4], inbox.ErrIllegalTransition, "the same lease twice")
		require.NoError(t, errs[5], "a large result completes on its own")
		require.ErrorIs(t, errs[6], inbox.ErrInvalidConfig)

		for _, k := range []struct {
			key    string
			result []byte
		}{{"a", []byte("ra")}, {"c", []byte("rc")}, {"big", large}} {
			rec := b.get(t, id("op", k.key))
			require.Equal(t, inbox.StatusCompleted, rec.Status, k.key)
			require.Equal(t, k.result, rec.Result, k.key)
			require.Empty(t, rec.LeaseOwner, k.key)
			require.True(t, rec.LeaseUntil.IsZero(), k.key)
			require.WithinDuration(t, usec(clk.Now()), rec.UpdatedAt, 0, k.key)
		}
		rc := b.get(t, id("op", "c"))
		require.Equal(t, "res-c", rc.ResourceID)
		require.Equal(t, "ref-c", rc.ExternalRef)
		require.True(t, rc.ExpiresAt.IsZero(), "no retention: kept forever")
		ra := b.get(t, id("op", "a"))
		require.WithinDuration(t, usec(clk.Now()).Add(time.Hour), ra.ExpiresAt, 0, "the retention runs from the completion")
		require.Equal(t, taken, b.get(t, id("op", "z")), "the zombie changed nothing")
		require.ErrorIs(t, a.Complete(b.ctx, inbox.Outcome{}), inbox.ErrIllegalTransition, "a completed lease ended")
		require.Equal(t, inbox.StatusFailed, b.get(t, id("op", "e")).Status)

		require.NoError(t, fresh.Complete(b.ctx, inbox.Outcome{Result: []byte("fresh")}))
		require.Equal(t, []byte("fresh"), b.get(t, id("op", "z")).Result)
		require.Empty(t, b.store.CompleteMany(b.ctx, nil))
	})

	// Every completion of a batch is either recorded or reported: with
	// several workers completing at once, nothing is lost or doubled.
	t.Run("ConcurrentCompleteManyRecordsEveryOutcome", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		const workers, per = 6, 10
		var wg sync.WaitGroup
		errs := make(chan error, workers*per)
		for w := range workers {
			wg.Go(func() {
				ps := make([]inbox.ReserveParams, per)
				for i := range ps {
					ps[i] = inbox.ReserveParams{ID: id("op", fmt.Sprintf("w%d-%02d", w, i)), PayloadHash: hash("p"),
						Owner: "w", Lease: time.Minute}
				}
				res, err := b.store.ReserveMany(b.ctx, ps)
				if err != nil {
					errs <- err
					return
				}
				cs := make([]inbox.Completion, per)
				for i, r := range res {
					cs[i] = inbox.Completion{Lease: r.Lease, Outcome: inbox.Outcome{Result: []byte(ps[i].ID.Key)}}
				}
				for _, err := range b.store.CompleteMany(b.ctx, cs) {
					if err != nil {
						errs <- err
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		for w := range workers {
			for i := range per {
				k := fmt.Sprintf("w%d-%02d", w, i)
				rec := b.get(t, id("op", k))
				require.Equal(t, inbox.StatusCompleted, rec.Status, k)
				require.Equal(t, []byte(k), rec.Result, k)
			}
		}
	})
}
