package inbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// ReserveParams are the inputs of [Store.Reserve].
type ReserveParams struct {
	// ID is the intent's identity. Operation and Key are required.
	ID ID
	// PayloadHash is the payload's fingerprint. Required.
	PayloadHash []byte
	// Owner names the worker in lease_owner: text of at most MaxOwnerLen
	// bytes. Required; see [NewOwnerID].
	Owner string
	// Lease is how long the reservation is exclusively the owner's before
	// another worker may take it over. Required.
	Lease time.Duration
	// CorrelationID links the record to logs and traces. Optional; dropped
	// when not storable.
	CorrelationID string
	// Retention is how long the record outlives its outcome before a purge
	// may delete it. 0 keeps it forever. A partitioned table ignores it,
	// as it ignores ClaimParams.Retention.
	Retention time.Duration
	// EventTime is when the event happened, as in ClaimParams.
	EventTime time.Time
}

// ReserveResult is the outcome of a successful [Store.Reserve].
type ReserveResult struct {
	// Lease is the caller's hold on a record it just inserted; nil when
	// the key was taken.
	Lease *Lease
	// Record is the inserted record, or the one that holds the key (same
	// payload fingerprint). Decide by its status: completed and failed are
	// final, pending waits for reconciliation, processing is held by a
	// lease until Record.LeaseExpired, after which [Store.TakeOver] may
	// take it.
	Record *Record
	// Err is what was wrong with this one reservation of a
	// [Store.ReserveMany] (an invalid key or lease, a *ConflictError,
	// ErrBeyondRetention); always nil from Reserve, which returns it.
	Err error
}

// Reserve inserts a processing record for p's key under a lease, in a
// statement of its own (no transaction is held across the work), or reads
// the record that already holds the key. Of several concurrent Reserve
// calls for one key exactly one gets a Lease. An existing record with
// another payload fingerprint yields a *ConflictError.
//
// The statement runs on its own, so a transient failure of it leaves
// nothing behind and is retried in place, up to [ReserveAttempts]
// statements a few milliseconds apart: on Galera the reservation that
// loses to another node's of the same key fails certification (MySQL
// error 1213), and its retry reads the winner's record, where a nack
// would have cost a redelivery. The error returned after the last
// attempt IsRetryable. (A lost connection may hide that the statement
// committed; a retry then finds the reservation as another worker's, held
// until its lease runs out, as a redelivery would.)
//
// The first lease a store hands out waits for the database's clock to be
// measured ([Store.SyncClock]), so that even it is judged by that clock.
func (s *Store) Reserve(ctx context.Context, p ReserveParams) (ReserveResult, error) {
	if err := checkLeaseParams(p.Owner, p.Lease); err != nil {
		return ReserveResult{}, err
	}
	s.syncBeforeLease(ctx)
	var (
		res ClaimResult
		err error
	)
	pause := reserveBackoff
	for attempt := 1; ; attempt++ {
		now := s.now()
		res, err = s.insert(ctx, s.db, "reserve", p.ID, p.PayloadHash, &params{
			status: StatusProcessing, leaseOwner: p.Owner, leaseUntil: dbTime(now.Add(p.Lease)),
			correlationID: p.CorrelationID, expiresAt: expiry(now, p.Retention),
		}, p.EventTime, now)
		if err == nil || !IsRetryable(err) || ctx.Err() != nil {
			break
		}
		if attempt == ReserveAttempts {
			err = fmt.Errorf("%w (%d attempts)", err, attempt)
			break
		}
		// Jittered, so that two nodes that collided do not again.
		t := time.NewTimer(pause/2 + rand.N(pause))
		select {
		case <-ctx.Done():
			t.Stop()
			return ReserveResult{}, err
		case <-t.C:
		}
		pause *= 2
	}
	if err != nil || !res.Claimed {
		return ReserveResult{Record: res.Record}, err
	}
	return ReserveResult{Lease: s.newLease(res.Record, p.Retention), Record: res.Record}, nil
}

