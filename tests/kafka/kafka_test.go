package kafkatests

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/internal/kafkatest"
	"github.com/inboxmill/inboxmill/tests/testdb"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

const (
	partitions  = 4
	handlerName = "record_effect"
	// waitLimit bounds every wait for consumers; generous for -race on two
	// cores, never reached when things work.
	waitLimit = 4 * time.Minute
)

// TestExactlyOnceThroughARebalance publishes a stream in which 30% of the
// messages are producer retries of an earlier event (new message, same event
// ID, re-stamped sent_at), on four partitions, as a producer outside
// Watermill does (headers, no Watermill UUID). Two consumers in one group
// process it through the dedup middleware; one dies mid-stream — it stops,
// its connections are cut, its last offsets are never committed — and the
// other takes its partitions over and receives again what the dead one had
// done. Every event's effect must exist exactly once.
//
// Then the topic is replayed: a dry run predicts that every message is a
// duplicate, and a new consumer group reading from the oldest offset runs no
// handler at all. After some inbox records are deleted the dry run reports
// their events as new (or, judged by a short retention, as older than the
// retention window), and a third group runs exactly those.
//
// PostgreSQL keys on a header, MariaDB on a field of the JSON payload.
func TestExactlyOnceThroughARebalance(t *testing.T) {
	for _, kind := range []testdb.Kind{testdb.PostgresPQ, testdb.MySQL} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel() // mostly waiting on commits: the two databases overlap well
			e := setup(t, kind)
			events := e.publish(messages)
			e.rebalance(events)
			e.replay(events)
		})
	}
}

type env struct {
	t       *testing.T
	kind    testdb.Kind
	db      *sql.DB
	store   *inbox.Store
	effects string
	insert  string
	brokers []string
	topic   string
	ctx     context.Context
}

func setup(t *testing.T, kind testdb.Kind) *env {
	db := testdb.Open(t, kind)
	dialect := testdb.Dialect(kind)
	e := &env{t: t, kind: kind, db: db, effects: testdb.UniqueName("kafka_effects"), topic: "orders", ctx: t.Context()}
	table := testdb.UniqueName("kafka_inbox")
	store, err := inbox.NewStore(db, dialect, inbox.Config{Table: table})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(e.ctx))
	e.store = store
	// No unique constraint on purpose: an effect that happened twice must
	// show up as a second row.
	_, err = db.ExecContext(e.ctx, "CREATE TABLE "+e.effects+" (event_id VARCHAR(64) NOT NULL, consumer VARCHAR(16) NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, tbl := range append([]string{e.effects}, inbox.TableNames(table)...) {
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tbl)
		}
	})
	e.insert = fmt.Sprintf("INSERT INTO %s (event_id, consumer) VALUES (%s, %s)", e.effects,
		dialect.Placeholder(1), dialect.Placeholder(2))
	e.brokers = kafkatest.Start(t, partitions, e.topic)
	return e
}

// dedupConfig is the key configuration shared by the consumers and the dry
// runs.
func (e *env) dedupConfig() dedup.Config {
	key := dedup.KeyFromMetadata("event_id")
	if e.kind == testdb.MySQL {
		key = dedup.KeyFromJSON("event_id")
	}
	return dedup.Config{
		Key:          key,
		Scope:        dedup.ScopeFromMetadata("tenant_id"),
		IgnoreFields: []string{"sent_at"},
	}
}

type order struct {
	EventID string `json:"event_id"`
	Order   string `json:"order"`
	Qty     int    `json:"qty"`
	SentAt  string `json:"sent_at"`
}

