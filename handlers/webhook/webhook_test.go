package webhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/handlers/webhook"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

// testNow is the receiver's clock in these tests.
var testNow = time.Unix(1700000000, 0)

// The signing helpers below sign as the providers' documentation says, in
// the fewest lines, independently of the verifiers under test.

func hmacSHA256(key []byte, parts ...string) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write([]byte(p))
	}
	return m.Sum(nil)
}

// stripeSign is a Stripe-Signature header: HMAC-SHA256 of "<t>.<body>",
// the secret's text as the key.
func stripeSign(secret string, ts time.Time, body string) string {
	return stripeSignAt(secret, fmt.Sprint(ts.Unix()), body)
}

// stripeSignAt is stripeSign with the timestamp as it is written in the
// header, so that any text can be signed.
func stripeSignAt(secret, t, body string) string {
	return "t=" + t + ",v1=" + hex.EncodeToString(hmacSHA256([]byte(secret), t, ".", body))
}

// githubSign is an X-Hub-Signature-256 header.
func githubSign(secret, body string) string {
	return "sha256=" + hex.EncodeToString(hmacSHA256([]byte(secret), body))
}

// standardSign is one webhook-signature entry: HMAC-SHA256 of
// "<id>.<timestamp>.<body>" keyed by the base64 secret after "whsec_".
func standardSign(secret, id string, ts time.Time, body string) string {
	return standardSignAt(secret, id, fmt.Sprint(ts.Unix()), body)
}

// standardSignAt is standardSign with the webhook-timestamp header's text.
func standardSignAt(secret, id, t, body string) string {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		panic(err)
	}
	return "v1," + base64.StdEncoding.EncodeToString(hmacSHA256(key, id, ".", t, ".", body))
}

// recordingPublisher keeps what was published, or fails every publish.
type recordingPublisher struct {
	mu   sync.Mutex
	msgs []*message.Message
	fail error
}

func (p *recordingPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fail != nil {
		return p.fail
	}
	for _, m := range msgs {
		m.Metadata.Set("_topic", topic)
		p.msgs = append(p.msgs, m)
	}
	return nil
}

func (p *recordingPublisher) Close() error { return nil }

func (p *recordingPublisher) published() []*message.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*message.Message(nil), p.msgs...)
}

// serve runs one request through h and returns the status code.
func serve(h http.Handler, req *http.Request) int {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code
}

func newReceiver(t *testing.T, pub message.Publisher, cfg webhook.ReceiverConfig) http.Handler {
	t.Helper()
	if cfg.Topic == "" {
		cfg.Topic = "webhooks"
	}
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return testNow }
	}
	h, err := webhook.NewReceiver(pub, cfg)
	require.NoError(t, err)
	return h
}

func post(body string, headers map[string]string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, "/webhooks", strings.NewReader(body))
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	return req
}

// scheme describes one verifier for the table test: how a provider signs
// a request with a secret at a time, and how to break its header.
type scheme struct {
	name     string
	verifier webhook.Verifier // secrets: current, next
	secrets  [2]string
	// sign returns the headers of body's request signed with secret at ts.
	sign func(secret string, ts time.Time, body string) map[string]string
	// sigHeader is the header malformed and missing cases change.
	sigHeader   string
	malformed   string
	timestamped bool
	wantID      string
	wantType    string
	wantTenant  string
}

const (
	stripeBody = `{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","type":"payment_intent.succeeded","account":"acct_1032D82eZvKYlo2C"}`
	githubBody = `{"action":"opened","installation":{"id":4242},"number":7}`
	svixBody   = `{"type":"invoice.paid","data":{"id":"in_1"}}`
	plainBody  = `{"order":"o-1","status":"paid"}`
)

var (
	svixSecret     = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	svixNextSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("inboxmill rotation key no. 2"))
)

