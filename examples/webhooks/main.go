// Command webhooks shows inboxmill's webhook ingress end to end. Two
// simulated providers — Stripe and GitHub — sign and deliver events to
// receivers on 127.0.0.1, retrying the way providers do: an event sent
// twice, a redelivery clicked several times at once, and attempts whose
// client gave up waiting although the receiver had already enqueued the
// event. A few forged, replayed and tampered requests are refused. The
// receivers put every verified request on a queue keyed by the provider's
// event ID; the consumer behind the queue runs each event once through the
// dedup middleware.
//
// With no flags it needs no servers (Watermill's GoChannel and an SQLite
// inbox); with -dsn it runs on watermill-sql's PostgreSQL queue and the
// PostgreSQL inbox:
//
//	go run ./examples/webhooks
//	go run ./examples/webhooks -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//
// It ends with a line like
//
//	received=19 rejected=4 published=15 executed=10 duplicates=5
//
// With -dsn every run has tables of its own, dropped at the end. With -db
// the SQLite file keeps the inbox: run it again and every event is already
// recorded, so all are acknowledged as duplicates (executed=0), as the
// program's note at the start says; -reset starts over.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/examples/internal/rerun"
	"github.com/inboxmill/inboxmill/handlers/webhook"
)

func main() { os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr)) }

// cli runs the command with args and returns its exit status.
func cli(args []string, stdout, stderr io.Writer) int {
	var cfg config
	fs := flag.NewFlagSet("webhooks", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.dsn, "dsn", "", "PostgreSQL DSN: use watermill-sql's queue and the PostgreSQL inbox (default: GoChannel and SQLite)")
	fs.StringVar(&cfg.dbPath, "db", "", "SQLite file to keep (default: a temporary file)")
	fs.BoolVar(&cfg.reset, "reset", false, "with -db, drop the inbox and the business table in the file first and start over")
	fs.BoolVar(&cfg.verbose, "v", false, "print every delivery")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := run(ctx, cfg, stdout); err != nil {
		fmt.Fprintln(stderr, "webhooks:", err)
		return 1
	}
	return 0
}

type config struct {
	dsn, dbPath    string
	reset, verbose bool
}

type summary struct {
	received, rejected, published, executed, duplicates int
	effects, distinctEffects                            int
}

