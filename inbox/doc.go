// Package inbox is the durable store behind inboxmill: one row per business
// intent in an inbox table, claimed atomically through a unique constraint,
// and the life-cycle of that row.
//
// # Mental model
//
// A record is identified by an [ID] (scope, operation, key): the tenant,
// the thing being done, and the business event's own ID. Claiming inserts
// the record; the primary key decides which of several concurrent
// deliveries owns the intent, so two workers can never both believe they
// are first. A delivery that finds the record already there reads it
// instead: the same payload fingerprint means a duplicate, a different one
// means the key was reused for another intent ([ErrPayloadConflict]).
//
// The store owns the record's life-cycle. Callers ask for a transition and
// the store decides whether it is legal:
//
//   - [Store.Claim] inserts a record inside the caller's transaction, as
//     completed (or failed): nobody sees it before that transaction
//     commits, and a rollback forgets it together with the work.
//   - [Store.Reserve] inserts a processing record under a lease, for work
//     outside the database, and returns a [Lease]; [Store.TakeOver] gives
//     an expired lease to a new worker as the next attempt, and
//     [Store.FencePending] holds a pending record for reconciliation.
//   - A Lease is the fencing token: Extend, Complete, Fail, Pend and
//     Release apply only while the record is still at the lease's attempt,
//     so a zombie worker whose lease was taken over changes nothing
//     ([ErrLeaseLost]); moves the life-cycle does not have are refused
//     ([ErrIllegalTransition]).
//
// The predicates that SQL states — [Record.LeaseExpired], [Record.Purgeable]
// — are written once, beside the statements they mirror.
//
// # Dialects
//
// The store runs SQL that a [Dialect] produces; a dialect does no I/O. The
// dialects shipped are packages of their own — inbox/postgres (lib/pq or
// pgx), inbox/mysql (MySQL and MariaDB) and inbox/sqlite — so a program
// links only the driver it uses: this package imports none. A dialect
// declares what it needs ([Capabilities]), classifies its driver's errors
// ([Transient], [ErrPrepareRefused]) and returns every statement from a
// [Queries] method, whose named [Arg]s the store binds; one lacking a
// statement does not compile. Package inbox/inboxtest is the conformance
// suite a dialect passes.
//
// # Transactions
//
// The store runs its SQL through a [DBTX], which *sql.DB, *sql.Conn and
// *sql.Tx all satisfy, so a claim can take part in the caller's
// transaction: the claim, the business writes and (with a SQL queue) the
// ack then commit or roll back together; [Store.WithSavepoint] undoes one
// attempt's work without ending that transaction. A transaction begun by
// [Store.BeginTx] also lets the store use its prepared statements
// ([Config.Prepare]).
//
// # Time
//
// Leases, take-overs and expiry are judged by [Store.Now], which follows the
// database server's clock: the store measures the offset of its own clock
// from the server's before its first lease and every [Config.ClockSync],
// so workers whose clocks disagree still agree on whether a lease has
// expired ([Store.SyncClock]). [Store.Close] stops that measurement.
//
// # Schema
//
// Each dialect ships its schema as up and down migration files;
// [Store.Migrate] applies them ([Store.MigrateTo], [Store.MigrateDown];
// a failure is a *[MigrationError] naming the version and step),
// [Store.Validate] reports a schema older or newer than the code, or a
// table of it dropped by hand, at start-up, and [Store.Migrations] renders
// them for tools of your own.
// Nothing creates schema on a first message.
//
// # Usage
//
//	store, err := inbox.NewStore(db, postgres.Dialect(), inbox.Config{Table: "inbox"})
//	if err != nil { ... }
//	defer store.Close()
//	if err := store.Migrate(ctx); err != nil { ... }
//
//	tx, _ := store.BeginTx(ctx, nil) // or a *sql.Tx of your own
//	res, err := store.Claim(ctx, tx, inbox.ClaimParams{
//		ID: inbox.ID{Operation: "ship", Key: eventID}, PayloadHash: h})
//	switch {
//	case errors.Is(err, inbox.ErrPayloadConflict): // same key, other intent: refuse
//	case err != nil: // transient errors satisfy inbox.IsRetryable
//	case res.Claimed: // first delivery: do the work in tx, then commit
//	default: // duplicate: res.Record holds what the first delivery stored
//	}
//
// Most programs use the store through the Watermill middleware in package
// dedup rather than directly.
package inbox