// publish produces total messages for 70% as many events; the other 30%
// are retries of an event published shortly before, usually landing on
// another partition. It returns the event IDs with their tenants.
func (e *env) publish(total int) map[string]string {
	rng := rand.New(rand.NewPCG(1, uint64(total)))
	events := total * 7 / 10
	type entry struct {
		pos   float64
		event int
		copy  int
	}
	entries := make([]entry, 0, total)
	for i := range events {
		entries = append(entries, entry{pos: float64(i), event: i})
	}
	for _, i := range rng.Perm(events)[:total-events] {
		entries = append(entries, entry{pos: float64(i) + 0.5 + float64(rng.IntN(50)), event: i, copy: 1})
	}
	sort.Slice(entries, func(a, b int) bool { return entries[a].pos < entries[b].pos })

	ids := make(map[string]string, events)
	records := make([]kafkatest.Record, 0, total)
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, en := range entries {
		id := fmt.Sprintf("evt-%06d", en.event)
		tenant := fmt.Sprintf("tenant-%d", en.event%3)
		ids[id] = tenant
		payload, err := json.Marshal(order{EventID: id, Order: fmt.Sprintf("o-%d", en.event), Qty: 1 + en.event%5,
			SentAt: base.Add(time.Duration(en.copy) * time.Second).Format(time.RFC3339)})
		require.NoError(e.t, err)
		records = append(records, kafkatest.Record{
			Partition: int32(rng.IntN(partitions)),
			Headers:   map[string]string{"event_id": id, "tenant_id": tenant},
			Value:     payload,
		})
	}
	start := time.Now()
	kafkatest.Produce(e.t, e.brokers, e.topic, records)
	e.t.Logf("published %d messages for %d events in %v", total, events, time.Since(start).Round(time.Millisecond))
	return ids
}

// consumer is one member of a consumer group: its own Sarama client,
// subscriber, router and middleware, as a separate process would have.
type consumer struct {
	name   string
	d      *dedup.Deduplicator
	router *message.Router
	dialer *kafkatest.KillableDialer
	done   chan struct{}
}

func (e *env) startConsumer(name, group string, outer message.HandlerMiddleware) *consumer {
	t := e.t
	c := &consumer{name: name, dialer: &kafkatest.KillableDialer{}, done: make(chan struct{})}
	cfg := kafkatest.ConfigWith(c.dialer)
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               e.brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		ConsumerGroup:         group,
		OverwriteSaramaConfig: cfg,
		NackResendSleep:       20 * time.Millisecond,
		ReconnectRetrySleep:   100 * time.Millisecond,
	}, watermill.NopLogger{})
	require.NoError(t, err)

	c.d, err = dedup.New(e.store, e.dedupConfig())
	require.NoError(t, err)
	c.router, err = message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	if outer != nil {
		c.router.AddMiddleware(outer)
	}
	c.router.AddMiddleware(c.d.Middleware)
	c.router.AddConsumerHandler(handlerName, e.topic, sub, func(msg *message.Message) error {
		tx, ok := dedup.TxFromContext(msg.Context())
		if !ok {
			return errors.New("no transaction in the message's context")
		}
		var o order
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return err
		}
		_, err := tx.ExecContext(msg.Context(), e.insert, o.EventID, name)
		return err
	})
	go func() {
		defer close(c.done)
		if err := c.router.Run(context.Background()); err != nil {
			t.Errorf("router %s: %v", name, err)
		}
	}()
	select {
	case <-c.router.Running():
	case <-time.After(waitLimit):
		t.Fatalf("router %s did not start", name)
	}
	return c
}

func (c *consumer) close(t *testing.T) {
	t.Helper()
	_ = c.router.Close()
	select {
	case <-c.done:
	case <-time.After(waitLimit):
		t.Fatalf("router %s did not stop", c.name)
	}
}

// killableDialer is the consumer's network: kill cuts every connection and
// refuses new ones, as when the process dies.
// waitFor polls cond until it holds, for at most waitLimit.
func (e *env) waitFor(what string, cond func() (bool, error)) {
	e.t.Helper()
	testkit.WaitFor(e.t, waitLimit, what, cond)
}

func (e *env) consumed(group string) func() (bool, error) {
	return func() (bool, error) { return kafkatest.Consumed(e.brokers, group, e.topic) }
}

