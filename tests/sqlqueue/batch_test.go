package sqlqueue_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
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

// batchSubscriber is a subscriber built for batches: it acks only what
// was delivered, and its transactions wait for a running attempt.
func (e *env) batchSubscriber(t *testing.T, batch int, ackDeadline time.Duration) message.Subscriber {
	t.Helper()
	schema, offsets := e.schema(batch)
	sub, err := watermillsql.NewSubscriber(e.db, wsql.SubscriberConfig{
		SchemaAdapter:    schema,
		OffsetsAdapter:   offsets,
		InitializeSchema: true,
		PollInterval:     10 * time.Millisecond,
		ResendInterval:   time.Millisecond,
		AckDeadline:      &ackDeadline,
	}, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// publishAll publishes one message per event ID, in order, and returns
// the messages' UUIDs (the queue row's uuid) by position.
func (e *env) publishAll(t *testing.T, ids ...string) []string {
	t.Helper()
	pub := e.publisher(t)
	uuids := make([]string, len(ids))
	for i, id := range ids {
		msg := event(id, fmt.Sprintf(`{"id":%q}`, id))
		uuids[i] = msg.UUID
		require.NoError(t, pub.Publish(e.topic, msg))
	}
	return uuids
}

// unacked is the set of queue rows not acked, by message UUID.
func (e *env) unacked(t *testing.T) map[string]bool {
	t.Helper()
	rows, err := e.db.Query("SELECT uuid FROM watermill_" + e.topic + " WHERE acked = false")
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var u string
		require.NoError(t, rows.Scan(&u))
		out[u] = true
	}
	require.NoError(t, rows.Err())
	return out
}

// effect writes one business row for the event through the joined
// transaction.
func (e *env) effect(msg *message.Message) error {
	tx, ok := dedup.TxFromContext(msg.Context())
	if !ok {
		return errors.New("no transaction")
	}
	_, err := tx.ExecContext(msg.Context(), fmt.Sprintf("INSERT INTO %s (event_id, step) VALUES (%s, 1)", e.effects, e.ph(1)),
		msg.Metadata.Get("event_id"))
	return err
}

func (e *env) router(t *testing.T, d *dedup.Deduplicator, sub message.Subscriber, h message.NoPublishHandlerFunc) (*message.Router, func()) {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddMiddleware(d.Middleware)
	r.AddConsumerHandler("apply", e.topic, sub, h)
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(context.Background()) })
	<-r.Running()
	stop := func() {
		_ = r.Close()
		wg.Wait()
	}
	t.Cleanup(stop)
	return r, stop
}

// newDedup joins the consuming transaction; the operation is the router
// handler's name, set here for the tests that call the middleware directly.
func newDedup(t *testing.T, e *env) *dedup.Deduplicator {
	t.Helper()
	d, err := dedup.New(e.store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "apply",
		Mode: dedup.Transactional{JoinTx: watermillsql.Tx}})
	require.NoError(t, err)
	return d
}

// TestStockQueueAdapterAcksUndeliveredRows records what makes batches
// unsafe with watermill-sql's queue adapters: a subscriber closed while
// the second message of a batch waits for its ack acks the whole batch at
// commit. AckDelivered acks the one acked.
func TestStockQueueAdapterAcksUndeliveredRows(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			for _, wrapped := range []bool{false, true} {
				e := setup(t, kind)
				e.publishAll(t, "evt-0", "evt-1", "evt-2", "evt-3", "evt-4")
				schema, offsets := e.schema(5)
				if wrapped {
					offsets = watermillsql.AckDelivered(offsets)
				}
				sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(e.db), wsql.SubscriberConfig{
					SchemaAdapter: schema, OffsetsAdapter: offsets, PollInterval: 10 * time.Millisecond,
				}, watermill.NopLogger{})
				require.NoError(t, err)
				msgs, err := sub.Subscribe(context.Background(), e.topic)
				require.NoError(t, err)
				(<-msgs).Ack()
				<-msgs // the first was acked; the second is left unacked
				require.NoError(t, sub.Close())
				if wrapped {
					require.Len(t, e.unacked(t), 4, "only the acked message is acked")
				} else {
					require.Empty(t, e.unacked(t), "watermill-sql's queue adapter acked the unacked message and the three never delivered")
				}
			}
		})
	}
}

