package transporttest

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// Words of the lines a consumer reports.
const (
	WordReady = "READY"
	// WordExec: the handler ran and its outcome committed; the router acks.
	WordExec = "EXEC"
	// WordDup: the middleware found the event done and acked without
	// running the handler.
	WordDup = "DUP"
	// WordInFlight: a live lease holds the event; nacked.
	WordInFlight = "INFLIGHT"
	// WordFenced: the handler ran but its outcome was refused, because
	// another attempt holds the record now; nacked.
	WordFenced = "FENCED"
	// WordNack: any other error; nacked.
	WordNack = "NACK"
	// WordDie: the process SIGKILLs itself at Point.
	WordDie = "DIE"
	// WordBye: the router closed after SIGTERM; Stats are final.
	WordBye = "BYE"
)

// Line is one thing a consumer reports; a process prints it on stdout as
// JSON, one per line.
type Line struct {
	Word     string `json:"w"`
	Consumer string `json:"c"`
	// At is when the line was reported; Start when the delivery it reports
	// reached the consumer's router.
	At    time.Time `json:"t"`
	Start time.Time `json:"start,omitzero"`
	Seq   int       `json:"seq,omitempty"`
	Event string    `json:"ev,omitempty"`
	// Attempt is the claim's attempt (the fencing token) when the handler ran.
	Attempt int64 `json:"attempt,omitempty"`
	// Found: a reserve-mode attempt after the first found the effect an
	// earlier one made, and recorded it without making it again.
	Found bool        `json:"found,omitempty"`
	Point Point       `json:"point,omitempty"`
	Err   string      `json:"err,omitempty"`
	Stats dedup.Stats `json:"stats"`
}

// Event is the payload of every message.
type Event struct {
	EventID string `json:"event_id"`
	Order   string `json:"order"`
	Qty     int    `json:"qty"`
	SentAt  string `json:"sent_at"`
}

// Metadata keys of every message.
const (
	MetaEventID = "event_id"
	MetaTenant  = "tenant_id"
	MetaSeq     = "seq"
)

// Consumer is one consumer: its own database pool, subscriber, router and
// middleware, as a separate service instance has. A consumer process runs
// one; tests run more in their own process with NewConsumer.
type Consumer struct {
	spec     Spec
	emit     func(Line)
	killable bool
	db       *sql.DB
	store    *inbox.Store
	d        *dedup.Deduplicator
	router   *message.Router
	insert   string
	lookup   string
	reached  atomic.Int64
	inFlight atomic.Int64
	done     chan struct{}
	runErr   error

	closeOnce sync.Once
	closeErr  error
}

type deliveryKey struct{}

// delivery is what the handler tells the observing middleware.
type delivery struct {
	ran     atomic.Bool
	found   atomic.Bool
	attempt atomic.Int64
}

// NewConsumer starts a consumer in this process and returns once its
// router runs. Every delivery's outcome goes to emit. s.DieAt must be
// empty: it would kill the test process.
func NewConsumer(tr Transport, s Spec, logger watermill.LoggerAdapter, emit func(Line)) (*Consumer, error) {
	if s.DieAt != "" {
		return nil, errors.New("transporttest: DieAt is only for consumer processes")
	}
	return newConsumer(tr, s, logger, emit, false)
}