func schemes() []scheme {
	return []scheme{
		{
			name:     "stripe",
			secrets:  [2]string{"whsec_current", "whsec_next"},
			verifier: webhook.StripeVerifier("whsec_current", "whsec_next"),
			sign: func(secret string, ts time.Time, body string) map[string]string {
				return map[string]string{"Stripe-Signature": stripeSign(secret, ts, body)}
			},
			sigHeader: "Stripe-Signature", malformed: "t=1700000000;v1=abc",
			timestamped: true,
			wantID:      "evt_1NG8Du2eZvKYlo2CUI79vXWy", wantType: "payment_intent.succeeded", wantTenant: "acct_1032D82eZvKYlo2C",
		},
		{
			name:     "github",
			secrets:  [2]string{"gh-current", "gh-next"},
			verifier: webhook.GitHubVerifier("gh-current", "gh-next"),
			sign: func(secret string, _ time.Time, body string) map[string]string {
				return map[string]string{
					"X-Hub-Signature-256": githubSign(secret, body),
					"X-GitHub-Delivery":   "72d3162e-cc78-11e3-81ab-4c9367dc0958",
					"X-GitHub-Event":      "pull_request",
				}
			},
			sigHeader: "X-Hub-Signature-256", malformed: "sha1=7d38cdd689735b008b3c702edd92eea23791c5f6",
			wantID: "72d3162e-cc78-11e3-81ab-4c9367dc0958", wantType: "pull_request", wantTenant: "4242",
		},
		{
			name:     "standardwebhooks",
			secrets:  [2]string{svixSecret, svixNextSecret},
			verifier: webhook.StandardWebhooksVerifier(svixSecret, svixNextSecret),
			sign: func(secret string, ts time.Time, body string) map[string]string {
				return map[string]string{
					"webhook-id":        "msg_2Lh9KRb0pzN4LePd3XiA4gF1",
					"webhook-timestamp": fmt.Sprint(ts.Unix()),
					"webhook-signature": standardSign(secret, "msg_2Lh9KRb0pzN4LePd3XiA4gF1", ts, body),
				}
			},
			sigHeader: "webhook-signature", malformed: "v1,not*base64",
			timestamped: true,
			wantID:      "msg_2Lh9KRb0pzN4LePd3XiA4gF1", wantType: "invoice.paid",
		},
		{
			name:    "hmac-hex",
			secrets: [2]string{"shared-current", "shared-next"},
			verifier: webhook.HMACVerifier(webhook.HMACConfig{
				Secrets: []string{"shared-current", "shared-next"}, SignatureHeader: "X-Signature", Prefix: "sha256=",
				IDHeader: "X-Event-Id", TypeHeader: "X-Event-Type", Provider: "shop",
			}),
			sign: func(secret string, _ time.Time, body string) map[string]string {
				return map[string]string{
					"X-Signature":  "sha256=" + hex.EncodeToString(hmacSHA256([]byte(secret), body)),
					"X-Event-Id":   "ord-1-paid",
					"X-Event-Type": "order.paid",
				}
			},
			sigHeader: "X-Signature", malformed: "sha256=" + strings.Repeat("g", 64),
			wantID: "ord-1-paid", wantType: "order.paid",
		},
		{
			name:    "hmac-base64",
			secrets: [2]string{"shared-current", "shared-next"},
			verifier: webhook.HMACVerifier(webhook.HMACConfig{
				Secrets: []string{"shared-current", "shared-next"}, SignatureHeader: "X-Shop-Hmac-Sha256",
				Encoding: webhook.Base64, IDHeader: "X-Shop-Webhook-Id",
			}),
			sign: func(secret string, _ time.Time, body string) map[string]string {
				return map[string]string{
					"X-Shop-Hmac-Sha256": base64.StdEncoding.EncodeToString(hmacSHA256([]byte(secret), body)),
					"X-Shop-Webhook-Id":  "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
				}
			},
			sigHeader: "X-Shop-Hmac-Sha256", malformed: "c2hvcnQ=",
			wantID: "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
		},
	}
}

func (s scheme) body() string {
	switch s.name {
	case "stripe":
		return stripeBody
	case "github":
		return githubBody
	case "standardwebhooks":
		return svixBody
	}
	return plainBody
}

