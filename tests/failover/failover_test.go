// Package failover_test proves the middleware's guarantee across a
// PostgreSQL failover. Each subtest starts a scratch primary with a
// streaming synchronous standby (see pair_test.go), an in-process
// Kafka-protocol broker and two consumers — routers with the dedup
// middleware, as two processes would run them — and streams business events
// with producer retries through them. A third of the way in, the primary is
// killed (pg_ctl stop -m immediate) and the standby promoted; the consumers
// keep running, their DSN naming both servers with
// target_session_attrs=read-write. When the stream has drained every
// event's effect is counted on the promoted standby.
//
// With synchronous replication (synchronous_commit = on) no effect may be
// lost or duplicated. With synchronous_commit = off the test measures and
// logs what acknowledged work the failover lost, and still fails on a
// duplicated effect.
//
// INBOXMILL_FAILOVER_EVENTS (or -failover.events) sets the number of events
// per subtest; the default is a quick run.
package failover_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	_ "github.com/lib/pq"              // registers "postgres"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/internal/kafkatest"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

var eventsFlag = flag.Int("failover.events", 0, "events per subtest (default: $INBOXMILL_FAILOVER_EVENTS or 500)")

func eventCount(t *testing.T) int {
	if *eventsFlag > 0 {
		return *eventsFlag
	}
	if s := os.Getenv("INBOXMILL_FAILOVER_EVENTS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "INBOXMILL_FAILOVER_EVENTS")
		require.GreaterOrEqual(t, n, 50, "INBOXMILL_FAILOVER_EVENTS")
		return n
	}
	return 500
}

const (
	topic      = "events"
	group      = "effects"
	partitions = 4
	consumers  = 2
	// retryShare of the messages are producer retries: a new message with
	// the event ID of one published shortly before.
	retryShare = 0.3
	// downFor is how long no server accepts writes: between the kill and
	// the promotion.
	downFor = 400 * time.Millisecond
	// waitLimit bounds the drain; generous for -race on two cores, never
	// reached when things work.
	waitLimit = 45 * time.Second
)

func TestFailover(t *testing.T) {
	requireBinaries(t)
	for _, c := range []struct {
		name, driver string
		sync         bool
	}{
		{"sync/pgx", "pgx", true},
		{"sync/pq", "postgres", true},
		{"async/pgx", "pgx", false},
		{"async/pq", "postgres", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runFailover(t, c.driver, c.sync)
			r.log(t)

			require.Zero(t, r.duplicated, "events with more than one effect: %v", r.duplicatedIDs)
			require.Empty(t, r.nonRetryable, "deliveries that failed during the failover with an error not classified retryable")
			require.Zero(t, r.poisoned, "messages sent to the poison queue")
			require.Positive(t, r.failed, "no delivery failed: the failover did not happen mid-stream")
			for i, n := range r.ackedAfterPromote {
				require.Positive(t, n, "consumer %d acked nothing after the promotion", i)
			}
			if c.sync {
				require.Zero(t, r.lost, "events without an effect: %v", r.lostIDs)
				require.Zero(t, r.ackedLost, "acknowledged effects missing on the promoted standby")
				require.Equal(t, r.events, r.effects)
			} else {
				// Asynchronous commit: what the failover cost is measured, not
				// asserted; it may be anything from none to everything not yet
				// replicated.
				t.Logf("async: %d acked effects lost of %d acked; %d events left without an effect of %d",
					r.ackedLost, r.acked, r.lost, r.events)
			}
		})
	}
}

// result is what one run measured.
type result struct {
	driver            string
	events, messages  int
	effects           int // rows on the promoted standby
	duplicated, lost  int
	duplicatedIDs     []string
	lostIDs           []string
	acked             int // executions whose commit succeeded and were acked
	ackedLost         int // of those, the ones whose row is missing
	reexecuted        int // events executed (and acked) more than once
	failed            int // deliveries that returned an error
	knownHandlerNet   int // of those, handler statements failed with a bare network error or EOF (not retryable)
	errClasses        map[string]*errClass
	nonRetryable      []string
	poisoned          int
	ackedAfterPromote [consumers]int
	down, firstWrite  time.Duration // kill to promotion, kill to first commit
	killedAtProgress  int           // distinct events acked at the kill
	producedAtKill    int
	inflightAtKill    int64 // handlers inside their transaction at the kill
	ran               time.Duration
}

