package inbox

import (
	"bytes"
	"context"
	"fmt"
	"time"
)

// FinishParams are the inputs of [Store.Finish].
type FinishParams struct {
	Scope, Operation, Key string
	// Attempt is the fencing token the caller holds (Record.Attempt).
	Attempt int64
	// From is the status the record must be in. Defaults to
	// StatusProcessing.
	From Status
	// To is the new status.
	To Status
	// Result is the replayable outcome; nil stores NULL.
	Result []byte
	// ResourceID names what the effect created. Optional.
	ResourceID string
	// ExternalRef is the provider's reference. Optional; empty keeps the
	// stored one.
	ExternalRef string
	// Error describes a failure or an uncertainty. Optional.
	Error string
	// ExpiresAt, when not zero, replaces the record's expiry. Callers moving
	// a record to completed or failed set it to now plus the retention, so
	// that an intent that stayed pending or processing longer than its
	// retention is not purged the moment it finishes (and then run again by
	// the next redelivery).
	ExpiresAt time.Time
}

// Finish moves the record from p.From to p.To with p's outcome and drops its
// lease, provided the record is still at p.Attempt and in p.From. Otherwise
// it changes nothing and returns [ErrLeaseLost] ([ErrNotFound] when there is
// no record). Moving a record to StatusProcessing releases it: the next
// delivery takes it over at once.
func (s *Store) Finish(ctx context.Context, q DBTX, p FinishParams) error {
	if p.From == "" {
		p.From = StatusProcessing
	}
	if !p.From.Valid() || !p.To.Valid() {
		return fmt.Errorf("inbox: finish: unknown status %q or %q", p.From, p.To)
	}
	return s.exec1(ctx, q, "finish", s.q.Finish, func(rec *Record) bool {
		return rec.Attempt == p.Attempt && rec.Status == p.To && bytes.Equal(rec.Result, p.Result) &&
			rec.ResourceID == p.ResourceID && rec.Error == p.Error
	}, p.Scope, p.Operation, p.Key,
		string(p.To), p.Result, p.ResourceID, p.ExternalRef, p.Error, s.timeArg(s.now()), s.timeArg(p.ExpiresAt),
		p.Scope, p.Operation, p.Key, p.Attempt, string(p.From))
}

// TakeOverParams are the inputs of [Store.TakeOver].
type TakeOverParams struct {
	Scope, Operation, Key string
	// Attempt is the attempt the caller saw; the take-over succeeds only if
	// the record is still at it.
	Attempt int64
	// LeaseOwner and LeaseUntil are the new lease.
	LeaseOwner string
	LeaseUntil time.Time
}

// TakeOver gives a processing record whose lease expired (or was released)
// to the caller as attempt Attempt+1. It is a compare-and-set: of several
// callers that saw the same attempt, exactly one gets (true, nil); the
// others get (false, nil) and should read the record again. The previous
// holder is fenced off: its Finish and ExtendLease now fail with
// [ErrLeaseLost].
func (s *Store) TakeOver(ctx context.Context, q DBTX, p TakeOverParams) (bool, error) {
	now := s.now()
	res, err := s.execContext(ctx, q, s.q.TakeOver, p.LeaseOwner, s.timeArg(p.LeaseUntil), s.timeArg(now),
		p.Scope, p.Operation, p.Key, p.Attempt, s.timeArg(now))
	if err != nil {
		return false, fmt.Errorf("inbox: take over: %w", s.Classify(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("inbox: take over: rows affected: %w", s.Classify(err))
	}
	// attempt changes, so even MySQL without CLIENT_FOUND_ROWS counts the row.
	return n == 1, nil
}

// ExtendLease moves the lease of a processing record to until, provided it
// is still at attempt; otherwise [ErrLeaseLost] (or [ErrNotFound]).
func (s *Store) ExtendLease(ctx context.Context, q DBTX, scope, operation, key string, attempt int64, until time.Time) error {
	return s.exec1(ctx, q, "extend lease", s.q.ExtendLease, func(rec *Record) bool {
		return rec.Attempt == attempt && rec.Status == StatusProcessing
	}, scope, operation, key,
		s.timeArg(until), s.timeArg(s.now()), scope, operation, key, attempt)
}

// exec1 runs an UPDATE that must change exactly one record. Zero rows means
// fenced off or missing — or, where the dialect counts only changed rows
// (MySQL without CLIENT_FOUND_ROWS), possibly matched with every value
// already in place: there the record is read to tell which.
func (s *Store) exec1(ctx context.Context, q DBTX, what, query string, applied func(*Record) bool,
	scope, operation, key string, args ...any) error {
	res, err := s.execContext(ctx, q, query, args...)
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
	rec, err := s.Get(ctx, q, scope, operation, key)
	if err != nil {
		return fmt.Errorf("inbox: %s: %w", what, err)
	}
	if s.q.ZeroRowsAmbiguous && applied(rec) {
		return nil
	}
	return fmt.Errorf("inbox: %s: record is %s at attempt %d: %w", what, rec.Status, rec.Attempt, ErrLeaseLost)
}

// ListPending returns up to limit pending records, least recently updated
// first.
func (s *Store) ListPending(ctx context.Context, q DBTX, limit int) ([]*Record, error) {
	return s.list(ctx, q, "list pending", s.q.SelectPending, limit)
}

// ListStale returns up to limit processing records whose lease has expired
// (or was released) and that nobody updated since updatedBefore: their
// worker is gone and no redelivery took them over.
func (s *Store) ListStale(ctx context.Context, q DBTX, updatedBefore time.Time, limit int) ([]*Record, error) {
	return s.list(ctx, q, "list stale", s.q.SelectStale, s.timeArg(s.now()), s.timeArg(updatedBefore), limit)
}

func (s *Store) list(ctx context.Context, q DBTX, what, query string, args ...any) ([]*Record, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("inbox: %s: %w", what, s.Classify(err))
	}
	defer rows.Close()
	var out []*Record
	for rows.Next() {
		rec, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("inbox: %s: %w", what, err)
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox: %s: %w", what, s.Classify(err))
	}
	return out, nil
}

// Stats describes the unfinished part of the inbox.
type Stats struct {
	Processing int64
	Pending    int64
	// OldestPending is when the oldest pending record was first claimed;
	// zero when none is pending.
	OldestPending time.Time
	// OldestExpired is the earliest expires_at of a finished record not yet
	// purged; zero when none. now minus it is the purge lag.
	OldestExpired time.Time
}

// Stats counts processing and pending records and reports the purge lag.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	rows, err := s.db.QueryContext(ctx, s.q.UnfinishedStats)
	if err != nil {
		return st, fmt.Errorf("inbox: stats: %w", s.Classify(err))
	}
	defer rows.Close()
	for rows.Next() {
		var (
			status string
			n      int64
			oldest time.Time
		)
		if err := rows.Scan(&status, &n, timeCol{&oldest}); err != nil {
			return st, fmt.Errorf("inbox: stats: %w", err)
		}
		switch Status(status) {
		case StatusProcessing:
			st.Processing = n
		case StatusPending:
			st.Pending, st.OldestPending = n, oldest
		}
	}
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("inbox: stats: %w", s.Classify(err))
	}
	if err := s.db.QueryRowContext(ctx, s.q.OldestExpired).Scan(timeCol{&st.OldestExpired}); err != nil {
		return st, fmt.Errorf("inbox: stats: %w", s.Classify(err))
	}
	return st, nil
}
