package outboxtests

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/internal/crashrelay"
	"github.com/inboxmill/inboxmill/internal/kafkatest"
	"github.com/inboxmill/inboxmill/tests/testdb"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

const (
	partitions     = 4
	ordersTopic    = "orders"
	shipmentsTopic = "shipments"
	shipmentSuffix = ":shipment-requested"
	// waitLimit bounds every wait; generous for -race on two cores, never
	// reached when things work.
	waitLimit = 2 * time.Minute
)

// The fault plan, by order number. The classes overlap on purpose: one
// order may be retried by its producer, fail after publishing to the
// outbox, and see its follow-up event's forwarder die twice.

// rejected orders are refused for good after the handler published to the
// outbox: nothing of theirs may ever leave the database.
func rejected(i int) bool { return i%37 == 7 }

func producerRetry(i int) bool      { return i%10 == 9 }
func failsAfterPublish(i int) bool  { return !rejected(i) && i%11 == 3 }
func upstreamLosesAck(i int) bool   { return !rejected(i) && i%13 == 5 }
func downstreamLosesAck(i int) bool { return !rejected(i) && i%14 == 9 }

// fault is what goes wrong during one attempt to forward an envelope.
type fault int

const (
	// crashBeforePublish: the forwarder process dies holding the envelope,
	// before writing to Kafka.
	crashBeforePublish fault = iota
	// kafkaRejects: the broker refuses the write (nothing is written); the
	// forwarder nacks and its subscriber retries.
	kafkaRejects
	// crashAfterPublish: Kafka has the message; the process dies before the
	// forwarder acks the envelope.
	crashAfterPublish
	// crashAtAckCommit: the ack is written in the outbox transaction; the
	// process dies before the commit.
	crashAtAckCommit
	// kafkaTimesOut: the broker writes the message and answers
	// REQUEST_TIMED_OUT; Sarama sends it again. Last in a plan: the attempt
	// succeeds, so no later fault would get its chance.
	kafkaTimesOut
	numFaults
)

var faultNames = [numFaults]string{"crash before the Kafka write", "Kafka refuses the write",
	"crash after the Kafka write", "crash at the ack commit", "Kafka times out after the write"}

// forwarderFaults lists, in order, one fault per attempt to forward order
// i's follow-up event.
func forwarderFaults(i int) []fault {
	if rejected(i) {
		return nil
	}
	var fs []fault
	for _, c := range []struct {
		f        fault
		mod, rem int
	}{{crashBeforePublish, 29, 11}, {kafkaRejects, 23, 6}, {crashAfterPublish, 17, 2}, {crashAtAckCommit, 19, 4},
		{kafkaTimesOut, 31, 8}} {
		if i%c.mod == c.rem {
			fs = append(fs, c.f)
		}
	}
	return fs
}

// extraCopies is how many more copies of order i's follow-up event its
// faults write to Kafka.
func extraCopies(i int) int {
	n := 0
	for _, f := range forwarderFaults(i) {
		if f == crashAfterPublish || f == crashAtAckCommit || f == kafkaTimesOut {
			n++
		}
	}
	return n
}

func orderID(i int) string { return fmt.Sprintf("evt-%05d", i) }

// orderNumber reads i from an order's event ID or from its follow-up's.
func orderNumber(id string) int {
	var i int
	_, _ = fmt.Sscanf(id, "evt-%d", &i)
	return i
}

