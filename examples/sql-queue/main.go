// Command sql-queue runs inboxmill behind watermill-sql's PostgreSQL queue.
// The middleware joins the transaction the subscriber consumed the message
// in, so the queue's ack, the inbox record and the handler's writes commit
// together; every attempt runs under a savepoint, so an attempt that fails
// halfway leaves nothing behind for the retry to commit.
//
// It needs PostgreSQL (default: 127.0.0.1:5432, database test, user
// postgres; see docker-compose.yml):
//
//	go run ./examples/sql-queue
//	go run ./examples/sql-queue -dsn 'postgres://user:pass@host:5432/db?sslmode=disable'
//
// Its tables stay in the database: run it again and every event is
// already recorded, so all are acknowledged as duplicates (executed=0), as
// the program's first line of output says. -reset drops its tables first
// and starts over.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/watermillsql"
	"github.com/inboxmill/inboxmill/examples/internal/rerun"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/internal/dsn"
)

func main() { os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr)) }

// cli runs the command with args and returns its exit status.
func cli(args []string, stdout, stderr io.Writer) int {
	var cfg config
	fs := flag.NewFlagSet("sql-queue", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.dsn, "dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL DSN")
	fs.StringVar(&cfg.topic, "topic", "inboxmill_invoices", "queue topic (table watermill_<topic>)")
	fs.StringVar(&cfg.table, "table", "sqlqueue_inbox", "inbox table; the invoices go to <table>_invoices")
	fs.IntVar(&cfg.events, "events", 30, fmt.Sprintf(
		"number of distinct invoice events; the run gives up after %v or %v per event, whichever is longer",
		runDeadline.Min, runDeadline.PerEvent))
	fs.BoolVar(&cfg.reset, "reset", false,
		"drop the example's tables first (the inbox, <table>_invoices and the queue table) and start over")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), runDeadline.For(cfg.events))
	defer cancel()
	if _, err := run(ctx, cfg, stdout); err != nil {
		fmt.Fprintln(stderr, "sql-queue:", err)
		return 1
	}
	return 0
}

// The run's deadline grows with the work: 2 minutes, or a share of time for
// each event when that is longer. 20,000 events take about two minutes.
var runDeadline = rerun.Deadline{Min: 2 * time.Minute, PerEvent: 20 * time.Millisecond}

type config struct {
	dsn, topic, table string
	events            int
	reset             bool
}

type summary struct{ published, delivered, executed, duplicates, conflicts, rows, distinct int }

