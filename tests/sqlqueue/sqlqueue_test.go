// Package sqlqueue_test runs the dedup middleware behind watermill-sql's
// queue subscriber on real PostgreSQL and MariaDB, joined to the consuming
// transaction with a savepoint per attempt.
package sqlqueue_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/watermillsql"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

var kinds = []testdb.Kind{testdb.PostgresPGX, testdb.MySQL}

// env is one test's queue topic, inbox and business table on one database.
type env struct {
	kind    testdb.Kind
	db      *sql.DB
	store   *inbox.Store
	topic   string
	effects string
}

func setup(t *testing.T, kind testdb.Kind) *env {
	t.Helper()
	db := testdb.Open(t, kind)
	e := &env{kind: kind, db: db, topic: testdb.UniqueName("orders"), effects: testdb.UniqueName("effects")}
	store, err := inbox.NewStore(db, testdb.Dialect(kind), inbox.Config{Table: testdb.UniqueName("inbox")})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(context.Background()))
	e.store = store
	_, err = db.Exec("CREATE TABLE " + e.effects + " (event_id VARCHAR(255) NOT NULL, step INTEGER NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, tbl := range append([]string{e.effects, "watermill_" + e.topic}, inbox.TableNames(store.Table())...) {
			_, _ = db.Exec("DROP TABLE IF EXISTS " + tbl)
		}
	})
	return e
}

func (e *env) ph(n int) string { return testdb.Dialect(e.kind).Placeholder(n) }

func (e *env) schema(batch int) (wsql.SchemaAdapter, wsql.OffsetsAdapter) {
	if e.kind == testdb.MySQL {
		return wsql.MySQLQueueSchema{SubscribeBatchSize: batch}, wsql.MySQLQueueOffsetsAdapter{}
	}
	return wsql.PostgreSQLQueueSchema{SubscribeBatchSize: batch}, wsql.PostgreSQLQueueOffsetsAdapter{}
}

func (e *env) publisher(t *testing.T) message.Publisher {
	t.Helper()
	schema, _ := e.schema(1)
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(e.db), wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true},
		watermill.NopLogger{})
	require.NoError(t, err)
	return pub
}

func (e *env) subscriber(t *testing.T, batch int) message.Subscriber {
	t.Helper()
	schema, offsets := e.schema(batch)
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(e.db), wsql.SubscriberConfig{
		SchemaAdapter:    schema,
		OffsetsAdapter:   offsets,
		InitializeSchema: true,
		PollInterval:     10 * time.Millisecond,
		ResendInterval:   time.Millisecond,
	}, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// requireOnce checks that every one of events events has writes effect
// rows, those of one successful attempt and nothing of the failed ones,
// and that the deduplicators ds executed each once.
func (e *env) requireOnce(t *testing.T, ds []*dedup.Deduplicator, events, writes int) {
	t.Helper()
	per := e.effectsPerEvent(t)
	require.Len(t, per, events, "no event lost")
	for id, n := range per {
		require.Equal(t, writes, n, "event %s: the writes of one successful attempt, nothing of the failed ones", id)
	}
	var executed uint64
	for _, d := range ds {
		executed += d.Stats().Executed
	}
	require.EqualValues(t, events, executed)
}

func event(id, payload string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
	msg.Metadata.Set("event_id", id)
	return msg
}

// effectsPerEvent counts business rows per event ID.
func (e *env) effectsPerEvent(t *testing.T) map[string]int {
	t.Helper()
	rows, err := e.db.Query("SELECT event_id, COUNT(*) FROM " + e.effects + " GROUP BY event_id")
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		out[id] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// TestQueueExactlyOnce: two consumers on one queue topic, events published
// twice, handlers that fail or panic after writing on their first attempt.
// watermill-sql resends a nacked message in the same transaction; only the
// savepoint keeps a failed attempt's writes out of the commit.
func TestQueueExactlyOnce(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			const events = 120
			pub := e.publisher(t)
			published := 0
			for i := range events {
				id := fmt.Sprintf("evt-%03d", i)
				require.NoError(t, pub.Publish(e.topic, event(id, fmt.Sprintf(`{"n":%d}`, i))))
				published++
				if i%3 == 0 { // a producer retry: same event, new message
					require.NoError(t, pub.Publish(e.topic, event(id, fmt.Sprintf(`{"n":%d}`, i))))
					published++
				}
			}

			var (
				mu       sync.Mutex
				attempts = map[string]int{}
			)
			handler := func(msg *message.Message) error {
				id := msg.Metadata.Get("event_id")
				tx, ok := dedup.TxFromContext(msg.Context())
				if !ok {
					return errors.New("no transaction")
				}
				consuming, _ := watermillsql.Tx(msg.Context())
				if consuming != tx {
					return errors.New("the handler does not run in the consuming transaction")
				}
				for step := 1; step <= 2; step++ {
					if _, err := tx.ExecContext(msg.Context(), fmt.Sprintf("INSERT INTO %s (event_id, step) VALUES (%s, %s)",
						e.effects, e.ph(1), e.ph(2)), id, step); err != nil {
						return err
					}
					mu.Lock()
					attempts[id]++
					n := attempts[id]
					mu.Unlock()
					var num int
					_, _ = fmt.Sscanf(id, "evt-%d", &num)
					if step == 1 && n == 1 && num%10 == 0 {
						return errors.New("downstream failed between two writes")
					}
					if step == 1 && n == 1 && num%17 == 0 {
						panic("handler bug between two writes")
					}
				}
				return nil
			}

			var ds []*dedup.Deduplicator
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var routers sync.WaitGroup
			for range 2 {
				d, err := dedup.New(e.store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Mode: dedup.Transactional{JoinTx: watermillsql.Tx}})
				require.NoError(t, err)
				ds = append(ds, d)
				r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
				require.NoError(t, err)
				r.AddMiddleware(d.Middleware)
				// The same handler name in both consumers: it is the operation, part of
				// the intent's identity.
				r.AddConsumerHandler("apply", e.topic, e.batchSubscriber(t, 1, 30*time.Second), handler)
				routers.Go(func() { _ = r.Run(ctx) })
				<-r.Running()
				t.Cleanup(func() { _ = r.Close() })
			}

			// Wait for what committed, not for Stats: the middleware counts
			// an execution when its savepoint is released, and the consuming
			// transaction commits after it returns.
			require.Eventually(t, func() bool {
				var done uint64
				for _, d := range ds {
					st := d.Stats()
					done += st.Executed + st.Duplicates
				}
				if done < uint64(published) {
					return false
				}
				per := e.effectsPerEvent(t)
				if len(per) < events {
					return false
				}
				for _, n := range per {
					if n < 2 {
						return false
					}
				}
				return true
			}, 2*time.Minute, 20*time.Millisecond)
			cancel()
			routers.Wait()

			e.requireOnce(t, ds, events, 2)
		})
	}
}