// TestOutboxExactlyOnceDownstream publishes order events to Kafka. The
// shipping consumer (dedup, transactional) writes a request row and
// publishes a ShipmentRequested event into a watermill-sql outbox table
// through the claim's transaction; Watermill's Forwarder moves the outbox
// to Kafka; the delivery consumer (its own dedup, another operation)
// writes a delivery row keyed by the follow-up's stable event ID.
//
// On the way: producer retries and lost acks on both consumers; handlers
// that fail, or refuse the order for good, after publishing to the outbox
// (the message must roll back with the transaction and never be
// forwarded); and the forwarder killed before the Kafka write, after it,
// and at the ack's commit, and Kafka writes refused or timed out after
// being written. Every order must have exactly one request and one
// delivery, every refused order none, and Kafka must hold duplicates — so
// that it is the downstream dedup, not luck, that keeps deliveries single.
func TestOutboxExactlyOnceDownstream(t *testing.T) {
	for _, kind := range []testdb.Kind{testdb.PostgresPGX, testdb.MySQL} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel() // mostly waiting on commits and polls: the two databases overlap well
			start := time.Now()
			e := setup(t, kind)
			e.startDownstream()
			e.startRelay()
			e.startUpstream()
			messages := e.publishOrders()
			e.waitDone()
			e.stop()
			e.check(messages, time.Since(start))
		})
	}
}

type env struct {
	t       *testing.T
	kind    testdb.Kind
	db      *sql.DB
	store   *inbox.Store
	dialect inbox.Dialect

	schema               wsql.SchemaAdapter
	offsets              wsql.OffsetsAdapter
	outboxTopic          string
	outboxTable          string
	requests, deliveries string

	cluster *kfake.Cluster
	brokers []string

	up, down             *dedup.Deduplicator
	upRouter, downRouter *message.Router
	relay                *crashrelay.Relay

	mu         sync.Mutex
	failedRuns map[string]bool // handler runs that published to the outbox and then failed
	failedOnce map[string]bool
	lostAck    map[string]bool
	fired      [numFaults]int       // forwarder faults applied
	handles    []*kfake.FaultHandle // the Kafka faults injected
}

func setup(t *testing.T, kind testdb.Kind) *env {
	db := testdb.Open(t, kind)
	e := &env{t: t, kind: kind, db: db, dialect: testdb.Dialect(kind),
		failedRuns: map[string]bool{}, failedOnce: map[string]bool{}, lostAck: map[string]bool{}}
	ctx := t.Context()

	var err error
	e.store, err = inbox.NewStore(db, e.dialect, inbox.Config{Table: testdb.UniqueName("outbox_inbox")})
	require.NoError(t, err)
	require.NoError(t, e.store.Migrate(ctx))

	// The outbox is a queue table (no consumer groups, rows acked in place):
	// unlike an offset-based schema (MySQL's default) it cannot skip a row
	// whose transaction commits after a later one's, which concurrent
	// handlers do all the time. One envelope per consuming transaction: the
	// queue acks every row a transaction fetched.
	e.outboxTopic = testdb.UniqueName("outbox")
	if kind == testdb.MySQL {
		schema := wsql.MySQLQueueSchema{SubscribeBatchSize: 1}
		e.schema, e.offsets, e.outboxTable = schema, wsql.MySQLQueueOffsetsAdapter{}, schema.MessagesTable(e.outboxTopic)
	} else {
		schema := wsql.PostgreSQLQueueSchema{SubscribeBatchSize: 1}
		e.schema, e.offsets, e.outboxTable = schema, wsql.PostgreSQLQueueOffsetsAdapter{}, schema.MessagesTable(e.outboxTopic)
	}
	e.requests, e.deliveries = testdb.UniqueName("outbox_requests"), testdb.UniqueName("outbox_deliveries")
	t.Cleanup(func() {
		for _, tbl := range append([]string{e.requests, e.deliveries, e.outboxTable}, inbox.TableNames(e.store.Table())...) {
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tbl)
		}
	})
	// No unique constraints: an effect that happened twice must show up
	// as a second row.
	for _, tbl := range []string{e.requests, e.deliveries} {
		_, err := db.ExecContext(ctx, "CREATE TABLE "+tbl+" (event_id VARCHAR(64) NOT NULL, run_id VARCHAR(64) NOT NULL)")
		require.NoError(t, err)
	}
	// Created up front: the outbox publisher runs inside handler
	// transactions, where it must not create tables.
	queries, err := e.schema.SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{Topic: e.outboxTopic})
	require.NoError(t, err)
	for _, q := range queries {
		_, err := db.ExecContext(ctx, q.Query, q.Args...)
		require.NoError(t, err)
	}

	e.cluster, err = kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(partitions, ordersTopic, shipmentsTopic),
		kfake.GroupMinSessionTimeout(500*time.Millisecond),
	)
	require.NoError(t, err)
	t.Cleanup(e.cluster.Close)
	e.brokers = e.cluster.ListenAddrs()
	return e
}

