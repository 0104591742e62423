package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/internal/service"
)

// ErrInvalidConfig: the reconciler's configuration is unusable.
var ErrInvalidConfig = errors.New("reconcile: invalid config")

// Verdict is what a [ResolveFunc] learned about an intent's effect.
type Verdict int

const (
	// Unresolved: still unknown. The record stays pending and is asked
	// about again on the next pass.
	Unresolved Verdict = iota
	// Succeeded: the effect happened. The record becomes completed, and
	// redeliveries are acked as duplicates.
	Succeeded
	// Failed: the effect did not happen and must not be tried again. The
	// record becomes failed (terminal).
	Failed
	// NotHappened: the effect did not happen and the intent still stands.
	// The record is released; the next redelivery runs the handler again as
	// a new attempt with the same idempotency key.
	NotHappened
)

func (v Verdict) String() string {
	switch v {
	case Unresolved:
		return "unresolved"
	case Succeeded:
		return "succeeded"
	case Failed:
		return "failed"
	case NotHappened:
		return "not_happened"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Resolution is a ResolveFunc's answer.
type Resolution struct {
	Verdict Verdict
	// Result is stored with a Succeeded record. For records of the dedup
	// middleware it is the output duplicates hand to the router: build it
	// with dedup.EncodeOutput; anything else is not replayed (duplicates
	// are acked without output). Nil for none.
	Result []byte
	// ResourceID and ExternalRef are stored when not empty.
	ResourceID  string
	ExternalRef string
	// Error is stored with a Failed record.
	Error string
}

// ResolveFunc asks the outside world what became of rec's effect, by
// rec.ExternalRef or the idempotency key the handler sent
// (rec.IdempotencyKey(), which is dedup's Claim.IdempotencyKey). An error counts as Unresolved for this pass.
type ResolveFunc func(ctx context.Context, rec *inbox.Record) (Resolution, error)

// Config configures a [Reconciler]. Only Resolve is required.
type Config struct {
	// Resolve looks an intent up. Required.
	Resolve ResolveFunc

	// Interval between passes once started. Defaults to DefaultInterval
	// (30 s).
	Interval time.Duration

	// BatchSize is how many records of each kind one pass loads. Defaults
	// to DefaultBatchSize (100).
	BatchSize int

	// StaleAfter: a processing record whose lease has expired (or was
	// released) and that nobody touched for this long was abandoned by its
	// worker and not taken over by a redelivery; the reconciler takes it
	// over and resolves it like a pending one. Defaults to
	// DefaultStaleAfter (5 minutes); -1 leaves processing records alone.
	// Keep it well above the lease.
	StaleAfter time.Duration

	// Lease is how long the reconciler holds a stale record it took over.
	// Defaults to DefaultLease (1 minute).
	Lease time.Duration

	// MaxTries: a record still unresolved after this many passes is
	// reported (Error log, the unresolved gauge). It stays pending. Defaults
	// to DefaultMaxTries (10).
	MaxTries int

	// Owner names the reconciler in lease_owner: text of at most
	// inbox.MaxOwnerLen bytes. Defaults to inbox.NewOwnerID("reconciler").
	Owner string

	// Logger receives a line per verdict recorded (Info), per record whose
	// Resolve failed (Info) and per record still unresolved after MaxTries
	// passes or pass that failed (Error). Keys are logged as digests.
	// Defaults to slog.Default() as it is when New is called, through
	// watermill.NewSlogLogger; watermill.NopLogger{} turns logging off.
	Logger watermill.LoggerAdapter

	// TracerProvider makes a span per pass, inboxmill.reconcile, with a
	// child inboxmill.resolve per record (whose context Resolve gets, so
	// a traced provider call nests below it). Defaults to
	// otel.GetTracerProvider(): no spans until the application installs a
	// provider.
	TracerProvider trace.TracerProvider

	// Registerer, when set, receives inboxmill_reconciler_pending,
	// inboxmill_reconciler_oldest_pending_age_seconds,
	// inboxmill_reconciler_unresolved (records past MaxTries) and
	// inboxmill_reconciler_resolved_total{verdict}, labelled with the table.
	Registerer prometheus.Registerer
}

// Defaults of Config.
const (
	DefaultInterval   = 30 * time.Second
	DefaultBatchSize  = 100
	DefaultStaleAfter = 5 * time.Minute
	DefaultLease      = time.Minute
	DefaultMaxTries   = 10
)

func (c Config) withDefaults() Config {
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.StaleAfter == 0 {
		c.StaleAfter = DefaultStaleAfter
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.MaxTries == 0 {
		c.MaxTries = DefaultMaxTries
	}
	if c.Owner == "" {
		c.Owner = inbox.NewOwnerID("reconciler")
	}
	if c.Logger == nil {
		c.Logger = watermill.NewSlogLogger(slog.Default())
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Resolve == nil {
		errs = append(errs, fmt.Errorf("%w: Resolve is required", ErrInvalidConfig))
	}
	if c.Interval < 0 {
		errs = append(errs, fmt.Errorf("%w: Interval %v is negative", ErrInvalidConfig, c.Interval))
	}
	if c.BatchSize < 0 {
		errs = append(errs, fmt.Errorf("%w: BatchSize %d is negative", ErrInvalidConfig, c.BatchSize))
	}
	if c.StaleAfter < -1 {
		errs = append(errs, fmt.Errorf("%w: StaleAfter %v is negative (use -1 to disable)", ErrInvalidConfig, c.StaleAfter))
	}
	if c.Lease < 0 {
		errs = append(errs, fmt.Errorf("%w: Lease %v is negative", ErrInvalidConfig, c.Lease))
	}
	if c.MaxTries < 0 {
		errs = append(errs, fmt.Errorf("%w: MaxTries %d is negative", ErrInvalidConfig, c.MaxTries))
	}
	if err := inbox.CheckText(c.Owner, inbox.MaxOwnerLen); err != nil {
		errs = append(errs, fmt.Errorf("%w: Owner %w", ErrInvalidConfig, err))
	}
	return errors.Join(errs...)
}

// Reconciler resolves pending and abandoned intents. Create it with [New];
// call [Reconciler.RunOnce] yourself, [Reconciler.Run] to run passes every
// Interval until its context ends, or [Reconciler.Start] to do that in a
// goroutine of its own until [Reconciler.Close].
type Reconciler struct {
	store   *inbox.Store
	cfg     Config
	metrics *reconcilerMetrics
	tracer  trace.Tracer

	mu    sync.Mutex
	tries map[inbox.ID]int

	runMu sync.Mutex // one pass at a time
	loop  service.Loop
}

// New returns a reconciler over store. It starts nothing.
func New(store *inbox.Store, cfg Config) (*Reconciler, error) {
	cfg = cfg.withDefaults()
	var errs []error
	if store == nil {
		errs = append(errs, fmt.Errorf("%w: store is nil", ErrInvalidConfig))
	}
	errs = append(errs, cfg.validate())
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	m, err := newReconcilerMetrics(cfg.Registerer, store.Table())
	if err != nil {
		return nil, fmt.Errorf("reconcile: register metrics: %w", err)
	}
	return &Reconciler{store: store, cfg: cfg, metrics: m, tries: map[inbox.ID]int{},
		tracer: cfg.TracerProvider.Tracer(tracerName)}, nil
}

// Report counts what one pass did.
type Report struct {
	// Examined counts the records loaded (pending, and stale processing
	// ones taken over).
	Examined int
	// Resolved counts records moved by a verdict, by verdict.
	Resolved map[Verdict]int
	// Unresolved counts records left pending this pass. A record that
	// someone else (a redelivery, another reconciler) moved between its
	// loading and its verdict counts in neither Resolved nor Unresolved.
	Unresolved int
	// GaveUp counts records unresolved after MaxTries passes.
	GaveUp int
}

// held is a record the pass may settle, with the handle that fences it.
type held struct {
	rec   *inbox.Record
	lease *inbox.Lease
}

// RunOnce makes one pass: stale processing records are taken over first
// (so a crashed worker cannot finish them any more), then every loaded
// record is resolved. Errors of single records are logged and counted as
// unresolved; the returned error is for failures to load or record.
func (r *Reconciler) RunOnce(ctx context.Context) (rep Report, err error) {
	r.runMu.Lock()
	defer r.runMu.Unlock()
	ctx, span := r.tracer.Start(ctx, spanPass, trace.WithAttributes(attrTable.String(r.store.Table())))
	defer func() { endPass(span, rep, err) }()
	rep = Report{Resolved: map[Verdict]int{}}

	var recs []held
	var errs []error
	if r.cfg.StaleAfter > 0 {
		// The store judges leases by the database's clock, measured before
		// its first lease.
		stale, err := r.store.ListStale(ctx, r.store.Now().Add(-r.cfg.StaleAfter), r.cfg.BatchSize)
		if err != nil {
			errs = append(errs, err)
		}
		for _, rec := range stale {
			lease, err := r.store.TakeOver(ctx, rec, inbox.TakeOverParams{Owner: r.cfg.Owner, Lease: r.cfg.Lease})
			switch {
			case err == nil:
				taken := *rec
				taken.Attempt, taken.LeaseOwner = lease.Attempt(), lease.Owner()
				recs = append(recs, held{&taken, lease})
			case errors.Is(err, inbox.ErrLeaseLost), errors.Is(err, inbox.ErrIllegalTransition):
				// A redelivery took it first: it is theirs.
			default:
				errs = append(errs, err)
			}
		}
	}
	pending, perr := r.store.ListPending(ctx, r.cfg.BatchSize)
	if err := perr; err != nil {
		errs = append(errs, err)
	}
	for _, rec := range pending {
		lease, err := r.store.FencePending(rec)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		recs = append(recs, held{rec, lease})
	}

	seen := map[inbox.ID]bool{}
	for _, h := range recs {
		if ctx.Err() != nil {
			break
		}
		rep.Examined++
		seen[h.rec.ID] = true
		v, err := r.resolve(ctx, h)
		if errors.Is(err, errMoved) {
			// Settled or taken by someone else: neither resolved by this
			// pass nor left pending by it.
			r.forget(h.rec.ID)
			continue
		}
		if err != nil {
			errs = append(errs, err)
		}
		if v != Unresolved {
			rep.Resolved[v]++
			r.metrics.resolved(v)
			r.forget(h.rec.ID)
			continue
		}
		rep.Unresolved++
		if tries := r.try(h.rec.ID); tries >= r.cfg.MaxTries {
			rep.GaveUp++
			if tries > r.cfg.MaxTries {
				continue // reported once; the gauge keeps counting it
			}
			r.cfg.Logger.Error("inboxmill: intent still unresolved after MaxTries passes; needs a look",
				nil, r.fields(h.rec, Unresolved))
		}
	}
	r.prune(seen, len(pending) < r.cfg.BatchSize)
	r.metrics.setUnresolved(r.unresolvedCount())
	if st, err := r.store.Stats(ctx); err == nil {
		r.metrics.setPending(st, r.store.Now())
	} else {
		errs = append(errs, err)
	}
	return rep, errors.Join(errs...)
}

// errMoved is resolve's report that someone else moved the record before
// its verdict could be recorded; RunOnce does not pass it on.
var errMoved = errors.New("reconcile: record moved by another worker")

// abandoned is the error a stale record taken over with no answer yet is
// left pending with: its effect is uncertain, which is what pending means.
const abandoned = "abandoned by its worker; outcome unknown"

// resolve asks about one record and records the verdict through its
// handle; the store decides whether the move is still legal.
func (r *Reconciler) resolve(ctx context.Context, h held) (v Verdict, err error) {
	rec := h.rec
	ctx, span := r.tracer.Start(ctx, spanResolve, trace.WithAttributes(
		attrOperation.String(rec.Operation), attrKeyDigest.String(rec.Digest()),
		attrAttempt.Int64(rec.Attempt), attrStatus.String(string(rec.Status))))
	defer func() { endResolve(span, v, err) }()
	res, err := r.cfg.Resolve(ctx, rec)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	if err != nil {
		r.cfg.Logger.Info("inboxmill: resolve failed; will ask again", r.fieldsErr(rec, err))
		res = Resolution{Verdict: Unresolved}
	}
	switch res.Verdict {
	case Succeeded:
		err = h.lease.Complete(ctx, inbox.Outcome{Result: res.Result, ResourceID: res.ResourceID, ExternalRef: res.ExternalRef})
	case Failed:
		err = h.lease.Fail(ctx, res.Error)
	case NotHappened:
		err = h.lease.Release(ctx, res.Error) // the next delivery takes it over
	case Unresolved:
		reason := ""
		if rec.Status != inbox.StatusPending {
			reason = abandoned
		}
		// On a pending record this touches it (same values, new
		// updated_at), so the next pass pages past it to newer pending
		// records instead of asking about the same BatchSize ones forever.
		err = h.lease.Pend(ctx, res.ExternalRef, reason)
	default:
		return Unresolved, fmt.Errorf("reconcile: Resolve returned unknown verdict %d", int(res.Verdict))
	}
	if err != nil {
		if errors.Is(err, inbox.ErrLeaseLost) || errors.Is(err, inbox.ErrNotFound) {
			// Someone else moved it (a redelivery took a released record
			// over, another reconciler got there first): nothing to do.
			r.cfg.Logger.Debug("inboxmill: intent moved by another worker before its verdict was recorded",
				r.fields(rec, res.Verdict))
			return Unresolved, errMoved
		}
		return Unresolved, fmt.Errorf("reconcile: record verdict %s: %w", res.Verdict, err)
	}
	if res.Verdict == Unresolved {
		return Unresolved, nil
	}
	r.cfg.Logger.Info("inboxmill: intent reconciled", r.fields(rec, res.Verdict))
	return res.Verdict, nil
}

func (r *Reconciler) try(id inbox.ID) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tries[id]++
	return r.tries[id]
}

func (r *Reconciler) forget(id inbox.ID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.tries, id)
}

// prune drops try counts of records no longer pending. Only a pass that saw
// every pending record (fewer than a batch) can tell.
func (r *Reconciler) prune(seen map[inbox.ID]bool, complete bool) {
	if !complete {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range r.tries {
		if !seen[id] {
			delete(r.tries, id)
		}
	}
}

func (r *Reconciler) unresolvedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, t := range r.tries {
		if t >= r.cfg.MaxTries {
			n++
		}
	}
	return n
}

func (r *Reconciler) fields(rec *inbox.Record, v Verdict) watermill.LogFields {
	return watermill.LogFields{
		"table":        r.store.Table(),
		"operation":    rec.Operation,
		"scope":        rec.Scope,
		"key_digest":   rec.Digest(),
		"attempt":      rec.Attempt,
		"status":       string(rec.Status),
		"external_ref": rec.ExternalRef,
		"verdict":      v.String(),
	}
}

func (r *Reconciler) fieldsErr(rec *inbox.Record, err error) watermill.LogFields {
	f := r.fields(rec, Unresolved)
	f["error"] = err.Error()
	return f
}

// Run runs a pass now and then every Interval until ctx ends or Close is
// called; it returns nil then. Running twice at once is an error.
func (r *Reconciler) Run(ctx context.Context) error {
	return wrapRunning(r.loop.Run(ctx, r.cfg.Interval, r.pass))
}

// Start is Run in a goroutine of its own, until Close.
func (r *Reconciler) Start() error {
	return wrapRunning(r.loop.Start(r.cfg.Interval, r.pass))
}

// Running returns a channel that is closed while the reconciler runs.
func (r *Reconciler) Running() <-chan struct{} { return r.loop.Running() }

// Close stops a running reconciler and waits for a pass under way to end.
// It is safe to call more than once, and on a reconciler never started.
func (r *Reconciler) Close() error { return r.loop.Close() }

func (r *Reconciler) pass(ctx context.Context) {
	if _, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
		r.cfg.Logger.Error("inboxmill: reconcile pass failed", err, watermill.LogFields{"table": r.store.Table()})
	}
}

func wrapRunning(err error) error {
	if errors.Is(err, service.ErrRunning) {
		return fmt.Errorf("reconcile: reconciler %w", err)
	}
	return err
}
