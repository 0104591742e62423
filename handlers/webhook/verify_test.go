package webhook_test

import (
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/handlers/webhook"
)

// Signatures produced by the providers' own code, not by this package's
// tests: a verifier that disagrees with them rejects real traffic.
func TestKnownVectors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		verifier webhook.Verifier
		headers  map[string]string
		body     string
		now      time.Time
		want     webhook.Event
	}{
		{
			// The test vector published with the Standard Webhooks
			// specification (also in Svix's libraries).
			name:     "standard webhooks specification",
			verifier: webhook.StandardWebhooksVerifier("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
			headers: map[string]string{
				"webhook-id":        "msg_p5jXN8AQM9LWM0D4loKWxJek",
				"webhook-timestamp": "1614265330",
				"webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
			},
			body: `{"test": 2432232314}`,
			now:  time.Unix(1614265330, 0),
			want: webhook.Event{ID: "msg_p5jXN8AQM9LWM0D4loKWxJek", Provider: "standardwebhooks", Timestamp: time.Unix(1614265330, 0)},
		},
		{
			// Signed by svix-webhooks v1.44.0 (Go: Webhook.Sign), sent with
			// Svix's own header names.
			name:     "svix library, svix- headers",
			verifier: webhook.StandardWebhooksVerifier("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
			headers: map[string]string{
				"svix-id":        "msg_2Lh9KRb0pzN4LePd3XiA4gF1",
				"svix-timestamp": "1700000000",
				"svix-signature": "v1,X5CCJmDCtfHReelgwJibrwgkxMgTFTMEu8VVQZwGtvk=",
			},
			body: `{"type":"invoice.paid","data":{"id":"in_1"}}`,
			now:  time.Unix(1700000030, 0),
			want: webhook.Event{ID: "msg_2Lh9KRb0pzN4LePd3XiA4gF1", Type: "invoice.paid", Provider: "standardwebhooks",
				Timestamp: time.Unix(1700000000, 0)},
		},
		{
			// Signed by stripe-go v82.5.1's webhook.GenerateTestSignedPayload.
			name:     "stripe-go",
			verifier: webhook.StripeVerifier("whsec_inboxmill_stripe_test_secret"),
			headers: map[string]string{
				"Stripe-Signature": "t=1700000000,v1=df8895853c39a31700569b4792c8178f1bb7a8239f455f9e1d3b910224a966ab",
			},
			body: stripeBody,
			now:  time.Unix(1700000100, 0),
			want: webhook.Event{ID: "evt_1NG8Du2eZvKYlo2CUI79vXWy", Type: "payment_intent.succeeded",
				Tenant: "acct_1032D82eZvKYlo2C", Provider: "stripe", Timestamp: time.Unix(1700000000, 0)},
		},
		{
			// The example in GitHub's "Validating webhook deliveries".
			name:     "github documentation",
			verifier: webhook.GitHubVerifier("It's a Secret to Everybody"),
			headers: map[string]string{
				"X-Hub-Signature-256": "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
				"X-GitHub-Delivery":   "72d3162e-cc78-11e3-81ab-4c9367dc0958",
				"X-GitHub-Event":      "ping",
			},
			body: "Hello, World!",
			now:  time.Unix(1700000000, 0),
			want: webhook.Event{ID: "72d3162e-cc78-11e3-81ab-4c9367dc0958", Type: "ping", Provider: "github"},
		},
		{
			// Signed by @octokit/webhooks-methods (GitHub's JavaScript SDK).
			name:     "octokit",
			verifier: webhook.GitHubVerifier("inboxmill-github-secret"),
			headers: map[string]string{
				"X-Hub-Signature-256": "sha256=50220ca02f8dfbdf6d820e292ddbb0c387ea58bfe3f0a9e92a8b0d428382135d",
				"X-GitHub-Delivery":   "d-42",
				"X-GitHub-Event":      "pull_request",
			},
			body: githubBody,
			now:  time.Unix(1700000000, 0),
			want: webhook.Event{ID: "d-42", Type: "pull_request", Tenant: "4242", Provider: "github"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ev, err := tc.verifier.Verify(post(tc.body, tc.headers), []byte(tc.body), tc.now)
			require.NoError(t, err)
			require.Equal(t, tc.want, ev)

			// And the test helpers sign the same way.
			if sig := tc.headers["Stripe-Signature"]; sig != "" {
				require.Equal(t, sig, stripeSign("whsec_inboxmill_stripe_test_secret", time.Unix(1700000000, 0), tc.body))
			}
			if sig := tc.headers["webhook-signature"]; sig != "" {
				require.Equal(t, sig, standardSign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", tc.headers["webhook-id"], tc.now, tc.body))
			}
		})
	}
}

func TestStripeSignatureHeader(t *testing.T) {
	t.Parallel()
	const secret = "whsec_s"
	good := stripeSign(secret, testNow, stripeBody)
	v1 := good[strings.Index(good, "v1=")+3:]
	other := strings.Repeat("0", 64)
	cases := []struct {
		name   string
		header string
		err    error // nil: accepted
	}{
		{name: "several v1, the valid one last", header: "t=1700000000,v1=" + other + ",v1=" + v1},
		{name: "v0 and unknown schemes ignored", header: "t=1700000000,v0=" + other + ",v1=" + v1 + ",x=y"},
		{name: "spaces around entries", header: "t=1700000000, v1=" + v1},
		{name: "upper-case hex", header: "t=1700000000,v1=" + strings.ToUpper(v1)},
		{name: "only v0", header: "t=1700000000,v0=" + v1, err: webhook.ErrMissingSignature},
		{name: "no timestamp", header: "v1=" + v1, err: webhook.ErrMalformedHeader},
		{name: "two timestamps", header: "t=1700000000,t=1700000000,v1=" + v1, err: webhook.ErrMalformedHeader},
		{name: "negative timestamp", header: "t=-1700000000,v1=" + v1, err: webhook.ErrMalformedHeader},
		{name: "signed timestamp", header: "t=+1700000000,v1=" + v1, err: webhook.ErrMalformedHeader},
		{name: "timestamp with a fraction", header: "t=1700000000.0,v1=" + v1, err: webhook.ErrMalformedHeader},
		{name: "huge timestamp", header: "t=99999999999999999999,v1=" + v1, err: webhook.ErrMalformedHeader},
		{name: "entry without =", header: "t=1700000000,v1", err: webhook.ErrMalformedHeader},
		{name: "v1 not hex", header: "t=1700000000,v1=" + strings.Repeat("z", 64), err: webhook.ErrMalformedHeader},
		{name: "v1 truncated", header: "t=1700000000,v1=" + v1[:62], err: webhook.ErrMalformedHeader},
		{name: "v1 empty", header: "t=1700000000,v1=", err: webhook.ErrMalformedHeader},
		{name: "leading zero changes the signed text", header: "t=01700000000,v1=" + v1, err: webhook.ErrSignatureMismatch},
		{name: "v1 of another timestamp", header: "t=1700000001,v1=" + v1, err: webhook.ErrSignatureMismatch},
		{name: "empty", header: "", err: webhook.ErrMissingSignature},
		{name: "comma only", header: ",", err: webhook.ErrMalformedHeader},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := webhook.StripeVerifier(secret).Verify(post(stripeBody, map[string]string{"Stripe-Signature": tc.header}),
				[]byte(stripeBody), testNow)
			if tc.err == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tc.err)
			}
		})
	}
}

