package webhook_test

import (
	"bufio"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/handlers/webhook"
)

// TestReceiverDuplicatedHeaders: a header sent twice is read as its first
// value, the one a verifier checks and publishes; a valid signature in a
// second copy does not rescue an invalid first one, and a second event ID
// does not replace the first. Nothing unverified is published.
func TestReceiverDuplicatedHeaders(t *testing.T) {
	t.Parallel()
	good := githubSign("s", githubBody)
	bad := "sha256=" + strings.Repeat("0", 64)
	stripeGood := stripeSign("whsec_x", testNow, stripeBody)
	for _, c := range []struct {
		name     string
		verifier webhook.Verifier
		body     string
		headers  [][2]string
		status   int
		id       string
	}{
		{"github: valid then invalid signature", webhook.GitHubVerifier("s"), githubBody,
			[][2]string{{"X-Hub-Signature-256", good}, {"X-Hub-Signature-256", bad}, {"X-GitHub-Delivery", "d-1"}}, http.StatusOK, "d-1"},
		{"github: invalid then valid signature", webhook.GitHubVerifier("s"), githubBody,
			[][2]string{{"X-Hub-Signature-256", bad}, {"X-Hub-Signature-256", good}, {"X-GitHub-Delivery", "d-1"}}, http.StatusUnauthorized, ""},
		{"github: two delivery IDs", webhook.GitHubVerifier("s"), githubBody,
			[][2]string{{"X-Hub-Signature-256", good}, {"X-GitHub-Delivery", "d-1"}, {"X-GitHub-Delivery", "d-2"}}, http.StatusOK, "d-1"},
		{"github: an empty first delivery ID", webhook.GitHubVerifier("s"), githubBody,
			[][2]string{{"X-Hub-Signature-256", good}, {"X-GitHub-Delivery", ""}, {"X-GitHub-Delivery", "d-2"}}, http.StatusBadRequest, ""},
		{"stripe: valid then garbage", webhook.StripeVerifier("whsec_x"), stripeBody,
			[][2]string{{"Stripe-Signature", stripeGood}, {"Stripe-Signature", "t=1,v1=zz"}}, http.StatusOK, "evt_1NG8Du2eZvKYlo2CUI79vXWy"},
		{"stripe: garbage then valid", webhook.StripeVerifier("whsec_x"), stripeBody,
			[][2]string{{"Stripe-Signature", "t=1,v1=zz"}, {"Stripe-Signature", stripeGood}}, http.StatusUnauthorized, ""},
		{"stripe: two timestamps in one header", webhook.StripeVerifier("whsec_x"), stripeBody,
			[][2]string{{"Stripe-Signature", stripeGood + ",t=1"}}, http.StatusUnauthorized, ""},
		{"standard: the signed ID first, another second", webhook.StandardWebhooksVerifier(svixSecret), svixBody,
			[][2]string{{"webhook-id", "msg_1"}, {"webhook-id", "msg_2"}, {"webhook-timestamp", fmt.Sprint(testNow.Unix())},
				{"webhook-signature", standardSign(svixSecret, "msg_1", testNow, svixBody)}}, http.StatusOK, "msg_1"},
		{"standard: another ID first, the signed one second", webhook.StandardWebhooksVerifier(svixSecret), svixBody,
			[][2]string{{"webhook-id", "msg_2"}, {"webhook-id", "msg_1"}, {"webhook-timestamp", fmt.Sprint(testNow.Unix())},
				{"webhook-signature", standardSign(svixSecret, "msg_1", testNow, svixBody)}}, http.StatusUnauthorized, ""},
		{"standard: webhook- and svix- headers both", webhook.StandardWebhooksVerifier(svixSecret), svixBody,
			[][2]string{{"svix-id", "msg_2"}, {"webhook-id", "msg_1"}, {"webhook-timestamp", fmt.Sprint(testNow.Unix())},
				{"webhook-signature", standardSign(svixSecret, "msg_1", testNow, svixBody)}, {"svix-signature", "v1,AAAA"}},
			http.StatusOK, "msg_1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pub := &recordingPublisher{}
			h := newReceiver(t, pub, webhook.ReceiverConfig{Verifier: c.verifier})
			req := httptest.NewRequest(http.MethodPost, "/webhooks", strings.NewReader(c.body))
			for _, kv := range c.headers {
				req.Header.Add(kv[0], kv[1])
			}
			require.Equal(t, c.status, serve(h, req))
			if c.status != http.StatusOK {
				require.Empty(t, pub.published())
				return
			}
			require.Len(t, pub.published(), 1)
			require.Equal(t, c.id, pub.published()[0].Metadata.Get(webhook.MetadataEventID))
		})
	}
}

