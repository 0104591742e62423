// Package pgxgroup is group commit's fastest mode, for PostgreSQL through
// pgx: a group's BEGIN and claim go to the server in one round trip, and
// the statements its handlers queue go with its COMMIT in a second, so
// that a group of any size costs two round trips.
//
// Turn it on with dedup.Group's Pipeline, over a store whose *sql.DB
// uses pgx's database/sql driver (sql.Open("pgx", dsn), or
// stdlib.OpenDBFromPool(pool)):
//
//	mw, err := dedup.New(store, dedup.Config{
//		Key:  dedup.KeyFromMetadata("event_id"),
//		Mode: dedup.Transactional{Group: &dedup.Group{Pipeline: pgxgroup.Pipeline()}},
//	})
//
// A handler takes its share of the group's transaction with FromContext
// and queues its writes:
//
//	tx, ok := pgxgroup.FromContext(msg.Context())
//	if !ok {
//		return nil, errors.New("no group transaction")
//	}
//	tx.Queue(`INSERT INTO orders (id, total) VALUES ($1, $2)`, id, total)
//
// A queued statement runs after the handler has returned, in the order
// the group's members queued theirs, in the round trip that commits. Its
// result can be checked with the callbacks of pgx.QueuedQuery (Exec,
// Query, QueryRow); a callback's error, like the statement's own, fails
// its member alone: the group rolls back and runs again without it, and
// that delivery is nacked (or, for a dedup.Permanent error, recorded as
// failed, as a handler's own error is). When any member set a callback,
// the COMMIT goes in a third round trip, after the callbacks have run.
// A member that returns output messages pays a round trip more, which
// stores them in its record.
//
// With pgx's default exec mode (QueryExecModeCacheStatement) the
// statements go as one extended-protocol batch (pgconn's ExecBatch) of
// statements this package prepares once per connection, named
// inboxmill_1, inboxmill_2, …: at most 512 per connection, the least
// recently used deallocated when the next group begins. pgx's query and
// batch tracers do not see them. Under any other exec mode they go
// through pgx.SendBatch, which honors it.
//
// dedup.TxFromContext finds nothing in this mode: handlers written for
// the *sql.Tx of the other modes are to use FromContext instead.
//
// Statements a handler needs to run at once (a read it decides on) go
// through Tx's ExecContext, QueryContext and QueryRowContext, which first
// send what the group has queued so far, so they see it; each is a round
// trip of its own. They make *Tx an inbox.DBTX: code written against
// that interface (or *sql.Tx's methods) runs unchanged.
//
// The guarantees are group commit's (see dedup.Group): one effect per
// key, no delivery acked before its group committed, a failed commit or
// a lost connection nacks every member.
package pgxgroup

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxmill/inboxmill/internal/pipeline"
)

// ErrNotPgx is returned when the store's database does not use pgx's
// database/sql driver.
var ErrNotPgx = errors.New("pgxgroup: the store's *sql.DB does not use pgx's database/sql driver (sql.Open(\"pgx\", …) or stdlib.OpenDBFromPool)")

// ErrRolledBack is returned when PostgreSQL answered the COMMIT with a
// rollback: an earlier statement had failed the transaction.
var ErrRolledBack = errors.New("pgxgroup: the transaction was rolled back at commit")

// Pipeline returns the setting for dedup.Group.Pipeline that runs groups
// through pgx pipelines.
func Pipeline() pipeline.Opener { return opener{} }

type opener struct{}

func (opener) Check(db *sql.DB) error {
	// By the driver's package, which this one does not import: importing
	// it would register the driver in every program that imports this.
	t := reflect.TypeOf(db.Driver())
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.PkgPath() != "github.com/jackc/pgx/v5/stdlib" {
		return ErrNotPgx
	}
	return nil
}

func (opener) Open(conn *sql.Conn) pipeline.Session {
	s := &session{conn: conn, failed: -1}
	s.items = s.buf[:0]
	return s
}