func run(ctx context.Context, cfg config, out io.Writer) (summary, error) {
	var sum summary
	var b *backend
	var err error
	if cfg.dsn != "" {
		b, err = postgresBackend(ctx, cfg.dsn)
	} else {
		b, err = sqliteBackend(ctx, cfg.dbPath, cfg.reset, out)
	}
	if err != nil {
		return sum, err
	}
	defer b.close()
	evs := events()
	if cfg.dbPath != "" && cfg.dsn == "" {
		found, err := rerun.Find(ctx, b.store)
		if err != nil {
			return sum, err
		}
		found.Report(out, len(evs))
	}

	// The consumer: one handler per provider, each running an event once.
	d, err := dedup.New(b.store, dedup.Config{
		Key:   dedup.KeyFromMetadata(webhook.MetadataEventID),
		Scope: dedup.ScopeFromMetadata(webhook.MetadataTenantID),
		// Stripe's pending_webhooks can differ between two deliveries of
		// one event; without this the second would be a payload conflict.
		IgnoreFields: []string{"pending_webhooks"},
		Mode:         dedup.Transactional{JoinTx: b.joinTx},
	})
	if err != nil {
		return sum, err
	}
	poison, err := middleware.PoisonQueueWithFilter(b.poison, "webhooks.poison", dedup.IsPoison)
	if err != nil {
		return sum, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return sum, err
	}
	router.AddMiddleware(poison, d.Middleware)
	record := func(msg *message.Message) error {
		// The business write goes through the claim's transaction: it
		// commits with the inbox record, or not at all.
		tx, ok := dedup.TxFromContext(msg.Context())
		if !ok {
			return errors.New("no dedup transaction")
		}
		_, err := tx.ExecContext(msg.Context(),
			fmt.Sprintf(`INSERT INTO %s (provider, event_id, event_type) VALUES (%s, %s, %s)`, b.effects, b.ph(1), b.ph(2), b.ph(3)),
			msg.Metadata.Get(webhook.MetadataProvider), msg.Metadata.Get(webhook.MetadataEventID),
			msg.Metadata.Get(webhook.MetadataEventType))
		return err
	}
	router.AddConsumerHandler("record_payment", b.stripeTopic, b.subscriber, record)
	router.AddConsumerHandler("start_build", b.githubTopic, b.subscriber, record)
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(ctx) }()
	defer func() {
		_ = router.Close()
		<-routerDone
	}()
	select {
	case <-router.Running():
	case <-ctx.Done():
		return sum, ctx.Err()
	}

	// The ingress: one receiver per provider, each with its secret.
	pub := &countingPublisher{Publisher: b.publisher}
	stripe, err := webhook.NewReceiver(pub, webhook.ReceiverConfig{
		Topic: b.stripeTopic, Verifier: webhook.StripeVerifier(stripeSecret), Tenant: "acme",
	})
	if err != nil {
		return sum, err
	}
	github, err := webhook.NewReceiver(pub, webhook.ReceiverConfig{
		Topic: b.githubTopic, Verifier: webhook.GitHubVerifier(githubSecret), Tenant: "acme",
	})
	if err != nil {
		return sum, err
	}
	mux := http.NewServeMux()
	mux.Handle("/webhooks/stripe", stripe)
	mux.Handle("/webhooks/github", github)
	stats := &requestStats{}
	srv := &http.Server{Handler: stats.count(slowNetwork(mux)), ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return sum, err
	}
	go func() { _ = srv.Serve(ln) }()
	baseURL := "http://" + ln.Addr().String()
	fmt.Fprintf(out, "receivers: %s/webhooks/stripe and /webhooks/github; %s\n", baseURL, b.describe)

	// The providers deliver everything, concurrently, then the attacks.
	s := newSender(baseURL, out, cfg.verbose)
	errs := make([]error, len(evs))
	var wg sync.WaitGroup
	for i, ev := range evs {
		wg.Go(func() { errs[i] = s.deliver(ctx, ev) })
	}
	wg.Wait()
	if err := errors.Join(append(errs, s.attacks(ctx))...); err != nil {
		return sum, err
	}
	s.close()
	// Shutdown waits for requests still being handled, so every count is
	// final.
	if err := srv.Shutdown(ctx); err != nil {
		return sum, err
	}

	// Every published message ends executed or acked as a duplicate.
	published := int(pub.n.Load())
	for st := d.Stats(); int(st.Executed+st.Duplicates) < published; st = d.Stats() {
		select {
		case <-ctx.Done():
			return sum, fmt.Errorf("waiting for the consumer: %w (stats %+v)", ctx.Err(), st)
		case <-time.After(5 * time.Millisecond):
		}
	}
	// Where the queue's consuming transaction carries the business write,
	// the row is there once the queue commits the ack.
	for b.unacked != nil {
		n, err := b.unacked(ctx)
		if err != nil {
			return sum, fmt.Errorf("counting unacked messages: %w", err)
		}
		if n == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return sum, fmt.Errorf("waiting for the queue to commit %d acks: %w", n, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	st := d.Stats()
	sum = summary{received: int(stats.received.Load()), rejected: int(stats.rejected.Load()), published: published,
		executed: int(st.Executed), duplicates: int(st.Duplicates)}
	if err := b.db.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT event_id) FROM `+b.effects).
		Scan(&sum.effects, &sum.distinctEffects); err != nil {
		return sum, err
	}
	fmt.Fprintf(out, "%d events, %d verified deliveries enqueued; business rows: %d for %d distinct events",
		len(evs), published, sum.effects, sum.distinctEffects)
	if sum.effects == sum.distinctEffects {
		fmt.Fprintln(out, " — every event took effect once")
	} else {
		fmt.Fprintln(out, " — DUPLICATE EFFECTS")
	}
	fmt.Fprintf(out, "received=%d rejected=%d published=%d executed=%d duplicates=%d\n",
		sum.received, sum.rejected, sum.published, sum.executed, sum.duplicates)
	if sum.effects != sum.distinctEffects {
		return sum, errors.New("an event took effect more than once")
	}
	return sum, nil
}

// countingPublisher counts successful publishes: what the receivers
// answered 2xx for.
type countingPublisher struct {
	message.Publisher
	n atomic.Int64
}

func (p *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	p.n.Add(int64(len(msgs)))
	return nil
}

// requestStats counts the requests that reached the receivers and those
// refused with a 4xx.
type requestStats struct{ received, rejected atomic.Int64 }

func (s *requestStats) count(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.received.Add(1)
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		if sw.status >= 400 && sw.status < 500 {
			s.rejected.Add(1)
		}
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// slowNetwork stands in for a slow path back to the provider: the answer
// to a request marked with holdHeader leaves only after the provider has
// stopped waiting for it. The receiver has enqueued the event by then; the
// provider, seeing a timeout, delivers it again.
func slowNetwork(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		if r.Header.Get(holdHeader) != "" {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		}
	})
}
