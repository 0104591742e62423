// Command external-effect charges cards through a payment provider that
// does not deduplicate, with everything at-least-once delivery and real
// networks throw at it — and charges every intent exactly once.
//
// The consumer uses inboxmill's reserve/complete mode: a short statement
// reserves the intent under a lease, the provider is called with no
// transaction open and with an idempotency key that is the same for every
// attempt, and a second short statement records the outcome only if the
// lease is still the worker's. Along the way:
//
//   - producers publish some intents twice;
//   - the provider is sometimes unavailable (nothing charged: retried), and
//     sometimes charges but answers after the client gave up (uncertain:
//     the intent goes pending and the reconciler asks the provider);
//   - workers crash right after charging; the queue redelivers, another
//     worker takes the expired lease over and, since an earlier attempt may
//     have charged, asks the provider before charging; when the crashed
//     worker comes back to life its late result is refused (fencing);
//   - the provider holds large charges for a manual review that outlasts
//     the run: those intents stay pending, the queue dead-letters their
//     messages, and, with -db (an inbox that outlives the run), the
//     program prints the inboxmill commands an operator runs once the
//     provider has decided.
//
// Everything runs in-process on 127.0.0.1 with a SQLite inbox: no servers.
//
//	go run ./examples/external-effect
//	go run ./examples/external-effect -db payments.db   # then run the inboxmill commands it prints
//	go run ./examples/external-effect -intents 200 -workers 8 -seed 7
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "modernc.org/sqlite"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/handlers/reconcile"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

func main() {
	var cfg config
	flag.IntVar(&cfg.intents, "intents", 40, "number of payment intents")
	flag.IntVar(&cfg.workers, "workers", 4, "consumer workers")
	flag.Int64Var(&cfg.seed, "seed", 1, "seed for the provider's failures and the workers' crashes")
	flag.StringVar(&cfg.dbPath, "db", "", "SQLite file for the inbox (default: a new temporary file)")
	flag.BoolVar(&cfg.verbose, "v", false, "log every delivery")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "external-effect:", err)
		os.Exit(1)
	}
}

type config struct {
	intents, workers int
	seed             int64
	dbPath           string
	verbose          bool
	// slowdown multiplies every timing below (0: 1), for a machine so
	// busy that the provider's fast answers miss the client's timeout.
	slowdown int
}

type summary struct {
	intents, charges, pendingResolved, doubleCharges int
	declined, crashes, fenced, takeovers             int
	// inReview are the intents left pending for the operator; deadLettered
	// the messages the queue gave up on.
	inReview, deadLettered int
}

// Timings, scaled down so a run takes seconds: the client waits 100 ms for
// the provider, whose slow answers take 300 ms; a lease lasts 400 ms and the
// queue redelivers an unacked message after 600 ms, up to maxReceives times.
const (
	clientTimeout = 100 * time.Millisecond
	slowAnswer    = 300 * time.Millisecond
	lease         = 400 * time.Millisecond
	visibility    = 600 * time.Millisecond
	maxReceives   = 10
)

// table is the example's inbox table.
const table = "payment_inbox"

