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

	// ErrInFlight: another delivery of the same key holds it and its outcome
	// is not known yet. Retry later (the message is nacked).
	ErrInFlight = errors.New("dedup: another delivery of the same key is in progress")

	// ErrInvalidConfig: the middleware's configuration is unusable.
	ErrInvalidConfig = errors.New("dedup: invalid config")
)

// IsPoison reports whether err means the message can never be processed as
// it is — a reused key with another payload, a missing or invalid key, a
// payload that cannot be fingerprinted — so
// that redelivering it would loop forever. Use it to route such messages to
// a poison queue:
//
//	pq, _ := middleware.PoisonQueueWithFilter(publisher, "poison", dedup.IsPoison)
func IsPoison(err error) bool {
	return errors.Is(err, ErrPayloadConflict) || errors.Is(err, ErrMissingKey) || errors.Is(err, ErrInvalidKey) ||
		errors.Is(err, ErrFingerprint)
}

// IsRetryable reports whether a redelivery of the message may succeed where
// this one failed: transient database errors (deadlocks, serialization
// failures, lost connections) and in-flight duplicates.
func IsRetryable(err error) bool {
	return inbox.IsRetryable(err) || errors.Is(err, ErrInFlight)
}

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