// TestReceiverVerifiers runs every verifier's cases through the
// receiver: the status, what was published, and the error a caller can
// branch on.
func TestReceiverVerifiers(t *testing.T) {
	t.Parallel()
	for _, s := range schemes() {
		body := s.body()
		cases := []receiverCase{
			{name: "valid", body: body, headers: s.sign(s.secrets[0], testNow, body), status: http.StatusOK},
			{name: "rotated secret", body: body, headers: s.sign(s.secrets[1], testNow, body), status: http.StatusOK},
			// The tampered body is the same JSON in other bytes: even that fails.
			{name: "tampered body", body: strings.Replace(body, ":", ": ", 1), headers: s.sign(s.secrets[0], testNow, body),
				status: http.StatusUnauthorized, err: webhook.ErrSignatureMismatch},
			{name: "wrong secret", body: body, headers: s.sign("whsec_"+base64.StdEncoding.EncodeToString([]byte("attacker")), testNow, body),
				status: http.StatusUnauthorized, err: webhook.ErrSignatureMismatch},
			{name: "malformed header", body: body, headers: with(s.sign(s.secrets[0], testNow, body), s.sigHeader, s.malformed),
				status: http.StatusUnauthorized, err: webhook.ErrMalformedHeader},
			{name: "missing header", body: body, headers: with(s.sign(s.secrets[0], testNow, body), s.sigHeader, ""),
				status: http.StatusUnauthorized, err: webhook.ErrMissingSignature},
		}
		if s.timestamped {
			cases = append(cases,
				receiverCase{name: "stale timestamp", body: body, headers: s.sign(s.secrets[0], testNow.Add(-6*time.Minute), body),
					status: http.StatusUnauthorized, err: webhook.ErrTimestampOutOfRange},
				receiverCase{name: "future timestamp", body: body, headers: s.sign(s.secrets[0], testNow.Add(6*time.Minute), body),
					status: http.StatusUnauthorized, err: webhook.ErrTimestampOutOfRange},
				receiverCase{name: "edge of the tolerance", body: body, headers: s.sign(s.secrets[0], testNow.Add(-5*time.Minute), body),
					status: http.StatusOK},
			)
		}
		for _, tc := range cases {
			t.Run(s.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				pub := &recordingPublisher{}
				h := newReceiver(t, pub, webhook.ReceiverConfig{Topic: "in." + s.name, Verifier: s.verifier})
				require.Equal(t, tc.status, serve(h, post(tc.body, tc.headers)))

				_, err := s.verifier.Verify(post(tc.body, tc.headers), []byte(tc.body), testNow)
				if tc.err != nil {
					require.ErrorIs(t, err, tc.err)
					require.Empty(t, pub.published(), "nothing is published for a rejected request")
					return
				}
				require.NoError(t, err)
				msgs := pub.published()
				require.Len(t, msgs, 1)
				m := msgs[0]
				require.Equal(t, tc.body, string(m.Payload), "the raw body is the payload")
				require.Equal(t, "in."+s.name, m.Metadata.Get("_topic"))
				require.Equal(t, s.wantID, m.Metadata.Get(webhook.MetadataEventID))
				require.Equal(t, s.wantType, m.Metadata.Get(webhook.MetadataEventType))
				require.Equal(t, s.wantTenant, m.Metadata.Get(webhook.MetadataTenantID))
				require.Equal(t, testNow.UTC().Format(time.RFC3339Nano), m.Metadata.Get(webhook.MetadataReceivedAt))
				require.NotEmpty(t, m.Metadata.Get(webhook.MetadataProvider))
				require.NotEmpty(t, m.UUID)
				require.NotEqual(t, s.wantID, m.UUID, "the UUID identifies the delivery, not the event")
			})
		}
	}
}

// receiverCase is one request of TestReceiverVerifiers.
type receiverCase struct {
	name    string
	body    string
	headers map[string]string
	status  int
	err     error // nil: accepted
}

// with returns a copy of h with k set to v, or removed when v is empty.
func with(h map[string]string, k, v string) map[string]string {
	out := map[string]string{}
	for hk, hv := range h {
		out[hk] = hv
	}
	if v == "" {
		delete(out, k)
	} else {
		out[k] = v
	}
	return out
}

// TestReceiverRetriesPublishEachDelivery: the receiver does not
// deduplicate; every retry is published with a fresh UUID and the same
// event_id, for the dedup middleware to recognise.
func TestReceiverRetriesPublishEachDelivery(t *testing.T) {
	t.Parallel()
	pub := &recordingPublisher{}
	h := newReceiver(t, pub, webhook.ReceiverConfig{Verifier: webhook.StripeVerifier("whsec_x")})
	for i := range 3 {
		// Stripe signs each attempt anew, with that attempt's time.
		ts := testNow.Add(time.Duration(-i) * time.Minute)
		require.Equal(t, http.StatusOK, serve(h, post(stripeBody, map[string]string{"Stripe-Signature": stripeSign("whsec_x", ts, stripeBody)})))
	}
	msgs := pub.published()
	require.Len(t, msgs, 3)
	uuids := map[string]bool{}
	for _, m := range msgs {
		require.Equal(t, "evt_1NG8Du2eZvKYlo2CUI79vXWy", m.Metadata.Get(webhook.MetadataEventID))
		uuids[m.UUID] = true
	}
	require.Len(t, uuids, 3, "a fresh UUID per request")
}

