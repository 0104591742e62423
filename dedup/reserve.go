package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/inbox"
)

// finishTimeout bounds recording an outcome after the handler returned. It
// runs on a context detached from the message's: an effect that happened
// must be recorded even when the router is shutting down.
const finishTimeout = 15 * time.Second

// reserve runs one delivery in Reserve mode:
//
//  1. a short statement reserves the intent (processing, lease, attempt 1);
//  2. the handler runs with no transaction open, a heartbeat extending the
//     lease;
//  3. a short statement records the outcome, fenced by the attempt.
//
// A delivery that finds the intent reserved waits a bounded time for it,
// takes it over if its lease expired, and otherwise nacks.
func (d *Deduplicator) reserve(msg *message.Message, h message.HandlerFunc, id identity) (
	[]*message.Message, Outcome, error,
) {
	rctx, sp := d.startPhase(msg.Context(), spanReserve, id)
	var expecting bool
	if d.rb != nil {
		d.rb.reserves.expect() // consumed by the first reservation
		// The batches' statements at once adapt to what they serve: the
		// delivery from its reservation to its completion.
		tk, start := d.rb.ctl.enter(), time.Now()
		defer func() { d.rb.ctl.done(time.Since(start), tk) }()
	}
	lease, rec, out, outcome, err := d.acquire(rctx, msg, id, &expecting)
	if lease == nil {
		var attempt int64
		if rec != nil {
			attempt = rec.Attempt
		}
		sp.end(string(outcome), attempt, err)
		return out, outcome, err
	}
	sp.setBool(attrTakeover, rec != nil)
	sp.end(phaseClaimed, lease.Attempt(), nil)
	return d.execute(msg, h, id, lease, expecting)
}

