package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrResultTooLarge: a result is larger than the store can write
// ([Store.ResultLimit]). Nothing was written; the caller's transaction is
// intact and may go on without the result.
var ErrResultTooLarge = errors.New("inbox: result too large to store")

// ResultMargin is what the dialects shipped keep free, below the database's
// limit on one statement or value, for the rest of the statement that
// stores a result: the key columns, the error text (at most MaxErrorLen),
// the other outcome columns and the protocol's framing. Measured on
// MariaDB 10.11 with every other column at its largest, a result of
// max_allowed_packet less 8 bytes is stored when bound as a prepared
// statement's parameter, and with interpolateParams=true a result of all
// NUL bytes (escaped to twice its size) up to half of max_allowed_packet
// less 5,769 bytes; the margin is eleven times that.
const ResultMargin = 64 << 10

// FallbackResultLimit is the limit [Store.ResultLimit] reports while the
// database's own could not be read: MySQL's max_allowed_packet of 1 MiB
// (the smallest in common use), less ResultMargin.
const FallbackResultLimit = 1<<20 - ResultMargin

// resultLimitRefresh is how long a limit read from the database is used
// before it is read again: MySQL's max_allowed_packet can be changed while
// the store runs (SET GLOBAL, for new connections).
const resultLimitRefresh = 10 * time.Minute

// resultLimitRetry spaces out reads of the limit while they fail.
const resultLimitRetry = time.Second

// resultSample is the result ResultLimit binds as ArgResult.
var resultSample = []byte("inboxmill")

// resultLimit caches the limit read from the database.
type resultLimit struct {
	mu     sync.Mutex
	n      int       // 0: never read
	read   time.Time // when n was read (local clock)
	failed time.Time // when a read last failed
	err    error     // why it failed
	stale  bool      // a large write failed: read again before the next
	max    int       // Config.MaxResult; 0 for none
}

// ResultLimit returns the size in bytes of the largest result the store
// writes: the database's limit (Queries.ResultLimit: MySQL's
// max_allowed_packet, or half of it when the driver interpolates
// parameters — interpolateParams=true escapes a result into the
// statement's text, up to twice its size —, half of PostgreSQL's 1 GiB
// for a value, SQLite's 1e9 bytes, each less [ResultMargin]), lowered to
// Config.MaxResult when that is set. A larger result is refused before it reaches the
// database: [Store.SaveOutput] returns [ErrResultTooLarge], and a
// [Lease]'s Complete records the outcome without it ([Lease.Dropped]).
//
// The limit is read through q — the caller's transaction, so that no
// second connection is needed while it is open — on the first call, again
// every ten minutes, and after a large result failed to be written. When
// the read fails, ResultLimit returns the last limit read or, if none
// was, [FallbackResultLimit], together with the error, which the caller
// may log; a failed read is not tried again for a second, and meanwhile
// the same answer is given.
func (s *Store) ResultLimit(ctx context.Context, q DBTX) (int, error) {
	c := &s.limit
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.n > 0 && !c.stale && now.Sub(c.read) < resultLimitRefresh {
		return c.capped(c.n), nil
	}
	if !c.failed.IsZero() && now.Sub(c.failed) < resultLimitRetry {
		return c.capped(c.n), c.err
	}
	var n int64
	// As text with arguments, never a statement the store prepared: that
	// is how a caller's own transaction sends a result, and the sample
	// shows the dialect whether the driver binds it or writes it into the
	// text.
	st := s.q.resultLimit
	err := q.QueryRowContext(ctx, st.SQL, s.bind(st, &params{result: resultSample})...).Scan(&n)
	switch {
	case err != nil:
		err = fmt.Errorf("inbox: read the result limit: %w", s.Classify(err))
	case n <= 0:
		err = fmt.Errorf("inbox: read the result limit: the database reports %d bytes", n)
	}
	if err != nil {
		c.failed, c.err = now, err
		return c.capped(c.n), err
	}
	c.n, c.read, c.failed, c.err, c.stale = int(n), now, time.Time{}, nil, false
	return c.capped(c.n), nil
}

// capped applies Config.MaxResult to n, with FallbackResultLimit for a
// limit never read.
func (c *resultLimit) capped(n int) int {
	if n <= 0 {
		n = FallbackResultLimit
	}
	if c.max > 0 && c.max < n {
		return c.max
	}
	return n
}

// failedLarge notes that writing a result of size bytes failed: when it
// is a large one, the limit is read again before the next check, in case
// the database's was lowered.
func (c *resultLimit) failedLarge(size int) {
	if size >= largeResult {
		c.mu.Lock()
		c.stale = true
		c.mu.Unlock()
	}
}

// ResultTooLargeError is a result refused by [Store.CheckResult]; it
// satisfies errors.Is(err, ErrResultTooLarge).
type ResultTooLargeError struct {
	// Size is the result's size and Limit the store's, in bytes.
	Size, Limit int
	// ReadErr is why the database's limit could not be read, when Limit
	// is the fallback ([Store.ResultLimit]); nil otherwise.
	ReadErr error
}

func (e *ResultTooLargeError) Error() string {
	if e.ReadErr != nil {
		return fmt.Sprintf("%v: %d bytes, over the fallback limit of %d bytes (%v)", ErrResultTooLarge, e.Size, e.Limit, e.ReadErr)
	}
	return fmt.Sprintf("%v: %d bytes, over the limit of %d bytes", ErrResultTooLarge, e.Size, e.Limit)
}

// Is reports whether target is ErrResultTooLarge.
func (e *ResultTooLargeError) Is(target error) bool { return target == ErrResultTooLarge }

// Unwrap returns ReadErr.
func (e *ResultTooLargeError) Unwrap() error { return e.ReadErr }

// CheckResult returns a *[ResultTooLargeError] when result is larger than
// [Store.ResultLimit], reading the limit through q when needed, and nil
// when the store writes it. A result of at most FallbackResultLimit bytes
// (and Config.MaxResult) passes without a read: MySQL's max_allowed_packet
// can be set lower than 1 MiB, but then only the write's own failure
// tells. [Store.SaveOutput] and a [Lease]'s transitions check their result
// with it; a caller checks first to know the result will be dropped.
func (s *Store) CheckResult(ctx context.Context, q DBTX, result []byte) error {
	if len(result) <= s.limit.capped(0) {
		// The common small result costs no read.
		return nil
	}
	limit, readErr := s.ResultLimit(ctx, q)
	if len(result) <= limit {
		return nil
	}
	return &ResultTooLargeError{Size: len(result), Limit: limit, ReadErr: readErr}
}