func TestReceiverMethodNotAllowed(t *testing.T) {
	t.Parallel()
	pub := &recordingPublisher{}
	h := newReceiver(t, pub, webhook.ReceiverConfig{Verifier: webhook.GitHubVerifier("s")})
	for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodHead, http.MethodDelete} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, "/webhooks", nil))
		require.Equal(t, http.StatusMethodNotAllowed, rec.Code, method)
		require.Equal(t, http.MethodPost, rec.Header().Get("Allow"))
	}
	require.Empty(t, pub.published())
}

func TestReceiverBodyLimit(t *testing.T) {
	t.Parallel()
	const limit = 64
	body := `{"padding":"` + strings.Repeat("x", limit) + `"}`
	headers := map[string]string{"X-Hub-Signature-256": githubSign("s", body), "X-GitHub-Delivery": "d-1"}

	t.Run("content length over the limit", func(t *testing.T) {
		t.Parallel()
		pub := &recordingPublisher{}
		h := newReceiver(t, pub, webhook.ReceiverConfig{Verifier: webhook.GitHubVerifier("s"), MaxBodyBytes: limit})
		require.Equal(t, http.StatusRequestEntityTooLarge, serve(h, post(body, headers)))
		require.Empty(t, pub.published())
	})
	t.Run("chunked body over the limit", func(t *testing.T) {
		t.Parallel()
		pub := &recordingPublisher{}
		h := newReceiver(t, pub, webhook.ReceiverConfig{Verifier: webhook.GitHubVerifier("s"), MaxBodyBytes: limit})
		req := post(body, headers)
		req.ContentLength = -1 // unknown: only reading finds out
		req.Body = io.NopCloser(strings.NewReader(body))
		require.Equal(t, http.StatusRequestEntityTooLarge, serve(h, req))
		require.Empty(t, pub.published())
	})
	t.Run("default limit is 1 MiB", func(t *testing.T) {
		t.Parallel()
		pub := &recordingPublisher{}
		h := newReceiver(t, pub, webhook.ReceiverConfig{Verifier: webhook.GitHubVerifier("s")})
		big := `{"padding":"` + strings.Repeat("x", webhook.DefaultMaxBodyBytes-14) + `"}`
		require.Len(t, big, webhook.DefaultMaxBodyBytes)
		ok := map[string]string{"X-Hub-Signature-256": githubSign("s", big), "X-GitHub-Delivery": "d-2"}
		require.Equal(t, http.StatusOK, serve(h, post(big, ok)))
		over := big + " "
		require.Equal(t, http.StatusRequestEntityTooLarge, serve(h, post(over, with(ok, "X-Hub-Signature-256", githubSign("s", over)))))
		require.Len(t, pub.published(), 1)
	})
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("connection reset by peer") }

func TestReceiverBadRequests(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		verifier webhook.Verifier
		req      func() *http.Request
	}{
		{name: "unreadable body", verifier: webhook.GitHubVerifier("s"), req: func() *http.Request {
			req := post("", nil)
			req.ContentLength = -1
			req.Body = io.NopCloser(failingReader{})
			return req
		}},
		{name: "stripe body without id", verifier: webhook.StripeVerifier("whsec_x"), req: func() *http.Request {
			body := `{"object":"event","type":"charge.failed"}`
			return post(body, map[string]string{"Stripe-Signature": stripeSign("whsec_x", testNow, body)})
		}},
		{name: "stripe body that is not JSON", verifier: webhook.StripeVerifier("whsec_x"), req: func() *http.Request {
			return post("id=evt_1", map[string]string{"Stripe-Signature": stripeSign("whsec_x", testNow, "id=evt_1")})
		}},
		{name: "github without delivery header", verifier: webhook.GitHubVerifier("s"), req: func() *http.Request {
			return post(githubBody, map[string]string{"X-Hub-Signature-256": githubSign("s", githubBody)})
		}},
		{name: "event ID too long for the inbox", verifier: webhook.GitHubVerifier("s"), req: func() *http.Request {
			return post(githubBody, map[string]string{"X-Hub-Signature-256": githubSign("s", githubBody),
				"X-GitHub-Delivery": strings.Repeat("d", 256)})
		}},
		{name: "custom verifier returning an empty ID", req: func() *http.Request { return post("{}", nil) },
			verifier: webhook.VerifierFunc(func(*http.Request, []byte, time.Time) (webhook.Event, error) {
				return webhook.Event{Provider: "custom"}, nil
			})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pub := &recordingPublisher{}
			h := newReceiver(t, pub, webhook.ReceiverConfig{Verifier: tc.verifier})
			require.Equal(t, http.StatusBadRequest, serve(h, tc.req()))
			require.Empty(t, pub.published())
		})
	}
}