func (e *env) insert(table string) string {
	return fmt.Sprintf("INSERT INTO %s (event_id, run_id) VALUES (%s, %s)", table,
		e.dialect.Placeholder(1), e.dialect.Placeholder(2))
}

func (e *env) dedup() *dedup.Deduplicator {
	d, err := dedup.New(e.store, dedup.Config{
		Key:   dedup.KeyFromMetadata("event_id"),
		Scope: dedup.ScopeFromMetadata("tenant_id"),
	})
	require.NoError(e.t, err)
	return d
}

// startUpstream runs the shipping consumer.
func (e *env) startUpstream() {
	e.up = e.dedup()
	e.upRouter = e.consumer("request_shipment", "shipping", ordersTopic, e.up, upstreamLosesAck, e.requestShipment)
}

// requestShipment writes the request row and publishes the follow-up event
// into the outbox, both through the claim's transaction.
func (e *env) requestShipment(msg *message.Message) error {
	ctx := msg.Context()
	tx, ok := dedup.TxFromContext(ctx)
	if !ok {
		return errors.New("no transaction in the message's context")
	}
	id := msg.Metadata.Get("event_id")
	run := watermill.NewUUID() // this run of the handler
	if _, err := tx.ExecContext(ctx, e.insert(e.requests), id, run); err != nil {
		return err
	}
	pub, err := wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: e.schema}, nil)
	if err != nil {
		return err
	}
	outbox := forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: e.outboxTopic})
	ev := message.NewMessage(watermill.NewUUID(), msg.Payload)
	ev.Metadata.Set("event_id", id+shipmentSuffix) // stable: the same for every run and every copy
	ev.Metadata.Set("causation_id", id)
	ev.Metadata.Set("tenant_id", msg.Metadata.Get("tenant_id"))
	ev.Metadata.Set("run_id", run)
	ev.SetContext(ctx)
	if err := outbox.Publish(shipmentsTopic, ev); err != nil {
		return err
	}

	i := orderNumber(id)
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case rejected(i):
		e.failedRuns[run] = true
		return dedup.Permanent(errors.New("order refused"))
	case failsAfterPublish(i) && !e.failedOnce[id]:
		e.failedOnce[id] = true
		e.failedRuns[run] = true
		return errors.New("simulated failure after publishing to the outbox")
	}
	return nil
}

// startDownstream runs the delivery consumer: its own dedup, under its own
// operation, keyed on the follow-up event's ID.
func (e *env) startDownstream() {
	e.down = e.dedup()
	e.downRouter = e.consumer("schedule_delivery", "delivery", shipmentsTopic, e.down, downstreamLosesAck,
		func(msg *message.Message) error {
			tx, ok := dedup.TxFromContext(msg.Context())
			if !ok {
				return errors.New("no transaction in the message's context")
			}
			_, err := tx.ExecContext(msg.Context(), e.insert(e.deliveries),
				msg.Metadata.Get("causation_id"), msg.Metadata.Get("run_id"))
			return err
		})
}

