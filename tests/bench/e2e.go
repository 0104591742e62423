package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/kafkaparallel"
	"github.com/inboxmill/inboxmill/dedup/pgxgroup"
	"github.com/inboxmill/inboxmill/dedup/watermillsql"
	"github.com/inboxmill/inboxmill/internal/kafkatest"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// Through a transport the variants are the handler alone in the
// transaction the transport gives it (plain) and under the middleware
// (inboxmill), both behind a message.Router.
var e2eVariants = []string{"plain", "inboxmill"}

// kafkaVariants add, through Kafka, the middleware with group commit
// (group) and, on PostgreSQL, with its pgx pipelines (group_pgx), all
// through watermill-kafka's subscriber; and through the parallel
// consumer (package dedup/kafkaparallel) the bare handler
// (parallel_plain), the middleware (parallel), with group commit
// (parallel_group) and with pipelines (parallel_group_pgx).
var kafkaVariants = []string{"plain", "inboxmill", "group", "group_pgx",
	"parallel_plain", "parallel", "parallel_group", "parallel_group_pgx"}

// kafkaVariant reports whether variant v runs on dialect d.
func kafkaVariant(d, v string) bool { return !strings.HasSuffix(v, "group_pgx") || d == "pg" }

// kafkaKeys is how many distinct record keys the Kafka scenarios' events
// have: the parallel consumer orders by record key, so this many lanes
// share a topic's partitions.
const kafkaKeys = 1024

// e2eTimeout bounds the wait for a transport to deliver every message.
const e2eTimeout = 10 * time.Minute