func (e *env) countEffects() (rows, distinct int) {
	e.t.Helper()
	require.NoError(e.t, e.db.QueryRowContext(e.ctx, "SELECT COUNT(*), COUNT(DISTINCT event_id) FROM "+e.effects).
		Scan(&rows, &distinct))
	return rows, distinct
}

var errCrashed = errors.New("consumer crashed before acking")

func (e *env) rebalance(events map[string]string) {
	t := e.t
	start := time.Now()
	const group = "shipping"
	crashAfter := uint64(messages / 5)
	var (
		a, b      *consumer
		crashed   atomic.Bool
		crashOnce sync.Once
		crash     = make(chan struct{})
		ready     = make(chan struct{})
	)
	// Consumer a dies once it has executed a fifth of the stream while b is
	// working too. The delivery that crosses the line has committed its
	// transaction but is never acked: b must receive it again.
	dies := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			<-ready
			if crashed.Load() {
				return nil, errCrashed
			}
			out, err := h(msg)
			if err == nil && a.d.Stats().Executed >= crashAfter && b.d.Stats().Executed > 0 {
				crashOnce.Do(func() {
					crashed.Store(true)
					a.dialer.Kill()
					close(crash)
				})
			}
			if crashed.Load() {
				return nil, errCrashed
			}
			return out, err
		}
	}
	a = e.startConsumer("a", group, dies)
	b = e.startConsumer("b", group, nil)
	close(ready)

	select {
	case <-crash:
	case <-time.After(waitLimit):
		t.Fatalf("consumer a never crashed: a %+v, b %+v", a.d.Stats(), b.d.Stats())
	}
	crashedAt := time.Now()
	atCrash := a.d.Stats()
	a.close(t)
	t.Logf("a died after %v having executed %d; b had executed %d", crashedAt.Sub(start).Round(time.Millisecond),
		atCrash.Executed, b.d.Stats().Executed)

	e.waitFor("every event's effect", func() (bool, error) {
		_, distinct := e.countEffects()
		return distinct == len(events), nil
	})
	e.waitFor("the group to commit every offset", e.consumed(group))
	b.close(t)

	rows, distinct := e.countEffects()
	var twice []string
	q, err := e.db.QueryContext(e.ctx, "SELECT event_id FROM "+e.effects+" GROUP BY event_id HAVING COUNT(*) > 1")
	require.NoError(t, err)
	for q.Next() {
		var id string
		require.NoError(t, q.Scan(&id))
		twice = append(twice, id)
	}
	require.NoError(t, q.Err())
	require.Empty(t, twice, "events whose effect happened more than once")
	require.Equal(t, len(events), distinct, "events whose effect is missing")
	require.Equal(t, len(events), rows)

	var records int
	require.NoError(t, e.db.QueryRowContext(e.ctx, "SELECT COUNT(*) FROM "+e.store.Table()).Scan(&records))
	require.Equal(t, len(events), records)

	sa, sb := a.d.Stats(), b.d.Stats()
	require.EqualValues(t, len(events), sa.Executed+sb.Executed)
	require.NotZero(t, sb.Executed)
	require.Zero(t, sa.Conflicts+sb.Conflicts+sa.Invalid+sb.Invalid)
	deliveries := sa.Executed + sa.Duplicates + sb.Executed + sb.Duplicates
	require.Greater(t, deliveries, uint64(messages), "b must have received again what a did not ack")
	t.Logf("%d messages, %d events: a executed %d, b executed %d; %d duplicates acked, %d redeliveries after the crash, "+
		"%d transient retries; %v", messages, len(events), sa.Executed, sb.Executed, sa.Duplicates+sb.Duplicates,
		deliveries-messages, sa.Retries+sb.Retries, time.Since(start).Round(time.Millisecond))
}

