package webhook

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"strings"
	"time"
)

// SignatureEncoding is how a generic HMAC signature is written in its
// header.
type SignatureEncoding int

const (
	// Hex: lower- or upper-case hexadecimal (GitHub, most providers).
	Hex SignatureEncoding = iota
	// Base64: standard base64 with padding (Shopify, Slack-style schemes).
	Base64
)

// HMACConfig configures [HMACVerifier], for providers that put an HMAC of
// the body in one header and the event ID in another. SignatureHeader,
// IDHeader and Secrets are required.
//
// Such a scheme signs the body only: the ID header is not covered, and
// nothing bounds a replay. Prefer a built-in verifier where the provider
// has one, and read the ID from the signed body (a custom [Verifier]) when
// the provider puts it there.
type HMACConfig struct {
	// Secrets are the shared secrets, used as the bytes of the string. A
	// signature under any of them is accepted (rotation). At least one.
	Secrets []string

	// SignatureHeader names the header holding the signature, e.g.
	// "X-Signature". Required.
	SignatureHeader string

	// Prefix is text before the encoded signature that must be present and
	// is stripped, e.g. "sha256=". Defaults to none.
	Prefix string

	// Encoding of the signature: Hex (default) or Base64.
	Encoding SignatureEncoding

	// Hash is the HMAC's hash function. Defaults to sha256.New.
	Hash func() hash.Hash

	// IDHeader names the header holding the event or delivery ID, the same
	// on every retry, e.g. "X-Event-Id". Required.
	IDHeader string

	// TypeHeader names a header holding the event type. Optional.
	TypeHeader string

	// Provider is reported as Event.Provider (metadata webhook_provider).
	// Defaults to "hmac".
	Provider string
}

func (c HMACConfig) withDefaults() HMACConfig {
	if c.Hash == nil {
		c.Hash = sha256.New
	}
	if c.Provider == "" {
		c.Provider = "hmac"
	}
	return c
}

func (c HMACConfig) validate() error {
	errs := []error{validateSecrets("HMACVerifier", c.Secrets, 0)}
	if c.SignatureHeader == "" {
		errs = append(errs, fmt.Errorf("%w: HMACVerifier: SignatureHeader is required", ErrInvalidConfig))
	}
	if c.IDHeader == "" {
		errs = append(errs, fmt.Errorf("%w: HMACVerifier: IDHeader is required", ErrInvalidConfig))
	}
	if c.Encoding != Hex && c.Encoding != Base64 {
		errs = append(errs, fmt.Errorf("%w: HMACVerifier: unknown Encoding %d", ErrInvalidConfig, c.Encoding))
	}
	return errors.Join(errs...)
}

// hmacVerifier is HMACVerifier's result: the config with its defaults and
// the outcome of validating it.
type hmacVerifier struct {
	cfg HMACConfig
	err error
}

// HMACVerifier returns a verifier for a generic "HMAC of the body in a
// header" scheme. A configuration error is reported by NewReceiver,
// and by every Verify call of a verifier used on its own.
func HMACVerifier(cfg HMACConfig) Verifier {
	cfg = cfg.withDefaults()
	return &hmacVerifier{cfg: cfg, err: cfg.validate()}
}

func (v *hmacVerifier) validate() error { return v.err }

func (v *hmacVerifier) Verify(r *http.Request, body []byte, _ time.Time) (Event, error) {
	if v.err != nil {
		return Event{}, v.err
	}
	c := v.cfg
	header := r.Header.Get(c.SignatureHeader)
	if header == "" {
		return Event{}, fmt.Errorf("%w: no %s header", ErrMissingSignature, c.SignatureHeader)
	}
	sig, err := decodeSignature(header, c.Prefix, c.Encoding, c.Hash().Size())
	if err != nil {
		return Event{}, fmt.Errorf("%w: %s is not in the configured format", err, c.SignatureHeader)
	}
	if !anyMAC(c.Hash, stringKeys(c.Secrets), [][]byte{sig}, body) {
		return Event{}, fmt.Errorf("%w: %s does not match", ErrSignatureMismatch, c.SignatureHeader)
	}
	id := r.Header.Get(c.IDHeader)
	if err := checkEventID(id); err != nil {
		return Event{}, fmt.Errorf("%w (%s header)", err, c.IDHeader)
	}
	ev := Event{ID: id, Provider: c.Provider}
	if c.TypeHeader != "" {
		ev.Type = r.Header.Get(c.TypeHeader)
	}
	return ev, nil
}

// decodeSignature strips prefix and decodes exactly size bytes.
func decodeSignature(s, prefix string, enc SignatureEncoding, size int) ([]byte, error) {
	if enc == Hex {
		return parsePrefixedHex(s, prefix, size)
	}
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok {
		return nil, ErrMalformedHeader
	}
	sig, err := decodeBase64(rest)
	if err != nil || len(sig) != size {
		return nil, ErrMalformedHeader
	}
	return sig, nil
}

// decodeBase64 accepts only the canonical standard encoding: one text per
// MAC. Go's decoder would otherwise skip line breaks and ignore non-zero
// padding bits.
func decodeBase64(s string) ([]byte, error) {
	if strings.ContainsAny(s, "\r\n") {
		return nil, ErrMalformedHeader
	}
	return base64.StdEncoding.Strict().DecodeString(s)
}
