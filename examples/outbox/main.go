// Command outbox shows a transactional outbox between two deduplicated
// consumers. Order events arrive on Kafka; the shipping consumer (dedup in
// transactional mode) writes a shipment request AND publishes a follow-up
// ShipmentRequested event through a watermill-sql publisher bound to the
// claim's transaction, so the event is stored in an outbox table exactly when
// the request commits. Watermill's Forwarder moves the outbox to a Kafka
// topic, where a delivery consumer with its own dedup schedules one delivery
// per order.
//
// The forwarder is at-least-once: a forwarder that dies after Kafka took the
// message but before its outbox transaction committed the ack forwards the
// message again when it restarts. This program kills it at exactly those
// points, and a handler fails after publishing to the outbox (its message
// rolls back with the transaction and is never forwarded). The delivery
// consumer recognises every forwarded copy by its event_id and runs once per
// order.
//
// It needs PostgreSQL (default: 127.0.0.1:5432, database test, user
// postgres); Kafka is an embedded Kafka-protocol broker unless -brokers
// names a cluster:
//
//	go run ./examples/outbox
//	go run ./examples/outbox -brokers localhost:9092 -dsn 'postgres://postgres@localhost:5432/test?sslmode=disable'
//
// Its tables stay in the database: run it again and every order is already
// recorded, so nothing is published, forwarded or delivered again, as the
// program's note at the start says. -reset drops its tables first and
// starts over; a cluster's topics and consumer-group offsets are kept.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/examples/internal/kafkaex"
	"github.com/inboxmill/inboxmill/examples/internal/rerun"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/internal/crashrelay"
	"github.com/inboxmill/inboxmill/internal/dsn"
)

const partitions = 4

func main() { os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr)) }

// cli runs the command with args and returns its exit status.
func cli(args []string, stdout, stderr io.Writer) int {
	var cfg config
	fs := flag.NewFlagSet("outbox", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.brokers, "brokers", "", "Kafka brokers, comma-separated (default: an embedded broker on 127.0.0.1)")
	fs.StringVar(&cfg.dsn, "dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable",
		"PostgreSQL for the inbox, the outbox and the business tables")
	fs.StringVar(&cfg.ordersTopic, "orders-topic", "outbox-orders", "Kafka topic of the order events")
	fs.StringVar(&cfg.shipmentsTopic, "shipments-topic", "outbox-shipments", "Kafka topic the outbox is forwarded to")
	fs.StringVar(&cfg.outboxTopic, "outbox-topic", "outbox_shipments",
		"watermill-sql topic of the outbox (table watermill_<topic>)")
	fs.StringVar(&cfg.tables, "tables", "outbox_example",
		"prefix of the tables: <prefix>_inbox, <prefix>_requests, <prefix>_deliveries")
	fs.IntVar(&cfg.events, "events", 60, fmt.Sprintf(
		"number of distinct order events; the run gives up after %v or %v per event, whichever is longer",
		runDeadline.Min, runDeadline.PerEvent))
	fs.BoolVar(&cfg.reset, "reset", false,
		"drop the example's tables first (the inbox, the requests, the deliveries and the outbox) and start over; "+
			"Kafka topics and offsets are kept")
	fs.BoolVar(&cfg.verbose, "v", false, "log what Watermill does")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), runDeadline.For(cfg.events))
	defer cancel()
	if _, err := run(ctx, cfg, stdout); err != nil {
		fmt.Fprintln(stderr, "outbox example:", err)
		return 1
	}
	return 0
}

// The run's deadline grows with the work: 2 minutes, or a share of time for
// each event when that is longer. 20,000 orders take about a minute on the
// embedded broker.
var runDeadline = rerun.Deadline{Min: 2 * time.Minute, PerEvent: 20 * time.Millisecond}

type config struct {
	brokers, dsn                             string
	ordersTopic, shipmentsTopic, outboxTopic string
	tables                                   string
	events                                   int
	reset, verbose                           bool
}

type summary struct {
	orders, messages                         int // order events, and messages carrying them
	outboxPublished, rolledBack              int // outbox rows committed; publishes rolled back
	forwarded, crashes                       int // Kafka writes by the forwarder; forwarder deaths
	downstreamExecuted, downstreamDuplicates int
}

