package inboxtest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
)

// runClaimMany checks the claim of several intents in one statement, which
// group commit builds on.
func runClaimMany(t *testing.T, h Harness) {
	t.Run("ClaimManyClaimsFreshKeysAndAnswersTakenOnes", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		// Committed before: a duplicate and a conflict.
		for _, k := range []string{"dup", "conflict"} {
			_, err := b.store.Claim(b0, b.db, inbox.ClaimParams{ID: id("op", k), PayloadHash: hash("p")})
			require.NoError(t, err)
		}
		odd := `quote " back \ comma , brace { } null NULL ünïcode`
		ps := []inbox.ClaimParams{
			{ID: id("op", "fresh-b"), PayloadHash: hash("p"), CorrelationID: "corr-1", Retention: time.Hour},
			{ID: id("op", "dup"), PayloadHash: hash("p")},
			{ID: id("op", "conflict"), PayloadHash: hash("other")},
			{ID: id("op", "fresh-a"), PayloadHash: hash("p")},
			{ID: id("op", ""), PayloadHash: hash("p")},            // invalid key
			{ID: id("op", "fresh-b"), PayloadHash: hash("p")},     // same key again, same payload
			{ID: id("op", "fresh-b"), PayloadHash: hash("other")}, // same key again, another payload
			{ID: inbox.ID{Scope: odd, Operation: odd, Key: odd}, PayloadHash: []byte{0, '\\', '"', 0xff},
				Status: inbox.StatusFailed, Error: odd},
		}
		tx, err := b.db.BeginTx(b0, nil)
		require.NoError(t, err)
		res, err := b.store.ClaimMany(b0, tx, ps)
		require.NoError(t, err)
		require.Len(t, res, len(ps))

		require.True(t, res[0].Claimed)
		require.NoError(t, res[0].Err)
		require.Equal(t, ps[0].ID, res[0].Record.ID)
		require.EqualValues(t, 1, res[0].Record.Attempt)
		require.False(t, res[1].Claimed, "a committed key is a duplicate")
		require.NoError(t, res[1].Err)
		require.Equal(t, inbox.StatusCompleted, res[1].Record.Status)
		require.False(t, res[2].Claimed)
		require.ErrorIs(t, res[2].Err, inbox.ErrPayloadConflict)
		var ce *inbox.ConflictError
		require.ErrorAs(t, res[2].Err, &ce)
		require.Equal(t, ps[2].ID, ce.ID)
		require.True(t, res[3].Claimed)
		require.ErrorIs(t, res[4].Err, inbox.ErrInvalidKey)
		require.False(t, res[4].Claimed)
		require.False(t, res[5].Claimed, "a key's second occurrence follows the first")
		require.NoError(t, res[5].Err)
		require.Same(t, res[0].Record, res[5].Record)
		require.ErrorIs(t, res[6].Err, inbox.ErrPayloadConflict)
		require.True(t, res[7].Claimed, "keys with quotes, backslashes and braces are bound as they are")
		require.NoError(t, tx.Commit())

		require.Equal(t, 5, b.records(t))
		got := b.get(t, ps[0].ID)
		require.Equal(t, hash("p"), got.PayloadHash)
		require.Equal(t, "corr-1", got.CorrelationID)
		require.Equal(t, inbox.StatusCompleted, got.Status)
		require.False(t, got.ExpiresAt.IsZero())
		require.WithinDuration(t, got.CreatedAt.Add(time.Hour), got.ExpiresAt, time.Second)
		require.True(t, got.CreatedAt.Equal(res[0].Record.CreatedAt), "the returned record is the stored one")
		odds := b.get(t, ps[7].ID)
		require.Equal(t, ps[7].PayloadHash, odds.PayloadHash)
		require.Equal(t, inbox.StatusFailed, odds.Status)
		require.Equal(t, odd, odds.Error)
		require.True(t, odds.ExpiresAt.IsZero(), "no retention: kept forever")
	})

	t.Run("ClaimManyRolledBackForgetsEveryClaim", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		ps := []inbox.ClaimParams{{ID: id("op", "a"), PayloadHash: hash("p")}, {ID: id("op", "b"), PayloadHash: hash("p")}}
		tx, err := b.db.BeginTx(b0, nil)
		require.NoError(t, err)
		res, err := b.store.ClaimMany(b0, tx, ps)
		require.NoError(t, err)
		require.True(t, res[0].Claimed && res[1].Claimed)
		require.NoError(t, tx.Rollback())
		require.Equal(t, 0, b.records(t))
		res, err = b.store.ClaimMany(b0, b.db, ps)
		require.NoError(t, err)
		require.True(t, res[0].Claimed && res[1].Claimed, "the keys are free again")
	})

	t.Run("ClaimManyOfOneAndOfNoneWork", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		res, err := b.store.ClaimMany(b0, b.db, nil)
		require.NoError(t, err)
		require.Empty(t, res)
		res, err = b.store.ClaimMany(b0, b.db, []inbox.ClaimParams{{ID: id("op", "one"), PayloadHash: hash("p")}})
		require.NoError(t, err)
		require.True(t, res[0].Claimed)
		_, err = b.store.ClaimMany(b0, b.db, make([]inbox.ClaimParams, inbox.MaxClaimMany+1))
		require.Error(t, err)
	})

	// Transactions claiming overlapping sets of keys, each in its own
	// order, hold their rows while they work: sorted claims make them wait
	// for each other, never deadlock, and every key is claimed once.
	t.Run("ConcurrentClaimManyOfOverlappingSetsClaimEachKeyOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		const workers, keys, per = 8, 24, 12
		var (
			mu      sync.Mutex
			claimed = map[string]int{}
			retries int
			wg      sync.WaitGroup
		)
		errs := make(chan error, workers)
		for w := range workers {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(w), 1))
				var ps []inbox.ClaimParams
				for _, k := range r.Perm(keys)[:per] {
					ps = append(ps, inbox.ClaimParams{ID: id("op", fmt.Sprintf("k%02d", k)), PayloadHash: hash("p")})
				}
				for try := 0; ; try++ {
					got, err := claimManyInTx(b, ps)
					if inbox.IsRetryable(err) && try < 20 {
						mu.Lock()
						retries++
						mu.Unlock()
						continue
					}
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					for _, k := range got {
						claimed[k]++
					}
					mu.Unlock()
					return
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		for k, n := range claimed {
			require.Equal(t, 1, n, "key %s claimed %d times", k, n)
		}
		require.Equal(t, b.records(t), len(claimed))
		if h.Dialect.Queries(b.table).InsertMany(1).Returning {
			require.Zero(t, retries, "sorted claims in one statement neither deadlock nor race")
		}
		t.Logf("%d keys claimed, %d retries", len(claimed), retries)
	})
}

// claimManyInTx claims ps in a transaction that holds the rows a moment
// before it commits, and returns the keys it claimed.
func claimManyInTx(b *bundle, ps []inbox.ClaimParams) ([]string, error) {
	tx, err := b.db.BeginTx(b0, nil)
	if err != nil {
		return nil, b.store.Classify(err)
	}
	defer func() { _ = tx.Rollback() }()
	res, err := b.store.ClaimMany(b0, tx, ps)
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, r := range res {
		if r.Err != nil {
			return nil, r.Err
		}
		if r.Claimed {
			keys = append(keys, r.Record.ID.Key)
		}
	}
	time.Sleep(5 * time.Millisecond)
	if err := tx.Commit(); err != nil {
		return nil, errors.Join(b.store.Classify(err))
	}
	return keys, nil
}
