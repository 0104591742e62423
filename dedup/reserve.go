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

// reserve runs one delivery in ModeReserve:
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
	ctx := msg.Context()
	db := d.store.DB()
	if _, synced := d.store.ClockOffset(); !synced && d.clockTry.due(time.Now()) {
		// Leases are judged by the database's clock (inbox.Config.ClockSync);
		// measure it before a reservation rather than in the background
		// after it, until one measurement succeeded (at most once a
		// second while none does). Without clock sync
		// (SQLite, or turned off) this returns at once. A failure leaves
		// the local clock in use; the claim reports a database that is down.
		_ = d.store.SyncClock(ctx)
	}
	waitUntil := time.Now().Add(max(d.cfg.InFlightWait, 0))
	var rec *inbox.Record
	for {
		if rec == nil {
			start := time.Now()
			now := d.store.Now()
			res, err := d.store.Claim(ctx, db, inbox.ClaimParams{
				Scope:         id.scope,
				Operation:     id.operation,
				Key:           id.key,
				PayloadHash:   id.hash,
				Status:        inbox.StatusProcessing,
				LeaseOwner:    d.cfg.Owner,
				LeaseUntil:    now.Add(d.cfg.Lease),
				CorrelationID: correlationID(msg),
				ExpiresAt:     d.expiresAt(),
			})
			d.metrics.observeClaim(id.operation, time.Since(start))
			switch {
			case errors.Is(err, ErrPayloadConflict):
				return nil, OutcomeConflict, err
			case err != nil:
				return nil, OutcomeRetry, err
			case res.Claimed:
				return d.execute(msg, h, id, res.Record.Attempt)
			}
			rec = res.Record
		}

		var leaseLeft time.Duration
		switch rec.Status {
		case inbox.StatusCompleted, inbox.StatusFailed:
			return d.replay(rec)
		case inbox.StatusPending:
			if d.cfg.AckPending {
				return nil, OutcomePending, nil
			}
		case inbox.StatusProcessing:
			now := d.store.Now()
			// The same rule as the TakeOver statement (lease_until < now):
			// were they to disagree on a lease expiring exactly now, the
			// delivery would spin between a refused take-over and a re-read.
			if rec.LeaseUntil.IsZero() || rec.LeaseUntil.Before(now) {
				ok, err := d.store.TakeOver(ctx, db, inbox.TakeOverParams{
					Scope: id.scope, Operation: id.operation, Key: id.key, Attempt: rec.Attempt,
					LeaseOwner: d.cfg.Owner, LeaseUntil: now.Add(d.cfg.Lease),
				})
				if err != nil {
					return nil, OutcomeRetry, err
				}
				if ok {
					d.stats.takeover.Add(1)
					d.metrics.observeTakeover(id.operation)
					return d.execute(msg, h, id, rec.Attempt+1)
				}
				// Another delivery took it first: read what it did. If the
				// record still shows the attempt just refused, wait below
				// rather than spin.
				seen := rec.Attempt
				if rec = d.reread(ctx, id); rec == nil || rec.Attempt != seen || rec.Status != inbox.StatusProcessing {
					continue
				}
			}
			leaseLeft = rec.LeaseUntil.Sub(now)
		}

		// Held by a live lease, or pending: wait a bounded time.
		left := time.Until(waitUntil)
		if left <= 0 {
			if rec.Status == inbox.StatusPending {
				return nil, OutcomePending, fmt.Errorf("%w (attempt %d)", ErrPending, rec.Attempt)
			}
			return nil, OutcomeInFlight, fmt.Errorf("%w (held by %s, attempt %d)", ErrInFlight, rec.LeaseOwner, rec.Attempt)
		}
		pause := min(d.cfg.InFlightPoll, left)
		if leaseLeft > 0 {
			pause = min(pause, leaseLeft+time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return nil, OutcomeRetry, ctx.Err()
		case <-time.After(pause):
		}
		rec = d.reread(ctx, id)
	}
}

// reread reads the record again; nil (claim again) when it is gone or the
// read failed, so that the next round's claim reports the error.
func (d *Deduplicator) reread(ctx context.Context, id identity) *inbox.Record {
	rec, err := d.store.Get(ctx, d.store.DB(), id.scope, id.operation, id.key)
	if err != nil {
		return nil
	}
	return rec
}