// TestQueueBatchExactlyOnce: two consumers fetching eight messages per
// transaction, events published twice in a row (so both copies share a
// batch), handlers that fail or panic after writing on their first
// attempt. Every effect once, every row acked.
func TestQueueBatchExactlyOnce(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			const events = 80
			var ids []string
			for i := range events {
				id := fmt.Sprintf("evt-%03d", i)
				ids = append(ids, id)
				if i%3 == 0 {
					ids = append(ids, id)
				}
			}
			e.publishAll(t, ids...)

			var (
				mu       sync.Mutex
				attempts = map[string]int{}
			)
			handler := func(msg *message.Message) error {
				id := msg.Metadata.Get("event_id")
				if err := e.effect(msg); err != nil {
					return err
				}
				mu.Lock()
				attempts[id]++
				n := attempts[id]
				mu.Unlock()
				var num int
				_, _ = fmt.Sscanf(id, "evt-%d", &num)
				if n == 1 && num%10 == 0 {
					return errors.New("downstream failed after a write")
				}
				if n == 1 && num%17 == 0 {
					panic("handler bug after a write")
				}
				return nil
			}
			var ds []*dedup.Deduplicator
			for range 2 {
				d := newDedup(t, e)
				ds = append(ds, d)
				e.router(t, d, e.batchSubscriber(t, 8, 5*time.Second), handler)
			}
			require.Eventually(t, func() bool {
				return len(e.unacked(t)) == 0
			}, 2*time.Minute, 20*time.Millisecond)

			e.requireOnce(t, ds, events, 1)
		})
	}
}

// TestQueueBatchDuplicatesWithinABatch: copies of one event in one
// fetched batch; the later ones find the record the first wrote in the
// same transaction.
func TestQueueBatchDuplicatesWithinABatch(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			e.publishAll(t, "evt-a", "evt-a", "evt-b", "evt-a", "evt-b")
			d := newDedup(t, e)
			e.router(t, d, e.batchSubscriber(t, 5, 5*time.Second), e.effect)
			require.Eventually(t, func() bool { return len(e.unacked(t)) == 0 }, time.Minute, 10*time.Millisecond)
			require.Equal(t, map[string]int{"evt-a": 1, "evt-b": 1}, e.effectsPerEvent(t))
			st := d.Stats()
			require.EqualValues(t, 2, st.Executed)
			require.EqualValues(t, 3, st.Duplicates)
		})
	}
}

// TestQueueBatchFailingMessageAloneIsRedelivered: the third message of a
// batch fails twice (nacked, the subscriber resends it in the same
// transaction, each attempt rolled back to its savepoint), then hangs
// until its ack deadline; the subscriber gives up on it and commits. The
// two before it are acked with their effects; it and the two after it are
// not acked and come back in a later transaction. Once it succeeds, every
// effect is there once.
func TestQueueBatchFailingMessageAloneIsRedelivered(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			uuids := e.publishAll(t, "evt-0", "evt-1", "evt-2", "evt-3", "evt-4")
			var (
				mu      sync.Mutex
				failing = true
				tries   = map[*sql.Tx]int{} // evt-2's attempts per consuming transaction
			)
			d := newDedup(t, e)
			e.router(t, d, e.batchSubscriber(t, 5, 500*time.Millisecond), func(msg *message.Message) error {
				if msg.Metadata.Get("event_id") != "evt-2" {
					return e.effect(msg)
				}
				tx, _ := watermillsql.Tx(msg.Context())
				mu.Lock()
				tries[tx]++
				n, f := tries[tx], failing
				mu.Unlock()
				if err := e.effect(msg); err != nil || !f {
					return err
				}
				if n <= 2 {
					return errors.New("evt-2 fails after its write")
				}
				<-msg.Context().Done() // past the ack deadline
				return msg.Context().Err()
			})
			require.Eventually(t, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(tries) >= 2
			}, time.Minute, 10*time.Millisecond, "evt-2 is delivered again in a later transaction")

			require.Equal(t, map[string]int{"evt-0": 1, "evt-1": 1}, e.effectsPerEvent(t))
			require.Equal(t, map[string]bool{uuids[2]: true, uuids[3]: true, uuids[4]: true}, e.unacked(t))

			mu.Lock()
			failing = false
			mu.Unlock()
			require.Eventually(t, func() bool { return len(e.unacked(t)) == 0 }, time.Minute, 10*time.Millisecond)
			require.Equal(t, map[string]int{"evt-0": 1, "evt-1": 1, "evt-2": 1, "evt-3": 1, "evt-4": 1}, e.effectsPerEvent(t))
			require.EqualValues(t, 5, d.Stats().Executed)
		})
	}
}

