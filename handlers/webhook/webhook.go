package webhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/inbox"
)

// Metadata the receiver sets on each message it publishes.
const (
	// MetadataEventID holds Event.ID, the provider's event or delivery ID:
	// key the dedup middleware on it (dedup.KeyFromMetadata(MetadataEventID)).
	MetadataEventID = "event_id"
	// MetadataTenantID holds Event.Tenant, or ReceiverConfig.Tenant when the
	// request names none; absent when neither does.
	MetadataTenantID = "tenant_id"
	// MetadataProvider names the provider ("stripe", "github", ...):
	// ReceiverConfig.Provider, else Event.Provider; absent when both are
	// empty.
	MetadataProvider = "webhook_provider"
	// MetadataEventType holds Event.Type; absent when empty.
	MetadataEventType = "webhook_event_type"
	// MetadataReceivedAt is when the receiver accepted the request, RFC 3339
	// with nanoseconds, UTC. It differs between retries of one event; the
	// fingerprint covers the payload only, so it never makes a conflict.
	MetadataReceivedAt = "received_at"
)

// ErrInvalidConfig: the receiver's or a built-in verifier's configuration
// is unusable. NewReceiver reports every problem at once, each wrapping it.
var ErrInvalidConfig = errors.New("webhook: invalid config")

// DefaultMaxBodyBytes is ReceiverConfig.MaxBodyBytes's default, 1 MiB:
// larger than the events Stripe, GitHub or Svix send, small enough that a
// flood of large bodies cannot exhaust memory.
const DefaultMaxBodyBytes = 1 << 20

// ReceiverConfig configures [NewReceiver]. Topic and Verifier are
// required.
type ReceiverConfig struct {
	// Topic the verified requests are published to. Required.
	Topic string

	// Verifier authenticates requests and names their event:
	// StripeVerifier, GitHubVerifier, StandardWebhooksVerifier,
	// HMACVerifier or your own. Required.
	Verifier Verifier

	// Provider overrides Event.Provider in metadata webhook_provider, e.g.
	// to tell two Stripe accounts apart. Defaults to the verifier's name.
	Provider string

	// Tenant is the tenant_id of events whose request names no tenant
	// (Event.Tenant empty), e.g. one receiver per tenant, each on its own
	// route and secret. Defaults to none: such events are published without
	// tenant_id, which dedup.ScopeFromMetadata("tenant_id") refuses.
	Tenant string

	// MaxBodyBytes is the largest body accepted; a larger one is answered
	// 413 without being read to its end. Defaults to DefaultMaxBodyBytes
	// (1 MiB).
	MaxBodyBytes int64

	// Now is the receiver's clock, given to the verifier for its timestamp
	// tolerance and written to metadata received_at. Defaults to time.Now.
	Now func() time.Time

	// Logger receives one line per rejected request (Info) and per failed
	// publish (Error), with the provider, the status and the reason. Bodies,
	// secrets and signatures are never logged. Defaults to
	// watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

func (c ReceiverConfig) withDefaults() ReceiverConfig {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	return c
}

func (c ReceiverConfig) validate() error {
	var errs []error
	if c.Topic == "" {
		errs = append(errs, fmt.Errorf("%w: Topic is required", ErrInvalidConfig))
	}
	if c.Verifier == nil {
		errs = append(errs, fmt.Errorf("%w: Verifier is required", ErrInvalidConfig))
	} else if v, ok := c.Verifier.(validator); ok {
		errs = append(errs, v.validate())
	}
	if err := inbox.CheckText(c.Tenant, inbox.MaxScopeLen); err != nil {
		errs = append(errs, fmt.Errorf("%w: Tenant %w", ErrInvalidConfig, err))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("%w: MaxBodyBytes %d is negative", ErrInvalidConfig, c.MaxBodyBytes))
	}
	return errors.Join(errs...)
}

// receiver is the http.Handler NewReceiver returns.
type receiver struct {
	pub message.Publisher
	cfg ReceiverConfig
}

