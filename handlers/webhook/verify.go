package webhook

import (
	"bytes"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/internal/canonjson"
)

// Errors a [Verifier] returns, wrapped with detail that never contains the
// body, a secret or a signature. The receiver answers 401 to all of them
// except ErrMissingEventID and ErrInvalidEventID (400): a request that is
// authentic but names no usable event cannot be deduplicated, and a
// provider retrying it would not change that.
var (
	// ErrMissingSignature: the request carries no signature, or lacks a
	// header the signature covers (a timestamp, a message ID).
	ErrMissingSignature = errors.New("webhook: signature missing")

	// ErrMalformedHeader: a signature or timestamp header is present but not
	// in the provider's format.
	ErrMalformedHeader = errors.New("webhook: malformed signature header")

	// ErrSignatureMismatch: no signature in the request matches the body
	// under any configured secret — a tampered body, a wrong or retired
	// secret, or a forgery.
	ErrSignatureMismatch = errors.New("webhook: signature mismatch")

	// ErrTimestampOutOfRange: the signature is valid but its signed
	// timestamp is further from now than the tolerance, in the past (a
	// replay of a captured request) or in the future.
	ErrTimestampOutOfRange = errors.New("webhook: timestamp outside the tolerance")

	// ErrMissingEventID: the request is authentic but carries no event or
	// delivery ID to deduplicate on.
	ErrMissingEventID = errors.New("webhook: no event ID")

	// ErrInvalidEventID: the event ID cannot be an inbox key: longer than
	// 255 bytes, not UTF-8, or containing a NUL byte; or, read from a JSON
	// body, not a string, or one that holds invalid UTF-8 or a lone
	// surrogate escape, which would decode to U+FFFD and look like another
	// event's ID.
	ErrInvalidEventID = errors.New("webhook: event ID is not a valid key")

	// ErrInvalidTenant: the tenant the request names cannot be an inbox
	// scope: longer than 255 bytes, not UTF-8, containing a NUL byte, or
	// read from a JSON body as a string that does not decode losslessly.
	// Published, it would make the message poison downstream; it is
	// refused with 400 instead.
	ErrInvalidTenant = errors.New("webhook: tenant is not a valid scope")
)

// DefaultTolerance is how far a signed timestamp may be from now, either
// way, when a verifier's Tolerance is 0. It is what the providers' own SDKs
// use.
const DefaultTolerance = 5 * time.Minute

// Event is what a [Verifier] learned from an authentic request.
type Event struct {
	// ID is the provider's event or delivery ID, the same on every retry of
	// the event: the key the dedup middleware claims (metadata event_id).
	// Required.
	ID string
	// Type is the provider's event type ("payment_intent.succeeded",
	// "push"); empty when the scheme has none.
	Type string
	// Tenant is the tenant the provider names in the request (a Stripe
	// Connect account, a GitHub App installation); empty when it names none.
	Tenant string
	// Provider names the scheme ("stripe", "github", ...).
	Provider string
	// Timestamp is the signed timestamp; zero for schemes that sign none.
	Timestamp time.Time
}

// Verifier authenticates a webhook request and identifies its event. body
// is the request's whole body (the receiver has read it; r.Body is
// drained), now the receiver's clock. A Verifier must compare MACs in
// constant time, accept a request only when a signature over exactly this
// body matches, and return an error wrapping one of the sentinel errors
// above otherwise. Its errors are logged: they must not contain the body,
// a secret or a signature. It must be safe for concurrent use.
//
// The receiver refuses an Event.ID that is not a valid inbox key, but it
// cannot tell a U+FFFD that the provider sent from one that decoding
// produced: a Verifier reading the ID from a JSON body with encoding/json
// must refuse strings that do not decode losslessly (invalid UTF-8, lone
// surrogate escapes) itself, as the Stripe verifier does.
//
// Implement it for a provider without a built-in verifier, or wrap one to
// derive the tenant from the route:
//
//	v := webhook.VerifierFunc(func(r *http.Request, body []byte, now time.Time) (webhook.Event, error) {
//		ev, err := stripe.Verify(r, body, now)
//		ev.Tenant = r.PathValue("tenant")
//		return ev, err
//	})
type Verifier interface {
	Verify(r *http.Request, body []byte, now time.Time) (Event, error)
}

// VerifierFunc adapts a function to a [Verifier].
type VerifierFunc func(r *http.Request, body []byte, now time.Time) (Event, error)

// Verify calls f.
func (f VerifierFunc) Verify(r *http.Request, body []byte, now time.Time) (Event, error) {
	return f(r, body, now)
}

// validator is implemented by the built-in verifiers so that
// NewReceiver reports a misconfigured one at construction rather
// than answering 401 to every request.
type validator interface {
	validate() error
}

// checkEventID reports whether id can be an inbox key.
func checkEventID(id string) error {
	switch {
	case id == "":
		return ErrMissingEventID
	case len(id) > inbox.MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidEventID, len(id), inbox.MaxKeyLen)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: not UTF-8", ErrInvalidEventID)
	}
	for i := 0; i < len(id); i++ {
		if id[i] == 0 {
			return fmt.Errorf("%w: contains a NUL byte", ErrInvalidEventID)
		}
	}
	return nil
}

