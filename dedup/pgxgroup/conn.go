package pgxgroup

import (
	"container/list"
	"context"
	"runtime"
	"strconv"
	"sync"
	"weak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// stmtCacheCapacity is how many statements a connection keeps prepared
// for groups, as pgx's own statement cache does by default (512); the
// least recently used one is deallocated when a new one would exceed it.
const stmtCacheCapacity = 512

// connState is what the pipelined path keeps per pgx connection: its
// prepared statements and the buffers it encodes arguments into. It is
// used only while the connection is held (database/sql's Conn.Raw), so
// it needs no lock.
type connState struct {
	// direct is false when the connection runs another exec mode than
	// pgx's default (the simple protocol for PgBouncer, say): its groups
	// then go through pgx's own batches, which honor the mode.
	direct   bool
	capacity int                      // stmtCacheCapacity; smaller in tests
	stmts    map[string]*list.Element // SQL → *pgconn.StatementDescription
	lru      list.List                // most recently used first
	next     uint64                   // the number in the next statement's name
	// stale are prepared statements to deallocate before the next group
	// begins: evicted, or invalidated by an error.
	stale   []string
	eqb     pgx.ExtendedQueryBuilder
	formats []int16 // result formats of the statements being sent
	// The batch being sent and its results: kept here, so that sending
	// allocates neither.
	batch   pgconn.Batch
	results results
}

// states maps each pgx connection to its state without keeping it alive:
// a connection database/sql discards takes its entry with it.
var states sync.Map // weak.Pointer[pgx.Conn] → *connState

func stateFor(c *pgx.Conn) *connState {
	key := weak.Make(c)
	if st, ok := states.Load(key); ok {
		return st.(*connState)
	}
	st := &connState{
		direct:   c.Config().DefaultQueryExecMode == pgx.QueryExecModeCacheStatement,
		capacity: stmtCacheCapacity,
		stmts:    make(map[string]*list.Element),
	}
	states.Store(key, st)
	runtime.AddCleanup(c, func(k weak.Pointer[pgx.Conn]) { states.Delete(k) }, key)
	return st
}

// statement returns sql's prepared statement on c, preparing it (a round
// trip) the first time.
func (st *connState) statement(ctx context.Context, c *pgx.Conn, sql string) (*pgconn.StatementDescription, error) {
	if e, ok := st.stmts[sql]; ok {
		st.lru.MoveToFront(e)
		return e.Value.(*pgconn.StatementDescription), nil
	}
	st.next++
	sd, err := c.PgConn().Prepare(ctx, "inboxmill_"+strconv.FormatUint(st.next, 10), sql, nil)
	if err != nil {
		return nil, err
	}
	st.stmts[sql] = st.lru.PushFront(sd)
	for st.lru.Len() > st.capacity {
		old := st.lru.Remove(st.lru.Back()).(*pgconn.StatementDescription)
		delete(st.stmts, old.SQL)
		// Not now: the group's statements may still use it.
		st.stale = append(st.stale, old.Name)
	}
	return sd, nil
}

// invalidate forgets sql's statement after the server refused it (it
// no longer exists, or a table changed under it), so that the next use
// prepares it again.
func (st *connState) invalidate(sql string) {
	e, ok := st.stmts[sql]
	if !ok {
		return
	}
	sd := st.lru.Remove(e).(*pgconn.StatementDescription)
	delete(st.stmts, sql)
	st.stale = append(st.stale, sd.Name)
}

// invalidateAll forgets every statement of the connection.
func (st *connState) invalidateAll() {
	for e := st.lru.Front(); e != nil; e = e.Next() {
		st.stale = append(st.stale, e.Value.(*pgconn.StatementDescription).Name)
	}
	st.lru.Init()
	clear(st.stmts)
}

// deallocateStale deallocates the statements evicted or invalidated
// since the last call; the connection is outside a transaction. A
// statement the server no longer has is no error.
func (st *connState) deallocateStale(ctx context.Context, c *pgx.Conn) error {
	for len(st.stale) > 0 {
		name := st.stale[len(st.stale)-1]
		if err := c.PgConn().Deallocate(ctx, name); err != nil && c.IsClosed() {
			return err
		}
		st.stale = st.stale[:len(st.stale)-1]
	}
	return nil
}