func run(ctx context.Context, cfg config, out io.Writer) (summary, error) {
	var sum summary
	if cfg.events < 1 {
		return sum, errors.New("-events must be at least 1")
	}
	logger := watermill.LoggerAdapter(watermill.NopLogger{})
	if cfg.verbose {
		logger = watermill.NewStdLogger(true, false)
	}

	db, err := sql.Open("pgx", cfg.dsn)
	if err != nil {
		return sum, err
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return sum, fmt.Errorf("PostgreSQL at %s: %w", dsn.Redact(cfg.dsn), err)
	}
	store, err := inbox.NewStore(db, postgres.Dialect(), inbox.Config{Table: cfg.tables + "_inbox"})
	if err != nil {
		return sum, err
	}
	requests, deliveries := cfg.tables+"_requests", cfg.tables+"_deliveries"
	// The outbox is a watermill-sql queue table: each row is acked in place,
	// so a row whose transaction commits after a later one's is still
	// picked up (an offset-based schema such as MySQL's default could skip
	// it). Its publisher runs inside handler transactions, where it must not
	// create tables (MySQL commits the open transaction on CREATE TABLE), so
	// the table is created below, once, with the schema adapter's own DDL.
	// SubscribeBatchSize 1: the queue acks every row a transaction fetched.
	schema := wsql.PostgreSQLQueueSchema{SubscribeBatchSize: 1}
	offsets := wsql.PostgreSQLQueueOffsetsAdapter{} // acked rows are kept for the count below (DeleteOnAck: false)
	outboxTable := schema.MessagesTable(cfg.outboxTopic)
	if cfg.reset {
		if err := rerun.Reset(ctx, out, store, requests, deliveries, outboxTable); err != nil {
			return sum, err
		}
	}
	// Here the example migrates its own inbox. In production migrations
	// run once per deploy (store.Migrate in a job, or your migration tool),
	// and a service checks at start-up that the schema is the one it was
	// built for, refusing to start on ErrSchemaOutdated or ErrSchemaNewer.
	if err := store.Migrate(ctx); err != nil {
		return sum, err
	}
	if err := store.Validate(ctx); err != nil {
		return sum, err
	}
	found, err := rerun.Find(ctx, store)
	if err != nil {
		return sum, err
	}
	found.Report(out, 2*cfg.events) // one record per order for each of the two consumers
	for _, ddl := range []string{
		`CREATE TABLE IF NOT EXISTS ` + requests + ` (event_id text NOT NULL, order_id text NOT NULL, qty integer NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS ` + deliveries + ` (event_id text NOT NULL, order_event_id text NOT NULL,
			order_id text NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			return sum, err
		}
	}

	if err := createOutbox(ctx, db, schema, cfg.outboxTopic); err != nil {
		return sum, err
	}
	var outboxBefore, leftover int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(*) FILTER (WHERE NOT acked) FROM `+outboxTable).
		Scan(&outboxBefore, &leftover); err != nil {
		return sum, err
	}
	// The forwarder sends what a stopped run left in the outbox with this
	// run's messages.
	rerun.Queued(out, leftover, outboxTable)
	fmt.Fprintf(out, "PostgreSQL: inbox %s_inbox, outbox %s\n", cfg.tables, outboxTable)

	brokers, stopKafka, err := kafkaex.Connect(cfg.brokers, partitions, cfg.ordersTopic, cfg.shipmentsTopic)
	if err != nil {
		return sum, err
	}
	defer stopKafka()
	if cfg.brokers == "" {
		fmt.Fprintf(out, "kafka: embedded broker at %s\n", brokers[0])
	} else {
		fmt.Fprintf(out, "kafka: %v\n", brokers)
	}

	// The forwarder: outbox table -> Kafka, run as a process that is killed
	// after some Kafka writes (before the ack) and at some ack commits, and
	// restarted each time (see internal/crashrelay).
	r, err := crashrelay.Start(db, crashrelay.Config{
		Topic: cfg.outboxTopic, Schema: schema, Offsets: offsets,
		Brokers:      brokers,
		PartitionKey: "causation_id", // keyed by the order: every copy of a message lands on its partition
		SaramaConfig: kafkaex.PublisherConfig,
		Logger:       logger,
		CrashAt: func(_ string, msg *message.Message, attempt int) crashrelay.Crash {
			if attempt > 0 {
				return crashrelay.None // each event's crash happens once
			}
			switch n := eventNumber(strings.TrimSuffix(msg.Metadata.Get("event_id"), shipmentSuffix)); {
			case n%10 == 3:
				return crashrelay.AfterPublish
			case n%15 == 7:
				return crashrelay.AtAckCommit
			}
			return crashrelay.None
		},
	})
	if err != nil {
		return sum, err
	}
	defer r.Close()

	// Downstream: the delivery service, its own dedup under its own
	// operation, keyed on the follow-up event's ID.
	down, err := dedup.New(store, dedup.Config{
		Key:   dedup.KeyFromMetadata("event_id"),
		Scope: dedup.ScopeFromMetadata("tenant_id"),
	})
	if err != nil {
		return sum, err
	}
	downRouter, err := startConsumer(ctx, brokers, cfg.shipmentsTopic, "outbox-delivery", "schedule_delivery", down,
		func(msg *message.Message) error {
			tx, ok := dedup.TxFromContext(msg.Context())
			if !ok {
				return errors.New("no transaction in the message's context")
			}
			var s shipment
			if err := json.Unmarshal(msg.Payload, &s); err != nil {
				return err
			}
			_, err := tx.ExecContext(msg.Context(),
				`INSERT INTO `+deliveries+` (event_id, order_event_id, order_id) VALUES ($1, $2, $3)`,
				msg.Metadata.Get("event_id"), msg.Metadata.Get("causation_id"), s.OrderID)
			return err
		}, logger)
	if err != nil {
		return sum, err
	}
	defer downRouter.Close()

	// Upstream: the shipping service. Its handler's writes — the request row
	// and the outbox row — commit with the inbox record, or not at all.
	up, err := dedup.New(store, dedup.Config{
		Key:   dedup.KeyFromMetadata("event_id"),
		Scope: dedup.ScopeFromMetadata("tenant_id"),
	})
	if err != nil {
		return sum, err
	}
	var (
		mu         sync.Mutex
		failed     = map[string]bool{}
		rolledBack int
	)
	upRouter, err := startConsumer(ctx, brokers, cfg.ordersTopic, "outbox-shipping", "request_shipment", up,
		func(msg *message.Message) error {
			ctx := msg.Context()
			tx, ok := dedup.TxFromContext(ctx)
			if !ok {
				return errors.New("no transaction in the message's context")
			}
			var o order
			if err := json.Unmarshal(msg.Payload, &o); err != nil {
				return err
			}
			id := msg.Metadata.Get("event_id")
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+requests+` (event_id, order_id, qty) VALUES ($1, $2, $3)`,
				id, o.OrderID, o.Qty); err != nil {
				return err
			}
			outbox, err := outboxPublisher(tx, schema, cfg.outboxTopic)
			if err != nil {
				return err
			}
			if err := outbox.Publish(cfg.shipmentsTopic, shipmentRequested(msg, o)); err != nil {
				return err
			}
			// Every eighth order fails once after publishing: the outbox row
			// rolls back with the request and the inbox record, and the
			// redelivery publishes again.
			mu.Lock()
			defer mu.Unlock()
			if eventNumber(id)%8 == 4 && !failed[id] {
				failed[id] = true
				rolledBack++
				return errors.New("simulated failure after publishing to the outbox")
			}
			return nil
		}, logger)
	if err != nil {
		return sum, err
	}
	defer upRouter.Close()

	msgs, err := publishOrders(brokers, cfg.ordersTopic, cfg.events, logger)
	if err != nil {
		return sum, err
	}

	// Done when every order message was handled, every outbox row forwarded
	// and acked, and the delivery consumer has seen every Kafka copy.
	if err := waitFor(ctx, "the shipping consumer", func() (bool, error) {
		st := up.Stats()
		return int(st.Executed+st.Duplicates) >= msgs, nil
	}); err != nil {
		return sum, err
	}
	if err := waitFor(ctx, "the forwarder to drain the outbox", func() (bool, error) {
		var pending int
		err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+outboxTable+` WHERE NOT acked`).Scan(&pending)
		return err == nil && pending == 0, err
	}); err != nil {
		return sum, err
	}
	relaySt := r.Stats()
	forwarded := relaySt.Writes
	if err := waitFor(ctx, "the delivery consumer", func() (bool, error) {
		st := down.Stats()
		return int(st.Executed+st.Duplicates) >= forwarded, nil
	}); err != nil {
		return sum, err
	}
	_ = upRouter.Close()
	r.Close()
	_ = downRouter.Close()

	var outboxAfter int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+outboxTable).Scan(&outboxAfter); err != nil {
		return sum, err
	}
	downSt := down.Stats()
	mu.Lock()
	sum = summary{orders: cfg.events, messages: msgs, outboxPublished: outboxAfter - outboxBefore, rolledBack: rolledBack,
		forwarded: forwarded, crashes: relaySt.Crashes,
		downstreamExecuted: int(downSt.Executed), downstreamDuplicates: int(downSt.Duplicates)}
	mu.Unlock()

	// Every order must have exactly one request and exactly one delivery.
	reqMissing, reqTwice, err := checkOnce(ctx, db,
		`SELECT event_id, COUNT(*) FROM `+requests+` GROUP BY event_id`, cfg.events)
	if err != nil {
		return sum, err
	}
	missing, twice, err := checkOnce(ctx, db,
		`SELECT order_event_id, COUNT(*) FROM `+deliveries+` GROUP BY order_event_id`, cfg.events)
	if err != nil {
		return sum, err
	}
	fmt.Fprintf(out, "shipping: %d messages for %d orders; %d outbox publishes rolled back with their transaction\n",
		sum.messages, sum.orders, sum.rolledBack)
	fmt.Fprintf(out, "forwarder: %d Kafka writes, %d crashes between the Kafka write and the outbox ack\n",
		sum.forwarded, sum.crashes)
	report := func(what string, missing, twice int) {
		if missing+twice == 0 {
			fmt.Fprintf(out, "%s: every order has exactly one\n", what)
		} else {
			fmt.Fprintf(out, "%s: %d orders have none, %d more than one\n", what, missing, twice)
		}
	}
	report("shipment requests", reqMissing, reqTwice)
	report("deliveries", missing, twice)
	fmt.Fprintf(out, "orders=%d outbox_published=%d forwarded=%d downstream_executed=%d downstream_duplicates=%d\n",
		sum.orders, sum.outboxPublished, sum.forwarded, sum.downstreamExecuted, sum.downstreamDuplicates)
	if reqMissing+reqTwice+missing+twice > 0 {
		return sum, errors.New("an order's effect is missing or duplicated")
	}
	return sum, nil
}