// consumer runs a Kafka consumer group member with the dedup middleware,
// behind a middleware that loses the ack of the chosen orders' first
// successful delivery, as a consumer that crashes after its commit does.
func (e *env) consumer(name, group, topic string, d *dedup.Deduplicator, losesAck func(int) bool,
	h message.NoPublishHandlerFunc,
) *message.Router {
	t := e.t
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               e.brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		ConsumerGroup:         group,
		OverwriteSaramaConfig: kafkatest.Config(),
		NackResendSleep:       20 * time.Millisecond,
		ReconnectRetrySleep:   100 * time.Millisecond,
	}, watermill.NopLogger{})
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			id := msg.Metadata.Get("event_id")
			if err == nil && losesAck(orderNumber(id)) {
				e.mu.Lock()
				defer e.mu.Unlock()
				if !e.lostAck[name+"/"+id] {
					e.lostAck[name+"/"+id] = true
					return nil, errors.New("simulated crash after the commit, before the ack")
				}
			}
			return out, err
		}
	}, d.Middleware)
	router.AddConsumerHandler(name, topic, sub, h)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := router.Run(context.Background()); err != nil {
			t.Errorf("router %s: %v", name, err)
		}
	}()
	t.Cleanup(func() {
		_ = router.Close()
		<-done
	})
	select {
	case <-router.Running():
	case <-time.After(waitLimit):
		t.Fatalf("router %s did not start", name)
	}
	return router
}

// publishOrders produces every order once, and the retried ones again a
// few positions later on another partition, as a producer outside
// Watermill does (headers, no Watermill UUID). It returns how many
// messages it produced.
func (e *env) publishOrders() int {
	var records []kafkatest.Record
	record := func(i int, partition int32) kafkatest.Record {
		return kafkatest.Record{
			Partition: partition,
			Headers:   map[string]string{"event_id": orderID(i), "tenant_id": fmt.Sprintf("tenant-%d", i%3)},
			Value:     fmt.Appendf(nil, `{"order":"o-%05d","qty":%d}`, i, 1+i%4),
		}
	}
	const lag = 5
	for i := range events + lag {
		if i < events {
			records = append(records, record(i, int32(i%partitions)))
		}
		if j := i - lag; j >= 0 && producerRetry(j) {
			records = append(records, record(j, int32((j+1)%partitions)))
		}
	}
	kafkatest.Produce(e.t, e.brokers, ordersTopic, records)
	return len(records)
}

func (e *env) accepted() (n int) {
	for i := range events {
		if !rejected(i) {
			n++
		}
	}
	return n
}

// waitDone waits until the shipping consumer has handled and committed
// every order message, the outbox is forwarded and acked, and the delivery
// consumer has handled and committed every Kafka copy.
func (e *env) waitDone() {
	accepted := e.accepted()
	e.waitFor("the shipping consumer", func() (bool, error) {
		if e.up.Stats().Executed < uint64(accepted) {
			return false, nil
		}
		return kafkatest.Consumed(e.brokers, "shipping", ordersTopic)
	})
	e.waitFor("the forwarder to ack the outbox", func() (bool, error) {
		var total, pending int
		err := e.db.QueryRowContext(e.t.Context(),
			"SELECT COUNT(*), COALESCE(SUM(CASE WHEN acked THEN 0 ELSE 1 END), 0) FROM "+e.outboxTable).Scan(&total, &pending)
		return err == nil && total >= accepted && pending == 0, err
	})
	e.waitFor("the delivery consumer", func() (bool, error) {
		var distinct int
		err := e.db.QueryRowContext(e.t.Context(), "SELECT COUNT(DISTINCT event_id) FROM "+e.deliveries).Scan(&distinct)
		if err != nil {
			return false, err
		}
		if distinct < accepted {
			return false, nil
		}
		return kafkatest.Consumed(e.brokers, "delivery", shipmentsTopic)
	})
}

// waitFor polls cond until it holds, for at most waitLimit.
func (e *env) waitFor(what string, cond func() (bool, error)) {
	e.t.Helper()
	testkit.WaitFor(e.t, waitLimit, what, cond)
}

func (e *env) stop() {
	_ = e.upRouter.Close()
	e.relay.Close()
	_ = e.downRouter.Close()
}