// TestStripeEventIDs: the event ID read from the body is published exactly
// as Stripe wrote it, or the request is refused. encoding/json turns
// invalid UTF-8 and lone surrogate escapes into U+FFFD, which would fold
// distinct events into one event_id and drop all but the first as
// duplicates; those, and IDs that cannot be inbox keys, are answered 400
// with nothing published. Every body is signed correctly.
func TestStripeEventIDs(t *testing.T) {
	t.Parallel()
	body := func(id string) string { return `{"id":` + id + `,"object":"event","type":"charge.succeeded"}` }
	cases := []struct {
		name   string
		id     string // the id field as written in the body
		want   string // the event_id published; "" when refused
		refuse error
	}{
		{name: "plain", id: `"evt_1"`, want: "evt_1"},
		{name: "escaped letters", id: `"evt_\u0031"`, want: "evt_1"},
		{name: "escaped U+FFFD itself", id: `"evt_\ufffd"`, want: "evt_\uFFFD"},
		{name: "U+FFFD written out", id: "\"evt_\uFFFD\"", want: "evt_\uFFFD"},
		{name: "surrogate pair", id: `"evt_\ud83d\ude00"`, want: "evt_\U0001F600"},
		{name: "255 bytes after unescaping", id: `"` + strings.Repeat(`\u0041`, 255) + `"`, want: strings.Repeat("A", 255)},
		{name: "lone high surrogate", id: `"evt_\ud800"`, refuse: webhook.ErrInvalidEventID},
		{name: "another lone high surrogate", id: `"evt_\ud801"`, refuse: webhook.ErrInvalidEventID},
		{name: "lone low surrogate", id: `"evt_\udfff"`, refuse: webhook.ErrInvalidEventID},
		{name: "high surrogate before a letter", id: `"evt_\ud800\u0041"`, refuse: webhook.ErrInvalidEventID},
		{name: "surrogates in the wrong order", id: `"evt_\ude00\ud83d"`, refuse: webhook.ErrInvalidEventID},
		{name: "raw invalid byte", id: "\"evt_\xff\"", refuse: webhook.ErrInvalidEventID},
		{name: "raw truncated sequence", id: "\"evt_\xe2\x82\"", refuse: webhook.ErrInvalidEventID},
		{name: "raw encoded surrogate", id: "\"evt_\xed\xa0\x80\"", refuse: webhook.ErrInvalidEventID},
		{name: "escaped NUL", id: `"evt_\u0000"`, refuse: webhook.ErrInvalidEventID},
		{name: "256 bytes", id: `"evt_` + strings.Repeat("x", 252) + `"`, refuse: webhook.ErrInvalidEventID},
		{name: "256 bytes after unescaping", id: `"` + strings.Repeat(`\u00e9`, 128) + `"`, refuse: webhook.ErrInvalidEventID},
		{name: "a number", id: `1234`, refuse: webhook.ErrInvalidEventID},
		{name: "empty", id: `""`, refuse: webhook.ErrMissingEventID},
		{name: "null", id: `null`, refuse: webhook.ErrMissingEventID},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := body(tc.id)
			headers := map[string]string{"Stripe-Signature": stripeSign("whsec_x", testNow, b)}
			v := webhook.StripeVerifier("whsec_x")
			pub := &recordingPublisher{}
			h := newReceiver(t, pub, webhook.ReceiverConfig{Verifier: v})
			code := serve(h, post(b, headers))
			ev, err := v.Verify(post(b, headers), []byte(b), testNow)
			if tc.refuse != nil {
				require.ErrorIs(t, err, tc.refuse)
				require.Equal(t, http.StatusBadRequest, code)
				require.Empty(t, pub.published())
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, ev.ID)
			require.Equal(t, http.StatusOK, code)
			require.Len(t, pub.published(), 1)
			require.Equal(t, tc.want, pub.published()[0].Metadata.Get(webhook.MetadataEventID))
		})
	}
}