// NewReceiver returns the HTTP ingress for one provider's webhooks.
// Providers deliver at least once and retry on any non-2xx answer or
// timeout, so one event arrives several times, sometimes minutes apart.
// The receiver does not try to notice that — it cannot without a
// transaction of its own. It verifies each request, publishes its raw body
// as a message keyed (metadata event_id) by the provider's event ID and
// answers; the dedup middleware behind the queue runs the business handler
// once per event ID.
//
// For each request it answers:
//
//   - 405 to any method but POST;
//   - 413 to a body over MaxBodyBytes, 400 to a body it cannot read;
//   - 401 when the Verifier rejects the request (missing, malformed or
//     wrong signature, timestamp outside the tolerance), 400 when the
//     request is authentic but its event ID is missing or unusable;
//   - 503 when the publisher fails: nothing was enqueued, and the
//     provider's retry will try again;
//   - 200 once the publisher returned success, and only then: the provider
//     stops retrying only events that were durably enqueued.
//
// Each message has a fresh UUID (the UUID identifies the delivery; the key
// is the event ID) and metadata event_id, tenant_id, webhook_provider,
// webhook_event_type and received_at (see the Metadata constants). Its
// context carries the request's values but not its cancellation: a
// provider that gives up waiting does not abort a publish under way.
//
// Mount one receiver per provider and secret:
//
//	stripe, err := webhook.NewReceiver(publisher, webhook.ReceiverConfig{
//		Topic:    "stripe.events",
//		Verifier: webhook.StripeVerifier(os.Getenv("STRIPE_WEBHOOK_SECRET")),
//		Tenant:   "acme",
//	})
//	mux.Handle("/webhooks/stripe", stripe)
func NewReceiver(publisher message.Publisher, cfg ReceiverConfig) (http.Handler, error) {
	cfg = cfg.withDefaults()
	err := cfg.validate()
	if publisher == nil {
		err = errors.Join(err, fmt.Errorf("%w: publisher is nil", ErrInvalidConfig))
	}
	if err != nil {
		return nil, err
	}
	return &receiver{pub: publisher, cfg: cfg}, nil
}

func (h *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		h.reject(w, r, http.StatusMethodNotAllowed, "", errors.New("method not allowed"))
		return
	}
	if r.ContentLength > h.cfg.MaxBodyBytes {
		h.reject(w, r, http.StatusRequestEntityTooLarge, "", fmt.Errorf("Content-Length %d over the limit of %d bytes", r.ContentLength, h.cfg.MaxBodyBytes))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			h.reject(w, r, http.StatusRequestEntityTooLarge, "", fmt.Errorf("body over the limit of %d bytes", mbe.Limit))
		} else {
			h.reject(w, r, http.StatusBadRequest, "", fmt.Errorf("reading the body: %w", err))
		}
		return
	}

	now := h.cfg.Now()
	ev, err := h.cfg.Verifier.Verify(r, body, now)
	if err == nil {
		err = checkEventID(ev.ID) // a custom verifier's ID too must be a usable key
	}
	if err == nil && ev.Tenant != "" {
		err = checkTenant(ev.Tenant) // and its tenant a usable scope
	}
	provider := h.cfg.Provider
	if provider == "" {
		provider = ev.Provider
	}
	if err != nil {
		status := http.StatusUnauthorized
		if errors.Is(err, ErrMissingEventID) || errors.Is(err, ErrInvalidEventID) || errors.Is(err, ErrInvalidTenant) {
			status = http.StatusBadRequest
		}
		h.reject(w, r, status, provider, err)
		return
	}

	msg := message.NewMessage(watermill.NewUUID(), body)
	msg.SetContext(context.WithoutCancel(r.Context()))
	msg.Metadata.Set(MetadataEventID, ev.ID)
	if tenant := ev.Tenant; tenant != "" {
		msg.Metadata.Set(MetadataTenantID, tenant)
	} else if h.cfg.Tenant != "" {
		msg.Metadata.Set(MetadataTenantID, h.cfg.Tenant)
	}
	if provider != "" {
		msg.Metadata.Set(MetadataProvider, provider)
	}
	if ev.Type != "" {
		msg.Metadata.Set(MetadataEventType, ev.Type)
	}
	msg.Metadata.Set(MetadataReceivedAt, now.UTC().Format(time.RFC3339Nano))

	if err := h.pub.Publish(h.cfg.Topic, msg); err != nil {
		h.cfg.Logger.Error("Webhook not enqueued; answering 503 so that the provider retries", err, watermill.LogFields{
			"provider": provider, "event_id": ev.ID, "topic": h.cfg.Topic, "message_uuid": msg.UUID,
		})
		http.Error(w, "not enqueued, retry later", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// reject answers status with its status text only; the reason goes to the
// log, not to a sender that may be probing. The built-in verifiers' errors
// never carry the body, a secret or a signature, and a custom Verifier's
// must not either.
func (h *receiver) reject(w http.ResponseWriter, r *http.Request, status int, provider string, err error) {
	h.cfg.Logger.Info("Webhook rejected", watermill.LogFields{
		"provider": provider, "status": status, "reason": err.Error(), "remote_addr": r.RemoteAddr, "topic": h.cfg.Topic,
	})
	http.Error(w, http.StatusText(status), status)
}
