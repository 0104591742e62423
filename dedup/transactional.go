package dedup

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/inbox"
)

// transactional runs one delivery in ModeTransactional, retrying the whole
// transaction when it fails transiently before the handler ran.
func (d *Deduplicator) transactional(msg *message.Message, h message.HandlerFunc, id identity) (
	[]*message.Message, Outcome, error,
) {
	ctx := msg.Context()
	if d.tx.JoinTx != nil {
		if tx, ok := d.tx.JoinTx(ctx); ok {
			return d.joined(ctx, tx, msg, h, id)
		}
	}
	if d.grp != nil {
		return d.grp.do(msg, h, id)
	}
	return d.alone(msg, h, id)
}

// alone runs one delivery in a transaction of its own.
func (d *Deduplicator) alone(msg *message.Message, h message.HandlerFunc, id identity) (
	[]*message.Message, Outcome, error,
) {
	ctx := msg.Context()
	if d.shouldReadFirst() {
		cctx, sp := d.startPhase(ctx, spanClaim, id)
		sp.setBool(attrReadFirst, true)
		out, outcome, attempt, err, done := d.readFirst(cctx, id)
		if done {
			sp.end(string(outcome), attempt, err)
			d.dups.observe(outcome == OutcomeDuplicate)
			return out, outcome, err
		}
		sp.end("undecided", attempt, nil)
	}
	for attempt := 1; ; attempt++ {
		out, outcome, ran, err := d.once(ctx, msg, h, id)
		if err == nil {
			d.dups.observe(outcome == OutcomeDuplicate)
		}
		if err != nil && !ran && inbox.IsRetryable(err) && attempt < d.tx.ClaimAttempts && ctx.Err() == nil {
			continue
		}
		var pe *PermanentError
		if errors.As(err, &pe) {
			return d.recordPermanent(ctx, msg, id, pe, err)
		}
		return out, outcome, err
	}
}

// once makes one transactional try in a transaction of its own. ran
// reports whether h was called.
func (d *Deduplicator) once(ctx context.Context, msg *message.Message, h message.HandlerFunc, id identity) (
	out []*message.Message, outcome Outcome, ran bool, err error,
) {
	// The delivery's context ends the transaction until its COMMIT is
	// sent, not after: pgx runs the COMMIT under the context the
	// transaction began with, and a cancel (a router closing) during the
	// COMMIT's round trip left its outcome unknown — committed, and the
	// delivery nacked. Before the COMMIT a cancel still rolls back and
	// frees the key's lock at once, even while a handler ignores it.
	txCtx, endTx := context.WithCancel(context.WithoutCancel(ctx))
	defer endTx()
	unwatch := context.AfterFunc(ctx, endTx)
	defer unwatch()
	tx, err := d.store.BeginTx(txCtx, d.tx.TxOptions)
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, OutcomeRetry, false, fmt.Errorf("dedup: begin: %w", d.store.Classify(err))
	}
	out, outcome, ran, commit, err := d.inTx(ctx, tx, tx.Tx, msg, h, id)
	if err != nil || outcome != OutcomeExecuted {
		// A duplicate only read; a failure must leave nothing behind.
		_ = tx.Rollback()
		commit.end(string(OutcomeRetry), 0, err)
		return out, outcome, ran, err
	}
	if !unwatch() {
		// The delivery's context ended after the handler: rolled back.
		_ = tx.Rollback()
		err := fmt.Errorf("dedup: commit: %w", ctx.Err())
		commit.end(string(OutcomeRetry), 0, err)
		return nil, OutcomeRetry, true, err
	}
	if err := tx.Commit(); err != nil {
		// After a lost connection the commit may have happened; the
		// redelivery's claim finds out, so a nack is safe either way.
		err = fmt.Errorf("dedup: commit: %w", d.store.Classify(err))
		commit.end(string(OutcomeRetry), 0, err)
		return nil, OutcomeRetry, true, err
	}
	commit.end(string(OutcomeExecuted), 0, nil)
	return out, OutcomeExecuted, true, nil
}

// inTx claims the message in tx and, when the key is new, runs h in it and
// stores h's output. The store's statements go through q: tx itself, or
// the *inbox.Tx wrapping it, which lets the store use its prepared
// statements. It neither commits nor rolls back: the caller owns tx,
// whether the middleware began it or a transport's consuming transaction
// (with a savepoint around the attempt) is joined. On OutcomeExecuted the
// caller commits; on anything else it rolls back. Once the handler has
// succeeded, commit is the span of storing its output and committing,
// which the caller ends.
func (d *Deduplicator) inTx(ctx context.Context, q inbox.DBTX, tx *sql.Tx, msg *message.Message, h message.HandlerFunc, id identity) (
	out []*message.Message, outcome Outcome, ran bool, commit span, err error,
) {
	cctx, sp := d.startPhase(ctx, spanClaim, id)
	start := time.Now()
	res, err := d.store.Claim(cctx, q, inbox.ClaimParams{
		ID:            id.ID,
		PayloadHash:   id.hash,
		Status:        inbox.StatusCompleted,
		CorrelationID: correlationID(msg),
		Retention:     d.retention(),
		EventTime:     id.eventTime,
	})
	d.metrics.observeClaim(id.Operation, time.Since(start))
	switch {
	case errors.Is(err, ErrPayloadConflict):
		sp.end(string(OutcomeConflict), 0, err)
		return nil, OutcomeConflict, false, span{}, err
	case err != nil:
		outcome := claimFailure(err)
		sp.end(string(outcome), 0, err)
		return nil, outcome, false, span{}, err
	case !res.Claimed:
		out, outcome, err := d.replay(res.Record)
		sp.end(string(outcome), res.Record.Attempt, err)
		return out, outcome, false, span{}, err
	}
	sp.end(phaseClaimed, res.Record.Attempt, nil)

	claim := d.claimFor(id, res.Record.Attempt)
	hctx, sp := d.startPhase(ctx, spanHandler, id)
	out, err = d.run(hctx, tx, msg, h, claim)
	if err != nil {
		err = d.classifyHandlerErr(ctx, tx, err)
		sp.end(string(handlerOutcome(err)), claim.Attempt, err)
		return nil, OutcomeRetry, true, span{}, err
	}
	sp.end(string(OutcomeExecuted), claim.Attempt, nil)

	octx, commit := d.startPhase(ctx, spanCommit, id)
	if len(out) > 0 {
		// Inserted as completed without a result (see ClaimParams.Status);
		// only handlers that produce messages pay for this second statement.
		enc, err := encodeMessages(out)
		if err != nil {
			return nil, OutcomeRetry, true, commit, err
		}
		if err := d.store.SaveOutput(octx, q, res.Record, enc); errors.Is(err, inbox.ErrResultTooLarge) {
			// Refused before it was sent: the effects commit without it.
			d.outputDropped(msg, id, err)
		} else if err != nil {
			return nil, OutcomeRetry, true, commit, fmt.Errorf("dedup: store output: %w", err)
		}
	}
	return out, OutcomeExecuted, true, commit, nil
}

