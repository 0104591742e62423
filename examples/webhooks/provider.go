package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

const (
	stripeSecret = "whsec_example_stripe_endpoint_secret"
	githubSecret = "example-github-webhook-secret"

	// holdHeader marks a request whose response the example's stand-in for
	// a slow network holds until the sender has given up waiting.
	holdHeader = "X-Example-Hold-Response"
)

// event is one event a provider must deliver, and how its deliveries go.
type event struct {
	provider string // "stripe" or "github"
	id, typ  string
	// body is the payload of the n-th delivery (from 1).
	body func(n int) string
	// impatient: the first attempt is made by a client with a tiny
	// timeout, which gives up although the receiver enqueued the event;
	// the provider then retries.
	impatient bool
	// extra: deliveries made after a successful one (a provider sending an
	// event twice, a redelivery from a dashboard).
	extra int
	// concurrent: the extra deliveries go out at once.
	concurrent bool
}

// events is what the two providers have to deliver: six Stripe events and
// four GitHub deliveries, with retries.
func events() []event {
	var evs []event
	for i := 1; i <= 6; i++ {
		typ := "payment_intent.succeeded"
		if i%3 == 0 {
			typ = "charge.refunded"
		}
		id := fmt.Sprintf("evt_3Pex%04dWebhookDemo", i)
		ev := event{provider: "stripe", id: id, typ: typ, body: func(n int) string {
			// pending_webhooks counts down between deliveries: the same
			// event in other bytes, which the consumer's fingerprint
			// ignores.
			return fmt.Sprintf(`{"id":%q,"object":"event","type":%q,"livemode":false,"pending_webhooks":%d,`+
				`"data":{"object":{"id":"pi_%04d","amount":%d,"currency":"eur"}}}`, id, typ, max(0, 3-n), i, 1000*i)
		}}
		switch i {
		case 2:
			ev.extra = 1 // Stripe may send an event more than once
		case 4:
			ev.impatient = true
		}
		evs = append(evs, ev)
	}
	for i := 1; i <= 4; i++ {
		typ := "push"
		if i%2 == 0 {
			typ = "pull_request"
		}
		body := fmt.Sprintf(`{"ref":"refs/heads/main","after":"%040d","repository":{"full_name":"acme/shop"}}`, i)
		ev := event{provider: "github", id: fmt.Sprintf("8d1f4c00-0000-11ef-8000-%012d", i), typ: typ,
			body: func(int) string { return body }}
		switch i {
		case 2:
			ev.impatient = true
		case 3:
			ev.extra, ev.concurrent = 2, true // "Redeliver" clicked twice
		}
		evs = append(evs, ev)
	}
	return evs
}

// sender plays the providers: it signs each attempt as Stripe and GitHub
// do, retries on timeouts and non-2xx answers, and sends a few requests a
// receiver must refuse.
type sender struct {
	baseURL   string
	client    *http.Client // a provider's usual client
	impatient *http.Client // gives up after a few milliseconds
	out       io.Writer
	verbose   bool

	mu sync.Mutex // serialises output lines
}

func newSender(baseURL string, out io.Writer, verbose bool) *sender {
	transport := &http.Transport{MaxIdleConnsPerHost: 16}
	return &sender{
		baseURL:   baseURL,
		client:    &http.Client{Transport: transport, Timeout: 10 * time.Second},
		impatient: &http.Client{Transport: transport, Timeout: 200 * time.Millisecond},
		out:       out,
		verbose:   verbose,
	}
}

func (s *sender) close() { s.client.Transport.(*http.Transport).CloseIdleConnections() }

func (s *sender) printf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.out, format, args...)
}

// request builds one signed attempt. Stripe signs every attempt anew with
// its own timestamp; GitHub signs the body and names the delivery.
func (s *sender) request(ctx context.Context, ev event, attempt int) (*http.Request, error) {
	body := ev.body(attempt)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.baseURL+"/webhooks/"+ev.provider, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	switch ev.provider {
	case "stripe":
		req.Header.Set("Stripe-Signature", stripeSignature(stripeSecret, time.Now(), body))
	case "github":
		req.Header.Set("X-Hub-Signature-256", githubSignature(githubSecret, body))
		req.Header.Set("X-GitHub-Delivery", ev.id)
		req.Header.Set("X-GitHub-Event", ev.typ)
	}
	return req, nil
}