type errClass struct {
	count, retryable int
	sample           string
}

func (r *result) log(t *testing.T) {
	t.Helper()
	t.Logf("%s: events=%d messages=%d effects=%d duplicated=%d lost=%d acked_executions=%d acked_lost=%d reexecuted=%d",
		r.driver, r.events, r.messages, r.effects, r.duplicated, r.lost, r.acked, r.ackedLost, r.reexecuted)
	t.Logf("kills=1 at %d of %d messages produced, %d events acked, %d handlers in their transaction; promoted %v after the kill; first commit on the new primary %v after the kill; run %v",
		r.producedAtKill, r.messages, r.killedAtProgress, r.inflightAtKill, r.down.Round(time.Millisecond),
		r.firstWrite.Round(time.Millisecond), r.ran.Round(time.Millisecond))
	t.Logf("failed deliveries (nacked, redelivered): %d, of which handler statements failed with a bare network error or EOF, not classified retryable: %d; acked after the promotion per consumer: %v",
		r.failed, r.knownHandlerNet, r.ackedAfterPromote)
	classes := make([]string, 0, len(r.errClasses))
	for k := range r.errClasses {
		classes = append(classes, k)
	}
	sort.Strings(classes)
	for _, k := range classes {
		c := r.errClasses[k]
		t.Logf("  error class %-28s count=%-4d retryable=%-4d e.g. %s", k, c.count, c.retryable, c.sample)
	}
}

// recorder sees every delivery's outcome, outside the dedup middleware.
type recorder struct {
	mu         sync.Mutex
	acked      map[string]bool      // event -> acked at least once
	executions map[string][]string  // event -> tokens of acked executions
	classes    map[string]*errClass // error classes of failed deliveries
	nonRetry   []string
	failed     int
	afterProm  [consumers]int
	firstWrite time.Time

	killedAt, promotedAt time.Time
	execs                sync.Map // *message.Message -> token, set by the handler
	stmtErrs             sync.Map // *message.Message -> the handler's failed statement's error
	// knownHandlerNetErrs are handler statements failed with a bare network
	// error or io.ErrUnexpectedEOF: not retryable, see
	// TestHandlerStatementConnectionLossIsRetryable.
	knownHandlerNetErrs int
	inflight            atomic.Int64
}

func (r *recorder) middleware(consumer int) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			start := time.Now()
			out, err := h(msg)
			tok, ran := r.execs.LoadAndDelete(msg)
			stmtErr, inHandler := r.stmtErrs.LoadAndDelete(msg)
			event := msg.Metadata.Get("event_id")
			r.mu.Lock()
			defer r.mu.Unlock()
			if err != nil {
				r.failed++
				k, sample := classify(err)
				c := r.classes[k]
				if c == nil {
					c = &errClass{sample: sample}
					r.classes[k] = c
				}
				c.count++
				var oe *net.OpError
				switch {
				case dedup.IsRetryable(err):
					c.retryable++
				case inHandler && (errors.As(stmtErr.(error), &oe) || errors.Is(stmtErr.(error), io.ErrUnexpectedEOF)):
					// Known and reported by its own test; counted, not failed here.
					r.knownHandlerNetErrs++
				case len(r.nonRetry) < 20:
					r.nonRetry = append(r.nonRetry, k+": "+sample+" ["+typeChain(err)+"]")
				}
				return out, err
			}
			r.acked[event] = true
			if ran {
				r.executions[event] = append(r.executions[event], tok.(string))
			}
			if !r.killedAt.IsZero() && start.After(r.killedAt) && r.firstWrite.IsZero() {
				r.firstWrite = time.Now()
			}
			if !r.promotedAt.IsZero() && start.After(r.promotedAt) {
				r.afterProm[consumer]++
			}
			return out, err
		}
	}
}

