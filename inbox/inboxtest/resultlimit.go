package inboxtest

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
)

// atLimitMax bounds the results the suite writes to prove that the
// database's own limit is storable: MySQL's (max_allowed_packet, or half
// of it, less a margin) is 16 MiB at most by default, PostgreSQL's and
// SQLite's hundreds, too many for a test.
const atLimitMax = 16 << 20

// runResultLimit checks Store.ResultLimit and that a result over it is
// refused before it reaches the database, leaving the transaction usable.
func runResultLimit(t *testing.T, h Harness) {
	t.Run("IsPositiveAndBelowThePacketLimit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		limit, err := b.store.ResultLimit(b.ctx, b.db)
		require.NoError(t, err)
		require.Positive(t, limit)
		require.Less(t, limit, 1<<30, "no database stores a value of 1 GiB")
		if h.Dialect.Name() == "mysql" {
			var packet int
			require.NoError(t, b.db.QueryRowContext(b.ctx, "SELECT @@max_allowed_packet").Scan(&packet))
			// The whole packet when the driver binds the result as a
			// parameter, half of it when it interpolates it (escaped, up
			// to twice its size); less the margin either way.
			require.Contains(t, []int{packet - inbox.ResultMargin, packet/2 - inbox.ResultMargin}, limit)
		}
		// Read through a transaction, as the middleware does, it is the same.
		tx, err := b.db.BeginTx(b.ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		again, err := b.store.ResultLimit(b.ctx, tx)
		require.NoError(t, err)
		require.Equal(t, limit, again)
	})

	t.Run("MaxResultLowersIt", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, h, func(c *inbox.Config) { c.MaxResult = 1000 })
		limit, err := b.store.ResultLimit(b.ctx, b.db)
		require.NoError(t, err)
		require.Equal(t, 1000, limit)
		_, err = inbox.NewStore(b.db, h.Dialect, inbox.Config{Table: b.table, MaxResult: -1})
		require.ErrorIs(t, err, inbox.ErrInvalidConfig)
	})

	t.Run("SaveOutputRefusesOverTheLimitAndTheTransactionCommits", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, h, func(c *inbox.Config) { c.MaxResult = 1000 })
		save := func(key string, size int) (error, *inbox.Record) {
			tx, err := b.db.BeginTx(b.ctx, nil)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback() }()
			k := id("big", key)
			res, err := b.store.Claim(b.ctx, tx, inbox.ClaimParams{ID: k, PayloadHash: hash("p")})
			require.NoError(t, err)
			require.True(t, res.Claimed)
			require.NoError(t, b.effect(b.ctx, tx, key, "effect"))
			serr := b.store.SaveOutput(b.ctx, tx, res.Record, bytes.Repeat([]byte{0}, size))
			// Refused or not, the transaction is intact: the claim and the
			// effect commit.
			require.NoError(t, tx.Commit())
			return serr, b.get(t, k)
		}
		err, rec := save("at", 1000)
		require.NoError(t, err)
		require.Len(t, rec.Result, 1000)

		err, rec = save("over", 1001)
		require.ErrorIs(t, err, inbox.ErrResultTooLarge)
		var tl *inbox.ResultTooLargeError
		require.True(t, errors.As(err, &tl))
		require.Equal(t, 1001, tl.Size)
		require.Equal(t, 1000, tl.Limit)
		require.NoError(t, tl.ReadErr)
		require.Equal(t, inbox.StatusCompleted, rec.Status)
		require.Nil(t, rec.Result)
		require.Equal(t, 1, b.countEffects(t, "over"))
	})

	t.Run("LeaseCompletesWithoutAResultOverTheLimit", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, h, func(c *inbox.Config) { c.MaxResult = 1000 })
		k := id("big", "lease")
		res, err := b.store.Reserve(b.ctx, inbox.ReserveParams{ID: k, PayloadHash: hash("p"), Owner: "w", Lease: time.Minute})
		require.NoError(t, err)
		require.NoError(t, res.Lease.Complete(b.ctx, inbox.Outcome{Result: make([]byte, 1001), ResourceID: "r-1"}))
		require.Contains(t, res.Lease.Dropped(), "result")
		rec := b.get(t, k)
		require.Equal(t, inbox.StatusCompleted, rec.Status)
		require.Nil(t, rec.Result)
		require.Equal(t, "r-1", rec.ResourceID, "only the result is dropped")
		require.Contains(t, rec.Error, "not storable")
	})

	// The database's own limit, where a test can afford it (MySQL): a
	// result of exactly that size is stored and read back, one byte more is
	// refused. This is what proves ResultMargin on MySQL. Where the limit is
	// hundreds of MiB (PostgreSQL, SQLite), a result of atLimitMax bytes is
	// stored instead.
	t.Run("TheDatabasesLimitIsStorable", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		limit, err := b.store.ResultLimit(b.ctx, b.db)
		require.NoError(t, err)
		size := min(limit, atLimitMax)
		// All NUL bytes: what the MySQL driver escapes to twice its size
		// when it interpolates parameters.
		result := make([]byte, size)
		k := id("big", "limit")
		tx, err := b.db.BeginTx(b.ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		res, err := b.store.Claim(b.ctx, tx, inbox.ClaimParams{ID: k, PayloadHash: hash("p"),
			CorrelationID: string(bytes.Repeat([]byte{'c'}, inbox.MaxCorrelationIDLen))})
		require.NoError(t, err)
		if size == limit {
			require.ErrorIs(t, b.store.SaveOutput(b.ctx, tx, res.Record, make([]byte, limit+1)), inbox.ErrResultTooLarge)
		}
		require.NoError(t, b.store.SaveOutput(b.ctx, tx, res.Record, result))
		require.NoError(t, tx.Commit())
		rec := b.get(t, k)
		require.Len(t, rec.Result, size)
	})
}
