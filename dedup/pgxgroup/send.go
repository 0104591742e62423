package pgxgroup

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// item is a statement queued in a session: a handler's (qq) or the
// session's own (kind), whose result goes to the session.
type item struct {
	sql   string
	args  []any
	qq    *pgx.QueuedQuery
	kind  stmtKind
	owner int
}

// stmtKind tells the session's own statements apart.
type stmtKind uint8

const (
	handlerStmt stmtKind = iota
	beginStmt
	claimStmt
	commitStmt
)

// sendItems sends items in one round trip on c and reads their results
// in order, running their callbacks. On the first that fails it stops
// and returns its owner (ownCommit when the connection broke: then
// nobody's statement is to blame) and error.
//
// With pgx's default exec mode the statements go as one extended-protocol
// batch (pgconn's ExecBatch) of statements this package prepares once
// per connection, without the allocations of pgx's own batches (those go
// through pgconn's pipeline, whose bookkeeping allocates per message).
// Their results are read as pgx's would be, so
// the callbacks of pgx.QueuedQuery run unchanged. pgx's query and batch
// tracers do not see these statements. Under any other exec mode (the
// simple protocol for PgBouncer, say) the items go through pgx.SendBatch,
// which honors it.
func (s *session) sendItems(ctx context.Context, c *pgx.Conn, items []item) (failed int, err error) {
	st := stateFor(c)
	if !st.direct {
		return s.sendBatch(ctx, c, items)
	}
	failed = ownCommit
	if !s.inTx {
		// Outside a transaction (a group begins): the time to deallocate.
		if err := st.deallocateStale(ctx, c); err != nil {
			return failed, err
		}
	}
	st.batch = pgconn.Batch{}
	batch := &st.batch
	st.formats = st.formats[:0]
	m := c.TypeMap()
	for i := range items {
		it := &items[i]
		if it.qq != nil {
			if it.sql, it.args, err = rewrite(ctx, c, it.qq.SQL, it.qq.Arguments); err != nil {
				return it.owner, err
			}
		}
		// Every statement is prepared, BEGIN and COMMIT too: an
		// unnamed one would be parsed again each time.
		sd, err := st.statement(ctx, c, it.sql)
		if err != nil {
			if c.IsClosed() {
				return ownCommit, err
			}
			// Refused by the server (a syntax error, a missing table):
			// the statement's, before anything ran.
			return it.owner, err
		}
		if err := st.eqb.Build(m, sd, it.args); err != nil {
			return it.owner, fmt.Errorf("pgxgroup: %w", err)
		}
		// ExecStatement keeps the result formats until the results are
		// read, while Build reuses its slice.
		n := len(st.formats)
		st.formats = append(st.formats, st.eqb.ResultFormats...)
		batch.ExecStatement(sd, st.eqb.ParamValues, st.eqb.ParamFormats, st.formats[n:len(st.formats):len(st.formats)])
	}
	st.results = results{mrr: c.PgConn().ExecBatch(ctx, batch), m: m}
	r := &st.results
	for i := range items {
		it := &items[i]
		read := r.read
		var err error
		switch {
		case it.qq != nil && it.qq.Fn != nil:
			err = it.qq.Fn(r)
		case it.kind == beginStmt:
			err = execThen(r, s.begun)
		case it.kind == commitStmt:
			err = execThen(r, s.committed)
		case it.kind == claimStmt:
			rows, _ := r.Query()
			err = s.claimed(rows)
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		if err == nil && r.read == read {
			// No callback, or one that did not read its result.
			_, err = r.Exec()
		}
		if err != nil {
			if !c.IsClosed() {
				failed = it.owner
				switch staleStatement(err) {
				case "26000":
					// A statement is gone: DISCARD ALL or DEALLOCATE
					// ALL ran on the connection, which took the others
					// too. All are prepared again when next used.
					st.invalidateAll()
				case "0A000":
					// A table changed under it ("cached plan must not
					// change result type"): prepared again next time.
					st.invalidate(it.sql)
				}
			}
			_ = r.mrr.Close() // repeats err
			return failed, err
		}
	}
	return failed, r.mrr.Close()
}

// execThen reads a statement's result and hands its command tag to f.
func execThen(r *results, f func(pgconn.CommandTag) error) error {
	ct, err := r.Exec()
	if err != nil {
		return err
	}
	return f(ct)
}

// staleStatement returns the SQLSTATE of err when it says a prepared
// statement can no longer run as prepared, and "" otherwise.
func staleStatement(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "26000" || pe.Code == "0A000") {
		return pe.Code
	}
	return ""
}

// rewrite applies a pgx.QueryRewriter given as the first argument
// (pgx.NamedArgs, say), as pgx's own batches do.
func rewrite(ctx context.Context, c *pgx.Conn, sql string, args []any) (string, []any, error) {
	if len(args) == 0 {
		return sql, args, nil
	}
	qr, ok := args[0].(pgx.QueryRewriter)
	if !ok {
		return sql, args, nil
	}
	sql, args, err := qr.RewriteQuery(ctx, c, sql, args[1:])
	if err != nil {
		return "", nil, fmt.Errorf("pgxgroup: rewrite query failed: %w", err)
	}
	return sql, args, nil
}

