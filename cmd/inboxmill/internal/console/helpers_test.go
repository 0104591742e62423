package console_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/cmd/inboxmill/internal/console"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// xssKey is a key that runs script if a page does not escape it.
const xssKey = `<img src=x onerror=alert(1)>`

// bundle is what a console test needs: a seeded store, the console in a
// test server, and what the console logged.
type bundle struct {
	store *inbox.Store
	clock *inboxtest.Clock
	srv   *httptest.Server
	logs  *lockedBuffer
	seed  seeded
}

// seeded names the records seed made, and counts them.
type seeded struct {
	pending, expiredLease, live, completed, failed, xss, purgeable inbox.ID
	counts                                                         map[string]map[inbox.Status]int64
	total                                                          int64
	awaitingPurge                                                  int64
}

// setup returns a console over a new, seeded inbox table of kind. cfg.Store
// and cfg.Logger are filled in.
func setup(t *testing.T, kind testdb.Kind, cfg console.Config) *bundle {
	t.Helper()
	b := &bundle{clock: &inboxtest.Clock{}, logs: &lockedBuffer{}}
	icfg := inbox.Config{Now: b.clock.Now}
	if kind == testdb.SQLite {
		icfg.Table = "inbox" // a database file of its own
	}
	b.store = inboxtest.NewStore(t, testdb.Open(t, kind), testdb.Dialect(kind), icfg)
	b.seed = seed(t, b.store, b.clock)
	cfg.Store = b.store
	cfg.Logger = slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h, err := console.New(cfg)
	require.NoError(t, err)
	b.srv = httptest.NewServer(h)
	t.Cleanup(b.srv.Close)
	return b
}

func hash(s string) []byte { h := sha256.Sum256([]byte(s)); return h[:] }

// seed fills the store with an inbox an operator would look at: payment
// charges pending reconciliation, one stuck under an expired lease and one
// in flight, shipped orders, a failed one, receipts awaiting purge, and a
// pending record whose key is markup.
func seed(t *testing.T, store *inbox.Store, clock *inboxtest.Clock) seeded {
	t.Helper()
	ctx := context.Background()
	s := seeded{counts: map[string]map[inbox.Status]int64{}}
	count := func(id inbox.ID, st inbox.Status) {
		if s.counts[id.Operation] == nil {
			s.counts[id.Operation] = map[inbox.Status]int64{}
		}
		s.counts[id.Operation][st]++
		s.total++
	}
	claim := func(id inbox.ID, st inbox.Status, errText string, retention time.Duration) {
		_, err := store.Claim(ctx, store.DB(), inbox.ClaimParams{ID: id, PayloadHash: hash(id.Key), Status: st, Error: errText,
			Retention: retention, CorrelationID: "corr-" + id.Key})
		require.NoError(t, err)
		count(id, st)
	}
	reserve := func(id inbox.ID, lease time.Duration) *inbox.Lease {
		res, err := store.Reserve(ctx, inbox.ReserveParams{ID: id, PayloadHash: hash(id.Key), Owner: "payments-7f9c-" + id.Key[len(id.Key)-4:],
			Lease: lease, Retention: 7 * 24 * time.Hour})
		require.NoError(t, err)
		require.NotNil(t, res.Lease)
		return res.Lease
	}
	pend := func(id inbox.ID, ref string) {
		require.NoError(t, reserve(id, time.Minute).Pend(ctx, ref, "provider timed out after the request was sent"))
		count(id, inbox.StatusPending)
	}

	for i := range 6 {
		claim(inbox.ID{Scope: "acme", Operation: "ship_order", Key: fmt.Sprintf("order-2024-%05d", 1200+i)}, inbox.StatusCompleted, "", 7*24*time.Hour)
	}
	s.completed = inbox.ID{Scope: "acme", Operation: "ship_order", Key: "order-2024-01200"}
	s.failed = inbox.ID{Scope: "globex", Operation: "ship_order", Key: "order-2024-01300"}
	claim(s.failed, inbox.StatusFailed, "carrier rejected the address: postcode missing", 7*24*time.Hour)
	for i := range 3 {
		id := inbox.ID{Scope: "acme", Operation: "send_receipt", Key: fmt.Sprintf("receipt-%05d", 880+i)}
		claim(id, inbox.StatusCompleted, "", 30*time.Minute)
		s.purgeable = id
	}
	s.pending = inbox.ID{Scope: "acme", Operation: "charge_card", Key: "pi_3QyT8fLkd81mZ2aB"}
	pend(s.pending, "ch_3QyT8fLkd81mZ2aB0x7")
	pend(inbox.ID{Scope: "globex", Operation: "charge_card", Key: "pi_3QyU1kPz02nXq9cD"}, "")
	s.xss = inbox.ID{Scope: "acme", Operation: "charge_card", Key: xssKey}
	pend(s.xss, "")
	s.expiredLease = inbox.ID{Scope: "globex", Operation: "charge_card", Key: "pi_3QyV4mRa77tYw1eF"}
	reserve(s.expiredLease, 5*time.Minute)
	count(s.expiredLease, inbox.StatusProcessing)

	// An hour and a quarter later: the receipts have expired, the lease
	// above ran out; one charge is in flight now.
	clock.Advance(75 * time.Minute)
	s.awaitingPurge = 3
	s.live = inbox.ID{Scope: "acme", Operation: "charge_card", Key: "pi_3QyW9nSb55uVx3gH"}
	reserve(s.live, 10*time.Minute)
	count(s.live, inbox.StatusProcessing)
	return s
}

