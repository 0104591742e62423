package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Prepare decides whether a [Store] runs its frequent statements — claim,
// read, finish, take-over, lease extension — as statements prepared once
// per connection.
type Prepare int

const (
	// PrepareAuto (the default) prepares where the dialect prefers it
	// (Capabilities.PreferPrepare): on MySQL and SQLite, not on PostgreSQL.
	// MySQL's driver otherwise prepares, executes and closes a statement
	// for every parameterized call (two round trips; one with
	// interpolateParams=true), and SQLite parses the SQL again each time.
	// On PostgreSQL, pgx already caches prepared statements per connection,
	// and named statements do not survive a PgBouncer in transaction mode;
	// choose PrepareAlways for lib/pq without such a pooler.
	PrepareAuto Prepare = iota
	// PrepareAlways prepares on every dialect.
	PrepareAlways
	// PrepareNever sends the SQL text with every call.
	PrepareNever
)

func (p Prepare) String() string {
	switch p {
	case PrepareAuto:
		return "auto"
	case PrepareAlways:
		return "always"
	case PrepareNever:
		return "never"
	}
	return fmt.Sprintf("Prepare(%d)", int(p))
}

func (p Prepare) enabled(c Capabilities) bool {
	switch p {
	case PrepareAlways:
		return true
	case PrepareNever:
		return false
	}
	return c.PreferPrepare
}

// Tx is a transaction on the store's database, begun by [Store.BeginTx].
// Passed to the store's methods, it lets them run their statements through
// the store's prepared statements; anything else runs through the embedded
// *sql.Tx, which is also what Commit and Rollback end.
type Tx struct {
	*sql.Tx
	store *Store
}

// BeginTx begins a transaction on the store's database. It is
// s.DB().BeginTx, with the statement cache (see [Prepare]) made available
// to the store's methods called with the returned *Tx. A plain *sql.Tx
// works with every method as well, without that cache: the store cannot
// tell which database an arbitrary transaction belongs to.
func (s *Store) BeginTx(ctx context.Context, opts *sql.TxOptions) (*Tx, error) {
	// Prepared before the transaction holds a connection: preparing on the
	// database inside it would need a second one, and wait forever for it
	// when the pool has no other.
	for _, q := range []stmt{s.q.insert, s.q.selectForClaim, s.q.selectOne, s.q.finish} {
		s.prepared(ctx, q.SQL)
	}
	tx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &Tx{Tx: tx, store: s}, nil
}

// stmtCache holds the statements prepared on the store's database, by SQL
// text. database/sql prepares each again on every connection that runs it,
// lazily, and keeps it there until Close.
type stmtCache struct {
	on     bool
	m      sync.Map // string -> *sql.Stmt
	failed sync.Map // string -> time.Time: do not try to prepare before then
	mu     sync.Mutex
	closed atomic.Bool // set under mu
}

// prepareBackoff is how long a statement that failed to prepare (not for
// the caller's context) is sent as text before the store tries again.
const prepareBackoff = time.Minute

func (c *stmtCache) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed.Store(true)
	var first error
	c.m.Range(func(k, v any) bool {
		if err := v.(*sql.Stmt).Close(); err != nil && first == nil {
			first = err
		}
		c.m.Delete(k)
		return true
	})
	return first
}

// cached returns the store's statement for query if it was prepared.
func (s *Store) cached(query string) *sql.Stmt {
	if !s.stmts.on {
		return nil
	}
	if st, ok := s.stmts.m.Load(query); ok {
		return st.(*sql.Stmt)
	}
	return nil
}

// prepared returns the store's statement for query, preparing it on first
// use, or nil when statements are off or preparing failed: the caller then
// sends the text, which reports any real error. Preparing runs under the
// caller's context and holds no lock, so it waits for a connection no
// longer than the caller would; two first uses may both prepare, and the
// second statement is closed.
func (s *Store) prepared(ctx context.Context, query string) *sql.Stmt {
	c := &s.stmts
	if !c.on {
		return nil
	}
	if st := s.cached(query); st != nil {
		return st
	}
	if c.closed.Load() {
		return nil
	}
	if until, ok := c.failed.Load(query); ok && time.Now().Before(until.(time.Time)) {
		return nil
	}
	st, err := s.db.PrepareContext(ctx, query)
	if err != nil {
		if ctx.Err() == nil {
			// The server refused (MySQL's max_prepared_stmt_count, say):
			// send the text for a while instead of asking on every call.
			c.failed.Store(query, time.Now().Add(prepareBackoff))
		}
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		_ = st.Close()
		return nil
	}
	if prev, loaded := c.m.LoadOrStore(query, st); loaded {
		_ = st.Close()
		return prev.(*sql.Stmt)
	}
	return st
}

// stmt returns the prepared statement to run query on q, or nil to send
// the text: q must be the store's database or a *Tx of this store.
func (s *Store) stmt(ctx context.Context, q DBTX, query string) *sql.Stmt {
	switch q := q.(type) {
	case *sql.DB:
		if q == s.db {
			return s.prepared(ctx, query)
		}
	case *Tx:
		if q.store != nil && q.store.db == s.db {
			// Only a statement prepared already (BeginTx prepares the
			// ones a transaction needs): see BeginTx.
			if st := s.cached(query); st != nil {
				// Bound to the transaction's connection, prepared there at
				// most once; closed with the transaction.
				return q.StmtContext(ctx, st)
			}
		}
	}
	return nil
}

// unusableStmt reports an error of running a prepared statement that
// means it was not run, so that sending the text instead is safe: the
// statement was closed (Store.Close raced with the call), or preparing it
// on a new connection was refused.
func (s *Store) unusableStmt(err error) bool {
	if err == nil {
		return false
	}
	if err.Error() == "sql: statement is closed" { // database/sql's errStmtClosed
		return true
	}
	return errors.Is(s.dialect.Classify(err), ErrPrepareRefused)
}

// exec runs st with p's values through q.
func (s *Store) exec(ctx context.Context, q DBTX, st stmt, p *params) (sql.Result, error) {
	args := s.bind(st, p)
	if ps := s.stmt(ctx, q, st.SQL); ps != nil {
		res, err := ps.ExecContext(ctx, args...)
		if !s.unusableStmt(err) {
			return res, err
		}
	}
	return q.ExecContext(ctx, st.SQL, args...)
}

// row is what queryRowContext returns: *sql.Row's Scan, falling back to
// the text when the prepared statement turns out unusable.
type row struct {
	row      *sql.Row
	fallback func() *sql.Row
	unusable func(error) bool
}

func (r row) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if r.fallback != nil && r.unusable(err) {
		return r.fallback().Scan(dest...)
	}
	return err
}

// queryRow runs st with p's values through q and returns its one row.
func (s *Store) queryRow(ctx context.Context, q DBTX, st stmt, p *params) row {
	args := s.bind(st, p)
	text := func() *sql.Row { return q.QueryRowContext(ctx, st.SQL, args...) }
	if ps := s.stmt(ctx, q, st.SQL); ps != nil {
		return row{row: ps.QueryRowContext(ctx, args...), fallback: text, unusable: s.unusableStmt}
	}
	return row{row: text()}
}

// query runs st with p's values through q (never prepared: scans are rare).
func (s *Store) query(ctx context.Context, q DBTX, st stmt, p *params) (*sql.Rows, error) {
	return q.QueryContext(ctx, st.SQL, s.bind(st, p)...)
}
