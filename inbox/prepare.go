package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
)

// Prepare decides whether a [Store] runs its frequent statements — claim,
// read, finish, take-over, lease extension — as statements prepared once
// per connection.
type Prepare int

const (
	// PrepareAuto (the default) prepares on MySQL and SQLite and not on
	// PostgreSQL. MySQL's driver otherwise prepares, executes and closes a
	// statement for every parameterized call (two round trips; one with
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

func (p Prepare) enabled(d Dialect) bool {
	switch p {
	case PrepareAlways:
		return true
	case PrepareNever:
		return false
	}
	switch d.Name() {
	case "mysql", "sqlite":
		return true
	}
	return false
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
	for _, q := range []string{s.q.Insert, s.q.SelectForClaim, s.q.Select, s.q.Finish} {
		s.prepared(ctx, q)
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
	mu     sync.Mutex
	closed bool
}

// Close releases the statements the store prepared (see [Prepare]). The
// store keeps working afterwards, sending SQL text. It does not close the
// database. Call it when the store is no longer used but the database is:
// MySQL, for one, limits prepared statements server-wide
// (max_prepared_stmt_count).
func (s *Store) Close() error {
	c := &s.stmts
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
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
// use, or nil when statements are off or preparing failed (the caller then
// sends the text, which reports any real error).
func (s *Store) prepared(ctx context.Context, query string) *sql.Stmt {
	c := &s.stmts
	if !c.on {
		return nil
	}
	if st := s.cached(query); st != nil {
		return st
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	if st, ok := c.m.Load(query); ok {
		return st.(*sql.Stmt)
	}
	// Not under ctx's cancellation alone: a statement prepared for one
	// caller serves all of them.
	st, err := s.db.PrepareContext(context.WithoutCancel(ctx), query)
	if err != nil {
		return nil
	}
	c.m.Store(query, st)
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

func (s *Store) execContext(ctx context.Context, q DBTX, query string, args ...any) (sql.Result, error) {
	if st := s.stmt(ctx, q, query); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return q.ExecContext(ctx, query, args...)
}

func (s *Store) queryRowContext(ctx context.Context, q DBTX, query string, args ...any) *sql.Row {
	if st := s.stmt(ctx, q, query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return q.QueryRowContext(ctx, query, args...)
}
