// Package dedup is the Watermill middleware that turns at-least-once
// delivery into exactly-once effects.
//
// # Mental model
//
// Every message names a business intent: a scope (the tenant), an operation
// (by default the handler's name) and a key (the business event's ID, never
// the delivery's UUID). The middleware begins a transaction, claims the
// intent in the inbox table under its unique constraint, runs the handler
// with that transaction in the message's context, stores the handler's
// output messages with the record and commits. Only then does the router
// publish the output and ack.
//
// A second delivery of the same intent finds the record: with the same
// payload fingerprint it is a duplicate — the handler does not run, the
// stored output is handed back (so a publish that failed after the commit
// is retried, not lost) and the message is acked; with another fingerprint
// the key was reused for a different intent — [ErrPayloadConflict], the
// handler does not run and the message is not acked. A concurrent delivery
// blocks on the uncommitted claim and then sees its outcome.
//
// # Two modes
//
// [Transactional] (the default) is for effects in the same database, as
// above. [Reserve] is for effects outside it — a payment, an e-mail, a
// partner API: a short statement reserves the intent under a lease
// (inbox.Lease), the handler runs with no transaction open and sends
// [Claim.IdempotencyKey] to the provider, and a second short statement
// records the outcome if the lease is still this worker's. A handler
// classifies its error with [Permanent] (failed for good) or [Uncertain]
// (pending until package handlers/reconcile resolves it); anything else
// releases the intent for an immediate retry.
//
// With watermill-sql's subscriber, Transactional.JoinTx set to
// watermillsql.Tx (package dedup/watermillsql) runs the middleware in the
// consuming transaction, so ack, record and writes commit together;
// watermillsql.NewSubscriber lets one transaction carry a batch. Package
// dedup/deduptest is the middleware's conformance suite and has helpers to
// test a handler under redelivery.
//
// # Group commit
//
// With Transactional.Group set, deliveries the middleware handles at the
// same time share one transaction: one statement claims every member's
// key (inbox.Store.ClaimMany), the claimed members' handlers run one after
// the other in the shared transaction, and one commit records them all;
// only then does each member's call return, so the router acks only
// committed work. Duplicates and conflicts are answered right after the
// claim. A handler that fails or panics nacks only its own message: the
// group is rolled back and runs again without it. A delivery alone in
// flight waits for nobody. See [Group] for what it asks of handlers and
// docs/benchmarks.md for what it gains and costs; it is off by default.
// On PostgreSQL through pgx, Group.Pipeline (package dedup/pgxgroup)
// sends a group's statements in two round trips whatever its size, with
// handlers that queue their writes: the fastest mode.
//
// In reserve mode, Reserve.Batch sends the reservations of deliveries in
// flight in one statement (inbox.Store.ReserveMany) and the completions
// of handlers that return together in another (inbox.Store.CompleteMany);
// no transaction is held across a handler. See [Batch]: it pays with
// many deliveries in flight against a busy database, and costs with few.
//
// # Usage
//
//	d, err := dedup.New(store, dedup.Config{
//		Key:   dedup.KeyFromMetadata("event_id"),
//		Scope: dedup.ScopeFromMetadata("tenant_id"),
//	})
//	poison, err := middleware.PoisonQueueWithFilter(pub, "poison", dedup.IsPoison)
//	router.AddMiddleware(poison, d.Middleware)
//
//	func handle(msg *message.Message) error {
//		tx, _ := dedup.TxFromContext(msg.Context())
//		_, err := tx.ExecContext(msg.Context(), "INSERT INTO shipments ...")
//		return err
//	}
//
// # Output too large to store
//
// Output is stored with the record only when it fits the store's limit
// ([inbox.Store.ResultLimit]: max_allowed_packet less a margin on MySQL
// and MariaDB, 16 MiB less 64 KiB by default on MariaDB 10.11, and half of
// that when the DSN sets interpolateParams=true; 512 MiB on PostgreSQL;
// about 1 GB on SQLite; lower with inbox.Config.MaxResult). A
// larger output is never sent to the database, which would refuse it at
// every attempt (MySQL closes the connection, losing the transaction, so
// the message would be redelivered for ever). Instead the intent completes
// without stored output, as it does when the output cannot be encoded: in
// transactional mode the handler's effects commit with the record, in
// reserve mode the record is completed. The router still publishes the
// output of that delivery. The middleware logs an Info line ("handler
// output too large to store") with key_digest, output_bytes and
// limit_bytes — never the output — and counts it in Stats.OutputsDropped
// and inboxmill_dedup_outputs_dropped_total (the delivery is also counted
// as executed).
//
// The consequence: a duplicate of such a record is acked without
// replaying any output. If publishing the first delivery's output failed
// after its commit, the redelivery cannot publish it again, and it is
// lost. A handler whose output can be that large should publish a
// reference to the data (a row, an object's address) rather than the
// data.
//
// # Logging
//
// Config.Logger defaults to slog.Default() through watermill.NewSlogLogger.
// A delivery that executed or was a duplicate is a Debug line; one refused,
// held, pending or failed is an Info line, and a key that keeps coming back
// with the same outcome — a reused key redelivered in a loop for want of a
// poison queue — is logged at Info once per Config.RepeatLogInterval with
// the number of repeats. Keys appear only as their digest
// (inbox.ID.Digest) under key_digest, as in the inboxmill-replay command's
// output, so a line leads to its record without revealing the key.
//
// # Tracing
//
// With an OpenTelemetry provider installed (otel.SetTracerProvider, or
// Config.TracerProvider), each delivery is an inboxmill.delivery span with
// a child per phase:
//
//	transactional: inboxmill.claim → inboxmill.handler → inboxmill.commit
//	reserve:       inboxmill.reserve → inboxmill.handler → inboxmill.complete | .pend | .fail | .release
//
// A duplicate has a claim (or reserve) span with outcome "duplicate" and no
// handler span. The handler's context carries the inboxmill.handler span,
// so its own spans nest below it. The delivery span is parented on the span
// in the message's context or, failing that, on the trace context the
// global propagator (otel.SetTextMapPropagator(propagation.TraceContext{}))
// finds in the message's metadata, such as the traceparent that
// watermill-kafka's otelsarama tracing writes into the Kafka headers.
// Attributes: inboxmill.outcome, inboxmill.operation, inboxmill.attempt,
// inboxmill.key_digest (never the key), inboxmill.mode. Until a provider is
// installed the spans are not made at all and cost no allocation.
//
// # What it does not cover
//
// Writes that bypass the transaction (another connection, an HTTP call) are
// not part of the atomic unit and can repeat when a failed attempt is
// redelivered. Records expire after Config.Retention; a delivery after that
// runs again.
package dedup