func run(ctx context.Context, cfg config, out io.Writer) (summary, error) {
	var sum summary
	if cfg.intents < 1 || cfg.workers < 1 {
		return sum, errors.New("-intents and -workers must be positive")
	}
	k := time.Duration(max(cfg.slowdown, 1))
	psp, err := startProvider(cfg.seed, k*slowAnswer)
	if err != nil {
		return sum, err
	}
	defer psp.close()
	api := &client{base: psp.addr, http: &http.Client{Timeout: k * clientTimeout}}

	dbPath, kept := cfg.dbPath, cfg.dbPath != ""
	if dbPath == "" {
		dir, err := os.MkdirTemp("", "inboxmill-external-effect")
		if err != nil {
			return sum, err
		}
		defer os.RemoveAll(dir)
		dbPath = filepath.Join(dir, "inbox.db")
	}
	db, err := sql.Open("sqlite", sqlite.DSN(dbPath))
	if err != nil {
		return sum, err
	}
	defer db.Close()
	store, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{Table: table})
	if err != nil {
		return sum, err
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

	logger := watermill.LoggerAdapter(watermill.NopLogger{})
	if cfg.verbose {
		logger = watermill.NewStdLogger(true, false)
	}
	d, err := dedup.New(store, dedup.Config{
		Key:       dedup.KeyFromMetadata("intent_id"),
		Operation: "charge_card",
		Mode: dedup.Reserve{
			Lease:             k * lease,
			HeartbeatInterval: k * lease / 4,
			InFlightWait:      300 * time.Millisecond,
			InFlightPoll:      20 * time.Millisecond,
		},
		Logger: logger,
	})
	if err != nil {
		return sum, err
	}

	// The reconciler asks the provider what became of pending intents, by
	// the idempotency key the handler sent.
	var pendingResolved atomic.Int64
	rec, err := reconcile.New(store, reconcile.Config{
		Interval:   100 * time.Millisecond,
		StaleAfter: 5 * time.Second,
		Logger:     logger,
		Resolve: func(ctx context.Context, r *inbox.Record) (reconcile.Resolution, error) {
			found, err := api.find(ctx, r.IdempotencyKey())
			switch {
			case err != nil:
				return reconcile.Resolution{}, err
			case len(found) > 0 && found[0].Status == "review":
				// The provider has not decided: only an operator can
				// settle it, once it has. The record keeps the charge's
				// reference for them.
				return reconcile.Resolution{Verdict: reconcile.Unresolved, ExternalRef: found[0].ID}, nil
			case len(found) > 0:
				if r.Status == inbox.StatusPending {
					pendingResolved.Add(1)
				}
				return reconcile.Resolution{Verdict: reconcile.Succeeded, ExternalRef: found[0].ID}, nil
			default:
				return reconcile.Resolution{Verdict: reconcile.NotHappened}, nil
			}
		},
	})
	if err != nil {
		return sum, err
	}
	if err := rec.Start(); err != nil {
		return sum, err
	}
	defer rec.Close()

	q := newQueue(k*visibility, maxReceives)
	for i := 1; i <= cfg.intents; i++ {
		q.publish(intentMessage(i))
		if i%7 == 0 { // a producer retry
			q.publish(intentMessage(i))
		}
	}

	workCtx, stopWork := context.WithCancel(ctx)
	c := &consumers{q: q, api: api, d: d, seed: cfg.seed, root: workCtx, zombies: make(chan struct{})}
	for range cfg.workers {
		c.spawn()
	}
	for !q.idle() {
		select {
		case <-ctx.Done():
			stopWork()
			return sum, fmt.Errorf("waiting for the queue to drain: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	stopWork()
	// The crashed workers come back to life and try to record what they did.
	close(c.zombies)
	c.wg.Wait()
	// One last reconciliation settles what the provider has decided on,
	// however quickly the queue gave up on its messages.
	if err := rec.Close(); err != nil {
		return sum, err
	}
	if _, err := rec.RunOnce(ctx); err != nil {
		return sum, err
	}

	sum.intents = cfg.intents
	sum.charges, sum.doubleCharges = psp.totals()
	sum.pendingResolved = int(pendingResolved.Load())
	sum.crashes, sum.fenced = int(c.crashes.Load()), int(c.fenced.Load())
	sum.takeovers = int(d.Stats().Takeovers)
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM payment_inbox WHERE status = 'failed'`).Scan(&sum.declined); err != nil {
		return sum, err
	}
	var unfinished int
	if err := db.QueryRowContext(ctx,
		`SELECT COUNT(*) FROM payment_inbox WHERE status NOT IN ('completed', 'failed')`).Scan(&unfinished); err != nil {
		return sum, err
	}
	inReview, err := store.ListPending(ctx, cfg.intents)
	if err != nil {
		return sum, err
	}
	sum.inReview, sum.deadLettered = len(inReview), len(q.deadLettered())
	st := d.Stats()
	fmt.Fprintf(out, "deliveries: executed=%d duplicates=%d retries=%d pending=%d in_flight=%d failed=%d takeovers=%d\n",
		st.Executed, st.Duplicates, st.Retries, st.Pending, st.InFlight, st.Failed, st.Takeovers)
	fmt.Fprintf(out, "workers crashed after charging: %d; late results refused by fencing: %d\n", sum.crashes, sum.fenced)
	fmt.Fprintf(out, "declined (failed for good): %d; unfinished records: %d\n", sum.declined, unfinished)
	if err := operatorCommands(out, dbPath, kept, inReview, sum.deadLettered); err != nil {
		return sum, err
	}
	fmt.Fprintf(out, "intents=%d charges=%d pending_resolved=%d double_charges=%d\n",
		sum.intents, sum.charges, sum.pendingResolved, sum.doubleCharges)
	switch {
	case sum.doubleCharges != 0:
		return sum, fmt.Errorf("%d intents were charged twice", sum.doubleCharges)
	case sum.charges != sum.intents-sum.declined:
		return sum, fmt.Errorf("%d charges for %d chargeable intents", sum.charges, sum.intents-sum.declined)
	case sum.inReview != reviewed(cfg.intents):
		return sum, fmt.Errorf("%d intents left pending, %d held for review", sum.inReview, reviewed(cfg.intents))
	case unfinished != sum.inReview:
		return sum, fmt.Errorf("%d records unfinished, %d of them pending review", unfinished, sum.inReview)
	}
	return sum, nil
}

// operatorCommands prints, for the intents left pending, the inboxmill
// commands an operator runs once the provider has decided: inspect by the
// key digest the logs print, and resolve, fenced by the attempt seen. For
// an inbox in a temporary file, removed on exit, it prints none: they
// could only fail.
func operatorCommands(out io.Writer, dbPath string, kept bool, pending []*inbox.Record, deadLettered int) error {
	if len(pending) == 0 {
		return nil
	}
	fmt.Fprintf(out, "left pending: %d intents whose charges the provider holds for review "+
		"(the queue dead-lettered %d messages)", len(pending), deadLettered)
	if !kept {
		fmt.Fprintln(out, "; this run's inbox is a temporary file, removed on exit: "+
			"run with -db FILE to keep it, and the commands that settle them are printed")
		return nil
	}
	abs, err := filepath.Abs(dbPath)
	if err != nil {
		return err
	}
	conn := "--dsn " + shellQuote(abs) + " --table " + table
	fmt.Fprintln(out, "; once it has decided, an operator runs:")
	for _, r := range pending {
		fmt.Fprintf(out, "  inboxmill inspect %s --digest %s\n", conn, r.Digest())
		fmt.Fprintf(out, "  inboxmill resolve %s --operation %s --key %s --attempt %d --to completed --external-ref %s "+
			"--reason 'provider approved the charge after review'\n",
			conn, shellQuote(r.Operation), shellQuote(r.Key), r.Attempt, shellQuote(r.ExternalRef))
	}
	fmt.Fprintln(out, "  (for a charge the provider declined: --to failed --reason 'provider declined the charge after review')")
	fmt.Fprintln(out, "  (in a clone of inboxmill, `go run ./cmd/inboxmill` in place of `inboxmill`)")
	return nil
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-./:@%+=,", r)) {
			return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
		}
	}
	if s == "" {
		return "''"
	}
	return s
}

// intentMessage is "charge this card for intent i". Every 11th amount is
// over the card's limit and is declined; every 13th (not 11th) is large
// enough for the provider to hold it for review.
func intentMessage(i int) *message.Message {
	amount := 100 + i
	switch {
	case i%11 == 0:
		amount = 9000
	case i%13 == 0:
		amount = reviewAbove + 500
	}
	msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"intent":"pi_%04d","amount":%d}`, i, amount))
	msg.Metadata.Set("intent_id", fmt.Sprintf("pi_%04d", i))
	return msg
}

// reviewed is how many of n intents the provider holds for review.
func reviewed(n int) int {
	r := 0
	for i := 1; i <= n; i++ {
		if i%13 == 0 && i%11 != 0 {
			r++
		}
	}
	return r
}