func TestStandardWebhooksHeaders(t *testing.T) {
	t.Parallel()
	const id = "msg_1"
	ts := "1700000000"
	good := standardSign(svixSecret, id, testNow, svixBody)
	next := standardSign(svixNextSecret, id, testNow, svixBody)
	cases := []struct {
		name    string
		headers map[string]string
		err     error
	}{
		{name: "rotation: old and new signatures", headers: map[string]string{"webhook-id": id, "webhook-timestamp": ts,
			"webhook-signature": "v1,Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyYmE= " + next}},
		{name: "asymmetric entries ignored", headers: map[string]string{"webhook-id": id, "webhook-timestamp": ts,
			"webhook-signature": "v1a,aGVsbG8= " + good}},
		{name: "only asymmetric entries", headers: map[string]string{"webhook-id": id, "webhook-timestamp": ts,
			"webhook-signature": "v1a,aGVsbG8="}, err: webhook.ErrMissingSignature},
		{name: "no id", headers: map[string]string{"webhook-timestamp": ts, "webhook-signature": good}, err: webhook.ErrMissingSignature},
		{name: "no timestamp", headers: map[string]string{"webhook-id": id, "webhook-signature": good}, err: webhook.ErrMissingSignature},
		{name: "timestamp not a number", headers: map[string]string{"webhook-id": id, "webhook-timestamp": "2023-11-14T22:13:20Z",
			"webhook-signature": good}, err: webhook.ErrMalformedHeader},
		{name: "other id", headers: map[string]string{"webhook-id": "msg_2", "webhook-timestamp": ts, "webhook-signature": good},
			err: webhook.ErrSignatureMismatch},
		{name: "signature without version", headers: map[string]string{"webhook-id": id, "webhook-timestamp": ts,
			"webhook-signature": strings.TrimPrefix(good, "v1,")}, err: webhook.ErrMissingSignature},
		{name: "truncated signature", headers: map[string]string{"webhook-id": id, "webhook-timestamp": ts,
			"webhook-signature": good[:len(good)-4]}, err: webhook.ErrMalformedHeader},
		{name: "svix headers", headers: map[string]string{"svix-id": id, "svix-timestamp": ts, "svix-signature": good}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := webhook.StandardWebhooksVerifier(svixSecret, svixNextSecret)
			_, err := v.Verify(post(svixBody, tc.headers), []byte(svixBody), testNow)
			if tc.err == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tc.err)
			}
		})
	}
}