// replay reads the whole topic again with new consumer groups, after a dry
// run has predicted what they will do.
func (e *env) replay(events map[string]string) {
	t := e.t
	start := time.Now()

	report := e.dryRun(0)
	require.Equal(t, dedup.DryRunReport{Messages: messages, Duplicate: messages}, withoutState(report),
		"a replay of the whole topic runs nothing")

	replayed := e.consumeAll("replay-1")
	require.Equal(t, dedup.Stats{Duplicates: messages}, replayed, "the replay ran handlers")
	rows, _ := e.countEffects()
	require.Equal(t, len(events), rows)
	t.Logf("replay of %d messages: dry run and a new consumer group agree, nothing ran (%v)", messages,
		time.Since(start).Round(time.Millisecond))

	// Forget some events, as an operator (or a purge) would.
	ids := make([]string, 0, len(events))
	for id := range events {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var forgotten int
	for i := 0; i < len(ids); i += 97 {
		require.NoError(t, e.store.Delete(e.ctx, e.db, inbox.ID{Scope: events[ids[i]], Operation: handlerName, Key: ids[i]}))
		forgotten++
	}

	report = e.dryRun(0)
	require.Equal(t, dedup.DryRunReport{Messages: messages, New: int64(forgotten), Duplicate: int64(messages - forgotten)},
		withoutState(report), "forgotten events are new; their later retries are duplicates of the replay's own run")
	// Judged by a retention shorter than the messages' age, the same events
	// are older than the retention window; the recorded ones stay duplicates.
	report = e.dryRun(time.Millisecond)
	require.Equal(t, dedup.DryRunReport{Messages: messages, Expired: int64(forgotten), Duplicate: int64(messages - forgotten)},
		withoutState(report))

	replayed = e.consumeAll("replay-2")
	require.Equal(t, dedup.Stats{Executed: uint64(forgotten), Duplicates: uint64(messages - forgotten)}, replayed,
		"the replay runs exactly what the dry run predicted")
	rows, distinct := e.countEffects()
	require.Equal(t, len(events)+forgotten, rows)
	require.Equal(t, len(events), distinct)
	t.Logf("after forgetting %d events the dry run and a third group agree (%v in all)", forgotten,
		time.Since(start).Round(time.Millisecond))
}

// withoutState drops the report's unexported memory of claimed keys, so
// that reports compare by their counts.
func withoutState(r dedup.DryRunReport) dedup.DryRunReport {
	return dedup.DryRunReport{Messages: r.Messages, New: r.New, Duplicate: r.Duplicate, Conflict: r.Conflict,
		Invalid: r.Invalid, Expired: r.Expired, Unfinished: r.Unfinished}
}

// dryRun classifies every message of the topic with the consumers' key
// configuration, reading the records as the subscriber does.
func (e *env) dryRun(retention time.Duration) dedup.DryRunReport {
	t := e.t
	cfg := e.dedupConfig()
	cfg.Operation = handlerName
	cfg.Retention = retention
	d, err := dedup.New(e.store, cfg)
	require.NoError(t, err)
	var r dedup.DryRunReport
	for _, km := range kafkatest.ReadAll(t, e.brokers, e.topic) {
		msg, err := kafka.DefaultMarshaler{}.Unmarshal(km)
		require.NoError(t, err)
		require.Empty(t, msg.UUID, "the producer is not Watermill: no UUID")
		res, err := d.DryRun(e.ctx, msg, km.Timestamp)
		require.NoError(t, err)
		r.Add(res)
	}
	return r
}

// consumeAll reads the whole topic with a new consumer group of one and
// returns what its middleware did.
func (e *env) consumeAll(group string) dedup.Stats {
	c := e.startConsumer(group, group, nil)
	e.waitFor(group+" to receive every message", func() (bool, error) {
		s := c.d.Stats()
		return s.Executed+s.Duplicates >= messages, nil
	})
	e.waitFor(group+" to commit every offset", e.consumed(group))
	c.close(e.t)
	return c.d.Stats()
}
