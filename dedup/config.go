package dedup

import (
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmill/inboxmill/inbox"
)

// DefaultRetention is how long a record is kept when Config.Retention is 0.
const DefaultRetention = 7 * 24 * time.Hour

// Defaults of the rate limit on repeated log lines (Config.RepeatLogInterval).
const (
	DefaultRepeatLogInterval = time.Minute
	// DefaultRepeatLogKeys is how many keys the rate limit remembers.
	DefaultRepeatLogKeys = 1024
)

// Mode selects how the middleware makes a handler's effect happen once:
// [Transactional] (the default) or [Reserve]. Each carries the settings of
// its mode only.
type Mode interface {
	modeName() string
	validate() []error
}

// Transactional is the mode for effects in the same database: claim,
// handler and output commit in one transaction. The zero value is the
// default mode.
type Transactional struct {
	// TxOptions are the options of the transactions the middleware begins.
	// Defaults to nil: the database's default isolation level (READ
	// COMMITTED on PostgreSQL, REPEATABLE READ on MySQL). Stricter levels
	// work; their serialization failures come back retryable.
	TxOptions *sql.TxOptions

	// ClaimAttempts is how many times the middleware tries a delivery when
	// its transaction fails transiently (deadlock, serialization failure,
	// busy database) before the handler ran. Defaults to
	// DefaultClaimAttempts (3). Once the handler has run, a failure is
	// returned to the router, which nacks.
	ClaimAttempts int

	// ReadFirst decides whether a delivery reads its record before
	// beginning a transaction, which makes a duplicate one indexed lookup
	// instead of a transaction with a conflicting insert. Defaults to
	// ReadFirstAuto: read first while most recent deliveries were
	// duplicates. Not used when joining a consuming transaction.
	ReadFirst ReadFirst

	// JoinTx, when set, finds the transaction the message was consumed in
	// (watermillsql.Tx in package dedup/watermillsql, for watermill-sql's
	// subscriber). The middleware then runs in it instead of beginning its
	// own, each attempt under a savepoint, so the ack, the inbox record and
	// the handler's writes commit together. The inbox must live in the
	// same database. When it finds none, the middleware begins its own
	// transaction. Defaults to nil.
	JoinTx TxJoiner

	// Group, when set, turns on group commit: deliveries handled at the
	// same time share one transaction, one claim statement and one
	// commit (see [Group]). Deliveries that JoinTx joins to a consuming
	// transaction are not grouped, and ReadFirst is not used for grouped
	// ones (their claim is shared already). Defaults to nil: every
	// delivery commits a transaction of its own.
	Group *Group
}

// Reserve is the mode for effects outside the database (payments,
// e-mails, partner APIs): a short statement reserves the intent under a
// lease, the handler runs with no transaction open, and a second short
// statement records the outcome if the lease is still this worker's.
type Reserve struct {
	// Lease is how long a claim is exclusively this worker's before
	// another delivery may take it over. Defaults to DefaultLease (30 s).
	// The heartbeat keeps extending it while the handler runs. Expiry is
	// judged by the store's Now, which follows the database server's clock
	// (inbox.Config.ClockSync, on by default for PostgreSQL and MySQL): the
	// store syncs it before its first lease. With the sync turned off, keep
	// worker clocks within Lease - HeartbeatInterval of each other, or a
	// worker whose clock runs ahead takes over a live lease; fencing then
	// still keeps the slower worker from recording, but both handlers run.
	Lease time.Duration

	// HeartbeatInterval is how often a running handler's lease is
	// extended. Defaults to Lease/3; -1 disables the heartbeat (then a
	// handler must finish within Lease). The heartbeat stops when the
	// message's context ends (the consumer is shutting down): the lease
	// then runs out and a redelivery may take the intent over.
	HeartbeatInterval time.Duration

	// InFlightWait is how long a delivery that finds the intent held by a
	// live lease (or pending) waits for it to finish before it nacks with
	// ErrInFlight (or ErrPending). Defaults to DefaultInFlightWait (5 s);
	// -1 nacks at once. It bounds the load a hot redelivery loop puts on
	// the database.
	InFlightWait time.Duration

	// InFlightPoll is how often a waiting delivery reads the record again.
	// Defaults to DefaultInFlightPoll (50 ms).
	InFlightPoll time.Duration

	// Owner names this worker in lease_owner: text of at most
	// inbox.MaxOwnerLen bytes. Defaults to inbox.NewOwnerID("").
	Owner string

	// AckPending acks a delivery whose intent is pending instead of
	// nacking it until the reconciler resolves it. Set it when the
	// reconciler's outcome needs no redelivery (nothing to publish, and a
	// reconciled failure is not re-run). Defaults to false.
	AckPending bool

	// Batch, when set, sends the reservations of deliveries handled at
	// the same time to the database in one statement, and their
	// completions in another (see [Batch]). Each handler still runs with
	// no transaction open, under its own lease. Defaults to nil: one
	// statement per reservation and per completion.
	Batch *Batch
}

