package webhook_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/inboxmill/inboxmill/handlers/webhook"
)

// Secrets of the fuzz target's verifiers; the seed corpus in
// testdata/fuzz/FuzzSignatureHeaders holds requests signed with them at
// fuzzNow.
const (
	fuzzStripeSecret = "whsec_fuzz_stripe"
	fuzzGitHubSecret = "fuzz-github"
	fuzzSWSecret     = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	fuzzHMACSecret   = "fuzz-hmac"
)

var fuzzNow = time.Unix(1700000000, 0)

// sentinels is every error a verifier may wrap when it rejects a request.
var sentinels = []error{
	webhook.ErrMissingSignature, webhook.ErrMalformedHeader, webhook.ErrSignatureMismatch,
	webhook.ErrTimestampOutOfRange, webhook.ErrMissingEventID, webhook.ErrInvalidEventID,
}

// FuzzSignatureHeaders feeds arbitrary signature, timestamp and ID headers
// and bodies to every built-in verifier (the same sig string as
// Stripe-Signature, X-Hub-Signature-256, webhook-signature and a generic
// HMAC header). Invariants:
//
//   - no verifier panics;
//   - a rejection wraps one of the package's sentinel errors, so the
//     receiver's status and a caller's errors.Is are always defined;
//   - nothing is accepted without a valid MAC: when a verifier accepts,
//     the header holds the MAC of exactly this body (and this timestamp and
//     ID, where the scheme signs them), computed here independently, under
//     the configured secret;
//   - an accepted timestamp lies within the default tolerance of now, and
//     an accepted event ID is a usable inbox key.
func FuzzSignatureHeaders(f *testing.F) {
	stripe := webhook.StripeVerifier(fuzzStripeSecret)
	github := webhook.GitHubVerifier(fuzzGitHubSecret)
	sw := webhook.StandardWebhooksVerifier(fuzzSWSecret)
	generic := webhook.HMACVerifier(webhook.HMACConfig{Secrets: []string{fuzzHMACSecret}, SignatureHeader: "X-Signature",
		Prefix: "sha256=", Encoding: webhook.Base64, IDHeader: "X-Event-Id"})
	swKey, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(fuzzSWSecret, "whsec_"))

	f.Fuzz(func(t *testing.T, sig, ts, id string, body []byte) {
		req, err := http.NewRequest(http.MethodPost, "http://receiver.test/webhooks", nil)
		if err != nil {
			t.Skip()
		}
		// Set bypasses header validation, so even bytes a real request
		// could not carry reach the parsers.
		for _, h := range []string{"Stripe-Signature", "X-Hub-Signature-256", "webhook-signature", "X-Signature"} {
			req.Header[http.CanonicalHeaderKey(h)] = []string{sig}
		}
		req.Header[http.CanonicalHeaderKey("webhook-timestamp")] = []string{ts}
		for _, h := range []string{"webhook-id", "X-GitHub-Delivery", "X-Event-Id"} {
			req.Header[http.CanonicalHeaderKey(h)] = []string{id}
		}
		lowerSig := strings.ToLower(sig)

		check := func(name string, v webhook.Verifier, validMAC func(ev webhook.Event) bool) {
			ev, err := v.Verify(req, body, fuzzNow)
			if err != nil {
				for _, s := range sentinels {
					if errors.Is(err, s) {
						return
					}
				}
				t.Fatalf("%s: rejection without a sentinel error: %v", name, err)
			}
			if !validMAC(ev) {
				t.Fatalf("%s accepted a request without a valid MAC: sig=%q ts=%q id=%q body=%q", name, sig, ts, id, body)
			}
			if !ev.Timestamp.IsZero() {
				if d := fuzzNow.Sub(ev.Timestamp).Abs(); d > webhook.DefaultTolerance {
					t.Fatalf("%s accepted a timestamp %v away", name, d)
				}
			}
			if ev.ID == "" || len(ev.ID) > 255 || strings.ContainsRune(ev.ID, 0) {
				t.Fatalf("%s accepted an unusable event ID %q", name, ev.ID)
			}
		}

		check("stripe", stripe, func(ev webhook.Event) bool {
			// Some t= entry of the header, with the body, has its MAC in
			// the header.
			for item := range strings.SplitSeq(sig, ",") {
				if t, ok := strings.CutPrefix(strings.TrimSpace(item), "t="); ok {
					if strings.Contains(lowerSig, hex.EncodeToString(mac([]byte(fuzzStripeSecret), t, ".", string(body)))) {
						return ev.Timestamp.Unix() == parseDigits(t)
					}
				}
			}
			return false
		})
		check("github", github, func(webhook.Event) bool {
			return lowerSig == "sha256="+hex.EncodeToString(mac([]byte(fuzzGitHubSecret), string(body)))
		})
		check("standardwebhooks", sw, func(ev webhook.Event) bool {
			return ev.ID == id && strings.Contains(sig, base64.StdEncoding.EncodeToString(mac(swKey, id, ".", ts, ".", string(body))))
		})
		check("hmac", generic, func(ev webhook.Event) bool {
			return ev.ID == id && sig == "sha256="+base64.StdEncoding.EncodeToString(mac([]byte(fuzzHMACSecret), string(body)))
		})
	})
}

func mac(key []byte, parts ...string) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write([]byte(p))
	}
	return m.Sum(nil)
}

// parseDigits is the value of a decimal string, or -1.
func parseDigits(s string) int64 {
	var n int64
	if s == "" || len(s) > 18 {
		return -1
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int64(c-'0')
	}
	return n
}
