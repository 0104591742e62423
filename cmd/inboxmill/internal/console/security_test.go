package console_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/cmd/inboxmill/internal/console"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// TestHostCheck: a console without a token answers only requests
// addressed to a loopback name, so that a page whose DNS name was rebound
// to 127.0.0.1 can neither read it nor submit its forms.
func TestHostCheck(t *testing.T) {
	t.Parallel()
	b := setup(t, testdb.SQLite, console.Config{AllowedHosts: []string{"Console.Tunnel.example"}})
	port := b.srv.Listener.Addr().String()
	port = port[strings.LastIndex(port, ":"):] // ":<port>"

	// The rebinding page first reads a form (and its CSRF cookie) under
	// its own name, then submits it.
	evil := b.client(t)
	evil.host = "attacker.example:8080"
	for _, path := range []string{"/", "/records?status=pending", recordPath(b.seed.pending), "/audit", "/metrics", "/healthz", "/static/console.css", "/login"} {
		r := evil.get(path)
		assert.Equal(t, http.StatusMisdirectedRequest, r.status, path)
		assert.Contains(t, r.body, "127.0.0.1", path)
		assert.NotContains(t, r.body, b.seed.pending.Key, path)
		assert.NotContains(t, r.body, "csrf_token", path)
	}
	// Even with a CSRF token it got some other way, the POST is refused.
	good := b.client(t)
	tok := good.csrf(recordPath(b.seed.failed))
	evil.http.Jar = good.http.Jar
	r := evil.post("/record/forget", actionForm(b.seed.failed, tok, "reason", "x"))
	assert.Equal(t, http.StatusMisdirectedRequest, r.status)
	assert.Equal(t, inbox.StatusFailed, b.record(t, b.seed.failed).Status)
	assert.Contains(t, b.logs.String(), "not addressed to a loopback name")

	for _, host := range []string{"attacker.example", "localhost.attacker.example" + port, "127.0.0.1.nip.io" + port,
		"localhost." + port, "[::2]" + port, "10.0.0.1" + port, "0.0.0.0" + port, "::1", "[::1" + port, "127.1" + port, "tunnel.example" + port} {
		c := b.client(t)
		c.host = host
		assert.Equal(t, http.StatusMisdirectedRequest, c.get("/").status, host)
	}
	for _, host := range []string{"127.0.0.1" + port, "127.0.0.1", "127.8.9.10" + port, "localhost" + port, "LocalHost",
		"[::1]" + port, "[::1]", "console.tunnel.example" + port, "CONSOLE.TUNNEL.EXAMPLE"} {
		c := b.client(t)
		c.host = host
		assert.Equal(t, http.StatusOK, c.get("/").status, host)
		tok := c.csrf(recordPath(b.seed.pending))
		r := c.post("/record/resolve", actionForm(b.seed.pending, tok, "to", "completed", "reason", "x", "mode", "dry-run"))
		assert.Equal(t, http.StatusOK, r.status, host)
	}
	c := b.client(t)
	c.host = "localhost" + port
	tok = c.csrf(recordPath(b.seed.failed))
	r = c.post("/record/forget", actionForm(b.seed.failed, tok, "reason", "x", "confirm", "yes"))
	assert.Equal(t, http.StatusSeeOther, r.status, r.body)

	// With a token, which every request must carry, any name will do: the
	// console may sit behind a proxy under any name.
	const token = "6f1c0e2d9b8a7f6e5d4c3b2a19081726"
	tb := setup(t, testdb.SQLite, console.Config{Token: token})
	tc := tb.client(t)
	tc.host = "console.example.com"
	assert.Equal(t, http.StatusUnauthorized, tc.get("/").status)
	tc.header.Set("Authorization", "Bearer "+token)
	assert.Equal(t, http.StatusOK, tc.get("/").status)

	_, err := console.New(console.Config{Store: b.store, AllowedHosts: []string{"tunnel.example:8080", ""}})
	require.ErrorIs(t, err, console.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "has a port")
	assert.Contains(t, err.Error(), `entry ""`)
}

