// Package consumer is one chaos consumer process: a Watermill router with
// the poison queue and the dedup middleware in front of a handler whose
// effect the driver counts afterwards. The driver starts several, kills them
// (or tells them to kill themselves at a chosen point), cuts their database
// connections and restarts them.
package consumer

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/kafkaparallel"
	"github.com/inboxmill/inboxmill/dedup/pgxgroup"
	"github.com/inboxmill/inboxmill/dedup/watermillsql"
	"github.com/inboxmill/inboxmill/handlers/reconcile"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// Timings of reserve mode. The lease is long compared with a charge (a few
// milliseconds): a worker frozen by a loaded machine must not lose its lease
// between asking the provider and charging, or a takeover charges too.
const (
	lease             = 5 * time.Second
	heartbeat         = time.Second
	inFlightWait      = time.Second
	chargeTimeout     = 500 * time.Millisecond
	lookupTimeout     = 2 * time.Second
	reconcileInterval = 250 * time.Millisecond
	// staleAfter is when the reconciler takes over a processing record
	// whose lease expired and that no redelivery took over.
	staleAfter = 3 * lease / 2
)

// groupCoordinators is how many groups a kafka-group consumer runs at once
// (dedup.Group.Coordinators), each on a connection of its own: below -pool.
const groupCoordinators = 2

type config struct {
	mode, db, dsn, app, name            string
	brokers, topic, group, poisonTopic  string
	inboxTable, effectsTable, provider  string
	dieAt, history                      string
	dieAfter, pool                      int
	lifeline, verbose, partitioned      bool
	pipeline                            bool
	reserveBatch, cooperative           bool
	ackDeadline, sqlPoll, closeDeadline time.Duration
}

