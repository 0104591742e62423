package inbox_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// partitionedStore is a migrated partitioned store on its own table, on a
// clock the test moves. Day-wide buckets kept 3 days.
func partitionedStore(t *testing.T, kind testdb.Kind, clock *inboxtest.Clock) (*inbox.Store, *sql.DB) {
	t.Helper()
	db := testdb.Open(t, kind)
	cfg := inbox.Config{}
	if clock != nil {
		cfg.Now = clock.Now
	}
	d := postgres.Partitioned(postgres.Partitions{Width: 24 * time.Hour, Ahead: 2, Retention: 3 * 24 * time.Hour})
	return inboxtest.NewStore(t, db, d, cfg), db
}

func rows(t *testing.T, db *sql.DB, table, where string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM "`+table+`" WHERE `+where, args...).Scan(&n))
	return n
}

func hash(s string) []byte { h := sha256.Sum256([]byte(s)); return h[:] }

// TestPartitionedOneRecordPerKeyAcrossBuckets is the guarantee a unique key
// alone cannot give a partitioned table: two claims of one key whose event
// times fall in different buckets, racing, never both commit. The control
// shows the race is real: the same table claimed by a plain INSERT ... ON
// CONFLICT inserts the key twice.
func TestPartitionedOneRecordPerKeyAcrossBuckets(t *testing.T) {
	for _, kind := range []testdb.Kind{testdb.PostgresPQ, testdb.PostgresPGX} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			store, db := partitionedStore(t, kind, nil)
			ctx := context.Background()
			now := store.Now()
			rounds := 60
			if testing.Short() {
				rounds = 20
			}
			for round := range rounds {
				key := inbox.ID{Operation: "charge", Key: fmt.Sprintf("evt-%d", round)}
				var (
					wg      sync.WaitGroup
					claimed [2]bool
					errs    [2]error
				)
				start := make(chan struct{})
				for i := range 2 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						tx, err := db.BeginTx(ctx, nil)
						if err != nil {
							errs[i] = err
							return
						}
						defer func() { _ = tx.Rollback() }()
						// Today's bucket and yesterday's.
						res, err := store.Claim(ctx, tx, inbox.ClaimParams{ID: key, PayloadHash: hash("p"),
							EventTime: now.Add(-time.Duration(i) * 24 * time.Hour)})
						if err != nil {
							errs[i] = err
							return
						}
						claimed[i] = res.Claimed
						errs[i] = tx.Commit()
					}()
				}
				close(start)
				wg.Wait()
				require.NoError(t, errors.Join(errs[:]...))
				assert.True(t, claimed[0] != claimed[1], "round %d: exactly one claim wins, got %v", round, claimed)
				assert.Equal(t, 1, rows(t, db, store.Table(), "key = $1", key.Key), "round %d: one record", round)
			}

			// The control: the same race without the claimable check.
			plain := func(key string, bucket time.Time) (int64, error) {
				res, err := db.ExecContext(ctx, `INSERT INTO "`+store.Table()+`" (operation, key, bucket, payload_hash,
	status, created_at, updated_at) VALUES ('charge', $1, $2, '\x01', 'completed', now(), now())
	ON CONFLICT DO NOTHING`, key, bucket)
				if err != nil {
					return 0, err
				}
				return res.RowsAffected()
			}
			n1, err := plain("control", now)
			require.NoError(t, err)
			n2, err := plain("control", now.Add(-24*time.Hour))
			require.NoError(t, err)
			assert.Equal(t, int64(2), n1+n2, "without the check, the unique key lets one key into two buckets")
		})
	}
}

// TestPartitionedClaimWaitsForTheHolder: a claim of a key held by an open
// transaction in another bucket waits for it, then sees its outcome: the
// committed record as a duplicate, or after a rollback the key free.
func TestPartitionedClaimWaitsForTheHolder(t *testing.T) {
	store, db := partitionedStore(t, testdb.PostgresPGX, nil)
	ctx := context.Background()
	now := store.Now()
	for _, commit := range []bool{true, false} {
		key := inbox.ID{Operation: "charge", Key: fmt.Sprintf("held-%v", commit)}
		holder, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = holder.Rollback() })
		res, err := store.Claim(ctx, holder, inbox.ClaimParams{ID: key, PayloadHash: hash("p"), EventTime: now})
		require.NoError(t, err)
		require.True(t, res.Claimed)

		done := make(chan inbox.ClaimResult, 1)
		go func() {
			tx, err := db.BeginTx(ctx, nil)
			if !assert.NoError(t, err) {
				done <- inbox.ClaimResult{}
				return
			}
			defer func() { _ = tx.Rollback() }()
			r, err := store.Claim(ctx, tx, inbox.ClaimParams{ID: key, PayloadHash: hash("p"),
				EventTime: now.Add(-48 * time.Hour)})
			assert.NoError(t, err)
			assert.NoError(t, tx.Commit())
			done <- r
		}()
		select {
		case <-done:
			t.Fatal("the second claim did not wait for the holder's transaction")
		case <-time.After(300 * time.Millisecond):
		}
		if commit {
			require.NoError(t, holder.Commit())
		} else {
			require.NoError(t, holder.Rollback())
		}
		r := <-done
		require.NotNil(t, r.Record)
		assert.Equal(t, !commit, r.Claimed, "commit=%v", commit)
		assert.Equal(t, 1, rows(t, db, store.Table(), "key = $1", key.Key))
	}
}

// TestPartitionedRefusesClosedBuckets: an event whose bucket has closed is
// refused by every kind of claim, and nothing is written; an event from
// the future goes into the newest partition.
func TestPartitionedRefusesClosedBuckets(t *testing.T) {
	store, db := partitionedStore(t, testdb.PostgresPGX, nil)
	ctx := context.Background()
	cfg, ok := store.Partitioning()
	require.True(t, ok)
	now := store.Now()
	old := now.Add(-cfg.Retention - 2*cfg.Width) // its bucket closed a day ago
	key := inbox.ID{Operation: "charge", Key: "old"}

	_, err := store.Claim(ctx, db, inbox.ClaimParams{ID: key, PayloadHash: hash("p"), EventTime: old})
	require.ErrorIs(t, err, inbox.ErrBeyondRetention)
	_, err = store.Reserve(ctx, inbox.ReserveParams{ID: key, PayloadHash: hash("p"), Owner: "w", Lease: time.Minute, EventTime: old})
	require.ErrorIs(t, err, inbox.ErrBeyondRetention)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	res, err := store.ClaimMany(ctx, tx, []inbox.ClaimParams{
		{ID: key, PayloadHash: hash("p"), EventTime: old},
		{ID: inbox.ID{Operation: "charge", Key: "fresh"}, PayloadHash: hash("p")},
	})
	require.NoError(t, err)
	require.ErrorIs(t, res[0].Err, inbox.ErrBeyondRetention)
	assert.True(t, res[1].Claimed)
	require.NoError(t, tx.Commit())
	assert.Equal(t, 0, rows(t, db, store.Table(), "key = 'old'"))

	// The newest partition is Ahead buckets after today's.
	newest := cfg.Bucket(now).Add(time.Duration(cfg.Ahead) * cfg.Width)
	_, err = store.Claim(ctx, db, inbox.ClaimParams{ID: inbox.ID{Operation: "charge", Key: "future"},
		PayloadHash: hash("p"), EventTime: now.Add(400 * 24 * time.Hour)})
	require.NoError(t, err)
	assert.Equal(t, 1, rows(t, db, store.Table(), "key = 'future' AND bucket = $1", newest))
}

// TestPartitionedPurgeDropsClosedPartitions: a purge drops the partitions
// whose buckets closed and whose records all expired, counts their
// records, and leaves a partition that holds a pending record (or one not
// expired yet) to the batched delete; a table detached for dropping is
// dropped on the next run, and one an operator detached is left alone.
func TestPartitionedPurgeDropsClosedPartitions(t *testing.T) {
	clock := &inboxtest.Clock{}
	store, db := partitionedStore(t, testdb.PostgresPGX, clock)
	ctx := context.Background()
	cfg, _ := store.Partitioning()
	start := store.Now()
	day0 := cfg.Bucket(start)

	claim := func(key string, eventTime time.Time, retention time.Duration) {
		t.Helper()
		_, err := store.Claim(ctx, db, inbox.ClaimParams{ID: inbox.ID{Operation: "op", Key: key}, PayloadHash: hash(key),
			EventTime: eventTime, Retention: retention})
		require.NoError(t, err)
	}
	// Day 0: ten records kept a day. Day 1: five, and one pending record.
	for i := range 10 {
		claim(fmt.Sprintf("d0-%d", i), day0.Add(time.Hour), 24*time.Hour)
	}
	for i := range 5 {
		claim(fmt.Sprintf("d1-%d", i), day0.Add(25*time.Hour), 24*time.Hour)
	}
	rr, err := store.Reserve(ctx, inbox.ReserveParams{ID: inbox.ID{Operation: "op", Key: "d1-pending"},
		PayloadHash: hash("x"), Owner: "w", Lease: time.Minute, Retention: 24 * time.Hour, EventTime: day0.Add(26 * time.Hour)})
	require.NoError(t, err)
	require.NoError(t, rr.Lease.Pend(ctx, "ref-1", "provider timed out"))

	// An operator's own detached copy of an old partition, named like one.
	keep := inbox.PartitionName(store.Table(), day0.Add(-30*24*time.Hour))
	_, err = db.Exec(`CREATE TABLE "` + keep + `" (x int)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS "` + keep + `"`) })

	// Nothing has closed yet.
	r, err := store.Purge(ctx, inbox.PurgeParams{})
	require.NoError(t, err)
	assert.Equal(t, 0, r.Partitions)

	// Five days on, the buckets of day 0 and day 1 have closed.
	clock.Advance(day0.Add(5*24*time.Hour + 2*time.Hour).Sub(start))
	actor := &inbox.Actor{Name: "ops", Reason: "retention"}
	r, err = store.Purge(ctx, inbox.PurgeParams{Audit: actor})
	require.NoError(t, err)
	assert.GreaterOrEqual(t, r.Partitions, 1)
	assert.Equal(t, int64(15), r.Deleted, "day 0's ten by the drop, day 1's five by the batches")
	assert.Equal(t, 0, rows(t, db, store.Table(), "key LIKE 'd0-%' OR key LIKE 'd1-%' AND key <> 'd1-pending'"))
	assert.Equal(t, 1, rows(t, db, store.Table(), "key = 'd1-pending'"), "the pending record stays")
	entries, _, err := store.ListAudit(ctx, inbox.AuditFilter{Action: inbox.ActionPurge})
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.Equal(t, int64(15), entries[0].Count)

	parts, err := store.Partitions(ctx)
	require.NoError(t, err)
	names := map[string]bool{}
	for _, p := range parts {
		names[p.Name] = true
		assert.False(t, p.Detached, p.Name)
	}
	assert.False(t, names[inbox.PartitionName(store.Table(), day0)], "day 0's partition is gone")
	assert.True(t, names[inbox.PartitionName(store.Table(), day0.Add(24*time.Hour))], "day 1's is kept for its pending record")
	var exists bool
	require.NoError(t, db.QueryRow(`SELECT to_regclass($1) IS NOT NULL`, `"`+keep+`"`).Scan(&exists))
	assert.True(t, exists, "a table the store did not detach is not dropped")

	// An interrupted drop: a partition marked and detached, not dropped.
	day1 := inbox.PartitionName(store.Table(), day0.Add(24*time.Hour))
	err = store.Delete(ctx, db, inbox.ID{Operation: "op", Key: "d1-pending"})
	require.NoError(t, err)
	_, err = db.Exec(`COMMENT ON TABLE "` + day1 + `" IS 'inboxmill: detached for dropping'`)
	require.NoError(t, err)
	_, err = db.Exec(`ALTER TABLE "` + store.Table() + `" DETACH PARTITION "` + day1 + `"`)
	require.NoError(t, err)
	parts, err = store.Partitions(ctx)
	require.NoError(t, err)
	require.True(t, parts[len(parts)-1].Detached && parts[len(parts)-1].Name == day1, "%+v", parts)
	r, err = store.Purge(ctx, inbox.PurgeParams{})
	require.NoError(t, err)
	assert.Equal(t, 1, r.Partitions)
	require.NoError(t, db.QueryRow(`SELECT to_regclass($1) IS NOT NULL`, `"`+day1+`"`).Scan(&exists))
	assert.False(t, exists)

	// The partitions a claim needs are there again, ahead included.
	parts, err = store.Partitions(ctx)
	require.NoError(t, err)
	now := store.Now()
	assert.Equal(t, cfg.Bucket(now).Add(time.Duration(cfg.Ahead)*cfg.Width), parts[len(parts)-1].From)
	claim("after", time.Time{}, time.Hour)
}

// TestPartitionedEnsureIsIdempotentAndConcurrent: stores racing to create
// the same partitions create each once and none fails.
func TestPartitionedEnsureIsIdempotentAndConcurrent(t *testing.T) {
	clock := &inboxtest.Clock{}
	store, db := partitionedStore(t, testdb.PostgresPQ, clock)
	ctx := context.Background()
	before, err := store.Partitions(ctx)
	require.NoError(t, err)
	n, err := store.EnsurePartitions(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "Migrate created them")
	cfg, _ := store.Partitioning()
	assert.Len(t, before, int(cfg.Retention/cfg.Width)+1+cfg.Ahead, "%+v", before)

	clock.Advance(10 * 24 * time.Hour)
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := inbox.NewStore(db, store.Dialect(), inbox.Config{Table: store.Table(), Now: clock.Now})
			if !assert.NoError(t, err) {
				return
			}
			defer s.Close()
			n, err := s.EnsurePartitions(ctx)
			assert.NoError(t, err)
			mu.Lock()
			total += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	assert.Equal(t, 1+cfg.Ahead+int(cfg.Retention/cfg.Width), total, "each missing bucket created once")
}

// TestPartitionedUnderRepeatableRead: in a transaction whose snapshot is
// older than another's commit of the same key (watermill-sql consumes
// under REPEATABLE READ), the claim fails with a transient serialization
// error rather than miss the record; its retry sees it.
func TestPartitionedUnderRepeatableRead(t *testing.T) {
	store, db := partitionedStore(t, testdb.PostgresPGX, nil)
	ctx := context.Background()
	now := store.Now()
	for _, level := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable} {
		key := inbox.ID{Operation: "op", Key: level.String()}
		late, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
		require.NoError(t, err)
		t.Cleanup(func() { _ = late.Rollback() })
		var one int
		require.NoError(t, late.QueryRow(`SELECT 1`).Scan(&one), "the snapshot is taken")

		first, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
		require.NoError(t, err)
		t.Cleanup(func() { _ = first.Rollback() })
		res, err := store.Claim(ctx, first, inbox.ClaimParams{ID: key, PayloadHash: hash("p"), EventTime: now})
		require.NoError(t, err)
		require.True(t, res.Claimed)
		require.NoError(t, first.Commit())

		_, err = store.Claim(ctx, late, inbox.ClaimParams{ID: key, PayloadHash: hash("p"), EventTime: now.Add(-24 * time.Hour)})
		require.Error(t, err, "%v: the old snapshot cannot see the record", level)
		assert.True(t, inbox.IsRetryable(err), "%v: %v", level, err)
		_ = late.Rollback()

		retry, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
		require.NoError(t, err)
		res, err = store.Claim(ctx, retry, inbox.ClaimParams{ID: key, PayloadHash: hash("p"), EventTime: now.Add(-24 * time.Hour)})
		require.NoError(t, err)
		assert.False(t, res.Claimed, "%v: the retry is a duplicate", level)
		require.NoError(t, retry.Commit())
		assert.Equal(t, 1, rows(t, db, store.Table(), "key = $1", key.Key))
	}
}

// TestPartitioningValidation: configurations that cannot work are refused
// by NewStore.
func TestPartitioningValidation(t *testing.T) {
	db := testdb.Open(t, testdb.PostgresPQ)
	for _, p := range []postgres.Partitions{
		{Width: 30 * time.Second},
		{Width: time.Hour, Retention: 30 * 24 * time.Hour},
		{Ahead: -1},
	} {
		_, err := inbox.NewStore(db, postgres.Partitioned(p), inbox.Config{})
		assert.ErrorIs(t, err, inbox.ErrInvalidConfig, "%+v", p)
	}
}

// TestPartitionedClosedBucketAnswersFromItsRecord: a delivery of an event
// whose bucket closed is answered by its record while the record is still
// there (not yet purged): refusing is only for when the store cannot tell.
func TestPartitionedClosedBucketAnswersFromItsRecord(t *testing.T) {
	clock := &inboxtest.Clock{}
	store, db := partitionedStore(t, testdb.PostgresPGX, clock)
	ctx := context.Background()
	cfg, _ := store.Partitioning()
	eventTime := store.Now().Add(-cfg.Retention) // the oldest open bucket
	key := inbox.ID{Operation: "op", Key: "late"}
	res, err := store.Claim(ctx, db, inbox.ClaimParams{ID: key, PayloadHash: hash("p"), EventTime: eventTime, Retention: 30 * 24 * time.Hour})
	require.NoError(t, err)
	require.True(t, res.Claimed)

	clock.Advance(2 * cfg.Width) // the bucket has closed; the record is kept 30 days
	res, err = store.Claim(ctx, db, inbox.ClaimParams{ID: key, PayloadHash: hash("p"), EventTime: eventTime})
	require.NoError(t, err)
	assert.False(t, res.Claimed)
	require.NotNil(t, res.Record)
	_, err = store.Claim(ctx, db, inbox.ClaimParams{ID: key, PayloadHash: hash("other"), EventTime: eventTime})
	require.ErrorIs(t, err, inbox.ErrPayloadConflict)
	_, err = store.Claim(ctx, db, inbox.ClaimParams{ID: inbox.ID{Operation: "op", Key: "never-seen"}, PayloadHash: hash("p"), EventTime: eventTime})
	require.ErrorIs(t, err, inbox.ErrBeyondRetention)
}
