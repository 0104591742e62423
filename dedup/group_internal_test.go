package dedup

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// groupEnv is a migrated store and a business table for the group
// commit tests and benchmarks of this file.
type groupEnv struct {
	store  *inbox.Store
	insert string
	count  string
}

func newGroupEnv(tb testing.TB, kind testdb.Kind) *groupEnv {
	tb.Helper()
	db := testdb.Open(tb, kind)
	d := testdb.Dialect(kind)
	table, effects := testdb.UniqueName("group_inbox"), testdb.UniqueName("group_effects")
	_, err := db.Exec("CREATE TABLE " + effects + " (event_id VARCHAR(255) NOT NULL)")
	require.NoError(tb, err)
	store, err := inbox.NewStore(db, d, inbox.Config{Table: table})
	require.NoError(tb, err)
	require.NoError(tb, store.Migrate(context.Background()))
	tb.Cleanup(func() {
		_ = store.Close()
		for _, t := range append(inbox.TableNames(table), effects) {
			_, _ = db.Exec("DROP TABLE IF EXISTS " + t)
		}
	})
	return &groupEnv{store: store, insert: fmt.Sprintf("INSERT INTO %s (event_id) VALUES (%s)", effects, d.Placeholder(1)),
		count: "SELECT COUNT(*) FROM " + effects}
}

// deliverFailing delivers n fresh events from workers goroutines through
// d, their IDs prefix and a number from 1; every failEvery-th event's
// handler fails after its write (0: none).
// It returns how many deliveries were nacked.
func (e *groupEnv) deliverFailing(tb testing.TB, d *Deduplicator, prefix string, n, workers, failEvery int) int64 {
	tb.Helper()
	boom := errors.New("handler failed")
	h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := TxFromContext(msg.Context())
		if _, err := tx.ExecContext(msg.Context(), e.insert, msg.Metadata.Get("event_id")); err != nil {
			return nil, err
		}
		if msg.Metadata.Get("fail") != "" {
			return nil, boom
		}
		return nil, nil
	})
	var next, nacked atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				msg := message.NewMessage(watermill.NewUUID(), []byte(`{"n":1}`))
				msg.Metadata.Set("event_id", prefix+strconv.FormatInt(i, 10))
				if failEvery > 0 && i%int64(failEvery) == 0 {
					msg.Metadata.Set("fail", "1")
				}
				if _, err := h(msg); err != nil {
					if !errors.Is(err, boom) {
						tb.Errorf("delivery %d: %v", i, err)
					}
					nacked.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return nacked.Load()
}

// TestGroupSavepointsNackOnlyTheFailedMember checks the savepoint way of
// isolating a failed member, which BenchmarkGroupFailures measures
// against rolling the group back: the same outcome either way.
func TestGroupSavepointsNackOnlyTheFailedMember(t *testing.T) {
	t.Parallel()
	for _, kind := range testdb.All {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			for _, savepoints := range []bool{false, true} {
				e := newGroupEnv(t, kind)
				d, err := New(e.store, Config{Key: KeyFromMetadata("event_id"), Operation: "op", Logger: watermill.NopLogger{},
					Mode: Transactional{Group: &Group{Coordinators: 2}}})
				require.NoError(t, err)
				d.grp.savepoints = savepoints
				const n, every = 200, 7
				nacked := e.deliverFailing(t, d, "evt-", n, 16, every)
				require.EqualValues(t, n/every, nacked)
				var rows int
				require.NoError(t, e.store.DB().QueryRow(e.count).Scan(&rows))
				require.Equal(t, n-n/every, rows, "savepoints=%v: the failed members' writes are undone, no other", savepoints)
				require.EqualValues(t, n-n/every, d.Stats().Executed)
			}
		})
	}
}

// BenchmarkGroupFailures compares the two ways of nacking only a failed
// member — rolling the group back and running it again without it, or a
// savepoint around every member — with no failures, one in 100 and one in
// 10, at 32 workers. It reports msgs/s.
func BenchmarkGroupFailures(b *testing.B) {
	for _, kind := range testdb.All {
		for _, savepoints := range []bool{false, true} {
			for _, every := range []int{0, 100, 10} {
				name := fmt.Sprintf("%s/savepoints=%v/fail_every=%d", kind, savepoints, every)
				b.Run(name, func(b *testing.B) {
					e := newGroupEnv(b, kind)
					d, err := New(e.store, Config{Key: KeyFromMetadata("event_id"), Operation: "op", Logger: watermill.NopLogger{},
						Mode: Transactional{Group: &Group{Coordinators: 4}}})
					require.NoError(b, err)
					d.grp.savepoints = savepoints
					e.deliverFailing(b, d, "warm-", 64, 32, every)
					start := time.Now()
					b.ResetTimer()
					e.deliverFailing(b, d, "evt-", b.N, 32, every)
					b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
				})
			}
		}
	}
}