// classify names an error's class the way the classification sees it:
// its SQLSTATE when it has one, else the connection-level cause.
func classify(err error) (string, string) {
	sample := err.Error()
	if len(sample) > 160 {
		sample = sample[:160] + "…"
	}
	var se interface{ SQLState() string }
	var oe *net.OpError
	switch {
	case errors.As(err, &se):
		return "SQLSTATE " + se.SQLState(), sample
	case errors.Is(err, pgconn.ErrConnClosed):
		return "pgconn.ErrConnClosed", sample
	case errors.Is(err, driver.ErrBadConn):
		return "driver.ErrBadConn", sample
	case errors.Is(err, syscall.ECONNREFUSED):
		return "ECONNREFUSED", sample
	case errors.Is(err, syscall.ECONNRESET):
		return "ECONNRESET", sample
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "EOF", sample
	case errors.As(err, &oe):
		return "net.OpError", sample
	case errors.Is(err, sql.ErrConnDone):
		return "sql.ErrConnDone", sample
	case errors.Is(err, sql.ErrTxDone):
		return "sql.ErrTxDone", sample
	}
	inner := err
	for {
		u := errors.Unwrap(inner)
		if u == nil {
			break
		}
		inner = u
	}
	return fmt.Sprintf("%T", inner), sample
}

// typeChain lists the types of err's Unwrap chain (first branch of a join).
func typeChain(err error) string {
	var types []string
	for e := err; e != nil; {
		types = append(types, fmt.Sprintf("%T", e))
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			if errs := u.Unwrap(); len(errs) > 0 {
				e = errs[len(errs)-1]
				continue
			}
			e = nil
		default:
			e = errors.Unwrap(e)
		}
	}
	return strings.Join(types, " > ")
}

type poisonCounter struct{ n atomic.Int64 }

func (p *poisonCounter) Publish(string, ...*message.Message) error { p.n.Add(1); return nil }
func (p *poisonCounter) Close() error                              { return nil }

type consumerProc struct {
	router *message.Router
	db     *sql.DB
	done   chan struct{}
	err    error
}

