package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"
)

// ListPending returns up to limit pending records, least recently updated
// first. A negative limit is [ErrInvalidParams].
func (s *Store) ListPending(ctx context.Context, limit int) ([]*Record, error) {
	if limit < 0 {
		return nil, invalidParams("list pending", []error{fmt.Errorf("limit %d is negative", limit)})
	}
	return s.list(ctx, "list pending", s.q.selectPending, &params{limit: limit})
}

// ListStale returns up to limit processing records whose lease has expired
// (or was released) and that nobody updated since updatedBefore: their
// worker is gone and no redelivery took them over. A negative limit is
// [ErrInvalidParams] (the databases read LIMIT -1 three ways).
func (s *Store) ListStale(ctx context.Context, updatedBefore time.Time, limit int) ([]*Record, error) {
	if limit < 0 {
		return nil, invalidParams("list stale", []error{fmt.Errorf("limit %d is negative", limit)})
	}
	return s.list(ctx, "list stale", s.q.selectStale, &params{now: s.now(), before: storableTime(updatedBefore), limit: limit})
}

// The times every dialect's time column holds: MySQL's DATETIME and its
// driver stop at the years 1 and 9999. No time the store writes lies
// outside (retentions and leases end within 292 years of now).
var (
	firstStorableTime = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	lastStorableTime  = time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)
)

// storableTime brings a caller's bound within what every dialect stores:
// compared with stored times, the bound then selects what it did.
func storableTime(t time.Time) time.Time {
	switch {
	case t.Before(firstStorableTime):
		return firstStorableTime
	case t.After(lastStorableTime):
		return lastStorableTime
	}
	return t
}

func (s *Store) list(ctx context.Context, what string, st stmt, p *params) ([]*Record, error) {
	rows, err := s.query(ctx, s.db, st, p)
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
	rows, err := s.query(ctx, s.db, s.q.unfinishedStats, &params{})
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
	if err := s.queryRow(ctx, s.db, s.q.oldestExpired, &params{}).Scan(timeCol{&st.OldestExpired}); err != nil {
		return st, fmt.Errorf("inbox: stats: %w", s.Classify(err))
	}
	return st, nil
}

// WithSavepoint runs fn inside a savepoint of tx, the caller's transaction:
// the savepoint is released when fn returns nil and rolled back to when fn
// returns an error or panics (the panic goes on), so fn's writes are kept
// or undone without ending tx. When a savepoint statement fails — the
// database ended the transaction (a MySQL deadlock rolls it back whole) —
// the error wraps [ErrTxAborted]: tx must not be written through again.
//
// Calls nest: fn may call WithSavepoint on tx again (through this store or
// another), and each savepoint has a name of its own, so the inner one's
// rollback or release never touches the outer one's.
func (s *Store) WithSavepoint(ctx context.Context, tx DBTX, fn func() error) (err error) {
	name := savepointName(savepointSeq.Add(1))
	if _, err := s.exec(ctx, tx, stmt(s.q.dialect.Savepoint(name)), &params{}); err != nil {
		return fmt.Errorf("inbox: savepoint: %w", s.Classify(err))
	}
	undo := func(cause error) error {
		// A context already cancelled still needs the rollback to run.
		rctx := context.WithoutCancel(ctx)
		if _, rerr := s.exec(rctx, tx, stmt(s.q.dialect.RollbackToSavepoint(name)), &params{}); rerr != nil {
			return joinErrs([]error{cause, fmt.Errorf("%w: rollback to savepoint: %w", ErrTxAborted, rerr)})
		}
		if _, rerr := s.exec(rctx, tx, stmt(s.q.dialect.ReleaseSavepoint(name)), &params{}); rerr != nil {
			return joinErrs([]error{cause, fmt.Errorf("%w: release savepoint: %w", ErrTxAborted, rerr)})
		}
		return cause
	}
	panicked := true
	defer func() {
		if panicked {
			_ = undo(nil)
		}
	}()
	ferr := fn()
	panicked = false
	if ferr != nil {
		return undo(ferr)
	}
	if _, rerr := s.exec(ctx, tx, stmt(s.q.dialect.ReleaseSavepoint(name)), &params{}); rerr != nil {
		return fmt.Errorf("%w: release savepoint: %w", ErrTxAborted, s.Classify(rerr))
	}
	return nil
}

// savepointSeq numbers the savepoints of every store in the process, so
// that no two share a name, even in one transaction used by two stores.
var savepointSeq atomic.Uint64

// savepointName is the name of the n-th savepoint.
func savepointName(n uint64) string { return "inboxmill_sp_" + strconv.FormatUint(n, 10) }

var _ DBTX = (*sql.Tx)(nil)
