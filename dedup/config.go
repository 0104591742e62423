package dedup

import (
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxmill/inboxmill/inbox"
)

// DefaultRetention is how long a record is kept when Config.Retention is 0.
const DefaultRetention = 7 * 24 * time.Hour

// Config configures a [Deduplicator]. Only Key is required.
type Config struct {
	// Key derives the idempotency key. Required; see KeyFromMetadata,
	// KeyFromJSON and KeyFromFunc.
	Key KeyFunc

	// Scope derives the scope (tenant). Defaults to one scope, "", for all
	// messages. See ScopeFromMetadata and ScopeConstant.
	Scope ScopeFunc

	// Operation names what the handler does, the third part of a record's
	// identity: the same key under two operations is two intents. Defaults
	// to the name of the router handler the message arrives at
	// (message.HandlerNameFromCtx); set it when the middleware runs outside
	// a message.Router, or to keep records when a handler is renamed.
	Operation string

	// Fingerprint computes the payload fingerprint. Defaults to
	// JSONFingerprint(IgnoreFields...).
	Fingerprint FingerprintFunc

	// IgnoreFields are dotted JSON paths left out of the default
	// fingerprint, for fields that differ between deliveries of the same
	// intent (a sent_at timestamp, a trace ID). Only valid when Fingerprint
	// is nil.
	IgnoreFields []string

	// Retention is how long a record outlives its claim: a duplicate that
	// arrives later runs again. Keep it longer than any redelivery, retry
	// or replay horizon (Kafka topic retention, webhook retry window).
	// Defaults to DefaultRetention (7 days); -1 keeps records forever.
	Retention time.Duration

	// TxOptions are the options of the transactions the middleware begins.
	// Defaults to nil: the database's default isolation level (READ
	// COMMITTED on PostgreSQL, REPEATABLE READ on MySQL). Stricter levels
	// work; their serialization failures come back retryable.
	TxOptions *sql.TxOptions

	// ClaimAttempts is how many times the middleware tries a delivery when
	// its transaction fails transiently (deadlock, serialization failure,
	// busy database) before the handler ran. Defaults to 3. Once the handler
	// has run, a failure is returned to the router, which nacks.
	ClaimAttempts int

	// Logger receives one line per delivery: executed at Debug; duplicates,
	// conflicts, invalid keys and failures at Info (never Error: a duplicate
	// is the middleware working, and the router logs a returned error
	// itself). Keys are logged as digests, never payloads.
	// Defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter

	// Registerer, when set, receives the Prometheus collectors
	// inboxmill_dedup_messages_total{operation,outcome} and
	// inboxmill_dedup_claim_duration_seconds{operation}. Several
	// middlewares may share one registry. Defaults to nil: no metrics.
	Registerer prometheus.Registerer
}

func (c Config) withDefaults() Config {
	if c.Scope == nil {
		c.Scope = ScopeConstant("")
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.ClaimAttempts == 0 {
		c.ClaimAttempts = 3
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Key == nil {
		errs = append(errs, fmt.Errorf("%w: Key is required (e.g. dedup.KeyFromMetadata(\"event_id\"))", ErrInvalidConfig))
	}
	if c.Fingerprint != nil && len(c.IgnoreFields) > 0 {
		errs = append(errs, fmt.Errorf("%w: IgnoreFields only applies to the default Fingerprint", ErrInvalidConfig))
	}
	if c.Retention < -1 {
		errs = append(errs, fmt.Errorf("%w: Retention %v is negative (use -1 to keep records forever)", ErrInvalidConfig, c.Retention))
	}
	if c.ClaimAttempts < 0 {
		errs = append(errs, fmt.Errorf("%w: ClaimAttempts %d is negative", ErrInvalidConfig, c.ClaimAttempts))
	}
	if c.Operation != "" {
		if err := inbox.ValidateIdentity("", c.Operation, "k"); err != nil {
			errs = append(errs, fmt.Errorf("%w: Operation: %v", ErrInvalidConfig, err))
		}
	}
	return errors.Join(errs...)
}