// TestStripeAccounts: the account of a Stripe Connect event becomes the
// tenant_id, part of the inbox identity downstream, so it follows the
// same lossless rule as the ID; one that cannot be a scope is answered 400
// and nothing is published, rather than published to become poison.
func TestStripeAccounts(t *testing.T) {
	t.Parallel()
	body := func(account string) string {
		return `{"id":"evt_1","object":"event","type":"charge.succeeded","account":` + account + `}`
	}
	for _, tc := range []struct {
		name, account, want string
		refused             bool
	}{
		{name: "plain", account: `"acct_1"`, want: "acct_1"},
		{name: "null", account: `null`, want: ""},
		{name: "lone surrogate", account: `"acct_\ud800"`, refused: true},
		{name: "raw invalid byte", account: "\"acct_\xff\"", refused: true},
		{name: "escaped NUL", account: `"acct_\u0000"`, refused: true},
		{name: "256 bytes", account: `"` + strings.Repeat("a", 256) + `"`, refused: true},
		{name: "a number", account: `12`, refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := body(tc.account)
			headers := map[string]string{"Stripe-Signature": stripeSign("whsec_x", testNow, b)}
			pub := &recordingPublisher{}
			h := newReceiver(t, pub, webhook.ReceiverConfig{Verifier: webhook.StripeVerifier("whsec_x")})
			code := serve(h, post(b, headers))
			if tc.refused {
				require.Equal(t, http.StatusBadRequest, code)
				require.Empty(t, pub.published())
				_, err := webhook.StripeVerifier("whsec_x").Verify(post(b, headers), []byte(b), testNow)
				require.ErrorIs(t, err, webhook.ErrInvalidTenant)
				return
			}
			require.Equal(t, http.StatusOK, code)
			require.Len(t, pub.published(), 1)
			require.Equal(t, tc.want, pub.published()[0].Metadata.Get(webhook.MetadataTenantID))
		})
	}
}

// A receiver's fallback tenant must be a scope too.
func TestReceiverTenantIsChecked(t *testing.T) {
	_, err := webhook.NewReceiver(&recordingPublisher{}, webhook.ReceiverConfig{Topic: "t",
		Verifier: webhook.StripeVerifier("whsec_x"), Tenant: "acme\x00"})
	require.ErrorIs(t, err, webhook.ErrInvalidConfig)
}

// TestHeaderEventIDs: an event ID read from a header must be an inbox key
// too; one with a NUL byte, over 255 bytes or not UTF-8 is answered 400
// and nothing is published. The requests are signed correctly, the
// Standard Webhooks ID included.
func TestHeaderEventIDs(t *testing.T) {
	t.Parallel()
	hmacV := webhook.HMACVerifier(webhook.HMACConfig{Secrets: []string{"s"}, SignatureHeader: "X-Signature", IDHeader: "X-Event-Id"})
	verifiers := []struct {
		name     string
		verifier webhook.Verifier
		body     string
		sign     func(id string) map[string]string
	}{
		{name: "github", verifier: webhook.GitHubVerifier("s"), body: githubBody, sign: func(id string) map[string]string {
			return map[string]string{"X-Hub-Signature-256": githubSign("s", githubBody), "X-GitHub-Delivery": id}
		}},
		{name: "standardwebhooks", verifier: webhook.StandardWebhooksVerifier(svixSecret), body: svixBody, sign: func(id string) map[string]string {
			return map[string]string{"webhook-id": id, "webhook-timestamp": fmt.Sprint(testNow.Unix()),
				"webhook-signature": standardSign(svixSecret, id, testNow, svixBody)}
		}},
		{name: "hmac", verifier: hmacV, body: plainBody, sign: func(id string) map[string]string {
			return map[string]string{"X-Signature": hex.EncodeToString(hmacSHA256([]byte("s"), plainBody)), "X-Event-Id": id}
		}},
	}
	ids := []struct {
		name string
		id   string
		ok   bool
	}{
		{name: "255 bytes", id: strings.Repeat("d", 255), ok: true},
		{name: "256 bytes", id: strings.Repeat("d", 256)},
		{name: "NUL byte", id: "d-\x00-1"},
		{name: "invalid UTF-8", id: "d-\xff"},
	}
	for _, v := range verifiers {
		for _, tc := range ids {
			t.Run(v.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				pub := &recordingPublisher{}
				h := newReceiver(t, pub, webhook.ReceiverConfig{Verifier: v.verifier})
				code := serve(h, post(v.body, v.sign(tc.id)))
				_, err := v.verifier.Verify(post(v.body, v.sign(tc.id)), []byte(v.body), testNow)
				if tc.ok {
					require.NoError(t, err)
					require.Equal(t, http.StatusOK, code)
					require.Equal(t, tc.id, pub.published()[0].Metadata.Get(webhook.MetadataEventID))
					return
				}
				require.ErrorIs(t, err, webhook.ErrInvalidEventID)
				require.Equal(t, http.StatusBadRequest, code)
				require.Empty(t, pub.published())
			})
		}
	}
}