// createOutbox creates the outbox topic's table, outside any transaction,
// with an index of the rows not yet forwarded: the forwarder fetches WHERE
// NOT acked ORDER BY "offset", and without it every fetch would walk past
// all the rows acked before.
func createOutbox(ctx context.Context, db *sql.DB, schema wsql.PostgreSQLQueueSchema, topic string) error {
	queries, err := schema.SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{Topic: topic})
	if err != nil {
		return err
	}
	queries = append(queries, wsql.Query{Query: `CREATE INDEX IF NOT EXISTS "watermill_` + topic + `_unacked" ON ` +
		schema.MessagesTable(topic) + ` ("offset") WHERE NOT acked`})
	for _, q := range queries {
		if _, err := db.ExecContext(ctx, q.Query, q.Args...); err != nil {
			return fmt.Errorf("create the outbox table: %w", err)
		}
	}
	return nil
}

// outboxPublisher publishes into the outbox table through tx, the claim's
// transaction: the row commits with the handler's other writes. The
// forwarder.Publisher wraps each message in an envelope naming its Kafka
// topic.
func outboxPublisher(tx *sql.Tx, schema wsql.SchemaAdapter, outboxTopic string) (message.Publisher, error) {
	// AutoInitializeSchema stays false: NewPublisher refuses it on a
	// transaction.
	pub, err := wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: schema}, nil)
	if err != nil {
		return nil, err
	}
	return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: outboxTopic}), nil
}