// session is one group try's transaction on one connection.
type session struct {
	conn *sql.Conn
	// items are the statements queued and not yet sent. A send takes
	// them and leaves the rest of the slice's capacity for the next.
	items   []item
	buf     [4]item // items' first array: a group of one needs no other
	members int
	inTx    bool
	failed  int
	failErr error
	// row reads each row of the claim (pipeline.Begin's Row).
	row func(row pipeline.Row) error
	// commitTag is the COMMIT's answer, empty until it arrives.
	commitTag pgconn.CommandTag
}

type txKey struct{}

// Tx is one member's share of its group's transaction. It is valid while
// the member's handler runs and must not be used from another goroutine.
type Tx struct {
	s      *session
	member int
}

// FromContext returns the share of the group's transaction a handler
// runs in; false when the middleware runs it in no pipelined group.
func FromContext(ctx context.Context) (*Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*Tx)
	return tx, ok
}

// Queue queues a statement to run after the handler has returned, in the
// group's transaction, in the round trip that commits. The returned
// query's Exec, Query or QueryRow set a callback that checks its result
// when it arrives; a callback's error fails this member.
func (t *Tx) Queue(query string, args ...any) *pgx.QueuedQuery {
	qq := &pgx.QueuedQuery{SQL: query, Arguments: args}
	t.s.items = append(t.s.items, item{qq: qq, owner: t.member})
	return qq
}

// flush sends what is queued, so that a statement run at once comes
// after it.
func (t *Tx) flush(ctx context.Context) error {
	s := t.s
	if s.failed >= 0 {
		return fmt.Errorf("pgxgroup: a statement queued earlier in the group failed: %w", s.failErr)
	}
	if len(s.items) == 0 {
		return nil
	}
	if failed, err := s.send(ctx); err != nil {
		if failed >= 0 {
			s.failed, s.failErr = failed, err
		}
		return fmt.Errorf("pgxgroup: a statement queued earlier in the group failed: %w", err)
	}
	return nil
}

// ExecContext runs a statement at once, after what the group has queued.
func (t *Tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.s.conn.ExecContext(ctx, query, args...)
}

// QueryContext runs a query at once, after what the group has queued.
func (t *Tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.s.conn.QueryContext(ctx, query, args...)
}

// QueryRowContext runs a query at once, after what the group has queued.
// When what was queued failed, the transaction is aborted and the row's
// Scan reports it.
func (t *Tx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	_ = t.flush(ctx)
	return t.s.conn.QueryRowContext(ctx, query, args...)
}

// raw runs f on the session's pgx connection.
func (s *session) raw(f func(c *pgx.Conn) error) error {
	return s.conn.Raw(func(dc any) error {
		c, ok := dc.(interface{ Conn() *pgx.Conn })
		if !ok {
			return ErrNotPgx
		}
		err := f(c.Conn())
		if err != nil && c.Conn().IsClosed() {
			// database/sql then discards the connection.
			return errors.Join(err, driver.ErrBadConn)
		}
		return err
	})
}

func beginSQL(opts *sql.TxOptions) (string, error) {
	if opts == nil {
		return "begin", nil
	}
	var b strings.Builder
	b.WriteString("begin")
	switch sql.IsolationLevel(opts.Isolation) {
	case sql.LevelDefault:
	case sql.LevelReadUncommitted:
		b.WriteString(" isolation level read uncommitted")
	case sql.LevelReadCommitted:
		b.WriteString(" isolation level read committed")
	case sql.LevelRepeatableRead, sql.LevelSnapshot:
		b.WriteString(" isolation level repeatable read")
	case sql.LevelSerializable:
		b.WriteString(" isolation level serializable")
	default:
		return "", fmt.Errorf("pgxgroup: isolation level %v is not supported", sql.IsolationLevel(opts.Isolation))
	}
	if opts.ReadOnly {
		b.WriteString(" read only")
	}
	return b.String(), nil
}

func (s *session) BeginQuery(ctx context.Context, b pipeline.Begin) error {
	for try := 0; ; try++ {
		s.items = s.items[:0]
		if err := s.queueBegin(b); err != nil {
			return err
		}
		_, err := s.send(ctx)
		if err == nil || try > 0 || staleStatement(err) == "" {
			return err
		}
		// The claim's prepared statement could not run (see sendItems):
		// nothing ran but the BEGIN, and it runs once more, prepared
		// again, rather than failing the group.
		if rerr := s.Rollback(ctx); rerr != nil {
			return errors.Join(err, rerr)
		}
	}
}