// handlerOutcome is what a transactional handler's error leads to: a
// recorded failure for a Permanent one, a retry for any other.
func handlerOutcome(err error) Outcome {
	var pe *PermanentError
	if errors.As(err, &pe) {
		return OutcomeFailed
	}
	return OutcomeRetry
}

// recordPermanent records a permanent failure after the handler's
// transaction rolled back, so that later deliveries are acked without
// running the handler, and returns err for the poison queue. If recording
// fails the delivery is only retried, with an error that is not poison. If another delivery of the intent
// recorded an outcome first — it claimed the key once this one's claim
// rolled back, and ran the handler too — that record decides, as it does
// for any duplicate: the failure is counted, and poisoned, once.
func (d *Deduplicator) recordPermanent(ctx context.Context, msg *message.Message, id identity, pe *PermanentError, err error) (
	[]*message.Message, Outcome, error,
) {
	fctx, sp := d.startPhase(context.WithoutCancel(ctx), spanFail, id)
	res, cerr := d.store.Claim(fctx, d.store.DB(), d.permanentClaim(msg, id, pe))
	switch {
	case cerr != nil:
		sp.end(string(OutcomeRetry), 0, cerr)
		// Not the permanent error itself: a poison queue would take the
		// message, while nothing recorded the failure. Nacked, the
		// redelivery runs the handler again and records it then.
		d.log.Info("inboxmill: could not record a permanent failure; the message will be retried",
			d.logFields(msg, id, OutcomeRetry, cerr))
		return nil, OutcomeRetry, fmt.Errorf("dedup: record the permanent failure %q: %w", pe.Error(), cerr)
	case !res.Claimed:
		out, outcome, err := d.replay(res.Record)
		sp.end(string(outcome), res.Record.Attempt, err)
		return out, outcome, err
	}
	sp.end(string(OutcomeFailed), res.Record.Attempt, nil)
	return nil, OutcomeFailed, err
}

// replay decides what a delivery of a key that is already recorded does.
func (d *Deduplicator) replay(rec *inbox.Record) ([]*message.Message, Outcome, error) {
	switch rec.Status {
	case inbox.StatusCompleted:
		out, err := decodeMessages(rec.Result)
		if err != nil {
			// The intent is done; a result this middleware cannot read (set
			// by hand or by a reconciler that did not use EncodeOutput) must
			// not turn every redelivery into a failure. Ack, replay nothing.
			d.log.Info("inboxmill: stored result is not replayable output; acking the duplicate without it",
				watermill.LogFields{"operation": rec.Operation, "scope": rec.Scope,
					"key_digest": rec.Digest(), "error": err.Error()})
			return nil, OutcomeDuplicate, nil
		}
		return out, OutcomeDuplicate, nil
	case inbox.StatusFailed:
		// Terminal: the intent was tried and refused for good. Running it
		// again would not be a retry but a second intent.
		return nil, OutcomeDuplicate, nil
	case inbox.StatusPending:
		return nil, OutcomePending, fmt.Errorf("%w (attempt %d)", ErrPending, rec.Attempt)
	default:
		return nil, OutcomeInFlight, fmt.Errorf("%w (record is %s, attempt %d)", ErrInFlight, rec.Status, rec.Attempt)
	}
}

func (d *Deduplicator) permanentClaim(msg *message.Message, id identity, pe *PermanentError) inbox.ClaimParams {
	return inbox.ClaimParams{
		ID: id.ID, PayloadHash: id.hash, Status: inbox.StatusFailed, Error: errorText(pe.Err),
		CorrelationID: correlationID(msg), Retention: d.retention(), EventTime: id.eventTime,
	}
}

// classifyHandlerErr classifies the handler's error by the dialect's
// driver codes only: a handler's own io.EOF or failed HTTP call must not
// come back as a transient database error. A lost connection is the
// exception, since drivers report it as a plain network error (lib/pq:
// "connection reset by peer", then driver.ErrBadConn): when the error looks
// like one and the claim's transaction no longer answers either, it was
// the database's connection that broke, and the redelivery is safe.
func (d *Deduplicator) classifyHandlerErr(ctx context.Context, tx *sql.Tx, err error) error {
	if c := d.store.Dialect().Classify(err); c != err || d.store.Classify(err) == err {
		return c
	}
	if _, perr := tx.ExecContext(context.WithoutCancel(ctx), "SELECT 1"); perr != nil {
		return inbox.Transient(err)
	}
	return err
}