func TestGitHubRejectsSHA1(t *testing.T) {
	t.Parallel()
	// Only the legacy SHA-1 header: a valid signature in a scheme that is
	// not accepted is a missing signature.
	m := hmacSHA1([]byte("s"), githubBody)
	headers := map[string]string{"X-Hub-Signature": "sha1=" + hex.EncodeToString(m), "X-GitHub-Delivery": "d-1"}
	_, err := webhook.GitHubVerifier("s").Verify(post(githubBody, headers), []byte(githubBody), testNow)
	require.ErrorIs(t, err, webhook.ErrMissingSignature)
}

func hmacSHA1(key []byte, body string) []byte {
	m := hmac.New(sha1.New, key)
	m.Write([]byte(body))
	return m.Sum(nil)
}

func TestToleranceSettings(t *testing.T) {
	t.Parallel()
	old := testNow.Add(-time.Hour)
	headers := map[string]string{"Stripe-Signature": stripeSign("whsec_s", old, stripeBody)}

	v := webhook.StripeVerifier("whsec_s")
	_, err := v.Verify(post(stripeBody, headers), []byte(stripeBody), testNow)
	require.ErrorIs(t, err, webhook.ErrTimestampOutOfRange, "default: 5 minutes")

	v.Tolerance = 2 * time.Hour
	_, err = v.Verify(post(stripeBody, headers), []byte(stripeBody), testNow)
	require.NoError(t, err)

	v.Tolerance = -1
	_, err = v.Verify(post(stripeBody, headers), []byte(stripeBody), testNow.Add(24*365*time.Hour))
	require.NoError(t, err, "-1 disables the check")

	sw := &webhook.StandardWebhooks{Secrets: []string{svixSecret}, Tolerance: 30 * time.Second}
	swHeaders := func(ts time.Time) map[string]string {
		return map[string]string{"webhook-id": "m", "webhook-timestamp": fmt.Sprint(ts.Unix()), "webhook-signature": standardSign(svixSecret, "m", ts, svixBody)}
	}
	_, err = sw.Verify(post(svixBody, swHeaders(testNow.Add(-31*time.Second))), []byte(svixBody), testNow)
	require.ErrorIs(t, err, webhook.ErrTimestampOutOfRange)
	_, err = sw.Verify(post(svixBody, swHeaders(testNow.Add(31*time.Second))), []byte(svixBody), testNow)
	require.ErrorIs(t, err, webhook.ErrTimestampOutOfRange)
	_, err = sw.Verify(post(svixBody, swHeaders(testNow.Add(29*time.Second))), []byte(svixBody), testNow)
	require.NoError(t, err)
}