// The owners of the session's own statements: a failure of theirs is
// no member's.
const (
	ownCommit = -1
	ownBegin  = -2
)

// queueBegin queues b's BEGIN and query, and starts a new group: its
// members count from 0.
func (s *session) queueBegin(b pipeline.Begin) error {
	begin, err := beginSQL(b.Opts)
	if err != nil {
		return err
	}
	s.row = b.Row
	s.items = append(s.items, item{sql: begin, owner: ownBegin, kind: beginStmt},
		item{sql: b.Query, args: b.Args, owner: ownBegin, kind: claimStmt})
	return nil
}

// begun is the BEGIN's result: a new group's transaction.
func (s *session) begun(pgconn.CommandTag) error {
	s.inTx, s.members, s.failed, s.failErr = true, 0, -1, nil
	return nil
}

// claimed reads the claim's rows.
func (s *session) claimed(rows pgx.Rows) error {
	for rows.Next() {
		if err := s.row(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// committed is the COMMIT's result.
func (s *session) committed(ct pgconn.CommandTag) error {
	s.commitTag = ct
	s.inTx = false
	if ct.String() != "COMMIT" {
		return ErrRolledBack
	}
	return nil
}

func (s *session) Member(ctx context.Context) context.Context {
	tx := &Tx{s: s, member: s.members}
	s.members++
	return context.WithValue(ctx, txKey{}, tx)
}

func (s *session) Failed() (int, error) { return s.failed, s.failErr }

// send sends the queued statements in one round trip and reads their
// results in order, running their callbacks. On the first that fails it
// stops and returns its owner (ownCommit when the connection broke: then
// nobody's statement is to blame) and error.
func (s *session) send(ctx context.Context) (failed int, err error) {
	n := len(s.items)
	items := s.items[:n:n]
	s.items = s.items[n:]
	failed = ownCommit
	err = s.raw(func(c *pgx.Conn) error {
		var err error
		failed, err = s.sendItems(ctx, c, items)
		return err
	})
	clear(items) // the arguments and callbacks are garbage now
	return failed, err
}

func (s *session) Commit(ctx context.Context) (int, error) {
	if s.failed >= 0 {
		return s.failed, s.failErr
	}
	callbacks := false
	for _, it := range s.items {
		callbacks = callbacks || (it.qq != nil && it.qq.Fn != nil)
	}
	if callbacks {
		// The callbacks decide before the COMMIT is sent.
		if failed, err := s.send(ctx); err != nil {
			return s.abort(ctx, failed, err)
		}
	}
	s.commitTag = pgconn.CommandTag{}
	s.items = append(s.items, item{sql: "commit", owner: ownCommit, kind: commitStmt})
	failed, err := s.send(ctx)
	switch {
	case err == nil:
		return -1, nil
	case failed == ownCommit:
		if s.commitTag.String() == "" {
			// No answer to the COMMIT: on a broken connection its outcome
			// is unknown; on a live one still in the transaction it never
			// ran (its prepared statement was gone, say). Either way
			// database/sql discards the connection: pgx's stdlib refuses
			// to reuse one that is not idle (ResetSession).
			s.inTx = false
		}
		return -1, err
	default:
		return s.abort(ctx, failed, err)
	}
}

// abort rolls back after a member's statement failed before the COMMIT.
func (s *session) abort(ctx context.Context, failed int, err error) (int, error) {
	if failed < 0 {
		s.inTx = false // the connection broke; it is discarded
		return -1, err
	}
	return failed, errors.Join(err, s.Rollback(context.WithoutCancel(ctx)))
}

func (s *session) Rollback(ctx context.Context) error {
	clear(s.items)
	s.items = s.items[:0]
	if !s.inTx {
		return nil
	}
	s.inTx = false
	return s.raw(func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, "rollback")
		return err
	})
}