// sendBatch sends items through pgx.SendBatch: for connections whose
// exec mode the direct path would not honor.
func (s *session) sendBatch(ctx context.Context, c *pgx.Conn, items []item) (failed int, err error) {
	b := &pgx.Batch{}
	for i := range items {
		it := &items[i]
		switch it.kind {
		case handlerStmt:
			b.QueuedQueries = append(b.QueuedQueries, it.qq)
		case beginStmt:
			b.Queue(it.sql, it.args...).Exec(s.begun)
		case claimStmt:
			b.Queue(it.sql, it.args...).Query(s.claimed)
		case commitStmt:
			b.Queue(it.sql, it.args...).Exec(s.committed)
		}
	}
	failed = ownCommit
	br := &closing{BatchResults: c.SendBatch(ctx, b)}
	for i, qq := range b.QueuedQueries {
		var err error
		if qq.Fn != nil {
			err = qq.Fn(br)
		} else {
			_, err = br.Exec()
		}
		if err != nil {
			if !c.IsClosed() {
				// The statement's own error, or its callback's: the
				// connection is fine, its owner is to blame.
				failed = items[i].owner
			}
			br.done()
			_ = br.Close() // repeats err
			return failed, err
		}
	}
	br.done()
	return failed, br.Close()
}

// closing closes the rows of a query before the next result is read:
// pgx's batches take rows a callback left unread (a QueryRow it did not
// scan) for the next result's.
type closing struct {
	pgx.BatchResults
	rows pgx.Rows
}

func (c *closing) done() {
	if c.rows != nil {
		c.rows.Close()
		c.rows = nil
	}
}

func (c *closing) Exec() (pgconn.CommandTag, error) {
	c.done()
	return c.BatchResults.Exec()
}

func (c *closing) Query() (pgx.Rows, error) {
	c.done()
	rows, err := c.BatchResults.Query()
	c.rows = rows
	return rows, err
}

func (c *closing) QueryRow() pgx.Row {
	rows, _ := c.Query()
	return row{rows}
}

// results reads a direct batch's results as a pgx.BatchResults, for the
// callbacks of pgx.QueuedQuery.
type results struct {
	// Always nil: keeps results a pgx.BatchResults should pgx add
	// methods to the interface.
	pgx.BatchResults

	mrr  *pgconn.MultiResultReader
	m    *pgtype.Map
	read int                  // results read so far
	cur  *pgconn.ResultReader // the last one
}

var errNoResult = errors.New("pgxgroup: no more results in batch")

func (r *results) next() (*pgconn.ResultReader, error) {
	r.read++
	if r.cur != nil {
		// A callback may leave rows unread (a QueryRow it did not
		// scan): they are not the next result's.
		_, _ = r.cur.Close()
		r.cur = nil
	}
	if !r.mrr.NextResult() {
		if err := r.mrr.Close(); err != nil {
			return nil, err
		}
		return nil, errNoResult
	}
	r.cur = r.mrr.ResultReader()
	return r.cur, nil
}

func (r *results) Exec() (pgconn.CommandTag, error) {
	rr, err := r.next()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return rr.Close()
}

func (r *results) Query() (pgx.Rows, error) {
	rr, err := r.next()
	if err != nil {
		return errRows{err: err}, err
	}
	return pgx.RowsFromResultReader(r.m, rr), nil
}

func (r *results) QueryRow() pgx.Row {
	rows, _ := r.Query()
	return row{rows}
}

// Close does nothing: the session reads what is left.
func (r *results) Close() error { return nil }

// Tx is nil: a group's transaction is not begun by pgx.Batch.BeginTx.
func (r *results) Tx() pgx.Tx { return nil }

// row is a query's first row, read as pgx's QueryRow reads it.
type row struct{ rows pgx.Rows }

func (r row) Scan(dest ...any) error {
	defer r.rows.Close()
	if err := r.rows.Err(); err != nil {
		return err
	}
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// errRows is the rows of a query whose result could not be read. The
// embedded interface, always nil, only keeps it a pgx.Rows should pgx
// add methods to the interface.
type errRows struct {
	pgx.Rows
	err error
}

func (e errRows) Close()                                       {}
func (e errRows) Err() error                                   { return e.err }
func (e errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (e errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (e errRows) Next() bool                                   { return false }
func (e errRows) Scan(...any) error                            { return e.err }
func (e errRows) Values() ([]any, error)                       { return nil, e.err }
func (e errRows) RawValues() [][]byte                          { return nil }
func (e errRows) Conn() *pgx.Conn                              { return nil }
func (e errRows) TypeMap() *pgtype.Map                         { return nil }