// ReserveAttempts is how many times [Store.Reserve] sends its statement
// when it fails transiently, the first time included.
const ReserveAttempts = 4

// reserveBackoff is about the pause before Reserve's first retry; it
// doubles for each retry after it (2, 4 and 8 ms, each ±50%).
const reserveBackoff = 2 * time.Millisecond

func checkLeaseParams(owner string, lease time.Duration) error {
	var errs []error
	if owner == "" {
		errs = append(errs, errors.New("lease owner is empty"))
	} else if err := CheckText(owner, MaxOwnerLen); err != nil {
		errs = append(errs, fmt.Errorf("lease owner %w", err))
	}
	if lease <= 0 {
		errs = append(errs, fmt.Errorf("lease %v is not positive", lease))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// TakeOverParams are the inputs of [Store.TakeOver].
type TakeOverParams struct {
	// Owner and Lease are the new lease, as in ReserveParams. Required.
	Owner string
	Lease time.Duration
}

// TakeOver gives rec, a processing record whose lease expired (or was
// released), to the caller as attempt rec.Attempt+1. It is a
// compare-and-set on the attempt rec shows: of several callers that read
// the same record, exactly one gets the Lease; the others get
// [ErrLeaseLost] and should read the record again. The previous holder is
// fenced off: its handle's transitions now fail with ErrLeaseLost.
//
// A record that is not processing, or whose lease is live by the store's
// clock ([Record.LeaseExpired]), is refused with [ErrIllegalTransition].
func (s *Store) TakeOver(ctx context.Context, rec *Record, p TakeOverParams) (*Lease, error) {
	if rec == nil {
		return nil, fmt.Errorf("%w: take over a nil record", ErrIllegalTransition)
	}
	if err := checkLeaseParams(p.Owner, p.Lease); err != nil {
		return nil, err
	}
	s.syncBeforeLease(ctx)
	now := s.now()
	if !rec.LeaseExpired(now) {
		return nil, fmt.Errorf("%w: take over a %s record whose lease runs until %v (now %v)",
			ErrIllegalTransition, rec.Status, rec.LeaseUntil, now)
	}
	until := dbTime(now.Add(p.Lease))
	res, err := s.exec(ctx, s.db, s.q.takeOver, &params{id: rec.ID, attempt: rec.Attempt,
		leaseOwner: p.Owner, leaseUntil: until, updatedAt: now, now: now})
	if err != nil {
		return nil, fmt.Errorf("inbox: take over: %w", s.Classify(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, fmt.Errorf("inbox: take over: rows affected: %w", s.Classify(err))
	}
	// attempt changes, so even MySQL without CLIENT_FOUND_ROWS counts the row.
	if n != 1 {
		return nil, fmt.Errorf("inbox: take over attempt %d: %w", rec.Attempt, ErrLeaseLost)
	}
	taken := *rec
	taken.Attempt, taken.LeaseOwner, taken.LeaseUntil, taken.UpdatedAt = rec.Attempt+1, p.Owner, until, now
	return s.newLease(&taken, rec.Retention()), nil
}

// FencePending returns a handle on rec, a pending record, fenced by the
// attempt and status rec shows: its transitions apply only while nobody
// has moved the record since rec was read. It writes nothing. This is how
// a reconciler (or an operator) settles an uncertain intent: Complete or
// Fail once the outcome is known, Release when the effect did not happen
// and the intent should run again, Pend to leave it pending (touched, so
// that scans page past it).
func (s *Store) FencePending(rec *Record) (*Lease, error) {
	if rec == nil {
		return nil, fmt.Errorf("%w: fence a nil record as pending", ErrIllegalTransition)
	}
	if rec.Status != StatusPending {
		return nil, fmt.Errorf("%w: fence a %s record as pending", ErrIllegalTransition, rec.Status)
	}
	return s.newLease(rec, rec.Retention()), nil
}

// Lease is a caller's hold on a record at one attempt: the fencing token.
// Every transition it makes applies only while the record is still at
// that attempt and in the status the handle holds it in; otherwise it
// changes nothing and returns [ErrLeaseLost]. A transition other than
// Extend ends the handle: later calls return [ErrIllegalTransition].
// A Lease is safe for concurrent use (a heartbeat may Extend while the
// worker Completes).
type Lease struct {
	store     *Store
	rec       Record // as held: attempt, status, owner, and the stored values a touch keeps
	retention time.Duration

	mu      sync.Mutex
	until   time.Time
	ended   bool
	dropped string
}

func (s *Store) newLease(rec *Record, retention time.Duration) *Lease {
	return &Lease{store: s, rec: *rec, retention: retention, until: rec.LeaseUntil}
}

// A nil *Lease, or one a store did not hand out (&Lease{}), holds
// nothing: its accessors return zero values and its transitions
// ErrIllegalTransition, never a panic.

// ID is the intent the lease holds.
func (l *Lease) ID() ID {
	if l == nil {
		return ID{}
	}
	return l.rec.ID
}

// Attempt is the fencing token the lease holds.
func (l *Lease) Attempt() int64 {
	if l == nil {
		return 0
	}
	return l.rec.Attempt
}

// Owner is the lease owner ("" for a pending record's handle).
func (l *Lease) Owner() string {
	if l == nil {
		return ""
	}
	return l.rec.LeaseOwner
}

// Until is when the lease runs out by the store's clock (zero for a
// pending record's handle).
func (l *Lease) Until() time.Time {
	if l == nil {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.until
}

// Extend moves the lease to d from now, while the record is still this
// handle's processing record.
func (l *Lease) Extend(ctx context.Context, d time.Duration) error {
	if l == nil {
		return errNoLease("extend")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.check("extend", StatusProcessing); err != nil {
		return err
	}
	if d <= 0 {
		return fmt.Errorf("%w: extend a lease by %v", ErrInvalidConfig, d)
	}
	s := l.store
	now := s.now()
	until := dbTime(now.Add(d))
	p := &params{id: l.rec.ID, attempt: l.rec.Attempt, leaseUntil: until, updatedAt: now}
	err := s.exec1(ctx, s.db, "extend lease", s.q.extendLease, p, func(rec *Record) bool {
		return rec.Attempt == l.rec.Attempt && rec.Status == StatusProcessing
	})
	if err == nil {
		l.until = until
	}
	return err
}

// Outcome is what [Lease.Complete] stores.
type Outcome struct {
	// Result is the replayable outcome (for the dedup middleware, the
	// encoded output messages). Nil stores none.
	Result []byte
	// ResourceID names what the effect created. Optional.
	ResourceID string
	// ExternalRef is the provider's reference. Optional; empty keeps the
	// stored one.
	ExternalRef string
}

// Complete records that the effect happened: the record becomes
// completed, is kept for its retention from now, and redeliveries are
// duplicates.
func (l *Lease) Complete(ctx context.Context, o Outcome) error {
	return l.transition(ctx, "complete", StatusCompleted, &params{
		result: o.Result, resourceID: o.ResourceID, externalRef: o.ExternalRef,
	}, true)
}

// Fail records that the intent failed for good: the record becomes failed
// (terminal), is kept for its retention from now, and is never run again.
func (l *Lease) Fail(ctx context.Context, reason string) error {
	return l.transition(ctx, "fail", StatusFailed, &params{errS: reason}, true)
}

// Pend records that the effect's outcome is unknown (a timeout after the
// request left): the record becomes pending, which nothing re-executes,
// until a reconciler settles it. externalRef, when not empty, is the
// provider's reference to look it up by. On a pending record's handle Pend
// leaves it pending with its stored values and a new update time, so that
// scans in update order page past it; reason, when not empty, replaces its
// error.
func (l *Lease) Pend(ctx context.Context, externalRef, reason string) error {
	if l == nil {
		return errNoLease("pend")
	}
	p := &params{externalRef: externalRef, errS: reason}
	if l.rec.Status == StatusPending {
		p.result, p.resourceID = l.rec.Result, l.rec.ResourceID
		if reason == "" {
			p.errS = l.rec.Error
		}
	}
	return l.transition(ctx, "pend", StatusPending, p, false)
}

// Release gives the intent up without an outcome: the record stays
// processing with no lease, so the next delivery takes it over at once as
// a new attempt and runs the work again. Use it when the effect certainly
// did not happen. reason is stored as the record's error.
func (l *Lease) Release(ctx context.Context, reason string) error {
	return l.transition(ctx, "release", StatusProcessing, &params{errS: reason}, false)
}

// Dropped says what the handle's last transition could not store and left
// out — "" when everything was stored. The transition itself succeeded:
// the record is in the state asked for, with the error column saying what
// is missing.
func (l *Lease) Dropped() string {
	if l == nil {
		return ""
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropped
}

// transition moves the held record to status to with p's outcome.
//
// An outcome the database refuses must not leave the record where it is:
// a processing record would be taken over once its lease expires and its
// work run again — every time, since the refusal is deterministic. So the
// outcome is made storable first (storableOutcome), and when the database
// still refuses it (a result over MySQL's packet limit, a value a dialect
// rejects), the same transition is made once more with only a storable
// error saying why, no result, no reference. Only when that fails too —
// the database is down — does the record stay as it was.
func (l *Lease) transition(ctx context.Context, what string, to Status, p *params, renew bool) error {
	if l == nil {
		return errNoLease(what)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.transitionLocked(ctx, what, to, p, renew)
}

// transitionLocked is transition with l.mu held.
func (l *Lease) transitionLocked(ctx context.Context, what string, to Status, p *params, renew bool) error {
	if err := l.check(what, l.rec.Status); err != nil {
		return err
	}
	s := l.store
	p.attempt, p.fromStatus, p.status = l.rec.Attempt, l.rec.Status, to
	if renew {
		p.expiresAt = expiry(s.now(), l.retention)
	}
	// A result over the database's limit is dropped up front: MySQL
	// would close the connection over it, twice, before the fallback
	// below gave it up.
	l.dropped = storableOutcome(p, s.CheckResult(ctx, s.db, p.result))
	err := s.finish(ctx, s.db, what, l.rec.ID, p)
	if IsRetryable(err) {
		// A lost connection, a deadlock, a Galera certification conflict:
		// the same outcome once more before anything is given up. If the
		// first write committed although its answer was lost, the record
		// shows it.
		retry := *p
		if err = s.finish(ctx, s.db, what, l.rec.ID, &retry); errors.Is(err, ErrLeaseLost) && l.wrote(ctx, to) {
			err = nil
		}
	}
	if err != nil && (!IsRetryable(err) || len(p.result) >= largeResult) &&
		!errors.Is(err, ErrLeaseLost) && !errors.Is(err, ErrNotFound) {
		// Refused, not merely failed: leaving it would refuse it again at
		// every attempt. A large result counts as refused after two
		// failures even when they looked transient: MySQL answers a
		// statement over max_allowed_packet by closing the connection.
		bare := *p
		bare.result, bare.resourceID, bare.externalRef = nil, "", ""
		bare.errS = StorableText("outcome not storable, recorded without it: "+err.Error(), MaxErrorLen)
		s.limit.failedLarge(len(p.result))
		bctx := ctx
		if len(p.result) >= largeResult && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// Writing the large result used up the caller's time (a busy
			// server takes seconds over megabytes). The outcome without it
			// is a small write and gets time of its own: an effect that
			// happened is recorded rather than left to be run again.
			var cancel context.CancelFunc
			bctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), bareOutcomeTimeout)
			defer cancel()
		}
		if berr := s.finish(bctx, s.db, what, l.rec.ID, &bare); berr == nil {
			l.dropped, err = joinDropped(l.dropped, "the outcome ("+err.Error()+")"), nil
		} else if errors.Is(berr, ErrLeaseLost) && l.wrote(bctx, to) {
			// The first write committed although its answer was lost.
			err = nil
		}
	}
	if err != nil {
		if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrNotFound) {
			l.ended = true
		}
		return err
	}
	l.ended = true
	return nil
}

// bareOutcomeTimeout bounds recording an outcome without its large
// result once writing the result ran past the caller's deadline.
const bareOutcomeTimeout = 10 * time.Second

// largeResult is the size from which a result that failed twice to be
// stored is taken for refused (MySQL's max_allowed_packet is 16 MiB by
// default, and can be as small as 1 MiB).
const largeResult = 1 << 20

// wrote reports whether the record now shows the transition to status to
// at the handle's attempt: a write whose answer was lost.
func (l *Lease) wrote(ctx context.Context, to Status) bool {
	rec, err := l.store.Get(ctx, l.store.db, l.rec.ID)
	return err == nil && rec.Attempt == l.rec.Attempt && rec.Status == to && rec.LeaseOwner == ""
}

func joinDropped(a, b string) string {
	if a == "" {
		return b
	}
	return a + ", " + b
}

// check refuses a transition on an ended handle, or one that needs the
// record in another status than the handle holds it in.
func (l *Lease) check(what string, need Status) error {
	switch {
	case l.store == nil:
		return errNoLease(what)
	case l.ended:
		return fmt.Errorf("%w: %s through a lease that already ended", ErrIllegalTransition, what)
	case l.rec.Status != need:
		return fmt.Errorf("%w: %s a %s record", ErrIllegalTransition, what, l.rec.Status)
	}
	return nil
}

// errNoLease refuses what on a lease no store handed out.
func errNoLease(what string) error {
	return fmt.Errorf("%w: %s through a nil lease, or one no store handed out", ErrIllegalTransition, what)
}

// finish runs the Finish statement for id with p (attempt, from, to and
// the outcome filled in); updated_at is now.
func (s *Store) finish(ctx context.Context, q DBTX, what string, id ID, p *params) error {
	p.id, p.updatedAt = id, s.now()
	return s.exec1(ctx, q, what, s.q.finish, p, func(rec *Record) bool {
		// Matched but changed nothing: only possible when the status
		// stays (a changed status is a changed row, counted even without
		// CLIENT_FOUND_ROWS), and then every value the statement sets is
		// in place, down to this call's updated_at. Anything else — a
		// record another handle moved from this status to the one asked
		// for, with the same outcome — is a write that did not happen.
		return p.fromStatus == p.status && rec.Attempt == p.attempt && rec.Status == p.status &&
			bytes.Equal(rec.Result, p.result) && rec.ResourceID == p.resourceID && rec.Error == p.errS &&
			rec.UpdatedAt.Equal(p.updatedAt) && (p.expiresAt.IsZero() || rec.ExpiresAt.Equal(p.expiresAt)) &&
			(p.externalRef == "" || rec.ExternalRef == p.externalRef) && rec.LeaseOwner == "" && rec.LeaseUntil.IsZero()
	})
}

// exec1 runs an UPDATE that must change exactly one record. Zero rows means
// fenced off or missing — or, where the dialect counts only changed rows
// (Capabilities.ZeroRowsAmbiguous), possibly matched with every value
// already in place: there the record is read to tell which.
func (s *Store) exec1(ctx context.Context, q DBTX, what string, st stmt, p *params, applied func(*Record) bool) error {
	res, err := s.exec(ctx, q, st, p)
	if err != nil {
		return fmt.Errorf("inbox: %s: %w", what, s.Classify(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("inbox: %s: rows affected: %w", what, s.Classify(err))
	}
	if n == 1 {
		return nil
	}
	rec, err := s.Get(ctx, q, p.id)
	if err != nil {
		return fmt.Errorf("inbox: %s: %w", what, err)
	}
	if s.caps.ZeroRowsAmbiguous && applied(rec) {
		return nil
	}
	return fmt.Errorf("inbox: %s: record is %s at attempt %d: %w", what, rec.Status, rec.Attempt, ErrLeaseLost)
}
