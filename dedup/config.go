package dedup

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxmill/inboxmill/inbox"
)

// DefaultRetention is how long a record is kept when Config.Retention is 0.
const DefaultRetention = 7 * 24 * time.Hour

// Mode selects how the middleware makes a handler's effect happen once.
type Mode int

const (
	// ModeTransactional (the default) is for effects in the same database:
	// claim, handler and output commit in one transaction.
	ModeTransactional Mode = iota
	// ModeReserve is for effects outside the database (payments, e-mails,
	// partner APIs): a short transaction reserves the intent under a lease,
	// the handler runs with no transaction open, and a second short
	// transaction records the outcome if the lease is still this worker's.
	ModeReserve
)

func (m Mode) String() string {
	switch m {
	case ModeTransactional:
		return "transactional"
	case ModeReserve:
		return "reserve"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

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

	// ReadFirst decides whether a transactional delivery reads its record
	// before beginning a transaction, which makes a duplicate one indexed
	// lookup instead of a transaction with a conflicting insert. Defaults to
	// ReadFirstAuto: read first while most recent deliveries were
	// duplicates. Not used when joining a consuming transaction.
	ReadFirst ReadFirst

	// JoinTx, when set, finds the transaction the message was consumed in
	// (WatermillSQLTx for watermill-sql's subscriber). The middleware then
	// runs in it instead of beginning its own, each attempt under a
	// savepoint, so the ack, the inbox record and the handler's writes
	// commit together. The inbox must live in the same database. When it
	// finds none, the middleware begins its own transaction. Transactional
	// mode only. Defaults to nil.
	JoinTx TxJoiner

	// Mode is ModeTransactional (default) or ModeReserve.
	Mode Mode

	// Lease is how long a reserve-mode claim is exclusively this worker's
	// before another delivery may take it over. Defaults to 30 s. The
	// heartbeat keeps extending it while the handler runs. Expiry is judged
	// by the store's Now, which follows the database server's clock
	// (inbox.Config.ClockSync, on by default for PostgreSQL and MySQL): the
	// middleware syncs it before its first reservation. With the sync
	// turned off, keep worker clocks within Lease - HeartbeatInterval of
	// each other, or a worker whose clock runs ahead takes over a live
	// lease; fencing then still keeps the slower worker from recording, but
	// both handlers run.
	Lease time.Duration

	// HeartbeatInterval is how often a running reserve-mode handler's lease
	// is extended. Defaults to Lease/3; -1 disables the heartbeat (then a
	// handler must finish within Lease). The heartbeat stops when the
	// message's context ends (the consumer is shutting down): the lease then
	// runs out and a redelivery may take the intent over.
	HeartbeatInterval time.Duration

	// InFlightWait is how long a reserve-mode delivery that finds the intent
	// held by a live lease (or pending) waits for it to finish before it
	// nacks with ErrInFlight (or ErrPending). Defaults to 5 s; -1 nacks at
	// once. It bounds the load a hot redelivery loop puts on the database.
	InFlightWait time.Duration

	// InFlightPoll is how often a waiting delivery reads the record again.
	// Defaults to 50 ms.
	InFlightPoll time.Duration

	// Owner names this worker in lease_owner. Defaults to
	// "<hostname>-<pid>-<random>".
	Owner string

	// AckPending acks a reserve-mode delivery whose intent is pending
	// instead of nacking it until the reconciler resolves it. Set it when
	// the reconciler's outcome needs no redelivery (nothing to publish, and
	// a reconciled failure is not re-run). Defaults to false.
	AckPending bool

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
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	if c.HeartbeatInterval == 0 && c.Lease > 0 {
		c.HeartbeatInterval = max(c.Lease/3, 1)
	}
	if c.InFlightWait == 0 {
		c.InFlightWait = 5 * time.Second
	}
	if c.InFlightPoll == 0 {
		c.InFlightPoll = 50 * time.Millisecond
	}
	if c.Owner == "" {
		c.Owner = defaultOwner()
	}
	return c
}

func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "worker"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	owner := fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	if len(owner) > 255 {
		owner = owner[len(owner)-255:]
	}
	return owner
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
	if c.Mode != ModeTransactional && c.Mode != ModeReserve {
		errs = append(errs, fmt.Errorf("%w: unknown Mode %d", ErrInvalidConfig, int(c.Mode)))
	}
	if c.ReadFirst < ReadFirstAuto || c.ReadFirst > ReadFirstNever {
		errs = append(errs, fmt.Errorf("%w: unknown ReadFirst %d", ErrInvalidConfig, int(c.ReadFirst)))
	}
	if c.Mode == ModeReserve && c.JoinTx != nil {
		errs = append(errs, fmt.Errorf("%w: JoinTx is for ModeTransactional; reserve mode holds no transaction across the handler", ErrInvalidConfig))
	}
	if c.Lease < 0 {
		errs = append(errs, fmt.Errorf("%w: Lease %v is negative", ErrInvalidConfig, c.Lease))
	}
	if c.HeartbeatInterval < -1 || (c.HeartbeatInterval > 0 && c.Lease > 0 && c.HeartbeatInterval >= c.Lease) {
		errs = append(errs, fmt.Errorf("%w: HeartbeatInterval %v must be shorter than Lease %v (or -1 to disable)",
			ErrInvalidConfig, c.HeartbeatInterval, c.Lease))
	}
	if c.InFlightWait < -1 {
		errs = append(errs, fmt.Errorf("%w: InFlightWait %v is negative (use -1 to nack at once)", ErrInvalidConfig, c.InFlightWait))
	}
	if c.InFlightPoll < 0 {
		errs = append(errs, fmt.Errorf("%w: InFlightPoll %v is negative", ErrInvalidConfig, c.InFlightPoll))
	}
	if len(c.Owner) > 255 {
		errs = append(errs, fmt.Errorf("%w: Owner is longer than 255 bytes", ErrInvalidConfig))
	}
	if c.Operation != "" {
		if err := inbox.ValidateIdentity("", c.Operation, "k"); err != nil {
			errs = append(errs, fmt.Errorf("%w: Operation: %v", ErrInvalidConfig, err))
		}
	}
	return errors.Join(errs...)
}