func newConsumer(tr Transport, s Spec, logger watermill.LoggerAdapter, emit func(Line), killable bool) (*Consumer, error) {
	c := &Consumer{spec: s, emit: emit, killable: killable, done: make(chan struct{})}
	var err error
	if s.DB == testdb.SQLite {
		c.db, err = sql.Open("sqlite", sqlite.DSN(s.DSN))
	} else {
		c.db, err = sql.Open("pgx", s.DSN)
	}
	if err != nil {
		return nil, err
	}
	c.db.SetMaxOpenConns(4)
	c.db.SetMaxIdleConns(4)
	ok := false
	defer func() {
		if !ok {
			_ = c.db.Close()
		}
	}()
	dialect := testdb.Dialect(s.DB)
	c.insert = fmt.Sprintf("INSERT INTO %s (event_id, seq, consumer, attempt, idem_key) VALUES (%s, %s, %s, %s, %s)",
		s.Effects, dialect.Placeholder(1), dialect.Placeholder(2), dialect.Placeholder(3), dialect.Placeholder(4),
		dialect.Placeholder(5))
	c.lookup = fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE idem_key = %s", s.Effects, dialect.Placeholder(1))

	c.store, err = inbox.NewStore(c.db, dialect, inbox.Config{Table: s.Inbox})
	if err != nil {
		return nil, err
	}
	defer func() {
		if !ok {
			_ = c.store.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.store.Validate(ctx); err != nil {
		return nil, err
	}
	cfg := dedup.Config{
		Key:          dedup.KeyFromMetadata(MetaEventID),
		Scope:        dedup.ScopeFromMetadata(MetaTenant),
		IgnoreFields: []string{"sent_at"}, // a rebuilt retry stamps it again
		Logger:       logger,
	}
	if s.Mode == Reserve {
		cfg.Mode = dedup.Reserve{Lease: s.Lease, HeartbeatInterval: s.Heartbeat, InFlightWait: s.InFlightWait,
			Owner: inbox.NewOwnerID(s.Consumer)}
	}
	if c.d, err = dedup.New(c.store, cfg); err != nil {
		return nil, err
	}
	sub, err := tr.NewSubscriber(s)
	if err != nil {
		return nil, fmt.Errorf("subscriber: %w", err)
	}
	c.router, err = message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, logger)
	if err != nil {
		_ = sub.Close()
		return nil, err
	}
	c.router.AddMiddleware(c.observe, c.d.Middleware)
	c.router.AddConsumerHandler(HandlerName, s.Topic, sub, c.handle)
	go func() {
		defer close(c.done)
		c.runErr = c.router.Run(context.Background())
	}()
	select {
	case <-c.router.Running():
	case <-c.done:
		return nil, fmt.Errorf("router: %w", c.runErr)
	case <-time.After(30 * time.Second):
		_ = c.router.Close()
		<-c.done
		return nil, errors.New("the router did not start within 30s")
	}
	ok = true
	return c, nil
}

// Stats returns what the consumer's middleware did so far.
func (c *Consumer) Stats() dedup.Stats { return c.d.Stats() }

// InFlight is how many deliveries the consumer is handling right now.
func (c *Consumer) InFlight() int { return int(c.inFlight.Load()) }

// Close closes the router, waiting for the deliveries in progress, then the
// store and the database. Calls after the first return the first's error.
func (c *Consumer) Close() error {
	c.closeOnce.Do(func() {
		err := c.router.Close()
		<-c.done
		c.closeErr = errors.Join(err, c.runErr, c.store.Close(), c.db.Close())
	})
	return c.closeErr
}

// handle is the business handler: one row in the effects table per run.
// The table has no unique constraint: an effect made twice is a second row.
func (c *Consumer) handle(msg *message.Message) error {
	ctx := msg.Context()
	claim, ok := dedup.ClaimFromContext(ctx)
	if !ok {
		return errors.New("no claim in the message's context")
	}
	var ev Event
	if err := json.Unmarshal(msg.Payload, &ev); err != nil {
		return dedup.Permanent(err)
	}
	seq, _ := strconv.Atoi(msg.Metadata.Get(MetaSeq))
	dl, _ := ctx.Value(deliveryKey{}).(*delivery)
	if dl != nil {
		dl.ran.Store(true)
		dl.attempt.Store(claim.Attempt)
	}
	if d := c.spec.Slow[ev.EventID]; d > 0 && claim.Attempt == 1 {
		time.Sleep(d)
	}
	args := []any{ev.EventID, seq, c.spec.Consumer, claim.Attempt, claim.IdempotencyKey}
	if c.spec.Mode == Reserve {
		// No transaction: the effect stands on its own, like a provider's.
		// A later attempt asks first whether an earlier one made it.
		if claim.Attempt > 1 {
			var n int
			if err := c.db.QueryRowContext(context.WithoutCancel(ctx), c.lookup, claim.IdempotencyKey).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				if dl != nil {
					dl.found.Store(true)
				}
				return nil
			}
		}
		if _, err := c.db.ExecContext(context.WithoutCancel(ctx), c.insert, args...); err != nil {
			return err
		}
	} else {
		tx, ok := dedup.TxFromContext(ctx)
		if !ok {
			return errors.New("no transaction in the message's context")
		}
		if _, err := tx.ExecContext(ctx, c.insert, args...); err != nil {
			return err
		}
	}
	c.reach(AfterEffect, Line{Seq: seq, Event: ev.EventID, Attempt: claim.Attempt})
	return nil
}