// TestStockSubscriberIsRefused: a subscriber built with wsql.NewSubscriber
// commits the consuming transaction under a running handler when it stops
// waiting for a message (past the ack deadline, or closing), and its queue
// adapters ack every fetched row; the middleware does not join its
// transactions, whatever the batch size, and the handler never runs
// (watermillsql.NewSubscriber is the way).
func TestStockSubscriberIsRefused(t *testing.T) {
	for _, kind := range kinds {
		for _, batch := range []int{1, 5} {
			t.Run(fmt.Sprintf("%s/batch-%d", kind, batch), func(t *testing.T) {
				t.Parallel()
				e := setup(t, kind)
				pub := e.publisher(t)
				require.NoError(t, pub.Publish(e.topic, event("evt-0", `{}`)))
				d, err := dedup.New(e.store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "apply",
					Mode: dedup.Transactional{JoinTx: watermillsql.Tx}})
				require.NoError(t, err)
				ran := false
				h := d.Middleware(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })

				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				msgs, err := e.subscriber(t, batch).Subscribe(ctx, e.topic)
				require.NoError(t, err)
				first := <-msgs
				_, err = h(first)
				require.ErrorIs(t, err, dedup.ErrUnregisteredConsumingTx)
				require.False(t, ran)
				first.Nack()
				cancel()
				require.Empty(t, e.effectsPerEvent(t))
			})
		}
	}
}

// TestQueueConflictGoesToThePoisonQueue: a reused key with another payload
// is routed to the poison topic, and the consuming transaction commits the
// ack without touching the record.
func TestQueueConflictGoesToThePoisonQueue(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			pub := e.publisher(t)
			require.NoError(t, pub.Publish(e.topic, event("evt-1", `{"amount":100}`)))
			require.NoError(t, pub.Publish(e.topic, event("evt-1", `{"amount":999}`)))
			require.NoError(t, pub.Publish(e.topic, event("evt-2", `{"amount":5}`)))

			poisonPub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 10}, watermill.NopLogger{})
			defer poisonPub.Close()
			poisoned, err := poisonPub.Subscribe(context.Background(), "poison")
			require.NoError(t, err)
			pq, err := middleware.PoisonQueueWithFilter(poisonPub, "poison", dedup.IsPoison)
			require.NoError(t, err)
			d, err := dedup.New(e.store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Mode: dedup.Transactional{JoinTx: watermillsql.Tx}})
			require.NoError(t, err)
			var calls atomic.Int64
			r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
			require.NoError(t, err)
			r.AddMiddleware(pq, d.Middleware)
			r.AddConsumerHandler("pay", e.topic, e.batchSubscriber(t, 1, 30*time.Second), func(msg *message.Message) error {
				calls.Add(1)
				tx, _ := dedup.TxFromContext(msg.Context())
				_, err := tx.ExecContext(msg.Context(), fmt.Sprintf("INSERT INTO %s (event_id, step) VALUES (%s, 1)",
					e.effects, e.ph(1)), msg.Metadata.Get("event_id"))
				return err
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { _ = r.Run(ctx) }()
			<-r.Running()
			defer r.Close()

			select {
			case pm := <-poisoned:
				require.Equal(t, "evt-1", pm.Metadata.Get("event_id"))
				require.JSONEq(t, `{"amount":999}`, string(pm.Payload))
				pm.Ack()
			case <-time.After(time.Minute):
				t.Fatal("nothing reached the poison queue")
			}
			require.Eventually(t, func() bool { return len(e.effectsPerEvent(t)) == 2 }, time.Minute, 10*time.Millisecond)
			require.EqualValues(t, 2, calls.Load())
			require.Equal(t, map[string]int{"evt-1": 1, "evt-2": 1}, e.effectsPerEvent(t))
			rec, err := e.store.Get(context.Background(), e.db, inbox.ID{Operation: "pay", Key: "evt-1"})
			require.NoError(t, err)
			require.Equal(t, inbox.StatusCompleted, rec.Status)
		})
	}
}