func runFailover(t *testing.T, drv string, syncCommit bool) *result {
	began := time.Now()
	p := startPair(t, syncCommit)
	n := eventCount(t)
	res := &result{driver: drv, events: n}
	dsn := p.dsn(drv)
	ctx := t.Context()

	admin, err := sql.Open(drv, dsn)
	require.NoError(t, err)
	admin.SetMaxOpenConns(2)
	t.Cleanup(func() { _ = admin.Close() })
	const table = "inbox"
	setup, err := inbox.NewStore(admin, postgres.Dialect(), inbox.Config{Table: table})
	require.NoError(t, err)
	require.NoError(t, setup.Migrate(ctx))
	// No unique constraint on purpose: an effect that happened twice shows
	// up as a second row. token names the execution that wrote the row.
	_, err = admin.ExecContext(ctx, `CREATE TABLE effects (event_id text NOT NULL, consumer int NOT NULL, token text NOT NULL)`)
	require.NoError(t, err)

	brokers := kafkatest.Start(t, partitions, topic)
	rec := &recorder{acked: map[string]bool{}, executions: map[string][]string{}, classes: map[string]*errClass{}}
	poison := &poisonCounter{}
	var seq atomic.Int64
	procs := make([]*consumerProc, consumers)
	for i := range procs {
		procs[i] = startConsumer(t, i, drv, dsn, table, brokers, rec, poison, &seq)
	}
	defer func() {
		for _, c := range procs {
			_ = c.router.Close()
			<-c.done
			_ = c.db.Close()
		}
	}()

	records := stream(n)
	res.messages = len(records)
	prod := newProducer(t, brokers)
	defer prod.Close()

	killAt := len(records) * 35 / 100
	var failover sync.WaitGroup
	const chunk = 10
	for start := 0; start < len(records); start += chunk {
		require.NoError(t, prod.SendMessages(records[start:min(start+chunk, len(records))]))
		if start >= killAt && rec.killedAtIsZero() {
			// Kill while handlers are inside their transactions.
			for deadline := time.Now().Add(time.Second); rec.inflight.Load() < 2 && time.Now().Before(deadline); {
				time.Sleep(100 * time.Microsecond)
			}
			res.inflightAtKill = rec.inflight.Load()
			rec.mu.Lock()
			res.killedAtProgress = len(rec.acked)
			rec.mu.Unlock()
			res.producedAtKill = start + chunk
			failover.Go(func() {
				p.killPrimary()
				killed := time.Now()
				rec.setKilled(killed)
				time.Sleep(downFor)
				p.promote()
				rec.setPromoted(time.Now())
				res.down = time.Since(killed)
			})
			for rec.killedAtIsZero() {
				time.Sleep(time.Millisecond)
			}
		}
		if start == 0 {
			// The group has formed and consumes: only then does the stream go on.
			testkit.WaitFor(t, waitLimit, "the first acked event", func() (bool, error) {
				rec.mu.Lock()
				defer rec.mu.Unlock()
				return len(rec.acked) > 0, nil
			})
		}
		time.Sleep(25 * time.Millisecond)
	}
	failover.Wait()

	testkit.WaitFor(t, waitLimit, "every event acked and every offset committed", func() (bool, error) {
		rec.mu.Lock()
		acked := len(rec.acked)
		rec.mu.Unlock()
		if acked < n {
			return false, fmt.Errorf("%d of %d events acked", acked, n)
		}
		return kafkatest.Consumed(brokers, group, topic)
	})
	for i, c := range procs {
		select {
		case <-c.done:
			t.Fatalf("consumer %d's router stopped during the run: %v", i, c.err)
		default:
		}
		require.True(t, c.router.IsRunning(), "consumer %d's router is running", i)
	}

	// Count on the promoted standby: the only server left.
	check, err := sql.Open("pgx", p.nodeDSN(1))
	require.NoError(t, err)
	defer check.Close()
	var inRecovery bool
	require.NoError(t, check.QueryRowContext(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery))
	require.False(t, inRecovery, "the standby was promoted")
	rows, err := check.QueryContext(ctx, `SELECT event_id, token FROM effects`)
	require.NoError(t, err)
	perEvent := map[string]int{}
	tokens := map[string]bool{}
	for rows.Next() {
		var ev, tok string
		require.NoError(t, rows.Scan(&ev, &tok))
		perEvent[ev]++
		tokens[tok] = true
		res.effects++
	}
	require.NoError(t, rows.Err())
	require.NoError(t, rows.Close())

	rec.mu.Lock()
	defer rec.mu.Unlock()
	for i := range n {
		id := eventID(i)
		switch c := perEvent[id]; {
		case c == 0:
			res.lost++
			res.lostIDs = append(res.lostIDs, id)
		case c > 1:
			res.duplicated++
			res.duplicatedIDs = append(res.duplicatedIDs, id)
		}
		ex := rec.executions[id]
		res.acked += len(ex)
		if len(ex) > 1 {
			res.reexecuted++
		}
		for _, tok := range ex {
			if !tokens[tok] {
				res.ackedLost++
			}
		}
	}
	res.failed, res.errClasses, res.nonRetryable = rec.failed, rec.classes, rec.nonRetry
	res.knownHandlerNet = rec.knownHandlerNetErrs
	res.ackedAfterPromote = rec.afterProm
	if !rec.firstWrite.IsZero() {
		res.firstWrite = rec.firstWrite.Sub(rec.killedAt)
	}
	res.poisoned = int(poison.n.Load())
	res.ran = time.Since(began)
	return res
}

func (r *recorder) killedAtIsZero() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.killedAt.IsZero()
}

func (r *recorder) setKilled(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.killedAt = at
}

func (r *recorder) setPromoted(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.promotedAt = at
}