// interrupted publishes ten events and returns a handler whose first
// attempt at evt-3 signals on reached and waits for its context to be
// cancelled (the subscriber stopped waiting for it); then it gives up, or
// writes on regardless with a context of its own and succeeds.
func interrupted(t *testing.T, e *env, writesOn bool) (ids, uuids []string, reached chan struct{}, h func(*message.Message) error) {
	for i := range 10 {
		ids = append(ids, fmt.Sprintf("evt-%d", i))
	}
	uuids = e.publishAll(t, ids...)
	reached = make(chan struct{})
	var once sync.Once
	h = func(msg *message.Message) error {
		first := false
		if msg.Metadata.Get("event_id") == "evt-3" {
			once.Do(func() { first = true })
		}
		if !first {
			return e.effect(msg)
		}
		close(reached)
		<-msg.Context().Done()
		if !writesOn {
			return e.effect(msg) // fails: the context is cancelled
		}
		time.Sleep(50 * time.Millisecond) // the subscriber reaches its ack and commit
		tx, _ := dedup.TxFromContext(msg.Context())
		_, err := tx.ExecContext(context.Background(), fmt.Sprintf("INSERT INTO %s (event_id, step) VALUES (%s, 1)",
			e.effects, e.ph(1)), "evt-3")
		return err
	}
	return ids, uuids, reached, h
}

// checkInterrupted: no row acked without its effect, no effect twice,
// nothing after the interrupted message acked; then a new consumer
// delivers the rest, every effect once.
func checkInterrupted(t *testing.T, e *env, ids, uuids []string) {
	t.Helper()
	per, unacked := e.effectsPerEvent(t), e.unacked(t)
	for i, id := range ids {
		require.LessOrEqual(t, per[id], 1, "%s applied twice", id)
		if !unacked[uuids[i]] {
			require.Equal(t, 1, per[id], "%s acked without its effect", id)
		}
		if i >= 3 {
			require.True(t, unacked[uuids[i]], "%s was not acked by the handler and must not be acked", id)
		}
	}
	e.router(t, newDedup(t, e), e.batchSubscriber(t, 10, 30*time.Second), e.effect)
	require.Eventually(t, func() bool { return len(e.unacked(t)) == 0 }, time.Minute, 10*time.Millisecond)
	per = e.effectsPerEvent(t)
	require.Len(t, per, len(ids))
	for id, n := range per {
		require.Equal(t, 1, n, id)
	}
}

