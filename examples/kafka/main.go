// Command kafka shows inboxmill behind a Kafka consumer group
// (watermill-kafka, Sarama) with a PostgreSQL inbox: order events arrive with
// everything at-least-once delivery throws at a consumer — producer retries
// that republish an event as a new message, handler failures, acks lost
// after the commit, and one event ID reused for a different order. Every
// order ships exactly once; the reused ID goes to the poison topic.
//
// By default it starts an in-process Kafka-protocol broker on 127.0.0.1, so
// only PostgreSQL is needed. Point it at a real cluster with -brokers; the
// repository's docker-compose.yml starts one:
//
//	go run ./examples/kafka
//	docker compose up -d
//	go run ./examples/kafka -brokers localhost:9092 -dsn 'postgres://postgres@localhost:5432/test?sslmode=disable'
//
// With -parallel N the consumer is the parallel one (package
// dedup/kafkaparallel): up to N messages of each partition run at once,
// those of one record key (here the event ID, by which the producer
// partitions) one after the other, and each partition commits its low
// watermark. The outcome is the same, faster:
//
//	go run ./examples/kafka -parallel 32
//
// Run it again: the inbox persists in PostgreSQL, so the republished events
// are all duplicates and nothing ships twice (executed=0), as the
// program's note at the start says. -reset drops its tables first and
// starts over; a cluster's topics and consumer-group offsets are kept.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/kafkaparallel"
	"github.com/inboxmill/inboxmill/examples/internal/kafkaex"
	"github.com/inboxmill/inboxmill/examples/internal/rerun"
	"github.com/inboxmill/inboxmill/examples/internal/shop"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/internal/dsn"
)

const partitions = 4

func main() { os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr)) }

// cli runs the command with args and returns its exit status.
func cli(args []string, stdout, stderr io.Writer) int {
	var cfg config
	fs := flag.NewFlagSet("kafka", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.brokers, "brokers", "", "Kafka brokers, comma-separated (default: an embedded broker on 127.0.0.1)")
	fs.StringVar(&cfg.dsn, "dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL for the inbox and the shipments")
	fs.StringVar(&cfg.topic, "topic", "orders", "topic of the order events; <topic>.poison receives the refused ones")
	fs.StringVar(&cfg.group, "group", "shipping", "consumer group")
	// Names of the example's own: -reset drops these tables, and a shared
	// database may well hold an application's "inbox".
	fs.StringVar(&cfg.inboxTable, "inbox-table", "kafka_example_inbox", "inbox table")
	fs.StringVar(&cfg.shipmentsTable, "shipments-table", "kafka_example_shipments", "the application's table")
	fs.IntVar(&cfg.events, "events", 100, fmt.Sprintf(
		"number of distinct order events; the run gives up after %v or %v per event, whichever is longer",
		runDeadline.Min, runDeadline.PerEvent))
	fs.BoolVar(&cfg.reset, "reset", false,
		"drop the example's tables first (the inbox and the shipments) and start over; Kafka topics and offsets are kept")
	fs.IntVar(&cfg.parallel, "parallel", 0,
		"consume with the parallel consumer, up to this many messages of a partition at once, one at a time per record key (0: watermill-kafka's subscriber, one per partition)")
	fs.IntVar(&cfg.pool, "pool", defaultPool,
		"the most PostgreSQL connections at once: every message in flight holds one for its transaction, and the parallel consumer keeps many in flight")
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
		fmt.Fprintln(stderr, "kafka example:", err)
		return 1
	}
	return 0
}

// The run's deadline grows with the work: 2 minutes, or a share of time for
// each event when that is longer. 5,000 events take about 12 seconds on
// the embedded broker.
var runDeadline = rerun.Deadline{Min: 2 * time.Minute, PerEvent: 20 * time.Millisecond}

// defaultPool is -pool's default.
const defaultPool = 16

type config struct {
	brokers, dsn, topic, group string
	inboxTable, shipmentsTable string
	events, parallel, pool     int
	reset, verbose             bool
}