// perEvent counts rows per event ID and remembers each event's run IDs.
func (e *env) perEvent(table string) (map[string]int, map[string]string) {
	rows, err := e.db.QueryContext(e.t.Context(), "SELECT event_id, run_id FROM "+table)
	require.NoError(e.t, err)
	defer rows.Close()
	counts, runs := map[string]int{}, map[string]string{}
	for rows.Next() {
		var id, run string
		require.NoError(e.t, rows.Scan(&id, &run))
		counts[id]++
		runs[id] = run
	}
	require.NoError(e.t, rows.Err())
	return counts, runs
}

func (e *env) check(messages int, elapsed time.Duration) {
	t := e.t
	accepted := e.accepted()

	// Upstream: one request per accepted order, written by the run whose
	// outbox message was committed; none for refused orders.
	requests, committedRun := e.perEvent(e.requests)
	for i := range events {
		id := orderID(i)
		want := 1
		if rejected(i) {
			want = 0
		}
		require.Equal(t, want, requests[id], "requests of %s", id)
		require.False(t, e.failedRuns[committedRun[id]], "%s: a failed run's request committed", id)
	}
	upSt := e.up.Stats()
	require.EqualValues(t, accepted, upSt.Executed)
	require.EqualValues(t, events-accepted, upSt.Failed, "refused orders are recorded as failed")

	// The outbox holds exactly the committed runs' messages, all acked.
	rows, err := e.db.QueryContext(t.Context(), "SELECT payload, acked FROM "+e.outboxTable)
	require.NoError(t, err)
	outboxed := map[string]int{}
	for rows.Next() {
		var payload []byte
		var acked bool
		require.NoError(t, rows.Scan(&payload, &acked))
		require.True(t, acked)
		var envelope struct {
			DestinationTopic string            `json:"destination_topic"`
			Metadata         map[string]string `json:"metadata"`
		}
		require.NoError(t, json.Unmarshal(payload, &envelope))
		require.Equal(t, shipmentsTopic, envelope.DestinationTopic)
		cause := envelope.Metadata["causation_id"]
		require.Equal(t, committedRun[cause], envelope.Metadata["run_id"], "%s: an outbox row from a run that rolled back", cause)
		outboxed[cause]++
	}
	require.NoError(t, rows.Err())
	_ = rows.Close()
	require.Len(t, outboxed, accepted)
	for id, n := range outboxed {
		require.Equal(t, 1, n, "outbox rows of %s", id)
	}

	// Kafka: every accepted order's follow-up event at least once, with the
	// copies the faults made; nothing from a rolled-back run.
	copies := map[string]int{}
	records := kafkatest.ReadAll(t, e.brokers, shipmentsTopic)
	for _, rec := range records {
		msg, err := kafka.DefaultMarshaler{}.Unmarshal(rec)
		require.NoError(t, err)
		cause := msg.Metadata.Get("causation_id")
		require.Equal(t, cause+shipmentSuffix, msg.Metadata.Get("event_id"))
		require.False(t, e.failedRuns[msg.Metadata.Get("run_id")], "%s: a rolled-back outbox message reached Kafka", cause)
		require.Equal(t, committedRun[cause], msg.Metadata.Get("run_id"), "%s: not the committed run's message", cause)
		copies[cause]++
	}
	plannedDuplicates := 0
	for i := range events {
		id := orderID(i)
		if rejected(i) {
			require.Zero(t, copies[id], "%s was refused, its outbox message rolled back, yet Kafka has it", id)
			continue
		}
		require.GreaterOrEqual(t, copies[id], 1+extraCopies(i), "Kafka copies of %s's follow-up event", id)
		plannedDuplicates += extraCopies(i)
	}
	duplicates := len(records) - accepted
	require.Positive(t, duplicates, "Kafka must hold duplicates for the test to prove the downstream dedup")
	require.GreaterOrEqual(t, duplicates, plannedDuplicates)

	// Every planned forwarder fault happened, the broker's ones included.
	planned := [numFaults]int{}
	for i := range events {
		for _, f := range forwarderFaults(i) {
			planned[f]++
		}
	}
	relaySt := e.relay.Stats()
	e.mu.Lock()
	fired, handles := e.fired, e.handles
	e.mu.Unlock()
	require.Equal(t, planned, fired, "forwarder faults (%v)", faultNames)
	for _, h := range handles {
		require.Equal(t, 1, h.Hits(), "an injected Kafka fault did not answer its produce request")
	}

	// Downstream: one delivery per accepted order, from the committed run;
	// every extra Kafka copy was recognised as a duplicate.
	deliveries, deliveredRun := e.perEvent(e.deliveries)
	for i := range events {
		id := orderID(i)
		want := 1
		if rejected(i) {
			want = 0
		}
		require.Equal(t, want, deliveries[id], "deliveries of %s", id)
		if want == 1 {
			require.Equal(t, committedRun[id], deliveredRun[id])
		}
	}
	downSt := e.down.Stats()
	require.EqualValues(t, accepted, downSt.Executed)
	require.GreaterOrEqual(t, downSt.Duplicates, uint64(duplicates))
	require.Zero(t, upSt.Conflicts+downSt.Conflicts+upSt.Invalid+downSt.Invalid)

	faults := ""
	for f, n := range fired {
		faults += fmt.Sprintf("; %s: %d", faultNames[f], n)
	}
	t.Logf("%d orders (%d refused) in %d messages; %d outbox publishes rolled back; forwarder: %d Kafka writes, "+
		"%d restarts%s; Kafka: %d records, %d duplicates (%d planned); downstream: executed %d, duplicates %d; %v",
		events, events-accepted, messages, len(e.failedRuns), relaySt.Writes, relaySt.Restarts, faults,
		len(records), duplicates, plannedDuplicates, downSt.Executed, downSt.Duplicates, elapsed.Round(time.Millisecond))
}

