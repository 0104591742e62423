package handlers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxmill/inboxmill/inbox"
)

// ErrInvalidConfig: the reconciler's configuration is unusable.
var ErrInvalidConfig = errors.New("handlers: invalid config")

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
// (dedup.IdempotencyKeyOf(rec)). An error counts as Unresolved for this pass.
type ResolveFunc func(ctx context.Context, rec *inbox.Record) (Resolution, error)

// ReconcilerConfig configures a [Reconciler]. Only Resolve is required.
type ReconcilerConfig struct {
	// Resolve looks an intent up. Required.
	Resolve ResolveFunc

	// Interval between passes once started. Defaults to 30 s.
	Interval time.Duration

	// BatchSize is how many records of each kind one pass loads. Defaults
	// to 100.
	BatchSize int

	// StaleAfter: a processing record whose lease has expired (or was
	// released) and that nobody touched for this long was abandoned by its
	// worker and not taken over by a redelivery; the reconciler takes it
	// over and resolves it like a pending one. Defaults to 5 minutes; -1
	// leaves processing records alone. Keep it well above the lease.
	StaleAfter time.Duration

	// Lease is how long the reconciler holds a stale record it took over.
	// Defaults to 1 minute.
	Lease time.Duration

	// MaxTries: a record still unresolved after this many passes is
	// reported (Error log, the unresolved gauge). It stays pending. Defaults
	// to 10.
	MaxTries int

	// Owner names the reconciler in lease_owner. Defaults to
	// "reconciler-<hostname>-<pid>-<random>".
	Owner string

	// Logger defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter

	// Registerer, when set, receives inboxmill_reconciler_pending,
	// inboxmill_reconciler_oldest_pending_age_seconds,
	// inboxmill_reconciler_unresolved (records past MaxTries) and
	// inboxmill_reconciler_resolved_total{verdict}, labelled with the table.
	Registerer prometheus.Registerer
}

func (c ReconcilerConfig) withDefaults() ReconcilerConfig {
	if c.Interval == 0 {
		c.Interval = 30 * time.Second
	}
	if c.BatchSize == 0 {
		c.BatchSize = 100
	}
	if c.StaleAfter == 0 {
		c.StaleAfter = 5 * time.Minute
	}
	if c.Lease == 0 {
		c.Lease = time.Minute
	}
	if c.MaxTries == 0 {
		c.MaxTries = 10
	}
	if c.Owner == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.Owner = fmt.Sprintf("reconciler-%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	return c
}

func (c ReconcilerConfig) validate() error {
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
	if len(c.Owner) > 255 {
		errs = append(errs, fmt.Errorf("%w: Owner is longer than 255 bytes", ErrInvalidConfig))
	}
	return errors.Join(errs...)
}

// Reconciler resolves pending and abandoned intents. Create it with
// [NewReconciler]; call [Reconciler.RunOnce] yourself, or [Reconciler.Start]
// to run passes every Interval until [Reconciler.Close].
type Reconciler struct {
	store   *inbox.Store
	cfg     ReconcilerConfig
	metrics *reconcilerMetrics

	mu    sync.Mutex
	tries map[recordID]int

	runMu  sync.Mutex // one pass at a time
	lifeMu sync.Mutex // guards cancel and done
	cancel context.CancelFunc
	done   chan struct{}
}

type recordID struct{ scope, operation, key string }

// NewReconciler returns a reconciler over store. It starts nothing.
func NewReconciler(store *inbox.Store, cfg ReconcilerConfig) (*Reconciler, error) {
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
		return nil, fmt.Errorf("handlers: register metrics: %w", err)
	}
	return &Reconciler{store: store, cfg: cfg, metrics: m, tries: map[recordID]int{}}, nil
}

// ReconcileReport counts what one pass did.
type ReconcileReport struct {
	// Examined counts the records loaded (pending, and stale processing
	// ones taken over).
	Examined int
	// Resolved counts records moved by a verdict, by verdict.
	Resolved map[Verdict]int
	// Unresolved counts records left pending this pass.
	Unresolved int
	// GaveUp counts records unresolved after MaxTries passes.
	GaveUp int
}