// TestTimestampsFarFromNow: a timestamp centuries away is as far outside
// the tolerance as one six minutes away, whichever way, however far the
// seconds are from what a time.Duration holds. Every request is signed
// correctly (with the check off each is accepted), so only the timestamp
// check can refuse it.
func TestTimestampsFarFromNow(t *testing.T) {
	t.Parallel()
	const maxDuration = time.Duration(1<<63 - 1)
	cases := []struct {
		name      string
		t         string    // the signed timestamp, as written in the header
		now       time.Time // the receiver's clock
		tolerance time.Duration
	}{
		{name: "year 2603", t: "20000000000", now: testNow},
		{name: "first second whose nanoseconds overflow int64", t: "9223372037", now: testNow},
		{name: "last second whose nanoseconds fit int64", t: "9223372036", now: testNow},
		{name: "largest timestamp parsed", t: "999999999999999999", now: testNow},
		{name: "293 years ahead", t: fmt.Sprint(testNow.AddDate(293, 0, 0).Unix()), now: testNow},
		{name: "1970", t: "0", now: testNow},
		{name: "clock at the zero time", t: fmt.Sprint(testNow.Unix()), now: time.Time{}},
		{name: "clock 30000 years ahead", t: fmt.Sprint(testNow.Unix()), now: testNow.AddDate(30000, 0, 0)},
		{name: "a century of tolerance", t: "20000000000", now: testNow, tolerance: 100 * 365 * 24 * time.Hour},
		{name: "the widest tolerance", t: "999999999999999999", now: testNow, tolerance: maxDuration},
	}
	for _, tc := range cases {
		requests := []struct {
			scheme   string
			verifier func(tolerance time.Duration) webhook.Verifier
			body     string
			headers  map[string]string
		}{
			{
				scheme: "stripe",
				verifier: func(tolerance time.Duration) webhook.Verifier {
					return &webhook.Stripe{Secrets: []string{"whsec_s"}, Tolerance: tolerance}
				},
				body:    stripeBody,
				headers: map[string]string{"Stripe-Signature": stripeSignAt("whsec_s", tc.t, stripeBody)},
			},
			{
				scheme: "standardwebhooks",
				verifier: func(tolerance time.Duration) webhook.Verifier {
					return &webhook.StandardWebhooks{Secrets: []string{svixSecret}, Tolerance: tolerance}
				},
				body: svixBody,
				headers: map[string]string{"webhook-id": "msg_1", "webhook-timestamp": tc.t,
					"webhook-signature": standardSignAt(svixSecret, "msg_1", tc.t, svixBody)},
			},
		}
		for _, r := range requests {
			t.Run(r.scheme+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				_, err := r.verifier(-1).Verify(post(r.body, r.headers), []byte(r.body), tc.now)
				require.NoError(t, err, "the signature is valid")

				v := r.verifier(tc.tolerance)
				_, err = v.Verify(post(r.body, r.headers), []byte(r.body), tc.now)
				require.ErrorIs(t, err, webhook.ErrTimestampOutOfRange)

				pub := &recordingPublisher{}
				h := newReceiver(t, pub, webhook.ReceiverConfig{Verifier: v, Now: func() time.Time { return tc.now }})
				require.Equal(t, http.StatusUnauthorized, serve(h, post(r.body, r.headers)))
				require.Empty(t, pub.published())
			})
		}
	}
}