// TestCrossSiteRequests: what another site's page makes a browser send —
// an image, a script, a fetch, a frame — is refused before it costs a
// query; a link followed from another site still opens the page.
func TestCrossSiteRequests(t *testing.T) {
	t.Parallel()
	b := setup(t, testdb.SQLite, console.Config{})
	digestPath := "/records?digest=" + b.seed.pending.Digest()
	for _, tc := range []struct {
		method, path, site, mode, dest string
		status                         int
	}{
		{"GET", digestPath, "cross-site", "no-cors", "image", http.StatusForbidden},
		{"GET", "/records?status=pending", "cross-site", "no-cors", "script", http.StatusForbidden},
		{"GET", "/metrics", "cross-site", "cors", "empty", http.StatusForbidden},
		{"GET", "/", "cross-site", "navigate", "iframe", http.StatusForbidden},
		{"GET", "/records/" + b.seed.pending.Digest(), "cross-site", "navigate", "object", http.StatusForbidden},
		{"GET", "/nowhere", "cross-site", "no-cors", "image", http.StatusForbidden},
		{"GET", "/audit", "cross-site", "", "", http.StatusForbidden},
		{"POST", "/record/forget", "cross-site", "navigate", "document", http.StatusForbidden},
		{"POST", "/login", "cross-site", "navigate", "document", http.StatusForbidden},
		// A link from another site (an alert, a chat message) opens the page.
		{"GET", digestPath, "cross-site", "navigate", "document", http.StatusSeeOther},
		{"GET", "/", "cross-site", "navigate", "document", http.StatusOK},
		{"GET", "/static/console.css", "cross-site", "no-cors", "style", http.StatusOK},
		{"GET", "/healthz", "cross-site", "cors", "empty", http.StatusOK},
		// The console's own requests, and those of clients that send no
		// Sec-Fetch headers.
		{"GET", digestPath, "same-origin", "no-cors", "image", http.StatusSeeOther},
		{"GET", "/metrics", "none", "navigate", "document", http.StatusOK},
		{"GET", "/metrics", "", "", "", http.StatusOK},
	} {
		name := fmt.Sprintf("%s %s %s/%s/%s", tc.method, tc.path, tc.site, tc.mode, tc.dest)
		c := b.client(t)
		for k, v := range map[string]string{"Sec-Fetch-Site": tc.site, "Sec-Fetch-Mode": tc.mode, "Sec-Fetch-Dest": tc.dest} {
			if v != "" {
				c.header.Set(k, v)
			}
		}
		var form map[string][]string
		if tc.method == http.MethodPost {
			form = actionForm(b.seed.failed, "", "reason", "x")
		}
		r := c.do(tc.method, tc.path, form)
		assert.Equal(t, tc.status, r.status, name)
		if tc.status == http.StatusForbidden {
			assert.Contains(t, r.body, "another site", name)
		}
	}
	assert.Equal(t, inbox.StatusFailed, b.record(t, b.seed.failed).Status)
}

