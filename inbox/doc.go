// Package inbox is the durable store behind inboxmill: one row per business
// intent in an inbox table, claimed atomically through a unique constraint.
//
// # Mental model
//
// A record is identified by (scope, operation, key): the tenant, the thing
// being done, and the business event's own ID. Claiming inserts the record;
// the primary key decides which of several concurrent deliveries owns the
// intent, so two workers can never both believe they are first. A delivery
// that finds the record already there reads it instead: the same payload
// fingerprint means a duplicate, a different one means the key was reused
// for another intent ([ErrPayloadConflict]).
//
// The store runs its SQL through a [DBTX], which *sql.DB, *sql.Conn and
// *sql.Tx all satisfy, so a claim can take part in the caller's transaction:
// the claim, the business writes and (with a SQL queue) the ack then commit
// or roll back together. A transaction begun by [Store.BeginTx] also lets the
// store use its prepared statements ([Config.Prepare]; release them with
// [Store.Close]).
//
// # Time
//
// Leases, take-overs and expiry are judged by [Store.Now], which follows the
// database server's clock: the store measures the offset of its own clock
// from the server's every [Config.ClockSync] and corrects by it, so workers
// whose clocks disagree still agree on whether a lease has expired
// ([Store.SyncClock]).
//
// # Dialects
//
// [Postgres], [MySQL] (also MariaDB) and [SQLite] only produce SQL; the one
// [Store] type runs it. Each dialect ships its schema as plain migration
// files ([Dialect.Migrations]) that [Store.Migrate] applies, or that goose,
// golang-migrate or atlas can apply as files.
//
// # Usage
//
//	store, err := inbox.NewStore(db, inbox.Postgres(), inbox.Config{Table: "inbox"})
//	if err != nil { ... }
//	if err := store.Migrate(ctx); err != nil { ... }
//
//	tx, _ := store.BeginTx(ctx, nil) // or a *sql.Tx of your own
//	res, err := store.Claim(ctx, tx, inbox.ClaimParams{Operation: "charge", Key: eventID, PayloadHash: h})
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