// TestVerifierErrorsAreClassified: a wrong signature is reported as a
// mismatch whether or not its timestamp is also stale, so a caller never
// mistakes a forgery for a clock problem.
func TestVerifierErrorsAreClassified(t *testing.T) {
	t.Parallel()
	stale := testNow.Add(-time.Hour)
	headers := map[string]string{"Stripe-Signature": stripeSign("whsec_other", stale, stripeBody)}
	_, err := webhook.StripeVerifier("whsec_s").Verify(post(stripeBody, headers), []byte(stripeBody), testNow)
	require.ErrorIs(t, err, webhook.ErrSignatureMismatch)
	require.NotErrorIs(t, err, webhook.ErrTimestampOutOfRange)
}

func TestHMACVerifierUsedAlone(t *testing.T) {
	t.Parallel()
	v := webhook.HMACVerifier(webhook.HMACConfig{Secrets: []string{"s"}})
	_, err := v.Verify(post("{}", nil), []byte("{}"), testNow)
	require.ErrorIs(t, err, webhook.ErrInvalidConfig, "a misconfigured verifier rejects everything")

	v = webhook.HMACVerifier(webhook.HMACConfig{Secrets: []string{"s"}, SignatureHeader: "X-Sig", IDHeader: "X-Id",
		Hash: sha1.New})
	body := "payload"
	ev, err := v.Verify(post(body, map[string]string{"X-Sig": hex.EncodeToString(hmacSHA1([]byte("s"), body)), "X-Id": "e-1"}),
		[]byte(body), testNow)
	require.NoError(t, err)
	require.Equal(t, webhook.Event{ID: "e-1", Provider: "hmac"}, ev)

	// A SHA-256-sized signature is malformed for a SHA-1 verifier.
	_, err = v.Verify(post(body, map[string]string{"X-Sig": hex.EncodeToString(hmacSHA256([]byte("s"), body)), "X-Id": "e-1"}),
		[]byte(body), testNow)
	require.ErrorIs(t, err, webhook.ErrMalformedHeader)

	// A missing prefix is malformed.
	v = webhook.HMACVerifier(webhook.HMACConfig{Secrets: []string{"s"}, SignatureHeader: "X-Sig", IDHeader: "X-Id",
		Prefix: "sha256=", Encoding: webhook.Base64})
	sig := base64.StdEncoding.EncodeToString(hmacSHA256([]byte("s"), body))
	_, err = v.Verify(post(body, map[string]string{"X-Sig": sig, "X-Id": "e-1"}), []byte(body), testNow)
	require.ErrorIs(t, err, webhook.ErrMalformedHeader)
	_, err = v.Verify(post(body, map[string]string{"X-Sig": "sha256=" + sig, "X-Id": "e-1"}), []byte(body), testNow)
	require.NoError(t, err)
}

func TestVerifierFunc(t *testing.T) {
	t.Parallel()
	// A custom verifier wrapping a built-in one: the tenant from the route.
	stripe := webhook.StripeVerifier("whsec_s")
	v := webhook.VerifierFunc(func(r *http.Request, body []byte, now time.Time) (webhook.Event, error) {
		ev, err := stripe.Verify(r, body, now)
		ev.Tenant = r.PathValue("tenant")
		return ev, err
	})
	pub := &recordingPublisher{}
	h := newReceiver(t, pub, webhook.ReceiverConfig{Verifier: v})
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/{tenant}", h)
	req := post(stripeBody, map[string]string{"Stripe-Signature": stripeSign("whsec_s", testNow, stripeBody)})
	req.URL.Path = "/webhooks/acme"
	require.Equal(t, http.StatusOK, serve(mux, req))
	require.Equal(t, "acme", pub.published()[0].Metadata.Get(webhook.MetadataTenantID))
}