// TestQueueBatchSubscriberClosedMidBatch: the subscriber is closed while
// the fourth message of a ten-message batch is in its handler. It stops
// waiting for the message and commits; the commit waits for the attempt
// to return. When the handler gives up, the three messages before it are
// acked and the seven from it on are not. When it writes on, its savepoint
// cannot be released on the cancelled context, so the whole transaction
// is rolled back. Either way a later consumer delivers the rest once.
func TestQueueBatchSubscriberClosedMidBatch(t *testing.T) {
	for _, kind := range kinds {
		for _, writesOn := range []bool{false, true} {
			name := string(kind) + "/gives-up"
			if writesOn {
				name = string(kind) + "/writes-on"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				e := setup(t, kind)
				ids, uuids, reached, handler := interrupted(t, e, writesOn)
				h := newDedup(t, e).Middleware(func(msg *message.Message) ([]*message.Message, error) { return nil, handler(msg) })
				sub := e.batchSubscriber(t, 10, 30*time.Second)
				msgs, err := sub.Subscribe(context.Background(), e.topic)
				require.NoError(t, err)
				for range 3 {
					msg := <-msgs
					_, err := h(msg)
					require.NoError(t, err)
					msg.Ack()
				}
				fourth := <-msgs
				done := make(chan error, 1)
				go func() { _, err := h(fourth); done <- err }()
				<-reached
				require.NoError(t, sub.Close())
				require.Error(t, <-done)

				if writesOn {
					require.Empty(t, e.effectsPerEvent(t))
					require.Len(t, e.unacked(t), 10)
				} else {
					require.Equal(t, map[string]int{"evt-0": 1, "evt-1": 1, "evt-2": 1}, e.effectsPerEvent(t))
					require.Len(t, e.unacked(t), 7)
				}
				checkInterrupted(t, e, ids, uuids)
			})
		}
	}
}

// TestQueueBatchRouterClosedMidBatch: the same through a router. Closing
// it also cancels the context the subscriber began its transaction with,
// which database/sql answers by rolling the transaction back; whether that
// or the subscriber's commit comes first, nothing is lost or applied
// twice.
func TestQueueBatchRouterClosedMidBatch(t *testing.T) {
	for _, kind := range kinds {
		for _, writesOn := range []bool{false, true} {
			name := string(kind) + "/gives-up"
			if writesOn {
				name = string(kind) + "/writes-on"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				e := setup(t, kind)
				ids, uuids, reached, handler := interrupted(t, e, writesOn)
				_, stop := e.router(t, newDedup(t, e), e.batchSubscriber(t, 10, 30*time.Second), handler)
				<-reached
				stop()
				checkInterrupted(t, e, ids, uuids)
			})
		}
	}
}

// TestQueueBatchPoison: in one batch, a key reused with another payload
// and a message that fails for good after a write go to the poison queue;
// the failure is recorded in the consuming transaction, its write rolled
// back, and every row is acked with the others' effects.
func TestQueueBatchPoison(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			pub := e.publisher(t)
			for _, m := range []*message.Message{
				event("evt-1", `{"amount":100}`), event("evt-1", `{"amount":999}`),
				event("evt-2", `{"amount":5}`), event("evt-3", `{"amount":7}`),
			} {
				require.NoError(t, pub.Publish(e.topic, m))
			}
			poisonPub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 10}, watermill.NopLogger{})
			defer poisonPub.Close()
			poisoned, err := poisonPub.Subscribe(context.Background(), "poison")
			require.NoError(t, err)
			pq, err := middleware.PoisonQueueWithFilter(poisonPub, "poison", dedup.IsPoison)
			require.NoError(t, err)
			d := newDedup(t, e)
			r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
			require.NoError(t, err)
			r.AddMiddleware(pq, d.Middleware)
			r.AddConsumerHandler("apply", e.topic, e.batchSubscriber(t, 4, 5*time.Second), func(msg *message.Message) error {
				if err := e.effect(msg); err != nil {
					return err
				}
				if msg.Metadata.Get("event_id") == "evt-2" {
					return dedup.Permanent(errors.New("refused for good"))
				}
				return nil
			})
			go func() { _ = r.Run(context.Background()) }()
			<-r.Running()
			defer r.Close()

			got := map[string]string{}
			for range 2 {
				select {
				case pm := <-poisoned:
					got[pm.Metadata.Get("event_id")] = string(pm.Payload)
					pm.Ack()
				case <-time.After(time.Minute):
					t.Fatal("nothing reached the poison queue")
				}
			}
			require.Equal(t, map[string]string{"evt-1": `{"amount":999}`, "evt-2": `{"amount":5}`}, got)
			require.Eventually(t, func() bool { return len(e.unacked(t)) == 0 }, time.Minute, 10*time.Millisecond)
			require.Equal(t, map[string]int{"evt-1": 1, "evt-3": 1}, e.effectsPerEvent(t))
			rec, err := e.store.Get(context.Background(), e.db, inbox.ID{Operation: "apply", Key: "evt-2"})
			require.NoError(t, err)
			require.Equal(t, inbox.StatusFailed, rec.Status)
		})
	}
}