func run(ctx context.Context, cfg config, out io.Writer) (summary, error) {
	var sum summary
	db, err := sql.Open("pgx", cfg.dsn)
	if err != nil {
		return sum, err
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return sum, fmt.Errorf("PostgreSQL at %s: %w", dsn.Redact(cfg.dsn), err)
	}
	store, err := inbox.NewStore(db, postgres.Dialect(), inbox.Config{Table: cfg.table})
	if err != nil {
		return sum, err
	}
	invoices := cfg.table + "_invoices"
	// SubscribeBatchSize 1: the queue acks everything it fetched in one
	// transaction, so a batch would ack a failed message with the rest.
	schema := wsql.PostgreSQLQueueSchema{SubscribeBatchSize: 1}
	queue := schema.MessagesTable(cfg.topic)
	if cfg.reset {
		if err := rerun.Reset(ctx, out, store, invoices, queue); err != nil {
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
	found.Report(out, cfg.events)
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+invoices+` (
		event_id text NOT NULL, line integer NOT NULL, amount integer NOT NULL)`); err != nil {
		return sum, err
	}

	logger := watermill.NopLogger{}
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(db),
		wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
	if err != nil {
		return sum, err
	}
	// watermillsql.NewSubscriber, not wsql.NewSubscriber: its commit waits
	// for a handler still running when the subscriber gives up on a message
	// (closing, or past the ack deadline), and it acks only what was
	// delivered, so batches are safe too.
	sub, err := watermillsql.NewSubscriber(db, wsql.SubscriberConfig{
		SchemaAdapter:    schema,
		OffsetsAdapter:   wsql.PostgreSQLQueueOffsetsAdapter{},
		InitializeSchema: true,
		PollInterval:     20 * time.Millisecond,
		ResendInterval:   10 * time.Millisecond, // a nacked message comes back at once, not after the default second
	}, logger)
	if err != nil {
		return sum, err
	}
	defer sub.Close()
	if err := sub.SubscribeInitialize(cfg.topic); err != nil {
		return sum, err
	}
	// The queue fetches WHERE NOT acked ORDER BY "offset" and indexes only
	// "offset": without this index every fetch walks past all the rows
	// acked before it.
	if _, err := db.ExecContext(ctx, `CREATE INDEX IF NOT EXISTS "watermill_`+cfg.topic+`_unacked" ON `+queue+
		` ("offset") WHERE NOT acked`); err != nil {
		return sum, err
	}
	// Messages an earlier run published but did not consume (it was
	// stopped) are delivered in this run too: count them in.
	var leftover int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+queue+` WHERE NOT acked`).Scan(&leftover); err != nil {
		return sum, err
	}
	rerun.Queued(out, leftover, queue)

	d, err := dedup.New(store, dedup.Config{
		Key:  dedup.KeyFromMetadata("event_id"),
		Mode: dedup.Transactional{JoinTx: watermillsql.Tx}, // run in the consuming transaction
	})
	if err != nil {
		return sum, err
	}
	poisonPubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, logger)
	defer poisonPubSub.Close()
	poison, err := middleware.PoisonQueueWithFilter(poisonPubSub, "invoices.poison", dedup.IsPoison)
	if err != nil {
		return sum, err
	}

	var mu sync.Mutex
	delivered := 0
	failedOnce := map[string]bool{}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return sum, err
	}
	router.AddMiddleware(poison, func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			mu.Lock()
			delivered++
			mu.Unlock()
			return h(msg)
		}
	}, d.Middleware)
	router.AddConsumerHandler("book_invoice", cfg.topic, sub, func(msg *message.Message) error {
		tx, _ := dedup.TxFromContext(msg.Context())
		id := msg.Metadata.Get("event_id")
		for line := 1; line <= 2; line++ {
			if _, err := tx.ExecContext(msg.Context(),
				`INSERT INTO `+invoices+` (event_id, line, amount) VALUES ($1, $2, 100)`, id, line); err != nil {
				return err
			}
			// Every fifth event fails once between its two writes. The
			// queue resends it in the same transaction; the savepoint has
			// already taken the first write back.
			mu.Lock()
			fail := line == 1 && !failedOnce[id] && len(id) > 0 && id[len(id)-1] == '5'
			if fail {
				failedOnce[id] = true
			}
			mu.Unlock()
			if fail {
				return errors.New("simulated ledger outage between two writes")
			}
		}
		return nil
	})
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = router.Run(rctx) }()
	select {
	case <-router.Running():
	case <-ctx.Done():
		return sum, ctx.Err()
	}

	for i := 1; i <= cfg.events; i++ {
		for copies := 1 + i%4/3; copies > 0; copies-- { // every fourth event twice: a producer retry
			if err := pub.Publish(cfg.topic, invoice(i, 100)); err != nil {
				return sum, err
			}
			sum.published++
		}
	}
	if err := pub.Publish(cfg.topic, invoice(2, 250)); err != nil { // event 2's ID reused for another invoice
		return sum, err
	}
	sum.published++

	// Done when every message was handled and its ack committed: the
	// middleware counts a message before the queue's transaction commits,
	// and stopping the router then would roll that transaction back and
	// leave the message for the next run.
	for {
		st := d.Stats()
		if int(st.Executed+st.Duplicates+st.Conflicts) >= sum.published+leftover {
			var unacked int
			if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+queue+` WHERE NOT acked`).Scan(&unacked); err != nil {
				return sum, err
			}
			if unacked == 0 {
				break
			}
		}
		select {
		case <-ctx.Done():
			return sum, fmt.Errorf("waiting for the queue: %w (%+v)", ctx.Err(), st)
		case <-time.After(10 * time.Millisecond):
		}
	}
	stop()
	if err := router.Close(); err != nil {
		return sum, err
	}
	st := d.Stats()
	mu.Lock()
	sum.delivered = delivered
	mu.Unlock()
	sum.executed, sum.duplicates, sum.conflicts = int(st.Executed), int(st.Duplicates), int(st.Conflicts)
	if err := db.QueryRowContext(ctx, `SELECT count(*), count(DISTINCT event_id) FROM `+invoices).
		Scan(&sum.rows, &sum.distinct); err != nil {
		return sum, err
	}
	fmt.Fprintf(out, "invoices: %d lines for %d events (two lines each, none from a failed attempt)\n", sum.rows, sum.distinct)
	fmt.Fprintf(out, "delivered=%d executed=%d duplicates=%d conflicts=%d\n",
		sum.delivered, sum.executed, sum.duplicates, sum.conflicts)
	if sum.rows != 2*sum.distinct {
		return sum, errors.New("an invoice was booked twice or halfway")
	}
	return sum, nil
}

func invoice(i, amount int) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"invoice":"inv-%04d","amount":%d}`, i, amount))
	msg.Metadata.Set("event_id", fmt.Sprintf("evt-%04d", i))
	return msg
}