// client is a browser-like HTTP client of the console: it keeps cookies and
// does not follow redirects.
type client struct {
	t    *testing.T
	base string
	http *http.Client
	// header is added to every request.
	header http.Header
	// host, when set, is the Host header of every request.
	host string
}

func (b *bundle) client(t *testing.T) *client {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &client{t: t, base: b.srv.URL, header: http.Header{}, http: &http.Client{
		Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

type response struct {
	status int
	body   string
	header http.Header
}

func (c *client) do(method, path string, form url.Values) response {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.base+path, body)
	require.NoError(c.t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range c.header {
		req.Header[k] = v
	}
	if c.host != "" {
		req.Host = c.host
	}
	res, err := c.http.Do(req)
	require.NoError(c.t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(c.t, err)
	return response{status: res.StatusCode, body: string(b), header: res.Header}
}

func (c *client) get(path string) response { return c.do(http.MethodGet, path, nil) }

func (c *client) post(path string, form url.Values) response {
	return c.do(http.MethodPost, path, form)
}

var csrfRE = regexp.MustCompile(`name="csrf_token" value="([^"]+)"`)

// csrf returns the CSRF token of the forms on the page at path (which also
// sets the cookie).
func (c *client) csrf(path string) string {
	c.t.Helper()
	r := c.get(path)
	m := csrfRE.FindStringSubmatch(r.body)
	require.NotNil(c.t, m, "no CSRF token on %s (status %d)", path, r.status)
	return m[1]
}

// recordPath is the path of id's page, as the console links it.
func recordPath(id inbox.ID) string {
	return "/record?" + url.Values{"scope": {id.Scope}, "operation": {id.Operation}, "key": {id.Key}}.Encode()
}

// actionForm is the form of a resolve or forget of id.
func actionForm(id inbox.ID, csrf string, kv ...string) url.Values {
	v := url.Values{"scope": {id.Scope}, "operation": {id.Operation}, "key": {id.Key}}
	if csrf != "" {
		v.Set("csrf_token", csrf)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v
}

func (b *bundle) record(t *testing.T, id inbox.ID) *inbox.Record {
	t.Helper()
	rec, err := b.store.Get(context.Background(), b.store.DB(), id)
	require.NoError(t, err)
	return rec
}

func (b *bundle) audit(t *testing.T, id inbox.ID) []inbox.AuditEntry {
	t.Helper()
	entries, _, err := b.store.ListAudit(context.Background(), inbox.AuditFilter{Record: &id})
	require.NoError(t, err)
	return entries
}

// lockedBuffer collects log output from concurrent requests.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// eachKind runs f as a parallel subtest against every database.
func eachKind(t *testing.T, f func(t *testing.T, kind testdb.Kind)) {
	for _, kind := range testdb.All {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			f(t, kind)
		})
	}
}