// jsonEventID decodes an event ID that a body holds as a JSON string,
// and checks that it can be an inbox key. encoding/json decodes invalid
// UTF-8 and lone surrogate escapes ("evt_\ud800") to U+FFFD, which would
// give distinct events one event_id, so that all but the first would be
// dropped as duplicates downstream; such a string is refused instead, by
// the same rule as dedup.KeyFromJSON: the canonicaliser accepts only
// strings that decode losslessly. A missing field or null is
// ErrMissingEventID, any other non-string ErrInvalidEventID.
func jsonEventID(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return "", ErrMissingEventID
	case raw[0] != '"':
		return "", fmt.Errorf("%w: not a JSON string", ErrInvalidEventID)
	}
	if _, err := canonjson.Canonicalize(raw, nil); err != nil {
		return "", fmt.Errorf("%w: not a valid UTF-8 string (invalid bytes or a lone surrogate escape)", ErrInvalidEventID)
	}
	var id string
	if err := json.Unmarshal(raw, &id); err != nil {
		return "", fmt.Errorf("%w: not a JSON string", ErrInvalidEventID)
	}
	return id, checkEventID(id)
}

// checkTenant checks that a tenant can be an inbox scope.
func checkTenant(tenant string) error {
	if err := inbox.CheckText(tenant, inbox.MaxScopeLen); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidTenant, err)
	}
	return nil
}

// jsonTenant reads an optional tenant string from a JSON body by the
// same lossless rule as jsonEventID: "" for a missing field or null.
func jsonTenant(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return "", nil
	case raw[0] != '"':
		return "", fmt.Errorf("%w: not a JSON string", ErrInvalidTenant)
	}
	if _, err := canonjson.Canonicalize(raw, nil); err != nil {
		return "", fmt.Errorf("%w: not a valid UTF-8 string (invalid bytes or a lone surrogate escape)", ErrInvalidTenant)
	}
	var tenant string
	if err := json.Unmarshal(raw, &tenant); err != nil {
		return "", fmt.Errorf("%w: not a JSON string", ErrInvalidTenant)
	}
	return tenant, checkTenant(tenant)
}

// anyMAC reports whether one of sigs is the MAC of the parts under one of
// keys. Every candidate is compared with every key's MAC by hmac.Equal,
// whose time does not depend on the contents, and the loop does not stop
// at a match: timing tells a forger nothing about how close a guess was.
func anyMAC(newHash func() hash.Hash, keys [][]byte, sigs [][]byte, parts ...[]byte) bool {
	ok := false
	for _, key := range keys {
		m := hmac.New(newHash, key)
		for _, p := range parts {
			m.Write(p)
		}
		want := m.Sum(nil)
		for _, sig := range sigs {
			if hmac.Equal(sig, want) {
				ok = true
			}
		}
	}
	return ok
}

// parseUnix parses a signed Unix timestamp in seconds: decimal digits only,
// as every provider writes it, so that the signed text and the parsed value
// cannot disagree (no sign, no spaces, no exponent).
func parseUnix(s string) (time.Time, error) {
	if s == "" || len(s) > 18 {
		return time.Time{}, fmt.Errorf("%w: timestamp is not a Unix time in seconds", ErrMalformedHeader)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return time.Time{}, fmt.Errorf("%w: timestamp is not a Unix time in seconds", ErrMalformedHeader)
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: timestamp is not a Unix time in seconds", ErrMalformedHeader)
	}
	return time.Unix(n, 0), nil
}

// checkTimestamp enforces tolerance around now; -1 disables the check, and
// any other value below 1 means DefaultTolerance (never a wider window).
func checkTimestamp(ts, now time.Time, tolerance time.Duration) error {
	if tolerance == -1 {
		return nil
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	d, fits := distance(ts, now)
	if fits && d <= tolerance {
		return nil
	}
	far := d.Truncate(time.Second).String()
	if !fits {
		far = "more than " + far
	}
	if ts.Before(now) {
		return fmt.Errorf("%w: signed %s ago, tolerance %v", ErrTimestampOutOfRange, far, tolerance)
	}
	return fmt.Errorf("%w: signed %s in the future, tolerance %v", ErrTimestampOutOfRange, far, tolerance)
}

// distance is how far apart a and b are, and whether that fits a
// time.Duration. time.Time.Sub saturates at about 292 years, so a
// difference of that size may be far larger; and negating the saturated
// minimum overflows back to it, so that a check of -now.Sub(ts) against
// the tolerance passes timestamps centuries ahead. Taking the later minus
// the earlier never negates, and adding the result back tells an exact
// difference from a saturated one.
func distance(a, b time.Time) (d time.Duration, fits bool) {
	if a.After(b) {
		a, b = b, a
	}
	d = b.Sub(a)
	return d, a.Add(d).Equal(b)
}

// validateSecrets is shared by the built-in verifiers' validate methods.
func validateSecrets(name string, secrets []string, tolerance time.Duration) error {
	var errs []error
	if len(secrets) == 0 {
		errs = append(errs, fmt.Errorf("%w: %s: at least one secret is required", ErrInvalidConfig, name))
	}
	for i, s := range secrets {
		if s == "" {
			errs = append(errs, fmt.Errorf("%w: %s: secret %d is empty", ErrInvalidConfig, name, i))
		}
	}
	if tolerance < -1 {
		errs = append(errs, fmt.Errorf("%w: %s: Tolerance %v is negative (-1 disables the check)", ErrInvalidConfig, name, tolerance))
	}
	return errors.Join(errs...)
}
