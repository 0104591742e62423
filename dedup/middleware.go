package dedup

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/inbox"
)

// Deduplicator is the Watermill middleware. Create it with [New] and add
// [Deduplicator.Middleware] to a router or a handler. It is safe for
// concurrent use and holds no goroutines between deliveries (with group
// commit, a group whose first delivery is answered before the others
// finishes in a goroutine that ends with it).
type Deduplicator struct {
	store   *inbox.Store
	cfg     Config
	tx      Transactional   // the mode's settings, with defaults
	rs      *Reserve        // nil in transactional mode
	grp     *grouper        // nil without group commit
	rb      *reserveBatches // nil without Reserve.Batch
	fp      FingerprintFunc
	metrics *metrics
	stats   counters
	dups    dupRate
	log     logger
	repeats *repeats // nil: every line at its level
	trace   tracing
}

// New returns a Deduplicator over store. It validates cfg (reporting every
// problem at once) and registers the metrics; it never touches the database.
func New(store *inbox.Store, cfg Config) (*Deduplicator, error) {
	cfg = cfg.withDefaults()
	var errs []error
	if store == nil {
		errs = append(errs, fmt.Errorf("%w: store is nil", ErrInvalidConfig))
	}
	errs = append(errs, cfg.validate())
	fp := cfg.Fingerprint
	if fp == nil {
		f, err := JSONFingerprint(cfg.IgnoreFields...)
		errs = append(errs, err)
		fp = f
	}
	if t, ok := cfg.Mode.(Transactional); ok && store != nil && t.Group != nil && t.Group.Pipeline != nil {
		errs = append(errs, checkPipeline(store, t.Group.Pipeline))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("dedup: register metrics: %w", err)
	}
	d := &Deduplicator{store: store, cfg: cfg, fp: fp, metrics: m, log: newLogger(cfg.Logger),
		repeats: newRepeats(cfg.RepeatLogInterval, DefaultRepeatLogKeys), trace: newTracing(cfg.TracerProvider)}
	switch mode := cfg.Mode.(type) {
	case Transactional:
		d.tx = mode
		if mode.Group != nil {
			d.grp = newGrouper(d, *mode.Group)
		}
	case Reserve:
		d.rs = &mode
		if mode.Batch != nil {
			d.rb = newReserveBatches(store, *mode.Batch)
			if mode.Batch.Statements == 0 && store.Dialect().Capabilities().SingleWriter {
				d.log.Info("inboxmill: reserve batches are off: the database has one writer at a time, where they do not pay; "+
					"set Batch.Statements to batch anyway", watermill.LogFields{"dialect": store.Dialect().Name()})
			}
		}
	}
	return d, nil
}

// Stats returns the outcome counts so far. They count what the middleware
// decided, not what committed: with Transactional.JoinTx an execution is
// counted when its savepoint is released, and the consuming transaction
// commits after the middleware returns (a commit that fails rolls it back,
// and the redelivery is counted again). To wait for work to be done, wait
// for its committed effects.
func (d *Deduplicator) Stats() Stats { return d.stats.snapshot() }

// Middleware wraps h so that it runs at most once per business intent, in a
// transaction that also records the intent:
//
//   - a new key: begin, claim, run h with the transaction in the message's
//     context (TxFromContext), store h's output messages with the record,
//     commit, return the output (the router publishes it, then acks);
//   - a key done before with the same payload: h does not run; the stored
//     output is returned again, so a publish that failed after the commit
//     is retried rather than lost;
//   - a key done before with another payload: h does not run; the error
//     wraps ErrPayloadConflict and the message is not acked;
//   - no usable key: h does not run; the error wraps ErrMissingKey or
//     ErrInvalidKey;
//   - h fails or panics: the transaction rolls back, nothing is recorded,
//     the error is returned (nack) and a redelivery runs h from a clean state.
func (d *Deduplicator) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		return d.handle(msg, h)
	}
}

// identity is what a delivery is deduplicated by.
type identity struct {
	inbox.ID
	hash      []byte
	digest    string    // idemKey's first 16 characters: ID.Digest
	idemKey   string    // ID.IdempotencyKey
	eventTime time.Time // zero without Config.EventTime
}

// claimFailure is the outcome of a claim that failed with err: refused
// for good when the store can no longer tell whether the event ran, to be
// retried otherwise.
func claimFailure(err error) Outcome {
	if errors.Is(err, ErrBeyondRetention) {
		return OutcomeInvalid
	}
	return OutcomeRetry
}