// acquire reserves the intent: it returns the lease when the handler is
// to run under it (with the record it took over, or nil for a new
// reservation), and otherwise what the delivery does instead, with the
// last record it read. With Reserve.Batch, *expecting is set when a
// reservation batch gave the lease and announced the delivery to the
// completion batch.
func (d *Deduplicator) acquire(ctx context.Context, msg *message.Message, id identity, expecting *bool) (
	lease *inbox.Lease, rec *inbox.Record, out []*message.Message, outcome Outcome, err error,
) {
	rs := d.rs
	waitUntil := time.Now().Add(max(rs.InFlightWait, 0))
	first := true
	for {
		if rec == nil {
			start := time.Now()
			res, announced, err := d.reserveIntent(ctx, inbox.ReserveParams{
				ID:            id.ID,
				PayloadHash:   id.hash,
				Owner:         rs.Owner,
				Lease:         rs.Lease,
				CorrelationID: correlationID(msg),
				Retention:     d.retention(),
				EventTime:     id.eventTime,
			}, first)
			*expecting = announced
			first = false
			d.metrics.observeClaim(id.Operation, time.Since(start))
			switch {
			case errors.Is(err, ErrPayloadConflict):
				return nil, nil, nil, OutcomeConflict, err
			case err != nil:
				return nil, nil, nil, claimFailure(err), err
			case res.Lease != nil:
				return res.Lease, nil, nil, "", nil
			}
			rec = res.Record
		}

		var leaseLeft time.Duration
		switch rec.Status {
		case inbox.StatusCompleted, inbox.StatusFailed:
			out, outcome, err := d.replay(rec)
			return nil, rec, out, outcome, err
		case inbox.StatusPending:
			if rs.AckPending {
				return nil, rec, nil, OutcomePending, nil
			}
		case inbox.StatusProcessing:
			now := d.store.Now()
			if rec.LeaseExpired(now) {
				lease, err := d.store.TakeOver(ctx, rec, inbox.TakeOverParams{Owner: rs.Owner, Lease: rs.Lease})
				switch {
				case err == nil:
					d.stats.takeover.Add(1)
					d.metrics.observeTakeover(id.Operation)
					return lease, rec, nil, "", nil
				case errors.Is(err, inbox.ErrLeaseLost), errors.Is(err, inbox.ErrIllegalTransition):
					// Another delivery took it first (or the store's clock
					// moved back past the lease): read what it did. If the
					// record still shows the attempt just refused, wait below
					// rather than spin.
					seen := rec.Attempt
					if rec = d.reread(ctx, id); rec == nil || rec.Attempt != seen || rec.Status != inbox.StatusProcessing {
						continue
					}
				default:
					return nil, rec, nil, OutcomeRetry, err
				}
			}
			leaseLeft = rec.LeaseUntil.Sub(now)
		}

		// Held by a live lease, or pending: wait a bounded time.
		left := time.Until(waitUntil)
		if left <= 0 {
			if rec.Status == inbox.StatusPending {
				return nil, rec, nil, OutcomePending, fmt.Errorf("%w (attempt %d)", ErrPending, rec.Attempt)
			}
			return nil, rec, nil, OutcomeInFlight, fmt.Errorf("%w (held by %s, attempt %d)", ErrInFlight, rec.LeaseOwner, rec.Attempt)
		}
		pause := min(rs.InFlightPoll, left)
		if leaseLeft > 0 {
			pause = min(pause, leaseLeft+time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return nil, rec, nil, OutcomeRetry, ctx.Err()
		case <-time.After(pause):
		}
		rec = d.reread(ctx, id)
	}
}

// reread reads the record again; nil (claim again) when it is gone or the
// read failed, so that the next round's claim reports the error.
func (d *Deduplicator) reread(ctx context.Context, id identity) *inbox.Record {
	rec, err := d.store.Get(ctx, d.store.DB(), id.ID)
	if err != nil {
		return nil
	}
	return rec
}

// execute runs the handler under lease, then records the outcome the
// handler's error classifies through it. expecting says whether the
// delivery is announced to the completion batch (Reserve.Batch).
func (d *Deduplicator) execute(msg *message.Message, h message.HandlerFunc, id identity, lease *inbox.Lease, expecting bool) (
	[]*message.Message, Outcome, error,
) {
	ctx := msg.Context()
	// The handler's context ends when the heartbeat finds the lease lost:
	// another worker owns the intent, and this one should stop its call.
	hctx, lost := context.WithCancelCause(ctx)
	stop := d.heartbeat(msg, id, lease, lost)
	sctx, sp := d.startPhase(hctx, spanHandler, id)
	out, herr := d.run(sctx, nil, msg, h, d.claimFor(id, lease.Attempt()))
	stop()
	lost(nil)
	if expecting && herr != nil {
		d.rb.completes.withdraw() // no completion to join
	}

	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	var (
		outcome Outcome
		ret     error
		ferr    error
		to      inbox.Status
		pe      *PermanentError
		ue      *UncertainError
	)
	switch {
	case herr == nil:
		sp.end(string(OutcomeExecuted), lease.Attempt(), nil)
		enc, err := encodeMessages(out)
		if err != nil {
			// The effect happened; record it, without the unusable output.
			d.log.Info("inboxmill: handler output cannot be stored; recording completion without it",
				d.logFields(msg, id, OutcomeExecuted, err))
			out = nil
		} else if err := d.store.CheckResult(fctx, d.store.DB(), enc); err != nil {
			d.outputDropped(msg, id, err)
			enc = nil
		}
		to, outcome = inbox.StatusCompleted, OutcomeExecuted
		fctx, sp = d.startPhase(fctx, spanComplete, id)
		ferr = d.completeIntent(fctx, lease, inbox.Outcome{Result: enc}, expecting)
	case errors.As(herr, &ue):
		sp.end(string(OutcomePending), lease.Attempt(), herr)
		to, outcome = inbox.StatusPending, OutcomePending
		if !d.rs.AckPending {
			ret = fmt.Errorf("%w: %w", ErrPending, herr)
		}
		fctx, sp = d.startPhase(fctx, spanPend, id)
		ferr = lease.Pend(fctx, ue.ExternalRef, errorText(ue.Err))
	case errors.As(herr, &pe):
		sp.end(string(OutcomeFailed), lease.Attempt(), herr)
		to, outcome, ret = inbox.StatusFailed, OutcomeFailed, herr
		fctx, sp = d.startPhase(fctx, spanFail, id)
		ferr = lease.Fail(fctx, errorText(pe.Err))
	default:
		// Transient: release the reservation so the redelivery takes it
		// over at once instead of waiting out the lease.
		sp.end(string(OutcomeRetry), lease.Attempt(), herr)
		to, outcome, ret = inbox.StatusProcessing, OutcomeRetry, herr
		fctx, sp = d.startPhase(fctx, spanRelease, id)
		ferr = lease.Release(fctx, errorText(herr))
	}
	if ferr != nil {
		sp.end(string(OutcomeRetry), lease.Attempt(), ferr)
	} else {
		sp.end(string(outcome), lease.Attempt(), nil)
	}
	if ferr == nil && lease.Dropped() != "" {
		d.log.Info("inboxmill: outcome recorded without what the database cannot store",
			d.logFields(msg, id, outcome, fmt.Errorf("dropped: %s", lease.Dropped())))
	}
	if ferr != nil {
		// Lease lost: another worker owns the intent now and records its
		// outcome. Anything else: the record stays processing under this
		// lease; after it expires a redelivery takes it over as a new
		// attempt, which is why handlers pass Claim.IdempotencyKey on.
		return nil, OutcomeRetry, errors.Join(fmt.Errorf("dedup: record outcome %s: %w", to, ferr), herr)
	}
	if outcome == OutcomeExecuted {
		return out, outcome, nil
	}
	return nil, outcome, ret
}

// heartbeat extends the lease every HeartbeatInterval until the returned
// stop function is called; stop waits for the goroutine to end. It gives up
// when the lease is lost (cancelling the handler's context with lost; the
// final transition reports it), and when the message's context ends: the
// consumer is going away, and the intent is left to expire and be taken
// over rather than held by a worker that may never report.
func (d *Deduplicator) heartbeat(msg *message.Message, id identity, lease *inbox.Lease, lost context.CancelCauseFunc) (stop func()) {
	if d.rs.HeartbeatInterval <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	msgDone := msg.Context().Done()
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(d.rs.HeartbeatInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-msgDone:
				return
			case <-t.C:
			}
			err := lease.Extend(ctx, d.rs.Lease)
			switch {
			case err == nil, ctx.Err() != nil:
			case errors.Is(err, inbox.ErrLeaseLost), errors.Is(err, inbox.ErrNotFound):
				d.log.Info("inboxmill: lease lost while the handler runs; another worker took over",
					d.logFields(msg, id, OutcomeRetry, err))
				lost(fmt.Errorf("%w: %w", ErrLeaseLost, err))
				return
			default:
				d.log.Info("inboxmill: heartbeat failed; will try again", d.logFields(msg, id, OutcomeRetry, err))
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
