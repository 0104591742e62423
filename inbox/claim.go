package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ClaimParams are the inputs of [Store.Claim].
type ClaimParams struct {
	// ID is the intent's identity. Operation and Key are required.
	ID ID
	// PayloadHash is the payload's fingerprint, 1 to MaxPayloadHashLen
	// bytes. Required.
	PayloadHash []byte
	// Status is the state the record is inserted with: StatusCompleted
	// (the default) or StatusFailed. Nobody can see the row before the
	// claim's transaction commits, and a rollback removes it, so the claim
	// inserts the outcome the transaction will have if it commits. Leases
	// (StatusProcessing) come from [Store.Reserve].
	Status Status
	// CorrelationID links the record to logs and traces. Optional; a value
	// that is not storable text of at most MaxCorrelationIDLen bytes is
	// dropped, never a reason to refuse the claim.
	CorrelationID string
	// Error is stored with a StatusFailed record, made storable
	// ([StorableText], at most MaxErrorLen bytes). Optional.
	Error string
	// Retention is how long the record outlives its claim before a purge
	// may delete it. 0 keeps it forever. A partitioned table ignores it:
	// its records expire when their bucket closes.
	Retention time.Duration
	// EventTime is when the event happened, by its producer: in a
	// partitioned table it decides the record's bucket, and an event
	// whose bucket has closed is refused with [ErrBeyondRetention]. Zero
	// means the claim's time. Other tables ignore it.
	EventTime time.Time
}

// MaxCorrelationIDLen bounds the correlation ID stored with a record.
const MaxCorrelationIDLen = 255

func checkHash(h []byte) error {
	if len(h) == 0 || len(h) > MaxPayloadHashLen {
		return fmt.Errorf("inbox: payload hash must be 1 to %d bytes, got %d", MaxPayloadHashLen, len(h))
	}
	return nil
}

// storableCorrelationID keeps an optional correlation ID only when every
// dialect stores it unchanged.
func storableCorrelationID(v string) string {
	if CheckText(v, MaxCorrelationIDLen) != nil {
		return ""
	}
	return v
}

// ClaimResult is the outcome of a successful [Store.Claim].
type ClaimResult struct {
	// Claimed is true when this call inserted the record: the caller owns
	// the intent. False means the key existed with the same payload
	// fingerprint: a duplicate.
	Claimed bool
	// Record is the inserted record when Claimed, and the existing one
	// otherwise.
	Record *Record
	// Err is what was wrong with this one claim of a [Store.ClaimMany]
	// (an invalid key, a *ConflictError); always nil from Claim, which
	// returns it.
	Err error
}

// claimRetries bounds how often an insert is tried again when the row that
// blocked it is gone by the time it is read (deleted by a purge, or rolled
// back under a driver that reported the conflict early).
const claimRetries = 3

// Claim inserts the record for p's key through q, or reads the record that
// already holds it: the transactional claim. q is normally a transaction
// in which the caller then does the intent's work: a concurrent Claim of
// the same key waits until that transaction ends and sees its outcome, so
// exactly one caller gets Claimed = true, and a rollback forgets the
// claim together with the work.
//
// An existing record with another payload fingerprint yields a
// *ConflictError (errors.Is ErrPayloadConflict). Database errors worth a
// retry satisfy [IsRetryable]; the transaction should then be rolled back.
func (s *Store) Claim(ctx context.Context, q DBTX, p ClaimParams) (ClaimResult, error) {
	if p.Status == "" {
		p.Status = StatusCompleted
	}
	if p.Status != StatusCompleted && p.Status != StatusFailed {
		return ClaimResult{}, fmt.Errorf("%w: a transactional claim inserts completed or failed, not %q (leases come from Reserve)",
			ErrIllegalTransition, p.Status)
	}
	now := s.now()
	return s.insert(ctx, q, "claim", p.ID, p.PayloadHash, &params{
		status: p.Status, correlationID: p.CorrelationID, errS: StorableText(p.Error, MaxErrorLen),
		expiresAt: expiry(now, p.Retention),
	}, p.EventTime, now)
}

func expiry(now time.Time, retention time.Duration) time.Time {
	if retention <= 0 {
		return time.Time{}
	}
	return dbTime(now.Add(retention))
}