// startRelay runs the forwarder (outbox table -> Kafka) as a process that
// dies at the planned points and is replaced, and has the broker refuse or
// time out the planned writes.
func (e *env) startRelay() {
	r, err := crashrelay.Start(e.db, crashrelay.Config{
		Topic: e.outboxTopic, Schema: e.schema, Offsets: e.offsets,
		Brokers:      e.brokers,
		PartitionKey: "causation_id",
		SaramaConfig: func() *sarama.Config {
			cfg := kafkatest.Config()
			cfg.Producer.Return.Successes = true
			cfg.Producer.Retry.Backoff = 20 * time.Millisecond
			return cfg
		},
		CrashAt:       e.forwarderFault,
		RetryInterval: 20 * time.Millisecond,
	})
	require.NoError(e.t, err)
	e.relay = r
	e.t.Cleanup(r.Close)
}

// forwarderFault applies the planned fault, if any, of this attempt to
// forward msg.
func (e *env) forwarderFault(topic string, msg *message.Message, attempt int) crashrelay.Crash {
	fs := forwarderFaults(orderNumber(msg.Metadata.Get("causation_id")))
	if attempt >= len(fs) {
		return crashrelay.None
	}
	f := fs[attempt]
	e.mu.Lock()
	defer e.mu.Unlock()
	e.fired[f]++
	switch f {
	case crashBeforePublish:
		return crashrelay.BeforePublish
	case crashAfterPublish:
		return crashrelay.AfterPublish
	case crashAtAckCommit:
		return crashrelay.AtAckCommit
	}
	code := kerr.UnknownServerError
	if f == kafkaTimesOut {
		code = kerr.RequestTimedOut
	}
	// Only the relay's process produces to the topic, one message at a
	// time: the fault answers exactly this write.
	e.handles = append(e.handles, e.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: code, Count: 1}))
	return crashrelay.None
}
