// Package pipeline is the contract between group commit (package dedup)
// and a driver that sends a group's statements in pipelines (package
// dedup/pgxgroup): a group's try runs on one connection, its BEGIN and
// claim in one round trip and the statements its handlers queued with
// the COMMIT in another.
package pipeline

import (
	"context"
	"database/sql"
)

// Opener starts sessions on the connections of a store's *sql.DB.
type Opener interface {
	// Check reports whether db's driver can run sessions, so that a
	// middleware configured for pipelines refuses to start on another.
	Check(db *sql.DB) error
	// Open starts a session on conn, which the caller closes after the
	// session has committed or rolled back.
	Open(conn *sql.Conn) Session
}

// Begin is a transaction to begin and the query to run in it in the
// same round trip: a group's BEGIN and claim.
type Begin struct {
	Opts  *sql.TxOptions
	Query string
	Args  []any
	// Row is called for each row the query returns, to scan it.
	Row func(row Row) error
}

// Session is one connection's transactions, one after the other. The
// statements of the store go through the *sql.Conn the session was
// opened on; the session sends its own through the same connection.
type Session interface {
	// BeginQuery begins a transaction and runs b's query in the same
	// round trip. An error from the query leaves the transaction
	// aborted; the caller rolls back.
	BeginQuery(ctx context.Context, b Begin) error

	// Member returns the context for the handler of the group's next
	// member: what it queues there belongs to that member.
	Member(ctx context.Context) context.Context

	// Failed reports a member whose queued statement failed when the
	// session sent them early (a handler ran a statement at once, after
	// what the members before it had queued), with the statement's
	// error; -1 when none did.
	Failed() (member int, err error)

	// Commit sends every statement still queued and commits. failed is
	// the member whose statement failed (the transaction is then rolled
	// back), or -1 when none did; err is that statement's error, or the
	// commit's.
	Commit(ctx context.Context) (failed int, err error)

	// Rollback ends the transaction without committing; it does nothing
	// when none is open.
	Rollback(ctx context.Context) error
}

// Row is one row of a Begin's query.
type Row interface {
	Scan(dest ...any) error
}