// Defaults of the modes' settings.
const (
	DefaultClaimAttempts = 3
	DefaultLease         = 30 * time.Second
	DefaultInFlightWait  = 5 * time.Second
	DefaultInFlightPoll  = 50 * time.Millisecond
)

func (Transactional) modeName() string { return "transactional" }
func (Reserve) modeName() string       { return "reserve" }

func (t Transactional) withDefaults() Transactional {
	if t.ClaimAttempts == 0 {
		t.ClaimAttempts = DefaultClaimAttempts
	}
	if t.Group != nil {
		g := t.Group.withDefaults() // a copy: the caller's value is not changed
		t.Group = &g
	}
	return t
}

func (t Transactional) validate() []error {
	var errs []error
	if t.ClaimAttempts < 0 {
		errs = append(errs, fmt.Errorf("%w: ClaimAttempts %d is negative", ErrInvalidConfig, t.ClaimAttempts))
	}
	if t.ReadFirst < ReadFirstAuto || t.ReadFirst > ReadFirstNever {
		errs = append(errs, fmt.Errorf("%w: unknown ReadFirst %d", ErrInvalidConfig, int(t.ReadFirst)))
	}
	if t.Group != nil {
		errs = append(errs, t.Group.validate()...)
	}
	return errs
}

func (r Reserve) withDefaults() Reserve {
	if r.Lease == 0 {
		r.Lease = DefaultLease
	}
	if r.HeartbeatInterval == 0 && r.Lease > 0 {
		r.HeartbeatInterval = max(r.Lease/3, 1)
	}
	if r.InFlightWait == 0 {
		r.InFlightWait = DefaultInFlightWait
	}
	if r.InFlightPoll == 0 {
		r.InFlightPoll = DefaultInFlightPoll
	}
	if r.Owner == "" {
		r.Owner = inbox.NewOwnerID("")
	}
	if r.Batch != nil {
		b := r.Batch.withDefaults() // a copy: the caller's value is not changed
		r.Batch = &b
	}
	return r
}