// deliver sends ev until the receiver answers 2xx, then makes its extra
// deliveries.
func (s *sender) deliver(ctx context.Context, ev event) error {
	attempt := 1
	for ; ; attempt++ {
		client := s.client
		req, err := s.request(ctx, ev, attempt)
		if err != nil {
			return err
		}
		if ev.impatient && attempt == 1 {
			client = s.impatient
			req.Header.Set(holdHeader, "1")
		}
		status, err := s.send(client, req)
		if err == nil && status/100 == 2 {
			if s.verbose {
				s.printf("%s %s attempt %d: %d\n", ev.provider, ev.id, attempt, status)
			}
			break
		}
		if attempt == 5 {
			return fmt.Errorf("%s %s: gave up after %d attempts: status %d, %v", ev.provider, ev.id, attempt, status, err)
		}
		if err != nil {
			s.printf("%s %s attempt %d: no answer within %v, gave up; retrying\n", ev.provider, ev.id, attempt, client.Timeout)
		} else {
			s.printf("%s %s attempt %d: %d; retrying\n", ev.provider, ev.id, attempt, status)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}

	var wg sync.WaitGroup
	errs := make([]error, ev.extra)
	for i := range ev.extra {
		send := func() {
			req, err := s.request(ctx, ev, attempt+1+i)
			if err != nil {
				errs[i] = err
				return
			}
			status, err := s.send(s.client, req)
			if err == nil && status/100 != 2 {
				err = fmt.Errorf("status %d", status)
			}
			if err != nil {
				errs[i] = fmt.Errorf("%s %s extra delivery: %w", ev.provider, ev.id, err)
			} else if s.verbose {
				s.printf("%s %s delivered again: %d\n", ev.provider, ev.id, status)
			}
		}
		if ev.concurrent {
			wg.Go(send)
		} else {
			send()
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (s *sender) send(client *http.Client, req *http.Request) (int, error) {
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// attacks are requests that must be refused: they reach the receiver, and
// nothing of them reaches the queue.
func (s *sender) attacks(ctx context.Context) error {
	forged := `{"id":"evt_forged","object":"event","type":"payout.paid","data":{"object":{"amount":999999}}}`
	captured := `{"id":"evt_3Pex0001WebhookDemo","object":"event","type":"payment_intent.succeeded"}`
	original := `{"ref":"refs/heads/main","after":"0000000000000000000000000000000000000001"}`
	cases := []struct {
		what     string
		provider string
		body     string
		headers  map[string]string
	}{
		{"Stripe event signed with a guessed secret", "stripe", forged,
			map[string]string{"Stripe-Signature": stripeSignature("whsec_guessed", time.Now(), forged)}},
		{"Stripe request captured 10 minutes ago, replayed", "stripe", captured,
			map[string]string{"Stripe-Signature": stripeSignature(stripeSecret, time.Now().Add(-10*time.Minute), captured)}},
		{"GitHub delivery with its body changed", "github", strings.Replace(original, "main", "release", 1),
			map[string]string{"X-Hub-Signature-256": githubSignature(githubSecret, original),
				"X-GitHub-Delivery": "8d1f4c00-0000-11ef-8000-999999999999", "X-GitHub-Event": "push"}},
		{"GitHub delivery without a signature", "github", original,
			map[string]string{"X-GitHub-Delivery": "8d1f4c00-0000-11ef-8000-999999999998", "X-GitHub-Event": "push"}},
	}
	for _, c := range cases {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.baseURL+"/webhooks/"+c.provider, strings.NewReader(c.body))
		if err != nil {
			return err
		}
		for k, v := range c.headers {
			req.Header.Set(k, v)
		}
		status, err := s.send(s.client, req)
		if err != nil {
			return err
		}
		s.printf("refused: %s: %d %s\n", c.what, status, http.StatusText(status))
		if status != http.StatusUnauthorized {
			return fmt.Errorf("%s: answered %d, want 401", c.what, status)
		}
	}
	return nil
}

// stripeSignature is a Stripe-Signature header as Stripe documents it:
// HMAC-SHA256 of "<unix time>.<body>" keyed by the endpoint secret.
func stripeSignature(secret string, t time.Time, body string) string {
	ts := fmt.Sprint(t.Unix())
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts + "." + body))
	return "t=" + ts + ",v1=" + hex.EncodeToString(m.Sum(nil))
}

// githubSignature is an X-Hub-Signature-256 header: HMAC-SHA256 of the
// body keyed by the webhook secret.
func githubSignature(secret, body string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(body))
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}
