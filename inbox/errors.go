package inbox

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

var (
	// ErrNotFound: no record has that (scope, operation, key).
	ErrNotFound = errors.New("inbox: record not found")

	// ErrPayloadConflict: the key was claimed with a different payload
	// fingerprint. The key was reused for another intent; the new payload
	// must not be processed, nor acknowledged as a duplicate.
	ErrPayloadConflict = errors.New("inbox: key reused with a different payload")

	// ErrLeaseLost: the record's attempt is no longer the caller's (another
	// worker took it over, or it was finished); nothing was changed.
	ErrLeaseLost = errors.New("inbox: attempt no longer holds the record")

	// ErrInvalidKey: a scope, operation or key is empty where it may not be,
	// longer than its limit, not valid UTF-8 or contains a NUL byte.
	ErrInvalidKey = errors.New("inbox: invalid key")

	// ErrInvalidConfig: the store's configuration is unusable.
	ErrInvalidConfig = errors.New("inbox: invalid config")

	// ErrTransient marks database errors after which retrying the whole
	// transaction may succeed: serialization failures, deadlocks, lock
	// timeouts, a busy SQLite database, a lost connection. The driver's own
	// error stays in the chain.
	ErrTransient = errors.New("inbox: transient database error")
)

// IsRetryable reports whether err is worth retrying from a clean start (a new
// transaction, or a redelivery of the message).
func IsRetryable(err error) bool {
	return errors.Is(err, ErrTransient)
}

// ConflictError carries the context of an [ErrPayloadConflict].
type ConflictError struct {
	Scope     string
	Operation string
	// KeyDigest identifies the key without revealing it (see [KeyDigest]).
	KeyDigest string
	// Existing is the record that holds the key.
	Existing *Record
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("inbox: key %s of operation %q in scope %q was claimed with a different payload",
		e.KeyDigest, e.Operation, e.Scope)
}

// Unwrap makes errors.Is(err, ErrPayloadConflict) true.
func (e *ConflictError) Unwrap() error { return ErrPayloadConflict }

// KeyDigest returns a short, stable digest of a record's identity that is safe
// to log: keys can carry customer data, digests cannot be read back.
func KeyDigest(scope, operation, key string) string {
	h := sha256.New()
	for _, s := range []string{scope, operation, key} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}