const shipmentSuffix = ":shipment-requested"

// shipmentRequested is the follow-up event of the order in msg. Its
// event_id is derived from the order event's, so every copy the forwarder
// sends — and every run of the handler — carries the same one.
func shipmentRequested(msg *message.Message, o order) *message.Message {
	payload, _ := json.Marshal(shipment{OrderID: o.OrderID, SKU: o.SKU, Qty: o.Qty})
	ev := message.NewMessage(watermill.NewUUID(), payload)
	ev.Metadata.Set("event_id", msg.Metadata.Get("event_id")+shipmentSuffix)
	ev.Metadata.Set("causation_id", msg.Metadata.Get("event_id"))
	ev.Metadata.Set("tenant_id", msg.Metadata.Get("tenant_id"))
	ev.SetContext(msg.Context()) // the outbox INSERT runs under the handler's context
	return ev
}

// startConsumer runs a Kafka consumer group with the dedup middleware in
// front of h.
func startConsumer(ctx context.Context, brokers []string, topic, group, name string, d *dedup.Deduplicator,
	h message.NoPublishHandlerFunc, logger watermill.LoggerAdapter,
) (*message.Router, error) {
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		ConsumerGroup:         group,
		OverwriteSaramaConfig: kafkaex.SubscriberConfig(),
		NackResendSleep:       10 * time.Millisecond,
	}, logger)
	if err != nil {
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return nil, err
	}
	router.AddMiddleware(d.Middleware)
	router.AddConsumerHandler(name, topic, sub, h)
	done := make(chan error, 1)
	go func() { done <- router.Run(context.WithoutCancel(ctx)) }()
	select {
	case <-router.Running():
		return router, nil
	case err := <-done:
		return nil, fmt.Errorf("%s: %w", name, err)
	case <-ctx.Done():
		_ = router.Close()
		return nil, ctx.Err()
	}
}

