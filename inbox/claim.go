package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// ClaimParams are the inputs of [Store.Claim].
type ClaimParams struct {
	// Scope is the tenant or security scope. May be empty (one global scope).
	Scope string
	// Operation names what is done with the key, e.g. the handler's name.
	// Required.
	Operation string
	// Key identifies the business intent, e.g. the event's ID. Required.
	Key string
	// PayloadHash is the payload's fingerprint. Required.
	PayloadHash []byte
	// Status is the state the record is inserted with. Defaults to
	// StatusProcessing. Transactional callers insert StatusCompleted
	// directly: nobody can see the row before their transaction commits, and
	// a rollback removes it, so an intermediate state would never be read.
	Status Status
	// LeaseOwner and LeaseUntil describe the claimer's lease, if any.
	LeaseOwner string
	LeaseUntil time.Time
	// CorrelationID links the record to logs and traces. Optional.
	CorrelationID string
	// Error is stored with the record; useful when inserting StatusFailed
	// directly. Optional.
	Error string
	// ExpiresAt is when the record may be purged. Zero keeps it forever.
	ExpiresAt time.Time
}

func (p ClaimParams) validate() error {
	var errs []error
	if err := ValidateIdentity(p.Scope, p.Operation, p.Key); err != nil {
		errs = append(errs, err)
	}
	if len(p.PayloadHash) == 0 || len(p.PayloadHash) > 64 {
		errs = append(errs, fmt.Errorf("inbox: payload hash must be 1 to 64 bytes, got %d", len(p.PayloadHash)))
	}
	if !p.Status.Valid() {
		errs = append(errs, fmt.Errorf("inbox: unknown status %q", p.Status))
	}
	return errors.Join(errs...)
}

// ValidateIdentity checks a record's identifying columns against the limits
// every dialect shares: valid UTF-8 without NUL bytes, within MaxScopeLen,
// MaxOperationLen and MaxKeyLen, and a non-empty operation and key. Errors
// wrap [ErrInvalidKey].
func ValidateIdentity(scope, operation, key string) error {
	var errs []error
	check := func(name, v string, max int, required bool) {
		switch {
		case required && v == "":
			errs = append(errs, fmt.Errorf("%w: %s is empty", ErrInvalidKey, name))
		case len(v) > max:
			errs = append(errs, fmt.Errorf("%w: %s is %d bytes, more than %d", ErrInvalidKey, name, len(v), max))
		case !utf8.ValidString(v):
			errs = append(errs, fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidKey, name))
		case containsNUL(v):
			errs = append(errs, fmt.Errorf("%w: %s contains a NUL byte", ErrInvalidKey, name))
		}
	}
	check("scope", scope, MaxScopeLen, false)
	check("operation", operation, MaxOperationLen, true)
	check("key", key, MaxKeyLen, true)
	return errors.Join(errs...)
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
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
}

// claimRetries bounds how often Claim re-inserts when the row that blocked
// its insert is gone by the time it reads it (deleted by a purge, or rolled
// back under a driver that reported the conflict early).
const claimRetries = 3

// Claim inserts the record for p's key through q, or reads the record that
// already holds it. q is normally a transaction: a concurrent Claim of the
// same key then waits until that transaction ends and sees its outcome, so
// exactly one caller gets Claimed = true.
//
// An existing record with another payload fingerprint yields a
// *ConflictError (errors.Is ErrPayloadConflict). Database errors worth a
// retry satisfy [IsRetryable]; the transaction should then be rolled back.
func (s *Store) Claim(ctx context.Context, q DBTX, p ClaimParams) (ClaimResult, error) {
	if p.Status == "" {
		p.Status = StatusProcessing
	}
	if err := p.validate(); err != nil {
		return ClaimResult{}, err
	}
	now := s.now().UTC()
	for range claimRetries {
		res, err := s.execContext(ctx, q, s.q.Insert,
			p.Scope, p.Operation, p.Key, p.PayloadHash, string(p.Status), p.LeaseOwner,
			s.timeArg(p.LeaseUntil), p.CorrelationID, p.Error, s.timeArg(now), s.timeArg(now), s.timeArg(p.ExpiresAt))
		if err != nil {
			return ClaimResult{}, fmt.Errorf("inbox: claim: %w", s.Classify(err))
		}
		n, err := res.RowsAffected()
		if err != nil {
			return ClaimResult{}, fmt.Errorf("inbox: claim: rows affected: %w", s.Classify(err))
		}
		if n == 1 {
			return ClaimResult{Claimed: true, Record: &Record{
				Scope: p.Scope, Operation: p.Operation, Key: p.Key, PayloadHash: p.PayloadHash,
				Status: p.Status, Attempt: 1, LeaseOwner: p.LeaseOwner, LeaseUntil: p.LeaseUntil,
				CorrelationID: p.CorrelationID, Error: p.Error, CreatedAt: now, UpdatedAt: now, ExpiresAt: p.ExpiresAt,
			}}, nil
		}
		rec, err := scanRecord(s.queryRowContext(ctx, q, s.q.SelectForClaim, p.Scope, p.Operation, p.Key))
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return ClaimResult{}, fmt.Errorf("inbox: claim: read existing record: %w", s.Classify(err))
		}
		if !rec.SamePayload(p.PayloadHash) {
			return ClaimResult{Record: rec}, &ConflictError{
				Scope: p.Scope, Operation: p.Operation, KeyDigest: KeyDigest(p.Scope, p.Operation, p.Key), Existing: rec,
			}
		}
		return ClaimResult{Record: rec}, nil
	}
	return ClaimResult{}, fmt.Errorf("inbox: claim: the record holding the key vanished %d times in a row: %w",
		claimRetries, ErrTransient)
}

// Get reads one record through q, or returns [ErrNotFound].
func (s *Store) Get(ctx context.Context, q DBTX, scope, operation, key string) (*Record, error) {
	rec, err := scanRecord(s.queryRowContext(ctx, q, s.q.Select, scope, operation, key))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("inbox: get: %w", s.Classify(err))
	}
	return rec, nil
}

// Delete removes one record through q. It reports [ErrNotFound] when there
// was none. Deleting a record forgets the intent: a later delivery of the
// same key runs again.
func (s *Store) Delete(ctx context.Context, q DBTX, scope, operation, key string) error {
	res, err := q.ExecContext(ctx, s.q.Delete, scope, operation, key)
	if err != nil {
		return fmt.Errorf("inbox: delete: %w", s.Classify(err))
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return ErrNotFound
	}
	return nil
}
