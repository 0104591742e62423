package webhook

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// StripeSignatureHeader is the header Stripe signs its webhooks in.
const StripeSignatureHeader = "Stripe-Signature"

// Stripe verifies Stripe's webhook signatures: a Stripe-Signature header
// "t=<unix>,v1=<hex>[,v1=<hex>...]" whose v1 entries are HMAC-SHA256 over
// "<t>.<body>" keyed by an endpoint's signing secret. The event ID is the
// body's "id" (the same on every retry), the type its "type", and the
// tenant its "account" (set on events from Stripe Connect accounts).
//
// Build it with [StripeVerifier]; set Tolerance on the result to change the
// window.
type Stripe struct {
	// Secrets are the endpoint's signing secrets ("whsec_..."), used as
	// they are written, prefix included. During a rotation Stripe signs with
	// the old and the new secret (two v1 entries); list both until the old
	// one expires. At least one is required.
	Secrets []string

	// Tolerance is how far the signed timestamp may be from now, either
	// way. Defaults to DefaultTolerance (5 minutes, as Stripe's libraries);
	// -1 disables the check, which lets anyone who captured one request
	// replay it for ever.
	Tolerance time.Duration
}

// StripeVerifier returns a Stripe verifier for the endpoint's signing
// secrets. More than one secret is for rotation: a signature under any of
// them is accepted.
func StripeVerifier(secrets ...string) *Stripe {
	return &Stripe{Secrets: secrets}
}

func (v *Stripe) validate() error {
	if v == nil {
		return fmt.Errorf("%w: nil *Stripe verifier", ErrInvalidConfig)
	}
	return validateSecrets("StripeVerifier", v.Secrets, v.Tolerance)
}

// Verify checks the Stripe-Signature header against the body and reads the
// event's ID, type and account from it.
func (v *Stripe) Verify(r *http.Request, body []byte, now time.Time) (Event, error) {
	header := r.Header.Get(StripeSignatureHeader)
	if header == "" {
		return Event{}, fmt.Errorf("%w: no %s header", ErrMissingSignature, StripeSignatureHeader)
	}
	t, ts, sigs, err := parseStripeSignature(header)
	if err != nil {
		return Event{}, err
	}
	if !anyMAC(sha256.New, stringKeys(v.Secrets), sigs, []byte(t), []byte("."), body) {
		return Event{}, fmt.Errorf("%w: no v1 signature matches", ErrSignatureMismatch)
	}
	if err := checkTimestamp(ts, now, v.Tolerance); err != nil {
		return Event{}, err
	}
	var ev struct {
		ID      json.RawMessage `json:"id"`
		Type    string          `json:"type"`
		Account json.RawMessage `json:"account"`
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		return Event{}, fmt.Errorf("%w: the body is not a Stripe event object", ErrMissingEventID)
	}
	id, err := jsonEventID(ev.ID)
	if err != nil {
		return Event{}, fmt.Errorf("%w (body field id)", err)
	}
	tenant, err := jsonTenant(ev.Account)
	if err != nil {
		return Event{}, fmt.Errorf("%w (body field account)", err)
	}
	return Event{ID: id, Type: ev.Type, Tenant: tenant, Provider: "stripe", Timestamp: ts}, nil
}

// parseStripeSignature splits "t=...,v1=...,v1=...,v0=..." into the
// timestamp, as signed and as a time, and the decoded v1 signatures. Entries of
// other schemes (v0, test-mode extras) are ignored, as Stripe asks; a v1
// entry that is not 32 bytes of hex cannot match and is skipped.
func parseStripeSignature(header string) (t string, ts time.Time, sigs [][]byte, err error) {
	seenT, seenV1 := false, false
	for item := range strings.SplitSeq(header, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			return "", ts, nil, fmt.Errorf("%w: %s entry without '='", ErrMalformedHeader, StripeSignatureHeader)
		}
		switch k {
		case "t":
			if seenT {
				return "", ts, nil, fmt.Errorf("%w: %s has two timestamps", ErrMalformedHeader, StripeSignatureHeader)
			}
			if ts, err = parseUnix(val); err != nil {
				return "", ts, nil, err
			}
			seenT, t = true, val
		case "v1":
			seenV1 = true
			if sig, err := hex.DecodeString(val); err == nil && len(sig) == sha256.Size {
				sigs = append(sigs, sig)
			}
		}
	}
	if !seenT {
		return "", ts, nil, fmt.Errorf("%w: %s has no timestamp", ErrMalformedHeader, StripeSignatureHeader)
	}
	if !seenV1 {
		return "", ts, nil, fmt.Errorf("%w: %s has no v1 signature", ErrMissingSignature, StripeSignatureHeader)
	}
	if len(sigs) == 0 {
		return "", ts, nil, fmt.Errorf("%w: no v1 signature in %s is 64 hex digits", ErrMalformedHeader, StripeSignatureHeader)
	}
	return t, ts, sigs, nil
}

func stringKeys(secrets []string) [][]byte {
	keys := make([][]byte, len(secrets))
	for i, s := range secrets {
		keys[i] = []byte(s)
	}
	return keys
}
