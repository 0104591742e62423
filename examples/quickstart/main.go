// Command quickstart shows inboxmill's promise end to end with no servers:
// a SQLite inbox, Watermill's in-memory GoChannel, and a stream of order
// events with everything at-least-once delivery throws at a consumer —
// producer retries, handler failures, acks lost after the commit, and one
// event ID reused for a different order. Every order ships exactly once.
//
// Run it twice: the SQLite file persists, so the second run finds every
// event already done and ships nothing new, as its note at the start says;
// -reset starts over. With -operator it also books a carrier for two of
// the orders in reserve mode and leaves one booking pending (the carrier
// timed out after the request went out) and one failed (the carrier
// refused it), for the operator command to resolve and forget:
//
//	go run ./examples/quickstart
//	go run ./examples/quickstart -operator   # then: go run ./cmd/inboxmill stats --dsn inboxmill-quickstart.db
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
	"strings"
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
	fs.BoolVar(&cfg.operator, "operator", false,
		"also book a carrier for two orders, leaving one booking pending and one failed for inboxmill resolve and forget")
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
	dbPath                   string
	events                   int
	reset, verbose, operator bool
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
	records := cfg.events
	if cfg.operator {
		records += len(bookings)
	}
	found.Report(out, records)

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
	if cfg.operator {
		if err := leaveForOperator(ctx, store, logger, cfg.dbPath, out); err != nil {
			return sum, err
		}
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

// bookOperation is the operation of the carrier bookings -operator makes.
const bookOperation = "book_carrier"

// bookings are the events -operator books a carrier for, and how the
// carrier answers each: event 3 times out after the request went out,
// event 5 is refused.
var bookings = []struct {
	event   int
	outcome error
}{
	{3, dedup.Uncertain(errors.New("the carrier's API timed out after the booking was sent"), "")},
	{5, dedup.Permanent(errors.New("the carrier refuses the delivery address"))},
}

// leaveForOperator books a carrier for the events of bookings in reserve
// mode, the mode for an effect outside the database: the booking is an
// API call that can end without an answer. One booking is left pending
// (no one knows whether the carrier booked it) and one failed, which is
// what inboxmill resolve and forget act on. A second run finds both
// records and leaves them as they are. Outside a router the middleware is
// called directly, with Config.Operation set.
func leaveForOperator(ctx context.Context, store *inbox.Store, logger watermill.LoggerAdapter, dbPath string, out io.Writer) error {
	d, err := dedup.New(store, dedup.Config{
		Key:          dedup.KeyFromMetadata("event_id"),
		Scope:        dedup.ScopeFromMetadata("tenant_id"),
		Operation:    bookOperation,
		IgnoreFields: []string{"sent_at"},
		Mode:         dedup.Reserve{InFlightWait: -1}, // a pending booking is answered at once
		Logger:       logger,
	})
	if err != nil {
		return err
	}
	for _, b := range bookings {
		msg := shop.OrderMessage(b.event, 1)
		// Both deliveries fail: the pending one is nacked until someone
		// settles it, the failed one is poison. The records tell.
		_, deliveryErr := d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, b.outcome })(msg)
		id := inbox.ID{Scope: msg.Metadata.Get("tenant_id"), Operation: bookOperation, Key: msg.Metadata.Get("event_id")}
		rec, err := store.Get(ctx, store.DB(), id)
		if err != nil {
			return fmt.Errorf("book a carrier for %s: %w (the delivery returned %v)", id.Key, err, deliveryErr)
		}
		what := "the carrier refused it for good; forget it to book again once the address is fixed"
		if rec.Status == inbox.StatusPending {
			what = "the carrier timed out after the request went out, so no one knows whether it booked; " +
				"resolve it once the carrier says, or forget it to book again"
		}
		fmt.Fprintf(out, "operator: %s %s is %s (key_digest %s): %s\n", bookOperation, id.Key, rec.Status, id.Digest(), what)
	}
	fmt.Fprintf(out, "operator: see them with `go run ./cmd/inboxmill list --dsn %s --operation %s` "+
		"(README, Operating inboxmill)\n", shellQuote(dbPath), bookOperation)
	return nil
}

// shellQuote quotes s for a POSIX shell when it holds more than a path's
// usual characters.
func shellQuote(s string) string {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-./:@%+=,", r)) {
			return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
		}
	}
	return s
}