func (d *Deduplicator) identify(msg *message.Message) (identity, error) {
	// The operation first: even a message refused for its key is counted
	// and logged under the handler it reached.
	id := identity{ID: inbox.ID{Operation: d.cfg.Operation}}
	if id.Operation == "" {
		id.Operation = message.HandlerNameFromCtx(msg.Context())
	}
	key, err := d.cfg.Key(msg)
	if err != nil {
		return id, err
	}
	scope, err := d.cfg.Scope(msg)
	if err != nil {
		return id, err
	}
	full := inbox.ID{Scope: scope, Operation: id.Operation, Key: key}
	if err := full.Validate(); err != nil {
		if id.Operation == "" {
			err = fmt.Errorf("%w (set dedup.Config.Operation when running outside a message.Router)", err)
		}
		return id, err
	}
	id.ID = full
	id.idemKey = full.IdempotencyKey()
	id.digest = id.idemKey[:16]
	if d.cfg.EventTime != nil {
		t, err := d.cfg.EventTime(msg)
		if err == nil && t.IsZero() {
			err = errors.New("the event time function returned the zero time")
		}
		if err != nil {
			return id, fmt.Errorf("%w: %w", ErrInvalidEventTime, err)
		}
		id.eventTime = t
	}
	hash, err := d.fp(msg)
	if err != nil {
		return id, fmt.Errorf("%w: %w", ErrFingerprint, err)
	}
	if len(hash) == 0 || len(hash) > inbox.MaxPayloadHashLen {
		return id, fmt.Errorf("%w: the fingerprint function returned %d bytes; it must return 1 to %d",
			ErrFingerprint, len(hash), inbox.MaxPayloadHashLen)
	}
	id.hash = hash
	return id, nil
}

func (d *Deduplicator) handle(msg *message.Message, h message.HandlerFunc) ([]*message.Message, error) {
	if d.grp != nil {
		d.grp.enter()
		defer d.grp.leave()
	}
	orig := msg.Context()
	ds := d.startDelivery(msg)
	defer msg.SetContext(orig)
	id, err := d.identify(msg)
	if err != nil {
		d.finish(msg, id, OutcomeInvalid, err)
		ds.endDelivery(id, OutcomeInvalid, err)
		return nil, err
	}
	var (
		out     []*message.Message
		outcome Outcome
	)
	if d.rs != nil {
		out, outcome, err = d.reserve(msg, h, id)
	} else {
		out, outcome, err = d.transactional(msg, h, id)
	}
	d.finish(msg, id, outcome, err)
	ds.endDelivery(id, outcome, err)
	return out, err
}

// run calls h with ctx, the transaction and the claim in the message's
// context, turns a panic into an error, and puts the message's context
// back: the message may be redelivered as the same value, and must not
// carry a finished transaction into the next attempt.
func (d *Deduplicator) run(ctx context.Context, tx *sql.Tx, msg *message.Message, h message.HandlerFunc, c Claim) (
	out []*message.Message, err error,
) {
	orig := msg.Context()
	msg.SetContext(withClaim(ctx, tx, c))
	defer func() {
		msg.SetContext(orig)
		if r := recover(); r != nil {
			out, err = nil, &PanicError{Value: r, Stack: string(debug.Stack())}
		}
	}()
	return h(msg)
}

func (d *Deduplicator) claimFor(id identity, attempt int64) Claim {
	return Claim{ID: id.ID, Attempt: attempt, IdempotencyKey: id.idemKey}
}

// errorText renders err for the record's error column; the store makes it
// storable (valid UTF-8, no NUL, at most inbox.MaxErrorLen bytes).
func errorText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// retention is the record's retention for the store: 0 keeps it forever.
func (d *Deduplicator) retention() time.Duration {
	return max(d.cfg.Retention, 0)
}

func (d *Deduplicator) logFields(msg *message.Message, id identity, o Outcome, err error) watermill.LogFields {
	fields := watermill.LogFields{
		"message_uuid": msg.UUID,
		"outcome":      string(o),
		"operation":    id.Operation,
		"scope":        id.Scope,
		"key_digest":   id.digest,
	}
	if d.rs != nil {
		fields["mode"] = "reserve"
	}
	if err != nil {
		fields["error"] = err.Error()
	}
	return fields
}

// correlationID picks up the correlation ID set by watermill's
// CorrelationID middleware, if any; the store drops one it cannot store.
func correlationID(msg *message.Message) string {
	return msg.Metadata.Get("correlation_id")
}