// TestReceiverTruncatedBodies sends requests over a real connection whose
// body ends before its Content-Length, or whose chunked body never ends,
// and requests the HTTP server refuses before the receiver sees them:
// none is published, and the receiver answers 400 to what reaches it.
func TestReceiverTruncatedBodies(t *testing.T) {
	t.Parallel()
	pub := &recordingPublisher{}
	h := newReceiver(t, pub, webhook.ReceiverConfig{Verifier: webhook.GitHubVerifier("s")})
	srv := httptest.NewServer(h)
	defer srv.Close()
	sig := githubSign("s", githubBody)
	head := "POST /webhooks HTTP/1.1\r\nHost: receiver.test\r\nX-Hub-Signature-256: " + sig + "\r\nX-GitHub-Delivery: d-1\r\n"
	for _, c := range []struct {
		name, raw string
		status    int
	}{
		{"half the body", head + fmt.Sprintf("Content-Length: %d\r\n\r\n", len(githubBody)) + githubBody[:len(githubBody)/2],
			http.StatusBadRequest},
		{"no body", head + fmt.Sprintf("Content-Length: %d\r\n\r\n", len(githubBody)), http.StatusBadRequest},
		{"chunked without its last chunk", head + "Transfer-Encoding: chunked\r\n\r\n" +
			fmt.Sprintf("%x\r\n%s\r\n", len(githubBody), githubBody), http.StatusBadRequest},
		{"chunk shorter than its size", head + "Transfer-Encoding: chunked\r\n\r\n" +
			fmt.Sprintf("%x\r\n%s", len(githubBody)+10, githubBody), http.StatusBadRequest},
		{"two Content-Lengths", head + fmt.Sprintf("Content-Length: %d\r\nContent-Length: %d\r\n\r\n", len(githubBody), len(githubBody)-1) +
			githubBody, http.StatusBadRequest},
		{"negative Content-Length", head + "Content-Length: -1\r\n\r\n" + githubBody, http.StatusBadRequest},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			require.NoError(t, err)
			defer conn.Close()
			_, err = io.WriteString(conn, c.raw)
			require.NoError(t, err)
			require.NoError(t, conn.(*net.TCPConn).CloseWrite()) // the sender went away mid-body
			require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			require.NoError(t, err)
			_ = resp.Body.Close()
			require.Equal(t, c.status, resp.StatusCode)
		})
	}
	require.Empty(t, pub.published(), "nothing truncated or malformed was published")

	// The whole request goes through on a fresh connection.
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/webhooks", strings.NewReader(githubBody))
	require.NoError(t, err)
	req.Header.Set("X-Hub-Signature-256", sig)
	req.Header.Set("X-GitHub-Delivery", "d-1")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Len(t, pub.published(), 1)
}

// The secrets of FuzzReceiver's verifiers; the seed corpus in
// testdata/fuzz/FuzzReceiver holds requests signed with them.
const (
	fuzzReceiverGitHub = "fuzz-receiver-github"
	fuzzReceiverStripe = "whsec_fuzz_receiver"
)

