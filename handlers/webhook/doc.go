// Package webhook is the HTTP ingress for providers' webhooks.
//
// [NewReceiver] is an http.Handler that verifies a provider's
// signature ([StripeVerifier], [GitHubVerifier], [StandardWebhooksVerifier],
// [HMACVerifier], or your own [Verifier]), publishes the raw body onto a
// queue with the provider's event ID as the event_id metadata, and answers
// 2xx only after the publisher succeeded. The dedup middleware behind the
// queue then runs the business handler once per event, however often the
// provider retries.
package webhook
