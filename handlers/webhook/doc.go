// Package webhook is the HTTP ingress for providers' webhooks: it turns
// signed requests into messages that the dedup middleware runs once per
// event.
//
// # How it works
//
// Providers deliver each event at least once and retry on any non-2xx
// answer or timeout, so one event arrives several times, sometimes minutes
// apart. The receiver does not try to notice that; it cannot without a
// transaction of its own. For each request the http.Handler that
// [NewReceiver] returns
//
//  1. verifies the provider's signature over the raw body with a
//     [Verifier], and answers 401 to anything not authentic or signed at a
//     time outside the tolerance;
//  2. publishes the raw body, unchanged, onto a queue, with the provider's
//     event ID (the same on every retry of the event) as the event_id
//     metadata, [MetadataEventID];
//  3. answers 2xx only after the publisher returned success, so that the
//     provider goes on retrying whatever was not durably enqueued.
//
// Behind the queue, the dedup middleware keyed on event_id runs the
// business handler once per event, however often the provider delivered
// it. A retry is enqueued again (with a fresh message UUID) and recognised
// there as a duplicate.
//
// # Usage
//
// Mount one receiver per provider and secret, and key the middleware on
// the metadata it sets:
//
//	stripe, err := webhook.NewReceiver(publisher, webhook.ReceiverConfig{
//		Topic:    "stripe.events",
//		Verifier: webhook.StripeVerifier(os.Getenv("STRIPE_WEBHOOK_SECRET")),
//		Tenant:   "acme", // tenant_id of events that name none
//	})
//	if err != nil {
//		return err
//	}
//	mux.Handle("/webhooks/stripe", stripe)
//
//	d, err := dedup.New(store, dedup.Config{
//		Key:          dedup.KeyFromMetadata(webhook.MetadataEventID),
//		Scope:        dedup.ScopeFromMetadata(webhook.MetadataTenantID),
//		IgnoreFields: []string{"pending_webhooks"}, // differs between Stripe's deliveries
//	})
//
// # Verifiers
//
// [StripeVerifier], [GitHubVerifier], [StandardWebhooksVerifier] (Svix and
// the services sending through it) and the generic [HMACVerifier] accept
// several secrets, for rotation, and compare MACs in constant time. Stripe
// and Standard Webhooks sign a timestamp: a request signed further than the
// tolerance ([DefaultTolerance], 5 minutes) from now, in the past or in the
// future, is refused with [ErrTimestampOutOfRange]. GitHub and the generic
// scheme sign the body only, so nothing bounds how long a captured request
// can be replayed; keep those endpoints on TLS and their requests out of
// logs. Implement [Verifier], or wrap a built-in one with [VerifierFunc],
// for anything else.
//
// # Event IDs
//
// The event ID becomes the inbox key, so it must be one: at most 255 bytes
// of valid UTF-8 without a NUL byte. An ID read from a JSON body (Stripe's
// "id") must also decode without loss: encoding/json turns invalid UTF-8
// and lone surrogate escapes such as "evt_\ud800" into U+FFFD, which would
// give distinct events one key, so such a string is refused, by the same
// rule as dedup.KeyFromJSON. An authentic request whose ID is missing or
// unusable is answered 400 ([ErrMissingEventID], [ErrInvalidEventID]) and
// nothing is published; the provider retrying it would not change that.
//
// # Errors
//
// Every rejection wraps one of the package's sentinel errors, for
// errors.Is. The sender gets the status text only; the reason goes to
// [ReceiverConfig].Logger, without the body, a secret or a signature.
// Configuration errors wrap [ErrInvalidConfig] and are reported by
// NewReceiver, all at once.
package webhook