// TestOffsetAdaptersAckTheLastAcked: watermill-sql's offset-based schemas
// store the offset of the last acked message, so a subscriber closed
// mid-batch loses nothing: the next one starts at the message left unacked.
func TestOffsetAdaptersAckTheLastAcked(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			var (
				schema  wsql.SchemaAdapter  = wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: 5}
				offsets wsql.OffsetsAdapter = wsql.DefaultPostgreSQLOffsetsAdapter{}
				pubCfg                      = wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}
			)
			if kind == testdb.MySQL {
				schema, offsets = wsql.DefaultMySQLSchema{SubscribeBatchSize: 5}, wsql.DefaultMySQLOffsetsAdapter{}
				pubCfg.SchemaAdapter = schema
			}
			t.Cleanup(func() { _, _ = e.db.Exec("DROP TABLE IF EXISTS watermill_offsets_" + e.topic) })
			pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(e.db), pubCfg, watermill.NopLogger{})
			require.NoError(t, err)
			for i := range 5 {
				require.NoError(t, pub.Publish(e.topic, event(fmt.Sprintf("evt-%d", i), `{}`)))
			}
			next := func() []string {
				sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(e.db), wsql.SubscriberConfig{
					SchemaAdapter: schema, OffsetsAdapter: offsets, InitializeSchema: true, PollInterval: 10 * time.Millisecond,
				}, watermill.NopLogger{})
				require.NoError(t, err)
				defer sub.Close()
				msgs, err := sub.Subscribe(context.Background(), e.topic)
				require.NoError(t, err)
				var got []string
				first := <-msgs
				got = append(got, first.Metadata.Get("event_id"))
				first.Ack()
				second := <-msgs // left unacked
				got = append(got, second.Metadata.Get("event_id"))
				require.NoError(t, sub.Close())
				return got
			}
			require.Equal(t, []string{"evt-0", "evt-1"}, next())
			require.Equal(t, []string{"evt-1", "evt-2"}, next(), "only evt-0 was acked")
		})
	}
}

// TestQueueBatchAbortedTxIsNotAcked: a consuming transaction ends under
// the batch (the handler's ROLLBACK stands in for MySQL rolling a
// transaction back on a deadlock), taking the effects of the messages
// before it along. The middleware finds its savepoint gone; the
// subscriber's ack, which would now run outside any transaction and
// autocommit, is refused and the batch comes back whole.
func TestQueueBatchAbortedTxIsNotAcked(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			e.publishAll(t, "evt-0", "evt-1", "evt-2", "evt-3", "evt-4")
			var once sync.Once
			d := newDedup(t, e)
			e.router(t, d, e.batchSubscriber(t, 5, 200*time.Millisecond), func(msg *message.Message) error {
				if err := e.effect(msg); err != nil {
					return err
				}
				var err error
				if msg.Metadata.Get("event_id") == "evt-2" {
					once.Do(func() {
						tx, _ := dedup.TxFromContext(msg.Context())
						_, _ = tx.ExecContext(msg.Context(), "ROLLBACK")
						err = errors.New("the transaction is gone")
					})
				}
				return err
			})
			require.Eventually(t, func() bool { return len(e.unacked(t)) == 0 }, time.Minute, 10*time.Millisecond)
			require.Equal(t, map[string]int{"evt-0": 1, "evt-1": 1, "evt-2": 1, "evt-3": 1, "evt-4": 1}, e.effectsPerEvent(t))
			require.EqualValues(t, 5, d.Stats().Executed-2, "evt-0 and evt-1 ran twice, their first run rolled back")
		})
	}
}