func parse(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("consumer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.mode, "mode", "", "one of "+strings.Join(wire.Modes, ", "))
	fs.StringVar(&c.db, "db", wire.Postgres, "database: "+strings.Join(wire.Databases, ", "))
	fs.StringVar(&c.dsn, "dsn", "", "the database's DSN")
	fs.StringVar(&c.app, "app", "", "PostgreSQL application_name of this process's connections")
	fs.StringVar(&c.name, "name", "consumer", "name written with every effect")
	fs.StringVar(&c.brokers, "brokers", "", "Kafka brokers, comma-separated (Kafka modes; the poison topic in every mode)")
	fs.StringVar(&c.topic, "topic", "", "topic to consume (a watermill-sql topic in sql-queue mode)")
	fs.StringVar(&c.group, "group", "", "Kafka consumer group")
	fs.StringVar(&c.poisonTopic, "poison-topic", "", "Kafka topic for refused messages")
	fs.StringVar(&c.inboxTable, "inbox-table", "", "inbox table (migrated by the driver)")
	fs.StringVar(&c.effectsTable, "effects-table", "", "business table (transactional modes)")
	fs.StringVar(&c.provider, "provider", "", "payment provider base URL (kafka-reserve)")
	fs.StringVar(&c.dieAt, "die-at", "", "kill this process (SIGKILL) at this point: "+strings.Join(wire.Points, ", "))
	fs.StringVar(&c.history, "history", "", "append this process's claims, commits and acks to this file (JSON lines)")
	fs.IntVar(&c.dieAfter, "die-after", 1, "... the n-th time a delivery reaches it")
	fs.IntVar(&c.pool, "pool", 4, "maximum open database connections")
	fs.BoolVar(&c.lifeline, "lifeline", false, "stop when stdin reaches EOF (the driver is gone)")
	fs.BoolVar(&c.partitioned, "partitioned", false, "PostgreSQL: the inbox table is partitioned (postgres.Partitioned)")
	fs.BoolVar(&c.pipeline, "pipeline", false, "kafka-group on PostgreSQL: groups in pgx pipelines (dedup/pgxgroup), the handler queues its effect")
	fs.BoolVar(&c.reserveBatch, "reserve-batch", false, "kafka-reserve: reservations and completions in batches (dedup.Reserve.Batch)")
	fs.BoolVar(&c.cooperative, "cooperative", false, "Kafka modes: rebalance with the cooperative-sticky strategy instead of Sarama's default (range, eager)")
	fs.BoolVar(&c.verbose, "v", false, "log what Watermill and inboxmill do, to stderr")
	fs.DurationVar(&c.ackDeadline, "ack-deadline", 5*time.Second, "sql-queue: watermill-sql's AckDeadline")
	fs.DurationVar(&c.sqlPoll, "sql-poll", 20*time.Millisecond, "sql-queue: poll interval of an empty queue")
	fs.DurationVar(&c.closeDeadline, "close-timeout", 30*time.Second,
		"how long a SIGTERM waits for the router to close (longer than the group's rebalance timeout)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	var errs []error
	switch c.mode {
	case wire.KafkaTx, wire.KafkaReserve, wire.SQLQueue, wire.KafkaGroup, wire.KafkaParallel:
	default:
		errs = append(errs, fmt.Errorf("-mode %q is not one of %s", c.mode, strings.Join(wire.Modes, ", ")))
	}
	for _, f := range []struct{ name, v string }{{"dsn", c.dsn}, {"app", c.app}, {"brokers", c.brokers},
		{"topic", c.topic}, {"poison-topic", c.poisonTopic}, {"inbox-table", c.inboxTable}} {
		if f.v == "" {
			errs = append(errs, fmt.Errorf("-%s is required", f.name))
		}
	}
	if !wire.ValidDatabase(c.db) {
		errs = append(errs, fmt.Errorf("-db %q is not one of %s", c.db, strings.Join(wire.Databases, ", ")))
	}
	if c.mode != wire.SQLQueue && c.group == "" {
		errs = append(errs, errors.New("-group is required in Kafka modes"))
	}
	if c.reserveBatch && c.mode != wire.KafkaReserve {
		errs = append(errs, errors.New("-reserve-batch is for kafka-reserve"))
	}
	if c.pipeline && (c.mode != wire.KafkaGroup || c.db != wire.Postgres) {
		errs = append(errs, errors.New("-pipeline is for kafka-group on PostgreSQL"))
	}
	if c.mode == wire.KafkaReserve && c.provider == "" {
		errs = append(errs, errors.New("-provider is required in kafka-reserve mode"))
	}
	if c.mode != wire.KafkaReserve && c.effectsTable == "" {
		errs = append(errs, errors.New("-effects-table is required in transactional modes"))
	}
	if c.dieAt != "" && (!wire.ValidPoint(c.dieAt) || c.dieAfter < 1) {
		errs = append(errs, fmt.Errorf("-die-at %q -die-after %d: want one of %s and a positive count",
			c.dieAt, c.dieAfter, strings.Join(wire.Points, ", ")))
	}
	return c, errors.Join(errs...)
}

// Main runs a consumer until SIGTERM or SIGINT (or, with -lifeline, until
// stdin reaches EOF), then closes the router, waiting for the deliveries in
// progress, and returns 0. It prints the wire.Line* lines on stdout.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cfg, err := parse(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "consumer:", err)
		}
		return 2
	}
	// The handler stays registered until the process exits: unregistered
	// (signal.NotifyContext's stop), a SIGTERM arriving after the router
	// closed for another reason — the lifeline ended — would kill the
	// process before it reports BYE and exits 0.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-sigs
		cancel()
	}()
	if cfg.lifeline {
		go func() {
			_, _ = io.Copy(io.Discard, stdin)
			cancel()
		}()
	}
	out := &lines{w: stdout}
	if err := run(ctx, cfg, out, stderr); err != nil {
		fmt.Fprintf(stderr, "consumer %s: %v\n", cfg.name, err)
		return 1
	}
	out.println(wire.LineBye)
	return 0
}

// Run is main for cmd programs.
func Run() { os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }

// lines writes whole lines to the driver, one writer at a time.
type lines struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lines) println(a ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintln(l.w, a...)
}

