// Command quickstart shows inboxmill's promise end to end with no servers:
// a SQLite inbox, Watermill's in-memory GoChannel, and a stream of order
// events with everything at-least-once delivery throws at a consumer —
// producer retries, handler failures, acks lost after the commit, and one
// event ID reused for a different order. Every order ships exactly once.
//
// Run it twice: the SQLite file persists, so the second run finds every
// event already done and ships nothing new.
//
//	go run ./examples/quickstart
//	go run ./examples/quickstart -db /tmp/shop.db -events 100
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
	"github.com/inboxmill/inboxmill/examples/internal/shop"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

const (
	ordersTopic = "orders"
	poisonTopic = "orders.poison"
)

func main() {
	var cfg config
	flag.StringVar(&cfg.dbPath, "db", "inboxmill-quickstart.db", "SQLite file for the inbox and the shipments table")
	flag.IntVar(&cfg.events, "events", 20, "number of distinct order events")
	flag.BoolVar(&cfg.verbose, "v", false, "log every delivery")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

type config struct {
	dbPath  string
	events  int
	verbose bool
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
	var before int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM shipments`).Scan(&before); err != nil {
		return sum, err
	}
	fmt.Fprintf(out, "inbox: SQLite file %s (%d shipments from earlier runs)\n", cfg.dbPath, before)

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
	for _, m := range msgs {
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
