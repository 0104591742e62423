package inboxtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
)

// runStore checks the transactional claim and the record reads and writes
// around it.
// b0 is the context of statements that need no deadline of their own.
var b0 = context.Background()

// reservedNames keeps the runs of ReservedWordsAreUsableTableNames
// against one database (two drivers, two statement modes) from sharing
// the tables, whose names cannot be made unique.
var reservedNames sync.Mutex

// lockReservedNames holds reservedNames, and a lock that other test
// processes on the same server respect too, until t ends: two suites may
// run against one server at once (a CI run beside another), and one's
// cleanup would drop the other's tables. The server's lock is taken on a
// connection of its own: a PostgreSQL advisory lock, MySQL's GET_LOCK.
// An SQLite database is the test's own file.
func lockReservedNames(t *testing.T, h Harness, db *sql.DB) {
	t.Helper()
	reservedNames.Lock()
	t.Cleanup(reservedNames.Unlock)
	const name = "inboxmill_test_reserved_names"
	var lock, unlock string
	switch h.Dialect.Name() {
	case "postgres":
		lock = "SELECT 1 FROM (SELECT pg_advisory_lock(hashtextextended('" + name + "', 0))) AS l"
		unlock = "SELECT pg_advisory_unlock(hashtextextended('" + name + "', 0))"
	case "mysql":
		lock = "SELECT COALESCE(GET_LOCK('" + name + "', 600), 0)"
		unlock = "SELECT RELEASE_LOCK('" + name + "')"
	default:
		return
	}
	conn, err := db.Conn(b0)
	require.NoError(t, err)
	var got int
	if err := conn.QueryRowContext(b0, lock).Scan(&got); err != nil || got != 1 {
		_ = conn.Close()
		require.FailNow(t, "the reserved-names lock", "got %d, %v", got, err)
	}
	t.Cleanup(func() {
		_, _ = conn.ExecContext(b0, unlock)
		_ = conn.Close()
	})
}

