package webhook

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Headers of the Standard Webhooks specification. Svix, which the
// specification comes from, also sends them prefixed "svix-" instead of
// "webhook-"; the verifier reads either set.
const (
	StandardWebhookIDHeader        = "webhook-id"
	StandardWebhookTimestampHeader = "webhook-timestamp"
	StandardWebhookSignatureHeader = "webhook-signature"
)

// StandardWebhooks verifies the Standard Webhooks scheme
// (https://www.standardwebhooks.com), used by Svix and the services that
// send through it: a webhook-signature header holding a space-separated
// list of "v1,<base64>" entries, each HMAC-SHA256 over
// "<webhook-id>.<webhook-timestamp>.<body>" keyed by the base64-decoded
// secret. The event ID is webhook-id (the same on every retry of a
// message), the type the JSON body's "type" when there is one. Entries of
// other versions ("v1a", asymmetric) are ignored.
type StandardWebhooks struct {
	// Secrets are the endpoint's secrets, base64 with an optional "whsec_"
	// prefix, as the sender shows them. During a rotation the sender signs
	// with the old and the new one; list both. At least one is required.
	Secrets []string

	// Tolerance is how far webhook-timestamp may be from now, either way.
	// Defaults to DefaultTolerance (5 minutes, as the specification's
	// libraries); -1 disables the check.
	Tolerance time.Duration
}

// StandardWebhooksVerifier returns a Standard Webhooks (Svix) verifier for
// the endpoint's "whsec_..." secrets (more than one during a rotation).
func StandardWebhooksVerifier(secrets ...string) *StandardWebhooks {
	return &StandardWebhooks{Secrets: secrets}
}

func (v *StandardWebhooks) validate() error {
	if v == nil {
		return fmt.Errorf("%w: nil *StandardWebhooks verifier", ErrInvalidConfig)
	}
	err := validateSecrets("StandardWebhooksVerifier", v.Secrets, v.Tolerance)
	if _, kerr := v.keys(); kerr != nil {
		err = errors.Join(err, fmt.Errorf("%w: StandardWebhooksVerifier: %w", ErrInvalidConfig, kerr))
	}
	return err
}

// keys decodes the secrets; decoding 32 bytes costs less than the HMAC,
// and keeps the exported Secrets the only state.
func (v *StandardWebhooks) keys() ([][]byte, error) {
	keys := make([][]byte, 0, len(v.Secrets))
	for i, s := range v.Secrets {
		k, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whsec_"))
		if err != nil || len(k) == 0 {
			return nil, fmt.Errorf("secret %d is not base64 after its whsec_ prefix", i)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// Verify checks webhook-signature against the message ID, timestamp and
// body.
func (v *StandardWebhooks) Verify(r *http.Request, body []byte, now time.Time) (Event, error) {
	prefix := "webhook-"
	if r.Header.Get(StandardWebhookSignatureHeader) == "" && r.Header.Get("svix-signature") != "" {
		prefix = "svix-"
	}
	id, t, header := r.Header.Get(prefix+"id"), r.Header.Get(prefix+"timestamp"), r.Header.Get(prefix+"signature")
	switch {
	case header == "":
		return Event{}, fmt.Errorf("%w: no %s header", ErrMissingSignature, StandardWebhookSignatureHeader)
	case id == "":
		return Event{}, fmt.Errorf("%w: no %sid header", ErrMissingSignature, prefix)
	case t == "":
		return Event{}, fmt.Errorf("%w: no %stimestamp header", ErrMissingSignature, prefix)
	}
	ts, err := parseUnix(t)
	if err != nil {
		return Event{}, err
	}
	sigs, err := parseStandardSignatures(header)
	if err != nil {
		return Event{}, err
	}
	keys, err := v.keys()
	if err != nil {
		return Event{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if !anyMAC(sha256.New, keys, sigs, []byte(id), []byte("."), []byte(t), []byte("."), body) {
		return Event{}, fmt.Errorf("%w: no v1 signature matches", ErrSignatureMismatch)
	}
	if err := checkTimestamp(ts, now, v.Tolerance); err != nil {
		return Event{}, err
	}
	if err := checkEventID(id); err != nil {
		return Event{}, fmt.Errorf("%w (%sid header)", err, prefix)
	}
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(body, &p) // the type is informative; a body without one is still an event
	return Event{ID: id, Type: p.Type, Provider: "standardwebhooks", Timestamp: ts}, nil
}

// parseStandardSignatures decodes the v1 entries of a space-separated
// "v1,<base64> v1a,<base64> ..." list. Entries of other versions are
// skipped (a sender may add schemes a receiver does not know); a list with
// no v1 entry at all is missing the signature, and one whose v1 entries
// are all undecodable is malformed.
func parseStandardSignatures(header string) ([][]byte, error) {
	var sigs [][]byte
	seenV1 := false
	for _, entry := range strings.Fields(header) {
		version, sig, ok := strings.Cut(entry, ",")
		if !ok || version != "v1" {
			continue
		}
		seenV1 = true
		if b, err := decodeBase64(sig); err == nil && len(b) == sha256.Size {
			sigs = append(sigs, b)
		}
	}
	if !seenV1 {
		return nil, fmt.Errorf("%w: %s has no v1 signature", ErrMissingSignature, StandardWebhookSignatureHeader)
	}
	if len(sigs) == 0 {
		return nil, fmt.Errorf("%w: no v1 signature in %s is 32 bytes of base64", ErrMalformedHeader, StandardWebhookSignatureHeader)
	}
	return sigs, nil
}