// TestReceiverPublishFails: 503 and no 2xx, so the provider keeps
// the event and retries it; the failure is logged without the body.
func TestReceiverPublishFails(t *testing.T) {
	t.Parallel()
	pub := &recordingPublisher{fail: errors.New("queue unavailable")}
	logs := testkit.NewLogger()
	h := newReceiver(t, pub, webhook.ReceiverConfig{Verifier: webhook.StripeVerifier("whsec_x"), Logger: logs})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, post(stripeBody, map[string]string{"Stripe-Signature": stripeSign("whsec_x", testNow, stripeBody)}))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Empty(t, pub.published())

	var errorsLogged int
	for _, e := range logs.Entries() {
		if e.Level == "error" {
			errorsLogged++
			require.Equal(t, "evt_1NG8Du2eZvKYlo2CUI79vXWy", e.Fields["event_id"])
		}
	}
	require.Equal(t, 1, errorsLogged)
	requireNoSecretsLogged(t, logs, "whsec_x", stripeBody)
}

// TestReceiverLogsNoBodyOrSecret: rejections are logged with a
// reason, never the body, the secret or the signature.
func TestReceiverLogsNoBodyOrSecret(t *testing.T) {
	t.Parallel()
	logs := testkit.NewLogger()
	pub := &recordingPublisher{}
	h := newReceiver(t, pub, webhook.ReceiverConfig{Verifier: webhook.StripeVerifier("whsec_topsecret"), Logger: logs})
	sig := stripeSign("whsec_wrong", testNow, stripeBody)
	require.Equal(t, http.StatusUnauthorized, serve(h, post(stripeBody, map[string]string{"Stripe-Signature": sig})))
	require.Equal(t, http.StatusUnauthorized, serve(h, post(stripeBody, map[string]string{"Stripe-Signature": "t=1,v1=" + strings.Repeat("ab", 32)})))
	require.Equal(t, http.StatusOK, serve(h, post(stripeBody, map[string]string{"Stripe-Signature": stripeSign("whsec_topsecret", testNow, stripeBody)})))
	require.NotEmpty(t, logs.Entries())
	requireNoSecretsLogged(t, logs, "whsec_topsecret", stripeBody, sig[strings.Index(sig, "v1=")+3:], "payment_intent")
}

func requireNoSecretsLogged(t *testing.T, logs *testkit.Logger, forbidden ...string) {
	t.Helper()
	for _, e := range logs.Entries() {
		line := fmt.Sprintf("%s %v %v", e.Msg, e.Err, e.Fields)
		for _, f := range forbidden {
			require.NotContains(t, line, f)
		}
	}
}

func TestReceiverTenantAndProvider(t *testing.T) {
	t.Parallel()
	sign := func(body string) map[string]string {
		return map[string]string{"Stripe-Signature": stripeSign("whsec_x", testNow, body)}
	}
	platformEvent := `{"id":"evt_platform","type":"balance.available"}`
	cases := []struct {
		name             string
		cfg              webhook.ReceiverConfig
		body             string
		tenant, provider string
		hasTenant        bool
	}{
		{name: "tenant from the event", cfg: webhook.ReceiverConfig{Tenant: "platform"}, body: stripeBody,
			tenant: "acct_1032D82eZvKYlo2C", hasTenant: true, provider: "stripe"},
		{name: "configured tenant when the event names none", cfg: webhook.ReceiverConfig{Tenant: "platform"}, body: platformEvent,
			tenant: "platform", hasTenant: true, provider: "stripe"},
		{name: "no tenant at all", body: platformEvent, provider: "stripe"},
		{name: "provider override", cfg: webhook.ReceiverConfig{Provider: "stripe-eu"}, body: platformEvent, provider: "stripe-eu"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pub := &recordingPublisher{}
			cfg := tc.cfg
			cfg.Verifier = webhook.StripeVerifier("whsec_x")
			h := newReceiver(t, pub, cfg)
			require.Equal(t, http.StatusOK, serve(h, post(tc.body, sign(tc.body))))
			m := pub.published()[0]
			_, has := m.Metadata[webhook.MetadataTenantID]
			require.Equal(t, tc.hasTenant, has)
			require.Equal(t, tc.tenant, m.Metadata.Get(webhook.MetadataTenantID))
			require.Equal(t, tc.provider, m.Metadata.Get(webhook.MetadataProvider))
		})
	}
}

