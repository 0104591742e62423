package dedup

import (
	"errors"
	"fmt"

	"github.com/inboxmill/inboxmill/inbox"
)

var (
	// ErrPayloadConflict: the message's key was already claimed with a
	// different payload. The handler did not run and the message is not
	// acknowledged: route it to a poison queue (see [IsPoison]). It is the
	// same value as inbox.ErrPayloadConflict.
	ErrPayloadConflict = inbox.ErrPayloadConflict

	// ErrMissingKey: the message carries no idempotency key (or no scope,
	// when the scope is read from the message). The handler did not run.
	ErrMissingKey = errors.New("dedup: message has no idempotency key")

	// ErrInvalidKey: the key, scope or operation is empty, too long, not
	// UTF-8 or contains a NUL byte. The handler did not run. It is the same
	// value as inbox.ErrInvalidKey.
	ErrInvalidKey = inbox.ErrInvalidKey

	// ErrFingerprint: the payload's fingerprint could not be computed (a
	// custom FingerprintFunc failed, or returned other than 1 to 64 bytes).
	// The handler did not run.
	ErrFingerprint = errors.New("dedup: cannot fingerprint the payload")

	// ErrInvalidEventTime: Config.EventTime could not read the event's
	// time from the message. The handler did not run.
	ErrInvalidEventTime = errors.New("dedup: cannot read the event's time")

	// ErrBeyondRetention: the event is older than a partitioned inbox
	// keeps records (its bucket has closed) and no record of it is left,
	// so whether it ran cannot be told. The handler did not run; route the
	// message to a poison queue. It is the same value as
	// inbox.ErrBeyondRetention.
	ErrBeyondRetention = inbox.ErrBeyondRetention

	// ErrInFlight: another delivery of the same key holds it and its outcome
	// is not known yet. Retry later (the message is nacked).
	ErrInFlight = errors.New("dedup: another delivery of the same key is in progress")

	// ErrPending: in reserve mode, the intent's external effect may or may
	// not have happened (an earlier attempt ended Uncertain) and waits for
	// the reconciler. The handler is not run again; the message is nacked
	// until the record is resolved (or acked, with Config.AckPending).
	ErrPending = errors.New("dedup: the intent's outcome is uncertain and awaits reconciliation")

	// ErrLeaseLost: in reserve mode, another worker took the intent over
	// while this one ran it (its lease expired); this worker's outcome was
	// not recorded. It is the same value as inbox.ErrLeaseLost.
	ErrLeaseLost = inbox.ErrLeaseLost

	// ErrInvalidConfig: the middleware's configuration is unusable.
	ErrInvalidConfig = errors.New("dedup: invalid config")
)

// IsPoison reports whether err means the message can never be processed as
// it is — a reused key with another payload, a missing or invalid key, a
// payload that cannot be fingerprinted, an unreadable event time, an event
// older than a partitioned inbox keeps records, a handler's Permanent
// failure — so
// that redelivering it would loop forever. Use it to route such messages to
// a poison queue:
//
//	pq, _ := middleware.PoisonQueueWithFilter(publisher, "poison", dedup.IsPoison)
func IsPoison(err error) bool {
	var pe *PermanentError
	return errors.Is(err, ErrPayloadConflict) || errors.Is(err, ErrMissingKey) || errors.Is(err, ErrInvalidKey) ||
		errors.Is(err, ErrFingerprint) || errors.Is(err, ErrInvalidEventTime) || errors.Is(err, ErrBeyondRetention) ||
		errors.As(err, &pe)
}

// IsRetryable reports whether a redelivery of the message may succeed where
// this one failed: transient database errors (deadlocks, serialization
// failures, lost connections), in-flight duplicates, intents pending
// reconciliation and lost leases.
func IsRetryable(err error) bool {
	return inbox.IsRetryable(err) || errors.Is(err, ErrInFlight) || errors.Is(err, ErrPending) ||
		errors.Is(err, ErrLeaseLost)
}

// Permanent marks a handler's error as final: the intent is recorded as
// failed with the error, never run again, and later duplicates are acked.
// The delivery itself returns the error, which IsPoison recognises. Use it
// for refusals that no retry can change (a declined card, a validation
// error). Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// PermanentError is a handler's error marked with [Permanent].
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent failure: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Uncertain marks a handler's error as an unknown outcome: the request may
// have reached the provider (a timeout after it was sent, a connection cut
// before the answer). In reserve mode the intent becomes pending with
// externalRef (the provider's reference or the idempotency key sent), is
// never re-executed by redelivery, and waits for the reconciler to ask the
// provider. In transactional mode there is no external effect to be unsure
// of; the error is treated like any other (rollback, retry).
// Uncertain(nil, ref) is nil.
func Uncertain(err error, externalRef string) error {
	if err == nil {
		return nil
	}
	return &UncertainError{Err: err, ExternalRef: externalRef}
}

// UncertainError is a handler's error marked with [Uncertain].
type UncertainError struct {
	Err         error
	ExternalRef string
}

func (e *UncertainError) Error() string { return "uncertain outcome: " + e.Err.Error() }
func (e *UncertainError) Unwrap() error { return e.Err }

// KeyError says which part of a message's identity could not be derived.
type KeyError struct {
	// Part is "key" or "scope".
	Part string
	// Source describes where it was looked for, e.g. `metadata "event_id"`.
	Source string
	// Err is ErrMissingKey or ErrInvalidKey, possibly wrapping a cause.
	Err error
}

func (e *KeyError) Error() string {
	return fmt.Sprintf("dedup: %s from %s: %v", e.Part, e.Source, e.Err)
}

func (e *KeyError) Unwrap() error { return e.Err }

// PanicError is returned when the handler panicked. The transaction was
// rolled back and the message is nacked.
type PanicError struct {
	Value any
	Stack string
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("dedup: handler panicked: %v", e.Value)
}