func runStore(t *testing.T, h Harness) {
	t.Run("ResultLimit", func(t *testing.T) { runResultLimit(t, h) })
	t.Run("TableNameInjectionIsRejected", func(t *testing.T) {
		t.Parallel()
		db := h.DB(t)
		for _, name := range []string{"inbox; DROP TABLE x", "inbox--", `"inbox"`, "inbox`", "1inbox", "in box", "inbox.x",
			"{{table}}", strings.Repeat("a", inbox.MaxTableLen+1)} {
			_, err := inbox.NewStore(db, h.Dialect, inbox.Config{Table: name})
			require.ErrorIs(t, err, inbox.ErrInvalidConfig, name)
		}
	})

	// Table names are quoted in every statement and migration, so words
	// that some database reserves are names like any other. The tables
	// cannot get random names, so the subtest cleans up after itself.
	t.Run("ReservedWordsAreUsableTableNames", func(t *testing.T) {
		db := h.DB(t)
		lockReservedNames(t, h, db)
		for _, word := range []string{"window", "range", "rows", "lock", "read", "returning", "commit", "order", "user", "Select"} {
			store, err := inbox.NewStore(db, h.Dialect, h.config(word))
			require.NoError(t, err, word)
			require.NoError(t, store.MigrateDown(b0, 0), word) // a leftover of an interrupted run
			require.NoError(t, store.Migrate(b0), word)
			require.NoError(t, store.Validate(b0), word)
			id := inbox.ID{Operation: "op", Key: "k"}
			res, err := store.Claim(b0, db, inbox.ClaimParams{ID: id, PayloadHash: hash("p"), Retention: time.Nanosecond})
			require.NoError(t, err, word)
			require.True(t, res.Claimed, word)
			rr, err := store.Reserve(b0, inbox.ReserveParams{ID: inbox.ID{Operation: "op", Key: "r"}, PayloadHash: hash("p"),
				Owner: "w", Lease: time.Minute})
			require.NoError(t, err, word)
			require.NoError(t, rr.Lease.Complete(b0, inbox.Outcome{}), word)
			_, err = store.Stats(b0)
			require.NoError(t, err, word)
			_, err = store.Purge(b0, inbox.PurgeParams{Before: store.Now().Add(time.Hour)})
			require.NoError(t, err, word)
			require.NoError(t, store.MigrateDown(b0, 0), word)
			require.NoError(t, store.Close())
		}
	})

	t.Run("ClaimThenDuplicateThenConflict", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		key := inbox.ID{Scope: "t1", Operation: "charge", Key: "evt-1"}
		p := inbox.ClaimParams{ID: key, PayloadHash: hash("a"), CorrelationID: "corr-1", Retention: time.Hour}

		res, err := b.store.Claim(b.ctx, b.db, p)
		require.NoError(t, err)
		require.True(t, res.Claimed)
		require.Equal(t, int64(1), res.Record.Attempt)
		require.Equal(t, inbox.StatusCompleted, res.Record.Status, "a claim inserts the outcome its commit will have")

		res, err = b.store.Claim(b.ctx, b.db, p)
		require.NoError(t, err)
		require.False(t, res.Claimed)
		rec := res.Record
		require.Equal(t, key, rec.ID)
		require.Equal(t, hash("a"), rec.PayloadHash)
		require.Equal(t, inbox.StatusCompleted, rec.Status)
		require.Equal(t, "corr-1", rec.CorrelationID)
		require.WithinDuration(t, usec(clk.Now()), rec.CreatedAt, 0)
		require.WithinDuration(t, usec(clk.Now()).Add(time.Hour), rec.ExpiresAt, 0)
		require.Equal(t, time.Hour, rec.Retention())
		require.True(t, rec.LeaseUntil.IsZero())
		require.Empty(t, rec.LeaseOwner)

		p.PayloadHash = hash("b")
		res, err = b.store.Claim(b.ctx, b.db, p)
		require.ErrorIs(t, err, inbox.ErrPayloadConflict)
		var ce *inbox.ConflictError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, key, ce.ID)
		require.Equal(t, hash("a"), ce.Existing.PayloadHash)
		require.Same(t, ce.Existing, res.Record)
		require.NotContains(t, err.Error(), "evt-1", "errors carry a digest, not the key")
		require.Contains(t, err.Error(), key.Digest())
		require.Equal(t, 1, b.records(t))
	})

	t.Run("ClaimInsertsCompletedOrFailedOnly", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		res, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id("op", "failed"), PayloadHash: hash("x"),
			Status: inbox.StatusFailed, Error: "card declined"})
		require.NoError(t, err)
		require.True(t, res.Claimed)
		rec := b.get(t, id("op", "failed"))
		require.Equal(t, inbox.StatusFailed, rec.Status)
		require.Equal(t, "card declined", rec.Error)
		require.True(t, rec.ExpiresAt.IsZero(), "no retention: kept forever")

		for _, st := range []inbox.Status{inbox.StatusProcessing, inbox.StatusPending, "bogus"} {
			_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id("op", string(st)), PayloadHash: hash("x"), Status: st})
			require.ErrorIs(t, err, inbox.ErrIllegalTransition, st)
			_, err = b.store.Get(b.ctx, b.db, id("op", string(st)))
			require.ErrorIs(t, err, inbox.ErrNotFound, "a refused claim inserts nothing")
		}
	})

	t.Run("KeysCompareByteForByte", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		// A case-insensitive or PAD SPACE collation would fold these together.
		for _, k := range []string{"Order-1", "order-1", "order-1 ", "ORDER-1", "órder-1"} {
			res, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id("op", k), PayloadHash: hash(k)})
			require.NoError(t, err, k)
			require.True(t, res.Claimed, k)
			require.Equal(t, k, b.get(t, id("op", k)).Key)
		}
		require.Equal(t, 5, b.records(t))
	})

	t.Run("ScopesAndOperationsAreSeparate", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		for _, k := range []inbox.ID{
			{Scope: "tenant-a", Operation: "op", Key: "k"},
			{Scope: "tenant-b", Operation: "op", Key: "k"},
			{Scope: "tenant-a", Operation: "other", Key: "k"},
			{Operation: "op", Key: "k"},
		} {
			res, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: k, PayloadHash: hash("x")})
			require.NoError(t, err)
			require.True(t, res.Claimed, "%+v", k)
		}
	})

	t.Run("InvalidInputIsRejected", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		for name, k := range map[string]inbox.ID{
			"empty key":       {Operation: "op", Key: ""},
			"empty operation": {Operation: "", Key: "k"},
			"long key":        {Operation: "op", Key: strings.Repeat("k", inbox.MaxKeyLen+1)},
			"long scope":      {Scope: strings.Repeat("s", inbox.MaxScopeLen+1), Operation: "op", Key: "k"},
			"long operation":  {Operation: strings.Repeat("o", inbox.MaxOperationLen+1), Key: "k"},
			"NUL in key":      {Operation: "op", Key: "a\x00b"},
			"bad UTF-8 key":   {Operation: "op", Key: "a\xffb"},
		} {
			require.ErrorIs(t, k.Validate(), inbox.ErrInvalidKey, name)
			_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: k, PayloadHash: hash("x")})
			require.ErrorIs(t, err, inbox.ErrInvalidKey, name)
		}
		for name, h := range map[string][]byte{"no hash": nil, "long hash": make([]byte, inbox.MaxPayloadHashLen+1)} {
			_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id("op", "k"), PayloadHash: h})
			require.Error(t, err, name)
		}
		require.Zero(t, b.records(t))

		// The longest valid identity fits every dialect's columns, and a
		// correlation ID that could not be stored is dropped rather than
		// failing the claim.
		longest := inbox.ID{Scope: strings.Repeat("s", inbox.MaxScopeLen), Operation: strings.Repeat("o", inbox.MaxOperationLen),
			Key: strings.Repeat("é", inbox.MaxKeyLen/2)}
		res, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: longest, PayloadHash: make([]byte, inbox.MaxPayloadHashLen),
			CorrelationID: strings.Repeat("c", inbox.MaxCorrelationIDLen+1)})
		require.NoError(t, err)
		require.True(t, res.Claimed)
		rec := b.get(t, longest)
		require.Equal(t, longest, rec.ID)
		require.Empty(t, rec.CorrelationID)
	})

	t.Run("SaveOutputStoresTheResult", func(t *testing.T) {
		t.Parallel()
		// On a clock that stands still, so that saving the same output
		// again changes no value at all (MySQL then counts no row).
		b := setupWith(t, h, onClock(newFixedClock()))
		tx, err := b.store.BeginTx(b.ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		res, err := b.store.Claim(b.ctx, tx, inbox.ClaimParams{ID: id("op", "k"), PayloadHash: hash("x")})
		require.NoError(t, err)
		require.True(t, res.Claimed)
		require.NoError(t, b.store.SaveOutput(b.ctx, tx, res.Record, []byte("output")))
		require.Equal(t, []byte("output"), res.Record.Result)
		// Saving it again (a retried statement) is no error.
		require.NoError(t, b.store.SaveOutput(b.ctx, tx, res.Record, []byte("output")))
		require.NoError(t, tx.Commit())
		rec := b.get(t, id("op", "k"))
		require.Equal(t, []byte("output"), rec.Result)
		require.Equal(t, inbox.StatusCompleted, rec.Status)

		res, err = b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id("op", "f"), PayloadHash: hash("x"), Status: inbox.StatusFailed})
		require.NoError(t, err)
		require.ErrorIs(t, b.store.SaveOutput(b.ctx, b.db, res.Record, []byte("x")), inbox.ErrIllegalTransition)
		require.Nil(t, b.get(t, id("op", "f")).Result)

		gone := *res.Record
		gone.ID = id("op", "missing")
		gone.Status = inbox.StatusCompleted
		require.ErrorIs(t, b.store.SaveOutput(b.ctx, b.db, &gone, []byte("x")), inbox.ErrNotFound)
	})

	t.Run("GetAndDelete", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		_, err := b.store.Get(b.ctx, b.db, id("op", "k"))
		require.ErrorIs(t, err, inbox.ErrNotFound)
		_, err = b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id("op", "k"), PayloadHash: hash("x")})
		require.NoError(t, err)
		require.NoError(t, b.store.Delete(b.ctx, b.db, id("op", "k")))
		require.ErrorIs(t, b.store.Delete(b.ctx, b.db, id("op", "k")), inbox.ErrNotFound)
		res, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id("op", "k"), PayloadHash: hash("y")})
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
		for i := range h.Concurrency {
			wg.Go(func() {
				for {
					claimed, err := b.claimInTx(fmt.Sprintf("delivery-%d", i))
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
		var effects int
		require.NoError(t, b.db.QueryRowContext(b.ctx, "SELECT COUNT(*) FROM "+b.effects).Scan(&effects))
		require.Equal(t, 1, effects, "only the winner's work committed")
	})

	t.Run("ClaimThatWaitedForAHolderThatCommittedIsADuplicate", func(t *testing.T) {
		// The holder commits while the second claim waits for it: the
		// second claim's statement began before the commit, so a dialect
		// that claims and reads in one statement does not see the record
		// and must read it again.
		t.Parallel()
		b := setup(t, h)
		for _, tc := range []struct {
			key, payload string
			conflict     bool
		}{{"same", "x", false}, {"other", "y", true}} {
			holder, err := b.db.BeginTx(b.ctx, nil)
			require.NoError(t, err)
			res, err := b.store.Claim(b.ctx, holder, inbox.ClaimParams{ID: id("op", tc.key), PayloadHash: hash("x")})
			require.NoError(t, err)
			require.True(t, res.Claimed)
			type answer struct {
				res inbox.ClaimResult
				err error
			}
			second := make(chan answer, 1)
			go func() {
				tx, err := b.db.BeginTx(b.ctx, nil)
				if err != nil {
					second <- answer{err: err}
					return
				}
				defer func() { _ = tx.Rollback() }()
				res, err := b.store.Claim(b.ctx, tx, inbox.ClaimParams{ID: id("op", tc.key), PayloadHash: hash(tc.payload)})
				second <- answer{res, err}
			}()
			select {
			case a := <-second:
				t.Fatalf("%s: the second claim did not wait for the holder: %+v %v", tc.key, a.res, a.err)
			case <-time.After(200 * time.Millisecond):
			}
			require.NoError(t, holder.Commit())
			a := <-second
			require.False(t, a.res.Claimed, tc.key)
			if tc.conflict {
				require.ErrorIs(t, a.err, inbox.ErrPayloadConflict, tc.key)
				continue
			}
			require.NoError(t, a.err, tc.key)
			require.NotNil(t, a.res.Record, tc.key)
			require.Equal(t, inbox.StatusCompleted, a.res.Record.Status)
			require.EqualValues(t, 1, a.res.Record.Attempt)
		}
	})

	t.Run("RolledBackClaimFreesTheKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		tx, err := b.db.BeginTx(b.ctx, nil)
		require.NoError(t, err)
		res, err := b.store.Claim(b.ctx, tx, inbox.ClaimParams{ID: id("op", "k"), PayloadHash: hash("x")})
		require.NoError(t, err)
		require.True(t, res.Claimed)
		require.NoError(t, tx.Rollback())
		res, err = b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id("op", "k"), PayloadHash: hash("y")})
		require.NoError(t, err)
		require.True(t, res.Claimed)
	})

	t.Run("RecordsReadBackAsReturned", func(t *testing.T) {
		// The record a write returns is the one a later read finds: times
		// at the databases' microsecond precision, however finely the
		// clock (or a duration) runs, and whatever the driver does with
		// the nanoseconds (pq and MySQL round them, pgx drops them).
		t.Parallel()
		clk := newFixedClock()
		clk.Advance(700 * time.Nanosecond) // past half a microsecond: rounding would go up
		b := setupWith(t, h, onClock(clk))
		same := func(t *testing.T, want, got *inbox.Record) {
			t.Helper()
			require.WithinDuration(t, want.CreatedAt, got.CreatedAt, 0, "created_at")
			require.WithinDuration(t, want.UpdatedAt, got.UpdatedAt, 0, "updated_at")
			require.WithinDuration(t, want.LeaseUntil, got.LeaseUntil, 0, "lease_until")
			require.WithinDuration(t, want.ExpiresAt, got.ExpiresAt, 0, "expires_at")
			require.Equal(t, want.Retention(), got.Retention())
		}
		res, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id("op", "claimed"), PayloadHash: hash("x"),
			Retention: time.Hour + 999*time.Nanosecond})
		require.NoError(t, err)
		same(t, res.Record, b.get(t, id("op", "claimed")))

		rr, err := b.store.Reserve(b.ctx, inbox.ReserveParams{ID: id("op", "reserved"), PayloadHash: hash("x"), Owner: "w1",
			Lease: time.Minute + 999*time.Nanosecond, Retention: time.Hour})
		require.NoError(t, err)
		require.NotNil(t, rr.Lease)
		stored := b.get(t, id("op", "reserved"))
		same(t, rr.Record, stored)
		require.WithinDuration(t, stored.LeaseUntil, rr.Lease.Until(), 0)

		clk.Advance(time.Second + 300*time.Nanosecond)
		require.NoError(t, rr.Lease.Extend(b.ctx, time.Minute+555*time.Nanosecond))
		require.WithinDuration(t, b.get(t, id("op", "reserved")).LeaseUntil, rr.Lease.Until(), 0)
	})

	t.Run("WithSavepoint", func(t *testing.T) {
		t.Parallel()
		for _, own := range []bool{true, false} {
			name := "sql.Tx"
			if own {
				name = "Store.BeginTx"
			}
			t.Run(name, func(t *testing.T) { b := setup(t, h); b.savepoints(t, own) })
		}
	})

	// A savepoint inside another (a caller's own WithSavepoint around
	// work that takes one too) is a level of its own: rolling the inner
	// one back keeps the outer one's work and leaves the outer one to be
	// released or rolled back, and rolling the outer one back undoes the
	// inner one's released work. MySQL replaces a savepoint by a new one
	// of the same name, so each level must be named apart.
	t.Run("WithSavepointNested", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		b.nestedSavepoints(t)
	})
}