// TestReceiverMessageContext: the message outlives the request's
// cancellation (a provider hanging up must not abort the publish) but keeps
// its values (trace IDs).
func TestReceiverMessageContext(t *testing.T) {
	t.Parallel()
	type key struct{}
	pub := &recordingPublisher{}
	h := newReceiver(t, pub, webhook.ReceiverConfig{Verifier: webhook.GitHubVerifier("s")})
	req := post(githubBody, map[string]string{"X-Hub-Signature-256": githubSign("s", githubBody), "X-GitHub-Delivery": "d-1"})
	ctx, cancel := context.WithCancel(context.WithValue(req.Context(), key{}, "trace-1"))
	cancel() // the provider hung up
	require.Equal(t, http.StatusOK, serve(h, req.WithContext(ctx)))
	m := pub.published()[0]
	require.NoError(t, m.Context().Err())
	require.Equal(t, "trace-1", m.Context().Value(key{}))
}

func TestReceiverConfigValidation(t *testing.T) {
	t.Parallel()
	pub := &recordingPublisher{}
	cases := []struct {
		name  string
		pub   message.Publisher
		cfg   webhook.ReceiverConfig
		wants []string // every problem is reported at once
	}{
		{name: "empty", pub: pub, cfg: webhook.ReceiverConfig{}, wants: []string{"Topic is required", "Verifier is required"}},
		{name: "nil publisher", cfg: webhook.ReceiverConfig{Topic: "t", Verifier: webhook.GitHubVerifier("s")}, wants: []string{"publisher is nil"}},
		{name: "negative body limit", pub: pub, cfg: webhook.ReceiverConfig{Topic: "t", Verifier: webhook.GitHubVerifier("s"), MaxBodyBytes: -1},
			wants: []string{"MaxBodyBytes -1 is negative"}},
		{name: "stripe without secrets", pub: pub, cfg: webhook.ReceiverConfig{Topic: "t", Verifier: webhook.StripeVerifier()},
			wants: []string{"StripeVerifier: at least one secret is required"}},
		{name: "stripe with an empty secret and a bad tolerance", pub: pub,
			cfg:   webhook.ReceiverConfig{Topic: "t", Verifier: &webhook.Stripe{Secrets: []string{"a", ""}, Tolerance: -time.Minute}},
			wants: []string{"secret 1 is empty", "Tolerance -1m0s is negative"}},
		{name: "github without secrets", pub: pub, cfg: webhook.ReceiverConfig{Topic: "t", Verifier: webhook.GitHubVerifier()},
			wants: []string{"GitHubVerifier: at least one secret is required"}},
		{name: "standard webhooks secret not base64", pub: pub,
			cfg:   webhook.ReceiverConfig{Topic: "t", Verifier: webhook.StandardWebhooksVerifier(svixSecret, "whsec_not base64!")},
			wants: []string{"secret 1 is not base64"}},
		{name: "hmac without headers", pub: pub, cfg: webhook.ReceiverConfig{Topic: "t", Verifier: webhook.HMACVerifier(webhook.HMACConfig{
			Secrets: []string{"s"}, Encoding: 7})},
			wants: []string{"SignatureHeader is required", "IDHeader is required", "unknown Encoding 7"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, err := webhook.NewReceiver(tc.pub, tc.cfg)
			require.Nil(t, h)
			require.ErrorIs(t, err, webhook.ErrInvalidConfig)
			for _, w := range tc.wants {
				require.ErrorContains(t, err, w)
			}
		})
	}
}

// TestReceiverConcurrent: one receiver serves many requests at once
// (go test -race).
func TestReceiverConcurrent(t *testing.T) {
	t.Parallel()
	pub := &recordingPublisher{}
	h := newReceiver(t, pub, webhook.ReceiverConfig{Verifier: webhook.StandardWebhooksVerifier(svixSecret)})
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			id := fmt.Sprintf("msg_%d", i%4)
			req := post(svixBody, map[string]string{"webhook-id": id, "webhook-timestamp": fmt.Sprint(testNow.Unix()),
				"webhook-signature": standardSign(svixSecret, id, testNow, svixBody)})
			if code := serve(h, req); code != http.StatusOK {
				t.Errorf("request %d: %d", i, code)
			}
		})
	}
	wg.Wait()
	require.Len(t, pub.published(), 32)
}