// FuzzReceiver sends arbitrary header lines (a header may repeat), bodies
// and body cuts to the receiver, with the GitHub and the Stripe verifier.
// headers is "Name: value" lines; a body is cut after cut bytes when cut
// is below its length, the rest failing to read, as a connection that
// drops mid-body. Invariants:
//
//   - the receiver never panics, and answers one of 200, 400, 401, 405
//     or 413 (503 only when the publisher fails, which it does not here);
//   - it answers 200 exactly when it published one message, and publishes
//     nothing otherwise;
//   - a published message carries exactly the body received whole, under
//     a signature that verifies independently, with an event ID and a
//     tenant the inbox can store;
//   - the response body is the status text, never a reason.
//
// The seed corpus is testdata/fuzz/FuzzReceiver.
func FuzzReceiver(f *testing.F) {
	now := time.Unix(1700000000, 0)
	type target struct {
		name  string
		valid func(h http.Header, body []byte) bool
		cfg   webhook.ReceiverConfig
	}
	targets := []target{
		{name: "github", cfg: webhook.ReceiverConfig{Verifier: webhook.GitHubVerifier(fuzzReceiverGitHub)},
			valid: func(h http.Header, body []byte) bool {
				m := hmac.New(sha256.New, []byte(fuzzReceiverGitHub))
				m.Write(body)
				return strings.EqualFold(h.Get("X-Hub-Signature-256"), "sha256="+hex.EncodeToString(m.Sum(nil)))
			}},
		{name: "stripe", cfg: webhook.ReceiverConfig{Verifier: webhook.StripeVerifier(fuzzReceiverStripe)},
			valid: func(h http.Header, body []byte) bool {
				header := strings.ToLower(h.Get("Stripe-Signature"))
				for item := range strings.SplitSeq(header, ",") {
					if ts, ok := strings.CutPrefix(strings.TrimSpace(item), "t="); ok {
						m := hmac.New(sha256.New, []byte(fuzzReceiverStripe))
						m.Write([]byte(ts + "."))
						m.Write(body)
						if strings.Contains(header, "v1="+hex.EncodeToString(m.Sum(nil))) {
							return true
						}
					}
				}
				return false
			}},
	}
	f.Fuzz(func(t *testing.T, method, headers string, body []byte, cut int) {
		for _, tg := range targets {
			pub := &recordingPublisher{}
			cfg := tg.cfg
			cfg.Topic, cfg.Now, cfg.MaxBodyBytes = "webhooks", func() time.Time { return now }, 4096
			h, err := webhook.NewReceiver(pub, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var r io.Reader = strings.NewReader(string(body))
			whole := cut < 0 || cut >= len(body)
			if !whole {
				r = io.MultiReader(strings.NewReader(string(body[:cut])), failingReader{})
			}
			req := httptest.NewRequest(http.MethodPost, "/webhooks", nil)
			req.Method = method
			req.Body = io.NopCloser(r)
			req.ContentLength = -1
			for _, line := range strings.Split(headers, "\n") {
				if k, v, ok := strings.Cut(line, ":"); ok {
					// Add, not Set: repeats stay, and bytes a parser
					// would refuse reach the verifiers.
					key := http.CanonicalHeaderKey(strings.TrimSpace(k))
					req.Header[key] = append(req.Header[key], strings.TrimSpace(v))
				}
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			got := pub.published()
			switch rec.Code {
			case http.StatusOK:
				if len(got) != 1 {
					t.Fatalf("%s: 200 with %d messages published", tg.name, len(got))
				}
				m := got[0]
				if !whole || method != http.MethodPost || string(m.Payload) != string(body) {
					t.Fatalf("%s: published a body that was not received whole: %q", tg.name, m.Payload)
				}
				if !tg.valid(req.Header, body) {
					t.Fatalf("%s: published without a valid signature: headers %q body %q", tg.name, headers, body)
				}
				id, tenant := m.Metadata.Get(webhook.MetadataEventID), m.Metadata.Get(webhook.MetadataTenantID)
				if id == "" || len(id) > 255 || !utf8.ValidString(id) || strings.ContainsRune(id, 0) {
					t.Fatalf("%s: published event ID %q", tg.name, id)
				}
				if len(tenant) > 255 || !utf8.ValidString(tenant) || strings.ContainsRune(tenant, 0) {
					t.Fatalf("%s: published tenant %q", tg.name, tenant)
				}
				if m.UUID == "" {
					t.Fatalf("%s: published a message without a UUID", tg.name)
				}
			case http.StatusBadRequest, http.StatusUnauthorized, http.StatusMethodNotAllowed, http.StatusRequestEntityTooLarge:
				if len(got) != 0 {
					t.Fatalf("%s: %d with %d messages published", tg.name, rec.Code, len(got))
				}
				if want := http.StatusText(rec.Code) + "\n"; rec.Body.String() != want {
					t.Fatalf("%s: %d answered %q, not its status text", tg.name, rec.Code, rec.Body.String())
				}
			default:
				t.Fatalf("%s: status %d", tg.name, rec.Code)
			}
		}
	})
}
