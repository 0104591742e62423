// Package handlers holds ready-made pieces that sit around the dedup
// middleware.
//
// # Reconciler
//
// In reserve mode (dedup.ModeReserve) a handler that cannot tell whether its
// external effect happened — a timeout after the request left — returns
// dedup.Uncertain, and the intent becomes pending. Nothing re-executes it:
// re-sending a payment whose outcome is unknown is how double charges
// happen. The [Reconciler] periodically loads pending intents (and
// processing ones abandoned by a crashed worker that no redelivery took
// over), asks a [ResolveFunc] that looks the effect up at the provider by
// the reference or idempotency key that was sent, and records the answer:
//
//	rec, err := handlers.NewReconciler(store, handlers.ReconcilerConfig{
//		Resolve: func(ctx context.Context, r *inbox.Record) (handlers.Resolution, error) {
//			charge, found, err := psp.FindByIdempotencyKey(ctx, dedup.IdempotencyKeyOf(r))
//			switch {
//			case err != nil:
//				return handlers.Resolution{}, err // try again next pass
//			case found:
//				return handlers.Resolution{Verdict: handlers.Succeeded, ExternalRef: charge.ID}, nil
//			default:
//				return handlers.Resolution{Verdict: handlers.NotHappened}, nil
//			}
//		},
//	})
//	rec.Start()
//	defer rec.Close()
package handlers