func run(ctx context.Context, cfg config, out *lines, stderr io.Writer) error {
	logger := watermill.LoggerAdapter(watermill.NopLogger{})
	if cfg.verbose {
		logger = watermill.NewStdLoggerWithOut(stderr, true, false)
		sarama.Logger = log.New(stderr, "[sarama] ", log.LstdFlags|log.Lmicroseconds)
	}
	db, dialect, err := openDB(cfg, out)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(cfg.pool)
	db.SetMaxIdleConns(cfg.pool)
	store, err := inbox.NewStore(db, dialect, inbox.Config{Table: cfg.inboxTable})
	if err != nil {
		return err
	}

	brokers := strings.Split(cfg.brokers, ",")
	pubCfg := kafka.DefaultSaramaSyncPublisherConfig()
	pubCfg.Version = wire.KafkaVersion
	pubCfg.ClientID = cfg.app
	pubCfg.Metadata.Retry.Backoff = 100 * time.Millisecond
	// A consumer may start while the broker restarts (down for up to about
	// two seconds): keep asking for metadata for ten, not three tries.
	pubCfg.Metadata.Retry.Max = 100
	poisonPub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: brokers, Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: pubCfg,
	}, logger)
	if err != nil {
		return fmt.Errorf("poison publisher: %w", err)
	}
	defer poisonPub.Close()
	poison, err := middleware.PoisonQueueWithFilter(poisonPub, cfg.poisonTopic, dedup.IsPoison)
	if err != nil {
		return err
	}

	dcfg := dedup.Config{
		Key:          dedup.KeyFromMetadata(wire.MetaEventID),
		Scope:        dedup.ScopeFromMetadata(wire.MetaTenant),
		IgnoreFields: []string{"sent_at"}, // a producer retry re-stamps it
		Logger:       logger,
	}
	var (
		sub message.Subscriber
		h   message.NoPublishHandlerFunc
	)
	hist, err := openHistory(cfg.history, cfg.name, cfg.mode == wire.SQLQueue)
	if err != nil {
		return err
	}
	defer hist.close()
	ks := &killSwitch{point: cfg.dieAt, after: int64(cfg.dieAfter), out: out, hist: hist}
	if cfg.mode == wire.KafkaGroup {
		ks.grouped = &groupTxs{}
	}
	var tracer kafka.SaramaTracer
	if cfg.verbose {
		tracer = groupLog{l: log.New(stderr, "[group] ", log.LstdFlags|log.Lmicroseconds)}
	}
	switch cfg.mode {
	case wire.KafkaTx, wire.KafkaReserve, wire.KafkaGroup, wire.KafkaParallel:
		sc := wire.SaramaConfig(cfg.app)
		if cfg.cooperative {
			sc.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyCooperativeSticky()}
		}
		kcfg := kafka.SubscriberConfig{
			Brokers:               brokers,
			Unmarshaler:           kafka.DefaultMarshaler{},
			ConsumerGroup:         cfg.group,
			OverwriteSaramaConfig: sc,
			NackResendSleep:       20 * time.Millisecond,
			ReconnectRetrySleep:   200 * time.Millisecond,
			Tracer:                tracer,
		}
		if cfg.mode == wire.KafkaParallel {
			// The same settings through the parallel consumer: an
			// account's events (the record key) one after the other, up
			// to wire.ParallelInFlight messages of a partition at once. A
			// revoked partition waits 3 s for its running messages, well
			// within the group's rebalance timeout (wire.SaramaConfig),
			// and leaves the rest to its next owner.
			sub, err = kafkaparallel.NewSubscriber(kcfg,
				kafkaparallel.Config{MaxInFlightPerPartition: wire.ParallelInFlight, DrainTimeout: 3 * time.Second}, logger)
		} else {
			sub, err = kafka.NewSubscriber(kcfg, logger)
		}
		if cfg.mode == wire.KafkaGroup {
			// Two coordinators for the deliveries of the consumer's
			// partitions (wire.GroupPartitions spread over its group):
			// fewer coordinators than deliveries in flight make groups
			// of several members.
			g := &dedup.Group{Coordinators: groupCoordinators}
			if cfg.pipeline {
				g.Pipeline = pgxgroup.Pipeline()
				ks.grouped.status = txStatus(db)
			}
			dcfg.Mode = dedup.Transactional{Group: g}
		}
	case wire.SQLQueue:
		// SubscribeBatchSize 1: the queue acks everything it fetched in one
		// transaction. A short AckDeadline: when the consuming transaction's
		// connection is cut mid-handler, the subscriber resends the nacked
		// message into the dead transaction (the middleware refuses each
		// time, ErrConsumingTxAborted) until the deadline, 30 s by default,
		// ends it; only then does a new transaction fetch the message again.
		var (
			schema  wsql.SchemaAdapter  = wsql.PostgreSQLQueueSchema{SubscribeBatchSize: 1}
			offsets wsql.OffsetsAdapter = wsql.PostgreSQLQueueOffsetsAdapter{}
		)
		if cfg.db == wire.MySQL {
			schema, offsets = wsql.MySQLQueueSchema{SubscribeBatchSize: 1}, wsql.MySQLQueueOffsetsAdapter{}
		}
		sub, err = watermillsql.NewSubscriber(db, wsql.SubscriberConfig{
			SchemaAdapter:  schema,
			OffsetsAdapter: offsets,
			AckDeadline:    &cfg.ackDeadline,
			PollInterval:   cfg.sqlPoll,
			ResendInterval: 20 * time.Millisecond,
			RetryInterval:  50 * time.Millisecond,
		}, logger)
		dcfg.Mode = dedup.Transactional{JoinTx: watermillsql.Tx}
	}
	if err != nil {
		return fmt.Errorf("subscriber: %w", err)
	}
	// watermill-kafka's Subscribe fails at once when no broker answers
	// (its reconnections retry; its first connection does not): a
	// consumer started while the broker restarts waits for it, as a
	// supervisor restarting the process would.
	sub = brokerPatient{Subscriber: sub, patience: time.Minute}

	if cfg.mode == wire.KafkaReserve {
		rs := dedup.Reserve{Lease: lease, HeartbeatInterval: heartbeat,
			InFlightWait: inFlightWait, InFlightPoll: 50 * time.Millisecond}
		if cfg.reserveBatch {
			// One statement of each kind at a time: the deliveries of the
			// consumer's partitions that arrive meanwhile share the next.
			rs.Batch = &dedup.Batch{Statements: 1}
		}
		dcfg.Mode = rs
		api := newProviderClient(cfg.provider)
		h = chargeHandler(api, ks)
		rec, err := reconcile.New(store, reconcile.Config{
			Resolve:    resolver(api),
			Interval:   reconcileInterval,
			StaleAfter: staleAfter,
			Lease:      lease,
			Logger:     logger,
		})
		if err != nil {
			return err
		}
		if err := rec.Start(); err != nil {
			return err
		}
		defer rec.Close()
	} else {
		h = effectHandler(cfg.effectsTable, cfg.name, dialect.Placeholder, ks)
		if cfg.pipeline {
			h = queuedEffectHandler(cfg.effectsTable, cfg.name, ks)
		}
	}
	d, err := dedup.New(store, dcfg)
	if err != nil {
		return err
	}

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: cfg.closeDeadline}, logger)
	if err != nil {
		return err
	}
	// Outermost the poison queue (a conflicting payload is published to the
	// poison topic and acked), then the kill points around the middleware.
	// How many deliveries are in the middleware at once, and the most.
	var inside, peak atomic.Int64
	count := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			n := inside.Add(1)
			defer inside.Add(-1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			return h(msg)
		}
	}
	router.AddMiddleware(poison, count, ks.middleware, d.Middleware)
	router.AddConsumerHandler(wire.Operation, cfg.topic, sub, h)

	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case err := <-routerDone:
		return fmt.Errorf("router: %w", err)
	case <-ctx.Done():
		_ = router.Close()
		return nil
	}
	out.println(wire.LineReady)

	report := func() {
		s, g := d.Stats(), d.GroupStats()
		if cfg.reserveBatch {
			// Reported as groups: statements and what they carried.
			bs := d.BatchStats()
			g.Groups, g.Members = bs.ReserveBatches, bs.Reservations
		}
		out.println(wire.LineStats, wire.Stats{Executed: s.Executed, Duplicates: s.Duplicates, Conflicts: s.Conflicts,
			InFlight: s.InFlight, Retries: s.Retries, Pending: s.Pending, Takeovers: s.Takeovers,
			Groups: g.Groups, Members: g.Members, Peak: uint64(peak.Load())}.String())
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case <-tick.C:
			report()
		case err := <-routerDone:
			return fmt.Errorf("router stopped on its own: %v", err)
		case <-ctx.Done():
			break wait
		}
	}
	if err := router.Close(); err != nil {
		// Show what the router was still waiting for.
		_ = pprof.Lookup("goroutine").WriteTo(stderr, 2)
		return fmt.Errorf("close router: %w", err)
	}
	if err := <-routerDone; err != nil {
		return fmt.Errorf("router: %w", err)
	}
	report()
	return nil
}

// brokerPatient subscribes again, for up to patience, while no Kafka
// broker answers.
type brokerPatient struct {
	message.Subscriber
	patience time.Duration
}

func (s brokerPatient) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	deadline := time.Now().Add(s.patience)
	for {
		ch, err := s.Subscriber.Subscribe(ctx, topic)
		if err == nil || !errors.Is(err, sarama.ErrOutOfBrokers) || time.Now().After(deadline) {
			return ch, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}