// RunOnce makes one pass: stale processing records are taken over first
// (so a crashed worker cannot finish them any more), then every loaded
// record is resolved. Errors of single records are logged and counted as
// unresolved; the returned error is for failures to load or record.
func (r *Reconciler) RunOnce(ctx context.Context) (ReconcileReport, error) {
	r.runMu.Lock()
	defer r.runMu.Unlock()
	rep := ReconcileReport{Resolved: map[Verdict]int{}}
	db := r.store.DB()
	if _, synced := r.store.ClockOffset(); !synced {
		// Staleness and leases are judged by the database's clock
		// (inbox.Config.ClockSync); the store keeps it synced after this.
		_ = r.store.SyncClock(ctx)
	}

	var recs []*inbox.Record
	var errs []error
	if r.cfg.StaleAfter > 0 {
		stale, err := r.store.ListStale(ctx, db, r.store.Now().Add(-r.cfg.StaleAfter), r.cfg.BatchSize)
		if err != nil {
			errs = append(errs, err)
		}
		for _, rec := range stale {
			ok, err := r.store.TakeOver(ctx, db, inbox.TakeOverParams{
				Scope: rec.Scope, Operation: rec.Operation, Key: rec.Key, Attempt: rec.Attempt,
				LeaseOwner: r.cfg.Owner, LeaseUntil: r.store.Now().Add(r.cfg.Lease),
			})
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if ok { // else a redelivery took it first: it is theirs
				rec.Attempt++
				rec.LeaseOwner = r.cfg.Owner
				recs = append(recs, rec)
			}
		}
	}
	pending, err := r.store.ListPending(ctx, db, r.cfg.BatchSize)
	if err != nil {
		errs = append(errs, err)
	}
	recs = append(recs, pending...)

	seen := map[recordID]bool{}
	for _, rec := range recs {
		if ctx.Err() != nil {
			break
		}
		rep.Examined++
		id := recordID{rec.Scope, rec.Operation, rec.Key}
		seen[id] = true
		v, err := r.resolve(ctx, rec)
		if err != nil {
			errs = append(errs, err)
		}
		if v != Unresolved {
			rep.Resolved[v]++
			r.metrics.resolved(v)
			r.forget(id)
			continue
		}
		rep.Unresolved++
		if tries := r.try(id); tries >= r.cfg.MaxTries {
			rep.GaveUp++
			if tries > r.cfg.MaxTries {
				continue // reported once; the gauge keeps counting it
			}
			r.cfg.Logger.Error("inboxmill: intent still unresolved after MaxTries passes; needs a look",
				nil, r.fields(rec, Unresolved))
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

// renewedExpiry keeps a finished record for its full retention from now:
// an intent pending longer than its retention must not be purged (and run
// again by a redelivery) the moment it is resolved.
func (r *Reconciler) renewedExpiry(rec *inbox.Record) time.Time {
	if rec.ExpiresAt.IsZero() {
		return time.Time{}
	}
	return r.store.Now().Add(rec.ExpiresAt.Sub(rec.CreatedAt))
}

// resolve asks about one record and records the verdict.
func (r *Reconciler) resolve(ctx context.Context, rec *inbox.Record) (Verdict, error) {
	res, err := r.cfg.Resolve(ctx, rec)
	if err != nil {
		r.cfg.Logger.Info("inboxmill: resolve failed; will ask again", r.fieldsErr(rec, err))
		res = Resolution{Verdict: Unresolved}
	}
	fin := inbox.FinishParams{Scope: rec.Scope, Operation: rec.Operation, Key: rec.Key, Attempt: rec.Attempt,
		From: rec.Status, Result: res.Result, ResourceID: res.ResourceID, ExternalRef: res.ExternalRef,
		Error: res.Error}
	switch res.Verdict {
	case Succeeded:
		fin.To, fin.ExpiresAt = inbox.StatusCompleted, r.renewedExpiry(rec)
	case Failed:
		fin.To, fin.ExpiresAt = inbox.StatusFailed, r.renewedExpiry(rec)
	case NotHappened:
		fin.To = inbox.StatusProcessing // released: the next delivery takes it over
	case Unresolved:
		fin.To = inbox.StatusPending
		if rec.Status == inbox.StatusPending {
			// Touch it (same values, new updated_at) so that the next pass
			// pages past it to newer pending records instead of asking about
			// the same BatchSize ones forever.
			fin.Result, fin.ResourceID, fin.Error = rec.Result, rec.ResourceID, rec.Error
		} else {
			// A stale record taken over with no answer yet: its effect is
			// uncertain, which is what pending means.
			fin.Error = "abandoned by its worker; outcome unknown"
		}
	default:
		return Unresolved, fmt.Errorf("handlers: Resolve returned unknown verdict %d", int(res.Verdict))
	}
	if err := r.store.Finish(ctx, r.store.DB(), fin); err != nil {
		if errors.Is(err, inbox.ErrLeaseLost) || errors.Is(err, inbox.ErrNotFound) {
			// Someone else moved it (a redelivery took a released record
			// over, another reconciler got there first): nothing to do.
			return Unresolved, nil
		}
		return Unresolved, fmt.Errorf("handlers: record verdict %s: %w", res.Verdict, err)
	}
	if res.Verdict == Unresolved {
		return Unresolved, nil
	}
	r.cfg.Logger.Info("inboxmill: intent reconciled", r.fields(rec, res.Verdict))
	return res.Verdict, nil
}

func (r *Reconciler) try(id recordID) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tries[id]++
	return r.tries[id]
}

func (r *Reconciler) forget(id recordID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.tries, id)
}

// prune drops try counts of records no longer pending. Only a pass that saw
// every pending record (fewer than a batch) can tell.
func (r *Reconciler) prune(seen map[recordID]bool, complete bool) {
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
		"key_digest":   inbox.KeyDigest(rec.Scope, rec.Operation, rec.Key),
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

// Start runs a pass now and then every Interval, in a goroutine of its own,
// until Close. Starting twice is an error.
func (r *Reconciler) Start() error {
	r.lifeMu.Lock()
	defer r.lifeMu.Unlock()
	if r.done != nil {
		return errors.New("handlers: reconciler already started")
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan struct{})
	go func() {
		defer close(r.done)
		t := time.NewTicker(r.cfg.Interval)
		defer t.Stop()
		for {
			if _, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
				r.cfg.Logger.Error("inboxmill: reconcile pass failed", err, watermill.LogFields{"table": r.store.Table()})
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return nil
}

// Close stops a started reconciler and waits for a pass under way to end.
// It is safe to call more than once, and on a reconciler never started.
func (r *Reconciler) Close() error {
	r.lifeMu.Lock()
	cancel, done := r.cancel, r.done
	r.lifeMu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	<-done
	return nil
}