// insert runs the Insert statement, reading the existing record when the
// key is taken. p carries the status, lease, correlation ID, error and
// expiry; the identity, hash and times are filled here.
func (s *Store) insert(ctx context.Context, q DBTX, what string, id ID, hash []byte, p *params, eventTime, now time.Time) (ClaimResult, error) {
	if err := errors.Join(id.Validate(), checkHash(hash)); err != nil {
		return ClaimResult{}, err
	}
	if err := s.place(ctx, q, p, eventTime, now); err != nil {
		if errors.Is(err, ErrBeyondRetention) {
			return s.beyondRetention(ctx, q, what, id, hash, err)
		}
		return ClaimResult{}, fmt.Errorf("inbox: %s: %w", what, err)
	}
	p.id, p.payloadHash = id, hash
	p.correlationID = storableCorrelationID(p.correlationID)
	p.createdAt, p.updatedAt = now, now
	for range claimRetries {
		res, err := s.exec(ctx, q, s.q.insert, p)
		if err != nil {
			s.forgetPartitions()
			return ClaimResult{}, fmt.Errorf("inbox: %s: %w", what, s.Classify(err))
		}
		n, err := res.RowsAffected()
		if err != nil {
			return ClaimResult{}, fmt.Errorf("inbox: %s: rows affected: %w", what, s.Classify(err))
		}
		if n == 1 {
			return ClaimResult{Claimed: true, Record: &Record{
				ID: id, PayloadHash: hash, Status: p.status, Attempt: 1, LeaseOwner: p.leaseOwner,
				LeaseUntil: p.leaseUntil, CorrelationID: p.correlationID, Error: p.errS,
				CreatedAt: now, UpdatedAt: now, ExpiresAt: p.expiresAt,
			}}, nil
		}
		rec, err := scanRecord(s.queryRow(ctx, q, s.q.selectForClaim, &params{id: id}))
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return ClaimResult{}, fmt.Errorf("inbox: %s: read existing record: %w", what, s.Classify(err))
		}
		if !rec.SamePayload(hash) {
			return ClaimResult{Record: rec}, &ConflictError{ID: id, Existing: rec}
		}
		return ClaimResult{Record: rec}, nil
	}
	return ClaimResult{}, fmt.Errorf("inbox: %s: the record holding the key vanished %d times in a row: %w",
		what, claimRetries, ErrTransient)
}

// beyondRetention answers a claim of an event whose bucket has closed: by
// its record while one is left (a duplicate, or a conflict), with refused
// (ErrBeyondRetention) once none is.
func (s *Store) beyondRetention(ctx context.Context, q DBTX, what string, id ID, hash []byte, refused error) (ClaimResult, error) {
	rec, err := scanRecord(s.queryRow(ctx, q, s.q.selectForClaim, &params{id: id}))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return ClaimResult{}, refused
	case err != nil:
		return ClaimResult{}, fmt.Errorf("inbox: %s: read existing record: %w", what, s.Classify(err))
	case !rec.SamePayload(hash):
		return ClaimResult{Record: rec}, &ConflictError{ID: id, Existing: rec}
	}
	return ClaimResult{Record: rec}, nil
}

// SaveOutput stores result with a record this caller's transaction q has
// just claimed ([Store.Claim] with Claimed = true), before it commits:
// what a duplicate replays. Claims insert no result, so only intents that
// produce output pay for this second statement.
//
// A result larger than [Store.ResultLimit] is not sent: SaveOutput returns
// [ErrResultTooLarge] and leaves q's transaction as it was, so that the
// caller can commit the claim without the result (MySQL would otherwise
// close the connection, and the transaction with it, at every attempt).
func (s *Store) SaveOutput(ctx context.Context, q DBTX, rec *Record, result []byte) error {
	if rec == nil {
		return fmt.Errorf("%w: save output of a nil record", ErrIllegalTransition)
	}
	if rec.Status != StatusCompleted {
		return fmt.Errorf("%w: output is stored with a completed record, not a %s one", ErrIllegalTransition, rec.Status)
	}
	if tooLarge := s.CheckResult(ctx, q, result); tooLarge != nil {
		return fmt.Errorf("inbox: save output: %w", tooLarge)
	}
	err := s.finish(ctx, q, "save output", rec.ID, &params{
		attempt: rec.Attempt, fromStatus: StatusCompleted, status: StatusCompleted, result: result,
		resourceID: rec.ResourceID, errS: rec.Error,
	})
	if err != nil {
		s.limit.failedLarge(len(result))
		return err
	}
	rec.Result = result
	return nil
}

// Get reads one record through q, or returns [ErrNotFound]. An id no
// record can have ([ID.Validate]) is [ErrInvalidKey], without a statement:
// PostgreSQL would refuse its invalid UTF-8 or NUL bytes with an error
// of its own.
func (s *Store) Get(ctx context.Context, q DBTX, id ID) (*Record, error) {
	if err := id.Validate(); err != nil {
		return nil, fmt.Errorf("inbox: get: %w", err)
	}
	rec, err := scanRecord(s.queryRow(ctx, q, s.q.selectOne, &params{id: id}))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("inbox: get: %w", s.Classify(err))
	}
	return rec, nil
}

// Delete removes one record through q. It reports [ErrNotFound] when there
// was none, and [ErrInvalidKey] for an id no record can have. Deleting a
// record forgets the intent: a later delivery of the same key runs again.
func (s *Store) Delete(ctx context.Context, q DBTX, id ID) error {
	if err := id.Validate(); err != nil {
		return fmt.Errorf("inbox: delete: %w", err)
	}
	res, err := s.exec(ctx, q, s.q.del, &params{id: id})
	if err != nil {
		return fmt.Errorf("inbox: delete: %w", s.Classify(err))
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return ErrNotFound
	}
	return nil
}