// kafka publishes msgs events per dialect, variant, partition count and
// round to an in-process Kafka-protocol broker (kfake) and consumes them
// with a router and the handler: through watermill-kafka's subscriber,
// which handles one message per partition at a time (so the partition
// count is also the worker count), or through the parallel consumer with
// up to --kafka-in-flight messages a partition and a pool of
// --kafka-pool connections. Rounds interleave the variants; the median
// is reported.
func (b *bench) kafka(ctx context.Context) (err error) {
	for _, parts := range b.opts.partitions {
		if err := b.kafkaOn(ctx, parts); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) kafkaOn(ctx context.Context, partitions int) (err error) {
	h := &harness{}
	defer h.close()
	defer h.recover(&err)
	type run struct {
		d       dialect
		variant string
		topic   string
	}
	var runs []run
	var topics []string
	for round := 1; round <= b.opts.rounds; round++ {
		for _, name := range b.opts.dialects {
			d, _ := dialectByName(name)
			for _, v := range inRoundOrder(round, kafkaVariants) {
				if kafkaVariant(d.name, v) && b.opts.hasKafka(v) {
					topic := fmt.Sprintf("%s_%s_%d", d.name, v, round)
					runs = append(runs, run{d, v, topic})
					topics = append(topics, topic)
				}
			}
		}
	}
	rounds := map[string][]result{}
	var order []string
	for i, r := range runs {
		// A broker of its own for each run, closed after it: the records
		// of the runs before (the warm-ups' too) do not pile up in this
		// process's heap.
		rh := &harness{}
		defer rh.close()
		brokers := kafkatest.Start(rh, int32(partitions), r.topic)
		total := b.opts.kafkaWarmup + b.opts.msgs
		records := make([]kafkatest.Record, total)
		for j, msg := range newMessages(total, nil) {
			records[j] = kafkatest.Record{Partition: int32(j % partitions), Value: msg.Payload,
				Key:     fmt.Appendf(nil, "acct-%d", j%kafkaKeys),
				Headers: map[string]string{"event_id": eventID(msg)}}
		}
		kafkatest.Produce(rh, brokers, r.topic, records)
		kcfg := kafka.SubscriberConfig{
			Brokers:               brokers,
			Unmarshaler:           kafka.DefaultMarshaler{},
			ConsumerGroup:         "bench_" + r.topic,
			OverwriteSaramaConfig: kafkatest.Config(),
			NackResendSleep:       20 * time.Millisecond,
			ReconnectRetrySleep:   100 * time.Millisecond,
		}
		var sub message.Subscriber
		conns := partitions + 2
		if strings.HasPrefix(r.variant, "parallel") {
			sub, err = kafkaparallel.NewSubscriber(kcfg, kafkaparallel.Config{MaxInFlightPerPartition: b.opts.kafkaInFlight},
				watermill.NopLogger{})
			conns = b.opts.kafkaPool
		} else {
			sub, err = kafka.NewSubscriber(kcfg, watermill.NopLogger{})
		}
		if err != nil {
			return err
		}
		scenario := "kafka_" + r.variant
		res, err := b.consume(ctx, r.d, scenario, conns, sub, r.topic, nil, b.opts.kafkaWarmup)
		rh.close()
		rh.cleanups = nil
		if err != nil {
			return fmt.Errorf("%s on %s with %d partitions: %w", r.variant, r.d.name, partitions, err)
		}
		res.workers = partitions
		if b.opts.rounds > 1 {
			b.logf("round %d/%d: %s (%s)", i/(len(runs)/b.opts.rounds)+1, b.opts.rounds, res, machineLoad())
		}
		key := r.d.name + "/" + scenario
		if _, ok := rounds[key]; !ok {
			order = append(order, key)
		}
		rounds[key] = append(rounds[key], res)
	}
	for _, key := range order {
		b.reportRounds(rounds[key])
	}
	return nil
}

// sqlQueue publishes msgs events per variant to a watermill-sql queue
// topic on PostgreSQL and consumes them with one subscriber, the middleware
// joining the consuming transaction (watermillsql.Tx). sqlqueue_plain and
// sqlqueue_inboxmill fetch one message per transaction (SubscribeBatchSize
// 1); sqlqueue_plain_batch and sqlqueue_inboxmill_batch fetch
// --sqlqueue-batch. The middleware's variants consume through
// watermillsql.NewSubscriber, the plain ones through wsql.NewSubscriber. Acked messages are
// deleted: with the default acked flag every fetch walks past all acked
// rows and the queue, not the handler, becomes what is measured.
func (b *bench) sqlQueue(ctx context.Context) error {
	batches := []int{1}
	if b.opts.sqlQueueBatch > 1 {
		batches = append(batches, b.opts.sqlQueueBatch)
	}
	for _, batch := range batches {
		for _, v := range e2eVariants {
			scenario := "sqlqueue_" + v
			if batch > 1 {
				scenario += "_batch"
			}
			if err := b.sqlQueueOn(ctx, scenario, batch); err != nil {
				return fmt.Errorf("%s: %w", scenario, err)
			}
		}
	}
	return nil
}

func (b *bench) sqlQueueOn(ctx context.Context, scenario string, batch int) error {
	d, _ := dialectByName("pg")
	f, err := b.newFixture(ctx, d, "sqlqueue", 4)
	if err != nil {
		return err
	}
	defer f.close()
	topic := testdb.UniqueName("bench_queue")
	schema := wsql.PostgreSQLQueueSchema{SubscribeBatchSize: batch}
	f.tables = append(f.tables, schema.MessagesTable(topic))
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(f.db),
		wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	msgs := newMessages(b.opts.msgs, nil)
	for i := 0; i < len(msgs); i += 500 {
		if err := pub.Publish(topic, msgs[i:min(i+500, len(msgs))]...); err != nil {
			return err
		}
	}
	cfg := wsql.SubscriberConfig{
		SchemaAdapter:    schema,
		OffsetsAdapter:   wsql.PostgreSQLQueueOffsetsAdapter{DeleteOnAck: true},
		InitializeSchema: true,
		PollInterval:     10 * time.Millisecond,
		ResendInterval:   time.Millisecond,
	}
	var sub message.Subscriber
	if strings.HasPrefix(scenario, "sqlqueue_inboxmill") {
		// The middleware joins only transactions its subscriber registered.
		sub, err = watermillsql.NewSubscriber(f.db, cfg, watermill.NopLogger{})
	} else {
		sub, err = wsql.NewSubscriber(wsql.BeginnerFromStdSQL(f.db), cfg, watermill.NopLogger{})
	}
	if err != nil {
		return err
	}
	r, err := b.consumeOn(ctx, f, scenario, 1, sub, topic, watermillsql.Tx, 0)
	if err == nil {
		b.report(r)
	}
	return err
}

// consume runs one variant on a fixture of its own, with a pool of conns
// connections.
func (b *bench) consume(ctx context.Context, d dialect, scenario string, conns int, sub message.Subscriber,
	topic string, join dedup.TxJoiner, warm int) (result, error) {
	f, err := b.newFixture(ctx, d, "e2e", conns)
	if err != nil {
		return result{}, err
	}
	defer f.close()
	return b.consumeOn(ctx, f, scenario, conns, sub, topic, join, warm)
}

// consumeOn routes topic from sub to the variant's handler until every
// message (warm of them first, then --msgs) was handled, and returns the
// throughput of the --msgs: from the warm-up's last completion (or the
// first message's arrival) to the last one's end.
func (b *bench) consumeOn(ctx context.Context, f *fixture, scenario string, workers int, sub message.Subscriber,
	topic string, join dedup.TxJoiner, warm int) (result, error) {
	handler := func(msg *message.Message) error {
		// The transaction the transport consumes in, if it has one.
		if tx, ok := watermillsql.Tx(msg.Context()); ok {
			_, err := tx.ExecContext(msg.Context(), f.insert, eventID(msg), 100)
			return err
		}
		_, err := f.ownTx(msg)
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return result{}, err
	}
	t := newE2ETimer(warm, b.opts.msgs)
	router.AddMiddleware(t.middleware)
	var d *dedup.Deduplicator
	switch scenario {
	case "kafka_inboxmill", "sqlqueue_inboxmill", "sqlqueue_inboxmill_batch", "kafka_group", "kafka_group_pgx",
		"kafka_parallel", "kafka_parallel_group", "kafka_parallel_group_pgx":
		store, err := f.newStore(ctx)
		if err != nil {
			return result{}, err
		}
		mode := dedup.Transactional{JoinTx: join}
		inner := f.inClaimTx
		switch scenario {
		case "kafka_group", "kafka_parallel_group":
			g := f.group
			mode.Group = &g
		case "kafka_group_pgx", "kafka_parallel_group_pgx":
			g := f.group
			g.Pipeline = pgxgroup.Pipeline()
			mode.Group, inner = &g, f.queued
		}
		cfg := dedupConfig(mode)
		cfg.Operation = "" // the router's handler name
		if d, err = dedup.New(store, cfg); err != nil {
			return result{}, err
		}
		router.AddMiddleware(d.Middleware)
		handler = func(msg *message.Message) error {
			_, err := inner(msg)
			return err
		}
	}
	router.AddConsumerHandler("bench_effect", topic, sub, handler)
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	var waitErr error
	select {
	case <-t.done:
	case err := <-runErr:
		waitErr = fmt.Errorf("router stopped: %v", err)
	case <-ctx.Done():
		waitErr = ctx.Err()
	case <-time.After(e2eTimeout):
		waitErr = fmt.Errorf("%d of %d messages handled after %v", t.completed.Load(), warm+b.opts.msgs, e2eTimeout)
	}
	if waitErr == nil {
		// The transport commits after the handler chain returned (the
		// watermill-sql subscriber on the ack): wait for the last commits
		// before closing, or the close would roll them back.
		waitErr = f.awaitRows(ctx, f.effects, warm+b.opts.msgs)
	}
	if err := errors.Join(waitErr, router.Close()); err != nil {
		return result{}, err
	}
	if d != nil && d.GroupStats() != (dedup.GroupStats{}) {
		gs := d.GroupStats()
		b.logf("%s on %s: %d groups, %.1f members each, %d alone; coordinators %d (0: unbounded), %d trials, %d kept",
			scenario, f.d.name, gs.Groups, float64(gs.Members)/float64(max(gs.Groups, 1)), gs.Solo, gs.Coordinators, gs.Trials, gs.Kept)
	}
	if d != nil {
		if st := d.Stats(); st.Executed != uint64(warm+b.opts.msgs) {
			return result{}, fmt.Errorf("middleware stats %+v, want %d executed", st, warm+b.opts.msgs)
		}
	}
	if err := f.expectRows(ctx, f.effects, warm+b.opts.msgs); err != nil {
		return result{}, err
	}
	r := t.result()
	r.scenario, r.dialect, r.workers = scenario, f.d.name, workers
	return r, nil
}

// e2eTimer is the router's outermost middleware: after warm deliveries
// have succeeded, it times each of the next n that succeeds, and closes
// done when they have.
type e2eTimer struct {
	warm, n    int
	lat        []time.Duration
	slot       atomic.Int64
	completed  atomic.Int64
	started    atomic.Bool
	first      sync.Once
	start, end time.Time
	m0, m1     runtime.MemStats
	done       chan struct{}
}

func newE2ETimer(warm, n int) *e2eTimer {
	return &e2eTimer{warm: warm, n: n, lat: make([]time.Duration, n), done: make(chan struct{})}
}

// begin starts the clock.
func (t *e2eTimer) begin() {
	t.first.Do(func() {
		runtime.ReadMemStats(&t.m0)
		t.start = time.Now()
		t.started.Store(true)
	})
}

func (t *e2eTimer) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if t.warm == 0 {
			t.begin() // at the first arrival
		}
		// A delivery counts toward the latencies when it arrived with the
		// clock running.
		timed := t.started.Load()
		t0 := time.Now()
		out, err := h(msg)
		if err != nil {
			return out, err
		}
		if timed {
			if i := t.slot.Add(1); i <= int64(t.n) {
				t.lat[i-1] = time.Since(t0)
			}
		}
		// Every latency is written before its completion is counted, so
		// the last count sees them all.
		switch t.completed.Add(1) {
		case int64(t.warm):
			t.begin() // the warm-up's last completion
		case int64(t.warm + t.n):
			t.end = time.Now()
			runtime.ReadMemStats(&t.m1)
			close(t.done)
		}
		return out, err
	}
}