// nestedSavepoints checks Store.WithSavepoint nested three deep in one
// transaction, in every combination of the levels failing or not.
func (b *bundle) nestedSavepoints(t *testing.T) {
	tx, err := b.store.BeginTx(b.ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	work := func(key string) error {
		if _, err := b.store.Claim(b.ctx, tx, inbox.ClaimParams{ID: id("op", key), PayloadHash: hash(key)}); err != nil {
			return err
		}
		return b.effect(b.ctx, tx, key, "")
	}
	boom := errors.New("boom")
	want := map[string]int{}
	// level runs work at depth d of 3 under a savepoint, failing where fail
	// says, and records what must survive the commit.
	var level func(prefix string, d int, fail []bool, kept bool) error
	level = func(prefix string, d int, fail []bool, kept bool) error {
		return b.store.WithSavepoint(b.ctx, tx, func() error {
			key := fmt.Sprintf("%s-%d-before", prefix, d)
			require.NoError(t, work(key))
			keptHere := kept && !fail[d]
			want[key] = boolInt(keptHere)
			if d+1 < len(fail) {
				err := level(prefix, d+1, fail, keptHere)
				if fail[d+1] {
					require.ErrorIs(t, err, boom, "level %d of %s", d+1, prefix)
					require.NotErrorIs(t, err, inbox.ErrTxAborted, "level %d of %s", d+1, prefix)
				} else {
					require.NoError(t, err, "level %d of %s", d+1, prefix)
				}
			}
			key = fmt.Sprintf("%s-%d-after", prefix, d)
			require.NoError(t, work(key), "level %d of %s is usable after the level inside it ended", d, prefix)
			want[key] = boolInt(keptHere)
			if fail[d] {
				return boom
			}
			return nil
		})
	}
	for _, fail := range [][]bool{
		{false, false, false}, {false, false, true}, {false, true, false}, {true, false, false},
		{false, true, true}, {true, false, true}, {true, true, false}, {true, true, true},
	} {
		prefix := fmt.Sprintf("%v", fail)
		prefix = strings.NewReplacer("[", "", "]", "", " ", "", "true", "f", "false", "k").Replace(prefix)
		err := level(prefix, 0, fail, true)
		if fail[0] {
			require.ErrorIs(t, err, boom, prefix)
			require.NotErrorIs(t, err, inbox.ErrTxAborted, prefix)
		} else {
			require.NoError(t, err, prefix)
		}
	}
	require.NoError(t, work("after"), "the transaction is still usable")
	want["after"] = 1
	require.NoError(t, tx.Commit())

	for key, n := range want {
		require.Equal(t, n, b.countEffects(t, key), key)
		_, err := b.store.Get(b.ctx, b.db, id("op", key))
		if n == 1 {
			require.NoError(t, err, key)
		} else {
			require.ErrorIs(t, err, inbox.ErrNotFound, key)
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// savepoints checks Store.WithSavepoint in one transaction: a store's own
// (own) or a plain *sql.Tx.
func (b *bundle) savepoints(t *testing.T, own bool) {
	var tx interface {
		inbox.DBTX
		Commit() error
		Rollback() error
	}
	if own {
		stx, err := b.store.BeginTx(b.ctx, nil)
		require.NoError(t, err)
		tx = stx
	} else {
		stx, err := b.db.BeginTx(b.ctx, nil)
		require.NoError(t, err)
		tx = stx
	}
	defer func() { _ = tx.Rollback() }()
	work := func(key string) error {
		if _, err := b.store.Claim(b.ctx, tx, inbox.ClaimParams{ID: id("op", key), PayloadHash: hash(key)}); err != nil {
			return err
		}
		return b.effect(b.ctx, tx, key, "")
	}
	require.NoError(t, work("before"))

	require.NoError(t, b.store.WithSavepoint(b.ctx, tx, func() error { return work("kept") }))

	boom := errors.New("boom")
	err := b.store.WithSavepoint(b.ctx, tx, func() error {
		require.NoError(t, work("failed"))
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.NotErrorIs(t, err, inbox.ErrTxAborted)

	require.PanicsWithValue(t, "handler panic", func() {
		_ = b.store.WithSavepoint(b.ctx, tx, func() error {
			require.NoError(t, work("panicked"))
			panic("handler panic")
		})
	}, "the panic goes on")

	// A statement that fails inside the savepoint (PostgreSQL then refuses
	// every statement until the rollback to the savepoint).
	err = b.store.WithSavepoint(b.ctx, tx, func() error {
		require.NoError(t, work("statement-failed"))
		_, err := tx.ExecContext(b.ctx, "INSERT INTO "+b.table+"_no_such_table (x) VALUES (1)")
		return err
	})
	require.Error(t, err)
	require.NotErrorIs(t, err, inbox.ErrTxAborted)

	require.NoError(t, work("after"), "the outer transaction is still usable")
	require.NoError(t, tx.Commit())

	for key, want := range map[string]int{"before": 1, "kept": 1, "after": 1, "failed": 0, "panicked": 0, "statement-failed": 0} {
		require.Equal(t, want, b.countEffects(t, key), key)
		_, err := b.store.Get(b.ctx, b.db, id("op", key))
		if want == 1 {
			require.NoError(t, err, key)
		} else {
			require.ErrorIs(t, err, inbox.ErrNotFound, key)
		}
	}
}

// claimInTx claims one fixed key in a transaction that records an effect
// and holds the row for a moment before committing, so that the other
// claimers queue behind it.
func (b *bundle) claimInTx(delivery string) (bool, error) {
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		return false, b.store.Classify(err)
	}
	defer func() { _ = tx.Rollback() }()
	res, err := b.store.Claim(b.ctx, tx, inbox.ClaimParams{ID: id("op", "hot"), PayloadHash: hash("x")})
	if err != nil {
		return false, err
	}
	if res.Claimed {
		if err := b.effect(b.ctx, tx, delivery, ""); err != nil {
			return false, b.store.Classify(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return res.Claimed, b.store.Classify(tx.Commit())
}