func (r Reserve) validate() []error {
	var errs []error
	if r.Lease < 0 {
		errs = append(errs, fmt.Errorf("%w: Lease %v is negative", ErrInvalidConfig, r.Lease))
	}
	if r.HeartbeatInterval < -1 || (r.HeartbeatInterval > 0 && r.Lease > 0 && r.HeartbeatInterval >= r.Lease) {
		errs = append(errs, fmt.Errorf("%w: HeartbeatInterval %v must be shorter than Lease %v (or -1 to disable)",
			ErrInvalidConfig, r.HeartbeatInterval, r.Lease))
	}
	if r.InFlightWait < -1 {
		errs = append(errs, fmt.Errorf("%w: InFlightWait %v is negative (use -1 to nack at once)", ErrInvalidConfig, r.InFlightWait))
	}
	if r.InFlightPoll < 0 {
		errs = append(errs, fmt.Errorf("%w: InFlightPoll %v is negative", ErrInvalidConfig, r.InFlightPoll))
	}
	if err := inbox.CheckText(r.Owner, inbox.MaxOwnerLen); err != nil {
		errs = append(errs, fmt.Errorf("%w: Owner %w", ErrInvalidConfig, err))
	}
	if r.Batch != nil {
		errs = append(errs, r.Batch.validate()...)
	}
	return errs
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

	// Retention is how long a record outlives its outcome: a duplicate
	// that arrives later runs again. Keep it longer than any redelivery,
	// retry or replay horizon (Kafka topic retention, webhook retry
	// window). Defaults to DefaultRetention (7 days); -1 keeps records
	// forever.
	Retention time.Duration

	// EventTime reads when the event happened from the message, for a
	// store whose table is partitioned by time (inbox/postgres.Partitioned):
	// the record goes into the partition of that time, and an event whose
	// partition's retention has run out is refused with ErrBeyondRetention
	// rather than run again. Every delivery of an event must carry the
	// same time. Defaults to nil: the time of the claim, which never
	// refuses. A message whose time cannot be read is refused with
	// ErrInvalidEventTime. See EventTimeFromMetadata and
	// EventTimeFromUUIDv7. Stores that are not partitioned ignore it.
	EventTime EventTimeFunc

	// Mode is Transactional{} (the default, also when nil) or Reserve{},
	// with the settings of that mode, as a value or a pointer (New copies
	// it; a nil pointer is refused).
	Mode Mode

	// Logger receives one line per delivery: executed and duplicate at
	// Debug (the middleware working as it should); conflicts, invalid keys,
	// keys held or pending, and failures at Info. Nothing is logged at
	// Error: the router logs the error a delivery returns itself. A key
	// that keeps coming back with the same outcome is logged at Info at
	// most once per RepeatLogInterval (see there). Keys are logged as
	// digests (inbox.ID.Digest), never as keys or payloads.
	//
	// Defaults to slog.Default() as it is when New is called, through
	// watermill.NewSlogLogger: call slog.SetDefault first to send the lines
	// to your handler. With the default, lines below the slog handler's
	// level cost nothing to skip. watermill.NopLogger{} turns logging off.
	Logger watermill.LoggerAdapter

	// RepeatLogInterval rate-limits the Info lines of a key that keeps
	// coming back with the same outcome: a reused key redelivered in a
	// loop (no poison queue), a handler that fails on every redelivery. The
	// first delivery is logged at Info; repeats within the interval are
	// logged at Debug; the first repeat after it is logged at Info again,
	// with "repeats" (deliveries since the first) and "suppressed" (repeats
	// logged at Debug since the last Info line). A key quiet for a whole
	// interval starts over. The middleware remembers the last
	// DefaultRepeatLogKeys keys, least recently seen first out. Defaults to
	// DefaultRepeatLogInterval (1 minute); -1 logs every delivery at its
	// level.
	RepeatLogInterval time.Duration

	// TracerProvider makes the OpenTelemetry spans of each delivery (see
	// the package documentation, "Tracing"). Defaults to
	// otel.GetTracerProvider(): no spans, at next to no cost, until the
	// application installs a provider with otel.SetTracerProvider.
	TracerProvider trace.TracerProvider

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
	if c.RepeatLogInterval == 0 {
		c.RepeatLogInterval = DefaultRepeatLogInterval
	}
	switch m := c.Mode.(type) {
	case nil:
		c.Mode = Transactional{}.withDefaults()
	case Transactional:
		c.Mode = m.withDefaults()
	case *Transactional:
		if m != nil {
			c.Mode = m.withDefaults()
		}
	case Reserve:
		c.Mode = m.withDefaults()
	case *Reserve:
		if m != nil {
			c.Mode = m.withDefaults()
		}
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
	if c.RepeatLogInterval < -1 {
		errs = append(errs, fmt.Errorf("%w: RepeatLogInterval %v is negative (use -1 to log every repeat)",
			ErrInvalidConfig, c.RepeatLogInterval))
	}
	if c.Retention < -1 {
		errs = append(errs, fmt.Errorf("%w: Retention %v is negative (use -1 to keep records forever)", ErrInvalidConfig, c.Retention))
	}
	switch m := c.Mode.(type) {
	case Transactional, Reserve:
		errs = append(errs, c.Mode.validate()...)
	case *Transactional, *Reserve:
		// withDefaults took the value of every other pointer.
		errs = append(errs, fmt.Errorf("%w: Mode is a nil %T", ErrInvalidConfig, m))
	default:
		errs = append(errs, fmt.Errorf("%w: Mode must be dedup.Transactional or dedup.Reserve, not %T", ErrInvalidConfig, c.Mode))
	}
	if c.Operation != "" {
		if err := (inbox.ID{Operation: c.Operation, Key: "k"}).Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%w: Operation: %v", ErrInvalidConfig, err))
		}
	}
	return errors.Join(errs...)
}