// publishOrders publishes n order events; every sixth a second time (a
// producer retry: a new message, the same event). It returns how many
// messages it published.
func publishOrders(brokers []string, topic string, n int, logger watermill.LoggerAdapter) (int, error) {
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: brokers,
		Marshaler: kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
			return msg.Metadata.Get("event_id"), nil
		}),
		OverwriteSaramaConfig: kafkaex.PublisherConfig(),
	}, logger)
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	var msgs []*message.Message
	for i := 1; i <= n; i++ {
		msgs = append(msgs, orderMessage(i))
		if i%6 == 0 {
			msgs = append(msgs, orderMessage(i))
		}
	}
	return len(msgs), pub.Publish(topic, msgs...)
}

type order struct {
	OrderID string `json:"order_id"`
	SKU     string `json:"sku"`
	Qty     int    `json:"qty"`
}

type shipment struct {
	OrderID string `json:"order_id"`
	SKU     string `json:"sku"`
	Qty     int    `json:"qty"`
}

func orderMessage(i int) *message.Message {
	payload, _ := json.Marshal(order{OrderID: fmt.Sprintf("o-%04d", i), SKU: fmt.Sprintf("sku-%d", i%3), Qty: 1 + i%4})
	msg := message.NewMessage(watermill.NewUUID(), payload)
	msg.Metadata.Set("event_id", eventID(i))
	msg.Metadata.Set("tenant_id", "shop-1")
	return msg
}

func eventID(i int) string { return fmt.Sprintf("evt-%04d", i) }

func eventNumber(id string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(id, "evt-"))
	return n
}

// checkOnce reads (order event ID, count) rows and reports how many of the
// orders 1..n have no row and how many more than one.
func checkOnce(ctx context.Context, db *sql.DB, query string, n int) (missing, twice int, err error) {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return 0, 0, err
	}
	defer rows.Close()
	counts := map[string]int{}
	for rows.Next() {
		var id string
		var c int
		if err := rows.Scan(&id, &c); err != nil {
			return 0, 0, err
		}
		counts[id] = c
	}
	if err := rows.Err(); err != nil {
		return 0, 0, err
	}
	for i := 1; i <= n; i++ {
		switch c := counts[eventID(i)]; {
		case c == 0:
			missing++
		case c > 1:
			twice++
		}
	}
	return missing, twice, nil
}

func waitFor(ctx context.Context, what string, cond func() (bool, error)) error {
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