// execute runs the handler for a reservation this worker holds at attempt,
// then records the outcome the handler's error classifies.
func (d *Deduplicator) execute(msg *message.Message, h message.HandlerFunc, id identity, attempt int64) (
	[]*message.Message, Outcome, error,
) {
	ctx := msg.Context()
	// The handler's context ends when the heartbeat finds the lease lost:
	// another worker owns the intent, and this one should stop its call.
	hctx, lost := context.WithCancelCause(ctx)
	stop := d.heartbeat(msg, id, attempt, lost)
	out, herr := d.run(hctx, nil, msg, h, d.claimFor(id, attempt))
	stop()
	lost(nil)
	msg.SetContext(ctx)

	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	fin := inbox.FinishParams{Scope: id.scope, Operation: id.operation, Key: id.key, Attempt: attempt,
		From: inbox.StatusProcessing}
	var (
		outcome Outcome
		ret     error
		pe      *PermanentError
		ue      *UncertainError
	)
	switch {
	case herr == nil:
		enc, err := encodeMessages(out)
		if err != nil {
			// The effect happened; record it, without the unusable output.
			d.cfg.Logger.Info("inboxmill: handler output cannot be stored; recording completion without it",
				d.logFields(msg, id, OutcomeExecuted, err))
			out = nil
		}
		fin.To, fin.Result, fin.ExpiresAt, outcome = inbox.StatusCompleted, enc, d.expiresAt(), OutcomeExecuted
	case errors.As(herr, &ue):
		fin.To, fin.ExternalRef, fin.Error, outcome = inbox.StatusPending, ue.ExternalRef, errorText(ue.Err), OutcomePending
		if !d.cfg.AckPending {
			ret = fmt.Errorf("%w: %w", ErrPending, herr)
		}
	case errors.As(herr, &pe):
		fin.To, fin.Error, fin.ExpiresAt, outcome, ret = inbox.StatusFailed, errorText(pe.Err), d.expiresAt(), OutcomeFailed, herr
	default:
		// Transient: release the reservation so the redelivery takes it
		// over at once instead of waiting out the lease.
		fin.To, fin.Error, outcome, ret = inbox.StatusProcessing, errorText(herr), OutcomeRetry, herr
	}
	if err := d.store.Finish(fctx, d.store.DB(), fin); err != nil {
		// Lease lost: another worker owns the intent now and records its
		// outcome. Anything else: the record stays processing under this
		// lease; after it expires a redelivery takes it over as a new
		// attempt, which is why handlers pass Claim.IdempotencyKey on.
		return nil, OutcomeRetry, errors.Join(fmt.Errorf("dedup: record outcome %s: %w", fin.To, err), herr)
	}
	if outcome == OutcomeExecuted {
		return out, outcome, nil
	}
	return nil, outcome, ret
}

// heartbeat extends the lease every HeartbeatInterval until the returned
// stop function is called; stop waits for the goroutine to end. It gives up
// when the lease is lost (cancelling the handler's context with lost; the
// final Finish reports it), and when the
// message's context ends: the consumer is going away, and the intent is
// left to expire and be taken over rather than held by a worker that may
// never report.
func (d *Deduplicator) heartbeat(msg *message.Message, id identity, attempt int64, lost context.CancelCauseFunc) (stop func()) {
	if d.cfg.HeartbeatInterval <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	msgDone := msg.Context().Done()
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(d.cfg.HeartbeatInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-msgDone:
				return
			case <-t.C:
			}
			err := d.store.ExtendLease(ctx, d.store.DB(), id.scope, id.operation, id.key, attempt,
				d.store.Now().Add(d.cfg.Lease))
			switch {
			case err == nil, ctx.Err() != nil:
			case errors.Is(err, inbox.ErrLeaseLost), errors.Is(err, inbox.ErrNotFound):
				d.cfg.Logger.Info("inboxmill: lease lost while the handler runs; another worker took over",
					d.logFields(msg, id, OutcomeRetry, err))
				lost(fmt.Errorf("%w: %w", ErrLeaseLost, err))
				return
			default:
				d.cfg.Logger.Info("inboxmill: heartbeat failed; will try again", d.logFields(msg, id, OutcomeRetry, err))
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