// result may be called once done is closed. Allocations are the whole
// process's: with Kafka that includes Sarama and the in-process broker.
// Latencies are of the deliveries that arrived with the clock running.
func (t *e2eTimer) result() result {
	r := result{msgs: t.n, perSec: float64(t.n) / t.end.Sub(t.start).Seconds(),
		allocs: float64(t.m1.Mallocs-t.m0.Mallocs) / float64(t.n)}
	r.p50, r.p99 = percentiles(t.lat[:min(int(t.slot.Load()), t.n)])
	return r
}

// harness lets the program use internal/kafkatest, written for tests: a
// failure panics with a fatal that recover turns back into an error, and
// cleanups run at close. kafkatest calls no other testing.TB method.
type harness struct {
	testing.TB // nil: calling a method not defined below panics
	cleanups   []func()
}

type fatal struct{ err error }

func (h *harness) Helper()                           {}
func (h *harness) Logf(string, ...any)               {}
func (h *harness) Fatalf(format string, args ...any) { panic(fatal{fmt.Errorf(format, args...)}) }
func (h *harness) Cleanup(f func())                  { h.cleanups = append(h.cleanups, f) }

func (h *harness) recover(err *error) {
	if r := recover(); r != nil {
		f, ok := r.(fatal)
		if !ok {
			panic(r)
		}
		*err = f.err
	}
}

func (h *harness) close() {
	for i := len(h.cleanups) - 1; i >= 0; i-- {
		h.cleanups[i]()
	}
}
