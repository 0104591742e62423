// Command quickstart shows inboxmill's promise end to end with no servers:
// a SQLite inbox, Watermill's in-memory GoChannel, and a stream of order
// events with everything at-least-once delivery throws at a consumer —
// producer retries, handler failures, acks lost after the commit, and one
// event ID reused for a different order. Every order ships exactly once.
//
// Run it twice: the SQLite file persists, so the second run finds every
// event already done and ships nothing new, as its note at the start says;
// -reset starts over.
//
//	go run ./examples/quickstart
//	go run ./examples/quickstart -db /tmp/shop.db -events 100
//
// The run gives up after a deadline that grows with -events (see -h).
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
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "modernc.org/sqlite"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/examples/internal/rerun"
	"github.com/inboxmill/inboxmill/examples/internal/shop"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

const (
	ordersTopic = "orders"
	poisonTopic = "orders.poison"
	// inFlight bounds the messages published and not yet acked, as a
	// broker's prefetch limit does. GoChannel hands the router every
	// message at once, each to its own handler goroutine: thousands of
	// transactions queueing for SQLite's one writer outwait its busy
	// timeout and fail over and over (10,000 events did not finish in two
	// minutes), and even hundreds only slow each other down.
	inFlight = 64
)

func main() { os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr)) }

// cli runs the command with args and returns its exit status.
func cli(args []string, stdout, stderr io.Writer) int {
	var cfg config
	fs := flag.NewFlagSet("quickstart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.dbPath, "db", "inboxmill-quickstart.db", "SQLite file for the inbox and the shipments table")
	fs.IntVar(&cfg.events, "events", 20, fmt.Sprintf(
		"number of distinct order events; the run gives up after %v or %v per event, whichever is longer",
		runDeadline.Min, runDeadline.PerEvent))
	fs.BoolVar(&cfg.reset, "reset", false, "drop the inbox and the shipments table in -db first and start over")
	fs.BoolVar(&cfg.verbose, "v", false, "log every delivery")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), runDeadline.For(cfg.events))
	defer cancel()
	if _, err := run(ctx, cfg, stdout); err != nil {
		fmt.Fprintln(stderr, "quickstart:", err)
		return 1
	}
	return 0
}

// The run's deadline grows with the work: 2 minutes, or a share of time for
// each event when that is longer. 20 events take well under a second;
// 10,000 take 10 to 30 seconds on a busy machine.
var runDeadline = rerun.Deadline{Min: 2 * time.Minute, PerEvent: 30 * time.Millisecond}

type config struct {
	dbPath         string
	events         int
	reset, verbose bool
}

type summary struct {
	published, delivered, executed, duplicates, conflicts, poisoned int
	shipments, distinctShipments                                    int
}

func run(ctx context.Context, cfg config, out io.Writer) (summary, error) {
	var sum summary
	if cfg.events < 7 {
		return sum, errors.New("-events must be at least 7")
	}
	db, err := sql.Open("sqlite", sqlite.DSN(cfg.dbPath))
	if err != nil {
		return sum, err
	}
	defer db.Close()

	store, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{Table: "inbox"})
	if err != nil {
		return sum, err
	}
	defer store.Close()
	if cfg.reset {
		if err := rerun.Reset(ctx, out, store, "shipments"); err != nil {
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
	// The application's own table. The handler writes to it in the same
	// transaction as the inbox record: both commit, or neither does.
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS shipments (
		event_id TEXT NOT NULL, order_id TEXT NOT NULL, sku TEXT NOT NULL, qty INTEGER NOT NULL)`); err != nil {
		return sum, err
	}
	found, err := rerun.Find(ctx, store)
	if err != nil {
		return sum, err
	}
	fmt.Fprintf(out, "database: SQLite file %s\n", cfg.dbPath)
	found.Report(out, cfg.events)

	logger := watermill.LoggerAdapter(watermill.NopLogger{})
	if cfg.verbose {
		logger = watermill.NewStdLogger(true, false)
	}
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 256}, logger)
	defer pubSub.Close()

	d, err := dedup.New(store, dedup.Config{
		Key:          dedup.KeyFromMetadata("event_id"),
		Scope:        dedup.ScopeFromMetadata("tenant_id"),
		IgnoreFields: []string{"sent_at"}, // a producer retry stamps a new time; same order
		Logger:       logger,
	})
	if err != nil {
		return sum, err
	}
	poison, err := middleware.PoisonQueueWithFilter(pubSub, poisonTopic, dedup.IsPoison)
	if err != nil {
		return sum, err
	}

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, logger)
	if err != nil {
		return sum, err
	}
	faults := shop.NewFaults()
	// Outermost first: a message that can never succeed goes to the poison
	// topic instead of being redelivered forever; acks are lost after dedup
	// committed, as when a consumer crashes before the broker hears of it.
	router.AddMiddleware(poison, faults.Count, faults.LoseAcks, d.Middleware)
	router.AddConsumerHandler("ship_order", ordersTopic, pubSub,
		faults.ShipOrder(`INSERT INTO shipments (event_id, order_id, sku, qty) VALUES (?, ?, ?, ?)`))

	poisoned, err := pubSub.Subscribe(ctx, poisonTopic)
	if err != nil {
		return sum, err
	}
	go func() { _ = router.Run(ctx) }()
	select {
	case <-router.Running():
	case <-ctx.Done():
		return sum, ctx.Err()
	}

	msgs := shop.Stream(cfg.events)
	for i, m := range msgs {
		for i-faults.Acked(d.Stats()) >= inFlight {
			select {
			case <-ctx.Done():
				return sum, fmt.Errorf("waiting for deliveries: %w (stats %+v)", ctx.Err(), d.Stats())
			case <-time.After(time.Millisecond):
			}
		}
		if err := pubSub.Publish(ordersTopic, m); err != nil {
			return sum, err
		}
	}
	for !faults.Settled(d.Stats(), len(msgs)) {
		select {
		case <-ctx.Done():
			return sum, fmt.Errorf("waiting for deliveries: %w (stats %+v)", ctx.Err(), d.Stats())
		case <-time.After(5 * time.Millisecond):
		}
	}
	conflicts := int(d.Stats().Conflicts)
	for range conflicts {
		select {
		case pm := <-poisoned:
			pm.Ack()
			sum.poisoned++
			fmt.Fprintf(out, "poison queue: event %s refused: %s\n",
				pm.Metadata.Get("event_id"), pm.Metadata.Get(middleware.ReasonForPoisonedKey))
		case <-ctx.Done():
			return sum, ctx.Err()
		}
	}
	if err := router.Close(); err != nil {
		return sum, err
	}

	st := d.Stats()
	sum.delivered = faults.Delivered()
	sum.published = len(msgs)
	sum.executed, sum.duplicates, sum.conflicts = int(st.Executed), int(st.Duplicates), int(st.Conflicts)
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT event_id) FROM shipments`).
		Scan(&sum.shipments, &sum.distinctShipments); err != nil {
		return sum, err
	}
	return sum, shop.Report(out, st, sum.delivered, sum.published, cfg.events, sum.shipments, sum.distinctShipments, "")
}