// TestMetricsCache: scrapes within Config.MetricsMaxAge share one read of
// the overview, however many arrive at once; an older one reads again.
func TestMetricsCache(t *testing.T) {
	t.Parallel()
	b := setup(t, testdb.SQLite, console.Config{})
	serve := func(maxAge time.Duration) (*httptest.Server, *atomic.Int64) {
		h, err := console.New(console.Config{Store: b.store, MetricsMaxAge: maxAge})
		require.NoError(t, err)
		var reads atomic.Int64
		console.OnOverviewRead(h, func() {
			reads.Add(1)
			time.Sleep(50 * time.Millisecond) // a slow database: the scrapes overlap
		})
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return srv, &reads
	}
	scrape := func(srv *httptest.Server) string {
		res, err := srv.Client().Get(srv.URL + "/metrics")
		if err != nil {
			return err.Error()
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return fmt.Sprint(res.StatusCode, "\n", string(body))
	}
	up := fmt.Sprintf(`inboxmill_inbox_up{table=%q} 1`, b.store.Table())
	pending := fmt.Sprintf(`inboxmill_inbox_records{operation="charge_card",status="pending",table=%q} 3`, b.store.Table())

	srv, reads := serve(time.Hour)
	const n = 12
	bodies := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bodies[i] = scrape(srv)
		}()
	}
	wg.Wait()
	for _, body := range bodies {
		require.True(t, strings.HasPrefix(body, "200\n"), body)
		assert.Contains(t, body, up)
		assert.Contains(t, body, pending)
	}
	assert.Equal(t, int64(1), reads.Load(), "concurrent scrapes share one read")
	assert.Contains(t, scrape(srv), pending)
	assert.Equal(t, int64(1), reads.Load(), "a later scrape within the max age reads nothing")

	// Past the max age a scrape reads again, and sees what changed.
	srv, reads = serve(time.Second)
	assert.Contains(t, scrape(srv), pending)
	assert.Equal(t, int64(1), reads.Load())
	_, err := b.store.Forget(t.Context(), inbox.ForgetParams{ID: b.seed.pending, Actor: inbox.Actor{Name: "t", Reason: "gauges move"}})
	require.NoError(t, err)
	time.Sleep(1100 * time.Millisecond)
	body := scrape(srv)
	assert.Contains(t, body, strings.Replace(pending, "} 3", "} 2", 1))
	assert.Equal(t, int64(2), reads.Load(), "a scrape past the max age reads again")

	_, err = console.New(console.Config{Store: b.store, MetricsMaxAge: -time.Second})
	require.ErrorIs(t, err, console.ErrInvalidConfig)
}

// TestOriginCheck: a state-changing request whose Origin is another site
// is refused even with the login cookie and a valid CSRF token, as an
// older browser that sends no Sec-Fetch-Site headers would send a hostile
// page's form. The console's own origin passes.
func TestOriginCheck(t *testing.T) {
	t.Parallel()
	const token = "origin-test-token-0123456789"
	b := setup(t, testdb.SQLite, console.Config{Token: token})
	c := b.client(t)
	tok := c.csrf("/login")
	require.Equal(t, http.StatusSeeOther, c.post("/login", map[string][]string{"token": {token}, "csrf_token": {tok}}).status)
	tok = c.csrf(recordPath(b.seed.failed))

	posts := []struct {
		path string
		form map[string][]string
	}{
		{"/record/forget", actionForm(b.seed.failed, tok, "reason", "x", "mode", "apply", "confirm", "yes")},
		{"/record/resolve", actionForm(b.seed.pending, tok, "to", "completed", "reason", "x", "mode", "apply")},
		{"/login", map[string][]string{"token": {token}, "csrf_token": {tok}}},
		{"/logout", map[string][]string{"csrf_token": {tok}}},
	}
	for _, origin := range []string{"https://evil.example", "http://evil.example", "null", "http://localhost.evil.example",
		strings.Replace(b.srv.URL, "127.0.0.1", "localhost", 1), "garbage"} {
		c.header.Set("Origin", origin)
		for _, p := range posts {
			r := c.post(p.path, p.form)
			assert.Equal(t, http.StatusForbidden, r.status, "%s from %s", p.path, origin)
			assert.Contains(t, r.body, "another site", "%s from %s", p.path, origin)
		}
	}
	assert.Equal(t, inbox.StatusFailed, b.record(t, b.seed.failed).Status)
	assert.Equal(t, inbox.StatusPending, b.record(t, b.seed.pending).Status)
	assert.Empty(t, b.audit(t, b.seed.failed))
	assert.Contains(t, b.logs.String(), "another site")
	// Reading needs no Origin check: a link followed from another site
	// still opens a page.
	assert.Equal(t, http.StatusOK, c.get("/").status)

	// The console's own origin, as a browser sends it with its forms.
	c.header.Set("Origin", b.srv.URL)
	r := c.post("/record/forget", posts[0].form)
	assert.Equal(t, http.StatusSeeOther, r.status, r.body)
	// No Origin at all: a client that is not a browser.
	c.header.Del("Origin")
	r = c.post("/record/resolve", posts[1].form)
	assert.Equal(t, http.StatusSeeOther, r.status, r.body)
}