type summary struct {
	published, delivered, executed, duplicates, conflicts, poisoned int
	shipments, distinctShipments                                    int
	// retried counts the handler runs rolled back and nacked: the
	// simulated failures, and any transient error of the database.
	retried int
}

func run(ctx context.Context, cfg config, out io.Writer) (summary, error) {
	var sum summary
	if cfg.events < 7 {
		return sum, errors.New("-events must be at least 7")
	}
	logger := watermill.LoggerAdapter(watermill.NopLogger{})
	if cfg.verbose {
		logger = watermill.NewStdLogger(true, false)
	}

	switch {
	case cfg.pool < 0:
		return sum, errors.New("-pool must be at least 1")
	case cfg.pool == 0:
		cfg.pool = defaultPool
	}
	db, err := sql.Open("pgx", cfg.dsn)
	if err != nil {
		return sum, err
	}
	defer db.Close()
	// A bounded pool: messages in flight beyond it wait for a connection
	// rather than ask the server for more than it allows (PostgreSQL's
	// max_connections is 100 by default, shared by every client).
	db.SetMaxOpenConns(cfg.pool)
	db.SetMaxIdleConns(cfg.pool)
	if err := db.PingContext(ctx); err != nil {
		return sum, fmt.Errorf("PostgreSQL at %s: %w", dsn.Redact(cfg.dsn), err)
	}
	store, err := inbox.NewStore(db, postgres.Dialect(), inbox.Config{Table: cfg.inboxTable})
	if err != nil {
		return sum, err
	}
	if cfg.reset {
		if err := rerun.Reset(ctx, out, store, cfg.shipmentsTable); err != nil {
			return sum, err
		}
	}
	// Here the example migrates its own inbox. In production migrations
	// run once per deploy (store.Migrate in a job, or your migration tool),
	// and a service checks at start-up that the schema is the one it was
	// built for, refusing to start on ErrSchemaOutdated or ErrSchemaNewer.
	if err := store.Migrate(ctx); err != nil {
		return sum, fmt.Errorf("inbox at %s: %w", dsn.Redact(cfg.dsn), err)
	}
	if err := store.Validate(ctx); err != nil {
		return sum, err
	}
	// The application's own table. The handler writes to it in the same
	// transaction as the inbox record: both commit, or neither does.
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+cfg.shipmentsTable+` (
		event_id text NOT NULL, order_id text NOT NULL, sku text NOT NULL, qty integer NOT NULL)`); err != nil {
		return sum, err
	}
	found, err := rerun.Find(ctx, store)
	if err != nil {
		return sum, err
	}
	found.Report(out, cfg.events)

	poisonTopic := cfg.topic + ".poison"
	brokers, stop, err := kafkaex.Connect(cfg.brokers, partitions, cfg.topic, poisonTopic)
	if err != nil {
		return sum, err
	}
	defer stop()
	if cfg.brokers == "" {
		fmt.Fprintf(out, "kafka: embedded broker at %s\n", brokers[0])
	} else {
		fmt.Fprintf(out, "kafka: %v\n", brokers)
	}

	publisher, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: brokers,
		// Partitioned by event ID, as a producer keyed on the business entity
		// would be: a retry lands on the same partition as the original.
		Marshaler: kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
			return msg.Metadata.Get("event_id"), nil
		}),
		OverwriteSaramaConfig: kafkaex.PublisherConfig(),
	}, logger)
	if err != nil {
		return sum, err
	}
	defer publisher.Close()
	kcfg := kafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		ConsumerGroup:         cfg.group,
		OverwriteSaramaConfig: kafkaex.SubscriberConfig(),
		NackResendSleep:       10 * time.Millisecond,
	}
	var subscriber message.Subscriber
	if cfg.parallel > 0 {
		// The same settings; messages of a partition run concurrently,
		// ordered per record key, and the partition's committed offset is
		// the first one not done: what a crash sends again above it, the
		// inbox acknowledges as duplicates.
		subscriber, err = kafkaparallel.NewSubscriber(kcfg, kafkaparallel.Config{MaxInFlightPerPartition: cfg.parallel}, logger)
		fmt.Fprintf(out, "kafka: parallel consumer, up to %d messages per partition at once, ordered per record key\n", cfg.parallel)
	} else {
		subscriber, err = kafka.NewSubscriber(kcfg, logger)
	}
	if err != nil {
		return sum, err
	}

	// The middleware owns the transaction: begin, claim the event's key,
	// run the handler, store its output, commit; then the router acks.
	d, err := dedup.New(store, dedup.Config{
		Key:          dedup.KeyFromMetadata("event_id"), // a Kafka header; never the Watermill UUID
		Scope:        dedup.ScopeFromMetadata("tenant_id"),
		IgnoreFields: []string{"sent_at"}, // a producer retry stamps a new time; same order
		Logger:       logger,
	})
	if err != nil {
		return sum, err
	}
	poison, err := middleware.PoisonQueueWithFilter(publisher, poisonTopic, dedup.IsPoison)
	if err != nil {
		return sum, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return sum, err
	}
	faults := shop.NewFaults()
	// Outermost first: a message that can never succeed goes to the poison
	// topic instead of being redelivered forever; acks are lost after dedup
	// committed, as when a consumer crashes before Kafka hears of it.
	router.AddMiddleware(poison, faults.Count, faults.LoseAcks, d.Middleware)
	router.AddConsumerHandler("ship_order", cfg.topic, subscriber, faults.ShipOrder(
		`INSERT INTO `+cfg.shipmentsTable+` (event_id, order_id, sku, qty) VALUES ($1, $2, $3, $4)`))

	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(context.WithoutCancel(ctx)) }()
	defer router.Close()
	select {
	case <-router.Running():
	case err := <-routerDone:
		return sum, fmt.Errorf("router: %w", err)
	case <-ctx.Done():
		return sum, ctx.Err()
	}

	msgs := shop.Stream(cfg.events)
	if err := publisher.Publish(cfg.topic, msgs...); err != nil {
		return sum, err
	}
	for !faults.Settled(d.Stats(), len(msgs)) {
		select {
		case <-ctx.Done():
			return sum, fmt.Errorf("waiting for deliveries: %w (stats %+v)", ctx.Err(), d.Stats())
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := router.Close(); err != nil {
		return sum, err
	}
	conflicts := int(d.Stats().Conflicts)
	if sum.poisoned, err = readPoison(ctx, cfg, brokers, poisonTopic, conflicts, out, logger); err != nil {
		return sum, err
	}

	st := d.Stats()
	sum.delivered = faults.Delivered()
	sum.published = len(msgs)
	sum.executed, sum.duplicates, sum.conflicts = int(st.Executed), int(st.Duplicates), int(st.Conflicts)
	sum.retried = int(st.Retries)
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT event_id) FROM `+cfg.shipmentsTable).
		Scan(&sum.shipments, &sum.distinctShipments); err != nil {
		return sum, err
	}
	return sum, shop.Report(out, st, sum.delivered, sum.published, cfg.events, sum.shipments, sum.distinctShipments,
		fmt.Sprintf(" on %d partitions", partitions))
}

// readPoison reads the n messages the poison queue received in this run.
func readPoison(ctx context.Context, cfg config, brokers []string, topic string, n int, out io.Writer,
	logger watermill.LoggerAdapter,
) (int, error) {
	if n == 0 {
		return 0, nil
	}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: brokers, Unmarshaler: kafka.DefaultMarshaler{}, ConsumerGroup: cfg.group + ".poison",
		OverwriteSaramaConfig: kafkaex.SubscriberConfig(),
	}, logger)
	if err != nil {
		return 0, err
	}
	defer sub.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		return 0, err
	}
	for i := range n {
		select {
		case pm := <-ch:
			fmt.Fprintf(out, "poison queue: event %s refused: %s\n",
				pm.Metadata.Get("event_id"), pm.Metadata.Get(middleware.ReasonForPoisonedKey))
			pm.Ack()
		case <-ctx.Done():
			return i, fmt.Errorf("reading the poison topic: %w", ctx.Err())
		}
	}
	return n, nil
}