func startConsumer(t *testing.T, i int, drv, dsn, table string, brokers []string, rec *recorder,
	poison message.Publisher, seq *atomic.Int64,
) *consumerProc {
	t.Helper()
	db, err := sql.Open(drv, dsn)
	require.NoError(t, err)
	db.SetMaxOpenConns(4)
	db.SetMaxIdleConns(4)
	store, err := inbox.NewStore(db, postgres.Dialect(), inbox.Config{Table: table})
	require.NoError(t, err)
	d, err := dedup.New(store, dedup.Config{
		Key:   dedup.KeyFromMetadata("event_id"),
		Scope: dedup.ScopeFromMetadata("tenant_id"),
	})
	require.NoError(t, err)

	cfg := kafkatest.Config()
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		ConsumerGroup:         group,
		OverwriteSaramaConfig: cfg,
		NackResendSleep:       20 * time.Millisecond,
		ReconnectRetrySleep:   100 * time.Millisecond,
	}, watermill.NopLogger{})
	require.NoError(t, err)

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	pq, err := middleware.PoisonQueueWithFilter(poison, "poison", dedup.IsPoison)
	require.NoError(t, err)
	router.AddMiddleware(pq, rec.middleware(i), d.Middleware)
	router.AddConsumerHandler("record_effect", topic, sub, func(msg *message.Message) error {
		tx, ok := dedup.TxFromContext(msg.Context())
		if !ok {
			return errors.New("no transaction in the message's context")
		}
		// Work while the transaction is open, before and after the write, so
		// that the kill finds handlers and commits in flight.
		rec.inflight.Add(1)
		defer rec.inflight.Add(-1)
		time.Sleep(2 * time.Millisecond)
		tok := fmt.Sprintf("c%d-%d", i, seq.Add(1))
		if _, err := tx.ExecContext(msg.Context(), `INSERT INTO effects (event_id, consumer, token) VALUES ($1, $2, $3)`,
			msg.Metadata.Get("event_id"), i, tok); err != nil {
			rec.stmtErrs.Store(msg, err)
			return err
		}
		time.Sleep(2 * time.Millisecond)
		rec.execs.Store(msg, tok)
		return nil
	})
	c := &consumerProc{router: router, db: db, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		c.err = router.Run(context.Background())
	}()
	select {
	case <-router.Running():
	case <-time.After(waitLimit):
		t.Fatalf("router %d did not start", i)
	}
	return c
}

func eventID(i int) string { return fmt.Sprintf("evt-%05d", i) }

// stream is n events and, for retryShare of the messages, producer retries
// of an event published shortly before, on random partitions: a retry is
// often consumed by the other consumer, before or after the failover.
func stream(n int) []*sarama.ProducerMessage {
	rng := rand.New(rand.NewPCG(7, uint64(n)))
	retries := int(float64(n) * retryShare / (1 - retryShare))
	type entry struct {
		pos   float64
		event int
	}
	entries := make([]entry, 0, n+retries)
	for i := range n {
		entries = append(entries, entry{pos: float64(i), event: i})
	}
	for range retries {
		i := rng.IntN(n)
		entries = append(entries, entry{pos: float64(i) + 0.5 + float64(rng.IntN(60)), event: i})
	}
	sort.SliceStable(entries, func(a, b int) bool { return entries[a].pos < entries[b].pos })
	out := make([]*sarama.ProducerMessage, 0, len(entries))
	for _, en := range entries {
		out = append(out, &sarama.ProducerMessage{
			Topic:     topic,
			Partition: int32(rng.IntN(partitions)),
			Value:     sarama.StringEncoder(fmt.Sprintf(`{"event_id":%q,"qty":%d}`, eventID(en.event), 1+en.event%5)),
			Headers: []sarama.RecordHeader{
				{Key: []byte("event_id"), Value: []byte(eventID(en.event))},
				{Key: []byte("tenant_id"), Value: []byte("tenant-" + strconv.Itoa(en.event%3))},
			},
		})
	}
	return out
}

func newProducer(t *testing.T, brokers []string) sarama.SyncProducer {
	t.Helper()
	cfg := kafkatest.Config()
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	p, err := sarama.NewSyncProducer(brokers, cfg)
	require.NoError(t, err)
	return p
}
