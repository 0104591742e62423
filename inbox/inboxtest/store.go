package inboxtest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
)

func runStore(t *testing.T, h Harness) {
	t.Run("MigrateIsIdempotent", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		require.NoError(t, b.store.Migrate(b.ctx))
		require.NoError(t, b.store.Migrate(b.ctx))
		vs, err := b.store.AppliedMigrations(b.ctx)
		require.NoError(t, err)
		ms, err := b.store.Migrations()
		require.NoError(t, err)
		require.Len(t, vs, len(ms))
	})

	t.Run("MigrateConcurrently", func(t *testing.T) {
		t.Parallel()
		db := h.DB(t)
		table := uniqueName("inbox")
		t.Cleanup(func() {
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table)
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table+"_migrations")
		})
		const n = 4
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				s, err := inbox.NewStore(db, h.Dialect, h.config(table))
				if err == nil {
					err = s.Migrate(context.Background())
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		s, err := inbox.NewStore(db, h.Dialect, h.config(table))
		require.NoError(t, err)
		closeStore(t, s)
		vs, err := s.AppliedMigrations(context.Background())
		require.NoError(t, err)
		ms, err := s.Migrations()
		require.NoError(t, err)
		want := make([]int, len(ms))
		for i, m := range ms {
			want[i] = m.Version
		}
		require.Equal(t, want, vs, "every version recorded once")
	})

	t.Run("TableNameInjectionIsRejected", func(t *testing.T) {
		t.Parallel()
		db := h.DB(t)
		for _, name := range []string{"inbox; DROP TABLE x", "inbox--", `"inbox"`, "1inbox", "in box", "inbox.x", "user", "ORDER",
			strings.Repeat("a", inbox.MaxTableLen+1)} {
			_, err := inbox.NewStore(db, h.Dialect, inbox.Config{Table: name})
			require.ErrorIs(t, err, inbox.ErrInvalidConfig, name)
		}
	})

	t.Run("ClaimThenDuplicateThenConflict", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		expires := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
		p := inbox.ClaimParams{Scope: "t1", Operation: "charge", Key: "evt-1", PayloadHash: hash("a"),
			CorrelationID: "corr-1", ExpiresAt: expires}

		res, err := b.store.Claim(b.ctx, b.db, p)
		require.NoError(t, err)
		require.True(t, res.Claimed)
		require.Equal(t, int64(1), res.Record.Attempt)
		require.Equal(t, inbox.StatusProcessing, res.Record.Status)

		res, err = b.store.Claim(b.ctx, b.db, p)
		require.NoError(t, err)
		require.False(t, res.Claimed)
		rec := res.Record
		require.Equal(t, "t1", rec.Scope)
		require.Equal(t, "charge", rec.Operation)
		require.Equal(t, "evt-1", rec.Key)
		require.Equal(t, hash("a"), rec.PayloadHash)
		require.Equal(t, inbox.StatusProcessing, rec.Status)
		require.Equal(t, "corr-1", rec.CorrelationID)
		require.WithinDuration(t, expires, rec.ExpiresAt, time.Millisecond)
		require.WithinDuration(t, time.Now(), rec.CreatedAt, time.Minute)
		require.True(t, rec.LeaseUntil.IsZero())

		p.PayloadHash = hash("b")
		res, err = b.store.Claim(b.ctx, b.db, p)
		require.ErrorIs(t, err, inbox.ErrPayloadConflict)
		var ce *inbox.ConflictError
		require.True(t, errors.As(err, &ce))
		require.Equal(t, hash("a"), ce.Existing.PayloadHash)
		require.NotContains(t, err.Error(), "evt-1", "errors carry a digest, not the key")
		require.Equal(t, 1, b.records(t))
	})

	t.Run("KeysCompareByteForByte", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		// A case-insensitive or PAD SPACE collation would fold these together.
		for _, k := range []string{"Order-1", "order-1", "order-1 ", "ORDER-1", "órder-1"} {
			res, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{Operation: "op", Key: k, PayloadHash: hash(k)})
			require.NoError(t, err, k)
			require.True(t, res.Claimed, k)
		}
		require.Equal(t, 5, b.records(t))
	})

	t.Run("ScopesAndOperationsAreSeparate", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		for _, p := range []inbox.ClaimParams{
			{Scope: "tenant-a", Operation: "op", Key: "k"},
			{Scope: "tenant-b", Operation: "op", Key: "k"},
			{Scope: "tenant-a", Operation: "other", Key: "k"},
			{Operation: "op", Key: "k"},
		} {
			p.PayloadHash = hash("x")
			res, err := b.store.Claim(b.ctx, b.db, p)
			require.NoError(t, err)
			require.True(t, res.Claimed, "%+v", p)
		}
	})

	t.Run("InvalidIdentityIsRejected", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		for name, p := range map[string]inbox.ClaimParams{
			"empty key":       {Operation: "op", Key: ""},
			"empty operation": {Operation: "", Key: "k"},
			"long key":        {Operation: "op", Key: strings.Repeat("k", inbox.MaxKeyLen+1)},
			"long scope":      {Scope: strings.Repeat("s", inbox.MaxScopeLen+1), Operation: "op", Key: "k"},
			"NUL in key":      {Operation: "op", Key: "a\x00b"},
			"bad UTF-8 key":   {Operation: "op", Key: "a\xffb"},
		} {
			p.PayloadHash = hash("x")
			_, err := b.store.Claim(b.ctx, b.db, p)
			require.ErrorIs(t, err, inbox.ErrInvalidKey, name)
		}
		// The longest valid key fits every dialect's column.
		res, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{
			Scope: strings.Repeat("s", inbox.MaxScopeLen), Operation: strings.Repeat("o", inbox.MaxOperationLen),
			Key: strings.Repeat("é", inbox.MaxKeyLen/2), PayloadHash: hash("x")})
		require.NoError(t, err)
		require.True(t, res.Claimed)
		require.Equal(t, 1, b.records(t))
	})

	t.Run("FinishIsFencedByAttempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		p := inbox.ClaimParams{Operation: "op", Key: "k", PayloadHash: hash("x"), LeaseOwner: "w1",
			LeaseUntil: time.Now().Add(time.Minute)}
		_, err := b.store.Claim(b.ctx, b.db, p)
		require.NoError(t, err)

		err = b.store.Finish(b.ctx, b.db, inbox.FinishParams{Operation: "op", Key: "k", Attempt: 2,
			To: inbox.StatusCompleted, Result: []byte("late")})
		require.ErrorIs(t, err, inbox.ErrLeaseLost)
		rec, err := b.store.Get(b.ctx, b.db, "", "op", "k")
		require.NoError(t, err)
		require.Equal(t, inbox.StatusProcessing, rec.Status)
		require.Equal(t, "w1", rec.LeaseOwner)
		require.Nil(t, rec.Result)

		err = b.store.Finish(b.ctx, b.db, inbox.FinishParams{Operation: "op", Key: "k", Attempt: 1,
			To: inbox.StatusCompleted, Result: []byte("done"), ResourceID: "order-9", ExternalRef: "ch_1"})
		require.NoError(t, err)
		rec, err = b.store.Get(b.ctx, b.db, "", "op", "k")
		require.NoError(t, err)
		require.Equal(t, inbox.StatusCompleted, rec.Status)
		require.Equal(t, []byte("done"), rec.Result)
		require.Equal(t, "order-9", rec.ResourceID)
		require.Equal(t, "ch_1", rec.ExternalRef)
		require.Empty(t, rec.LeaseOwner)
		require.True(t, rec.LeaseUntil.IsZero())

		err = b.store.Finish(b.ctx, b.db, inbox.FinishParams{Operation: "op", Key: "missing", Attempt: 1,
			To: inbox.StatusCompleted})
		require.ErrorIs(t, err, inbox.ErrNotFound)
	})

	t.Run("GetAndDelete", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		_, err := b.store.Get(b.ctx, b.db, "", "op", "k")
		require.ErrorIs(t, err, inbox.ErrNotFound)
		_, err = b.store.Claim(b.ctx, b.db, inbox.ClaimParams{Operation: "op", Key: "k", PayloadHash: hash("x")})
		require.NoError(t, err)
		require.NoError(t, b.store.Delete(b.ctx, b.db, "", "op", "k"))
		require.ErrorIs(t, b.store.Delete(b.ctx, b.db, "", "op", "k"), inbox.ErrNotFound)
		res, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{Operation: "op", Key: "k", PayloadHash: hash("y")})
		require.NoError(t, err)
		require.True(t, res.Claimed, "a deleted record no longer holds its key")
	})

	t.Run("ConcurrentClaimsInTransactionsHaveOneWinner", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners int
			errs    []error
		)
		for range h.Concurrency {
			wg.Go(func() {
				for {
					claimed, err := b.claimInTx()
					if inbox.IsRetryable(err) {
						continue // a deadlock or busy database: try again, as a redelivery would
					}
					mu.Lock()
					if claimed {
						winners++
					}
					if err != nil {
						errs = append(errs, err)
					}
					mu.Unlock()
					return
				}
			})
		}
		wg.Wait()
		require.Empty(t, errs)
		require.Equal(t, 1, winners)
		require.Equal(t, 1, b.records(t))
	})

	t.Run("RolledBackClaimFreesTheKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		tx, err := b.db.BeginTx(b.ctx, nil)
		require.NoError(t, err)
		res, err := b.store.Claim(b.ctx, tx, inbox.ClaimParams{Operation: "op", Key: "k", PayloadHash: hash("x")})
		require.NoError(t, err)
		require.True(t, res.Claimed)
		require.NoError(t, tx.Rollback())
		res, err = b.store.Claim(b.ctx, b.db, inbox.ClaimParams{Operation: "op", Key: "k", PayloadHash: hash("y")})
		require.NoError(t, err)
		require.True(t, res.Claimed)
	})
}

// claimInTx claims one fixed key in a transaction that holds the row for a
// moment before committing, so that the other claimers queue behind it.
func (b *bundle) claimInTx() (bool, error) {
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		return false, b.store.Classify(err)
	}
	defer func() { _ = tx.Rollback() }()
	res, err := b.store.Claim(b.ctx, tx, inbox.ClaimParams{Operation: "op", Key: "hot", PayloadHash: hash("x"),
		Status: inbox.StatusCompleted})
	if err != nil {
		return false, err
	}
	if res.Claimed {
		time.Sleep(20 * time.Millisecond)
	}
	return res.Claimed, b.store.Classify(tx.Commit())
}