// observe sits outside the dedup middleware and reports each delivery's
// outcome; it holds the AfterCommit kill point.
func (c *Consumer) observe(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		c.inFlight.Add(1)
		defer c.inFlight.Add(-1)
		start := time.Now()
		ctx := msg.Context()
		dl := &delivery{}
		msg.SetContext(context.WithValue(ctx, deliveryKey{}, dl))
		out, err := h(msg)
		msg.SetContext(ctx)

		seq, _ := strconv.Atoi(msg.Metadata.Get(MetaSeq))
		l := Line{Seq: seq, Event: msg.Metadata.Get(MetaEventID), Start: start, Attempt: dl.attempt.Load(),
			Found: dl.found.Load()}
		switch {
		case err == nil && dl.ran.Load():
			c.reach(AfterCommit, l)
			l.Word = WordExec
		case err == nil:
			l.Word = WordDup
		case errors.Is(err, dedup.ErrLeaseLost):
			l.Word, l.Err = WordFenced, err.Error()
		case errors.Is(err, dedup.ErrInFlight):
			l.Word = WordInFlight
		default:
			l.Word, l.Err = WordNack, err.Error()
		}
		c.emit(l)
		return out, err
	}
}

// reach kills the process the DieAfter-th time a first attempt reaches p.
// A takeover (a later attempt) does not count: it completes what another
// consumer's death left, which the checks follow on its own.
func (c *Consumer) reach(p Point, l Line) {
	if !c.killable || c.spec.DieAt != p || l.Attempt != 1 || c.reached.Add(1) != int64(c.spec.DieAfter) {
		return
	}
	l.Word, l.Point = WordDie, p
	c.emit(l)
	self, err := os.FindProcess(os.Getpid())
	if err == nil {
		err = self.Kill() // SIGKILL: no deferred function runs, nothing is acked or rolled back politely
	}
	if err != nil {
		panic(fmt.Sprintf("kill self at %s: %v", p, err))
	}
	select {}
}

// processMain runs a consumer process: it reports READY once its router
// runs, then runs until SIGTERM (or until its stdin closes: the test
// process is gone), closes the router and reports BYE.
func processMain(tr Transport, s Spec) int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	emit := func(l Line) {
		mu.Lock()
		defer mu.Unlock()
		l.Consumer, l.At = s.Consumer, time.Now()
		_ = enc.Encode(l)
	}
	lifeline := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(lifeline)
	}()
	logger := watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	c, err := newConsumer(tr, s, logger, emit, true)
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 1
	}
	emit(Line{Word: WordReady})
	select {
	case <-sigs:
	case <-lifeline:
		fmt.Fprintln(os.Stderr, "consumer: stdin closed; stopping")
	case <-c.done:
		fmt.Fprintln(os.Stderr, "consumer: the router stopped by itself:", c.runErr)
		return 1
	}
	err = c.Close()
	emit(Line{Word: WordBye, Stats: c.Stats()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer: close:", err)
		return 1
	}
	return 0
}
