// Package reconcile settles the intents nobody else will: pending ones,
// whose external effect may or may not have happened, and processing ones
// abandoned by a crashed worker that no redelivery took over.
//
// # Mental model
//
// In reserve mode (dedup.Reserve) a handler that cannot tell whether its
// external effect happened — a timeout after the request left — returns
// dedup.Uncertain, and the intent becomes pending. Nothing re-executes it:
// re-sending a payment whose outcome is unknown is how double charges
// happen. The [Reconciler] periodically loads those records, asks a
// [ResolveFunc] that looks the effect up at the provider by the reference
// or the idempotency key that was sent, and records the answer through the
// store's fenced handle (inbox.Lease): a record a worker or another
// reconciler moved meanwhile is left alone.
//
//	r, err := reconcile.New(store, reconcile.Config{
//		Resolve: func(ctx context.Context, rec *inbox.Record) (reconcile.Resolution, error) {
//			charge, found, err := psp.FindByIdempotencyKey(ctx, rec.IdempotencyKey())
//			switch {
//			case err != nil:
//				return reconcile.Resolution{}, err // try again next pass
//			case found:
//				return reconcile.Resolution{Verdict: reconcile.Succeeded, ExternalRef: charge.ID}, nil
//			default:
//				return reconcile.Resolution{Verdict: reconcile.NotHappened}, nil
//			}
//		},
//	})
//	go r.Run(ctx) // or r.Start(); defer r.Close()
//
// # Verdicts
//
// [Succeeded] completes the record (redeliveries become duplicates),
// [Failed] fails it for good, [NotHappened] releases it so the next
// redelivery runs the handler again with the same idempotency key, and
// [Unresolved] leaves it pending to be asked about on a later pass.
//
// # Observability
//
// Verdicts are logged to Config.Logger (slog.Default() unless set) and
// counted in Prometheus when Config.Registerer is set. With an
// OpenTelemetry provider installed, each pass is a span
// (inboxmill.reconcile) with one child per record (inboxmill.resolve),
// whose context Resolve receives; docs/observability.md lists their
// attributes.
package reconcile
