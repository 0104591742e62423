package console_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/cmd/inboxmill/internal/console"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testdb"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

// TestOverviewAndMetrics checks the overview's and /metrics' figures
// against what was seeded, on every database.
func TestOverviewAndMetrics(t *testing.T) {
	eachKind(t, func(t *testing.T, kind testdb.Kind) {
		b := setup(t, kind, console.Config{})
		c := b.client(t)
		r := c.get("/")
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.Contains(t, r.body, fmt.Sprintf(`id="total">%d<`, b.seed.total))
		assert.Contains(t, r.body, fmt.Sprintf(`id="awaiting-purge">%d<`, b.seed.awaitingPurge))
		// The oldest pending record was claimed 75 minutes before now.
		assert.Regexp(t, `id="oldest-pending">1h 1[56]m<`, r.body)
		for op, byStatus := range b.seed.counts {
			row := regexp.MustCompile(`(?s)<tr data-operation="` + op + `">(.*?)</tr>`).FindStringSubmatch(r.body)
			require.NotNil(t, row, "no row for %s", op)
			for _, st := range []inbox.Status{inbox.StatusPending, inbox.StatusProcessing, inbox.StatusFailed, inbox.StatusCompleted} {
				cell := regexp.MustCompile(`<td class="n" data-status="` + string(st) + `"[^>]*>(?:<a [^>]*>|<span class="muted">)(\d+)<`).FindStringSubmatch(row[1])
				require.NotNil(t, cell, "no %s cell for %s", st, op)
				assert.Equal(t, fmt.Sprint(byStatus[st]), cell[1], "%s %s", op, st)
			}
		}

		m := c.get("/metrics")
		require.Equal(t, http.StatusOK, m.status)
		table := b.store.Table()
		for op, byStatus := range b.seed.counts {
			for _, st := range []inbox.Status{inbox.StatusPending, inbox.StatusProcessing, inbox.StatusFailed, inbox.StatusCompleted} {
				assert.Contains(t, m.body, fmt.Sprintf(`inboxmill_inbox_records{operation=%q,status=%q,table=%q} %d`, op, st, table, byStatus[st]))
			}
		}
		assert.Contains(t, m.body, fmt.Sprintf(`inboxmill_inbox_up{table=%q} 1`, table))
		assert.Contains(t, m.body, fmt.Sprintf(`inboxmill_inbox_awaiting_purge{table=%q} %d`, table, b.seed.awaitingPurge))
		age := regexp.MustCompile(`inboxmill_inbox_oldest_pending_age_seconds\{table="` + table + `"\} (\S+)`).FindStringSubmatch(m.body)
		require.NotNil(t, age, m.body)
		var secs float64
		_, err := fmt.Sscan(age[1], &secs)
		require.NoError(t, err)
		assert.InDelta(t, 75*60, secs, 60)
		lease := regexp.MustCompile(`inboxmill_inbox_oldest_expired_lease_age_seconds\{table="` + table + `"\} (\S+)`).FindStringSubmatch(m.body)
		require.NotNil(t, lease)
		assert.NotEqual(t, "0", lease[1])
		assert.Contains(t, m.body, "go_goroutines") // the default registry's runtime metrics
	})
}

// TestResolveAndForget drives the forms as a browser would: read the page,
// submit its form with the CSRF token, follow the redirect.
func TestResolveAndForget(t *testing.T) {
	eachKind(t, func(t *testing.T, kind testdb.Kind) {
		b := setup(t, kind, console.Config{Actor: "oncall"})
		c := b.client(t)
		page := c.get(recordPath(b.seed.pending))
		require.Equal(t, http.StatusOK, page.status)
		require.Contains(t, page.body, `action="/record/resolve"`)
		require.Contains(t, page.body, `action="/record/forget"`)
		tok := csrfRE.FindStringSubmatch(page.body)[1]
		rec := b.record(t, b.seed.pending)

		// A dry run checks and changes nothing.
		r := c.post("/record/resolve", actionForm(b.seed.pending, tok, "to", "completed", "reason", "checked", "mode", "dry-run",
			"attempt", fmt.Sprint(rec.Attempt)))
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.Contains(t, r.body, "Dry run: resolving would move this record from pending")
		assert.Equal(t, inbox.StatusPending, b.record(t, b.seed.pending).Status)
		assert.Empty(t, b.audit(t, b.seed.pending))

		r = c.post("/record/resolve", actionForm(b.seed.pending, tok, "to", "completed", "reason", "charge ch_3Qy found at the provider",
			"external_ref", "ch_3QyT8fLkd81mZ2aB0x7", "attempt", fmt.Sprint(rec.Attempt), "mode", "apply"))
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		loc := r.header.Get("Location")
		require.True(t, strings.HasPrefix(loc, "/record?"), loc)
		r = c.get(loc)
		require.Equal(t, http.StatusOK, r.status)
		assert.Contains(t, r.body, "Record resolved.")
		assert.Contains(t, r.body, `id="status">completed<`)
		assert.Contains(t, r.body, "charge ch_3Qy found at the provider") // its history
		assert.Equal(t, inbox.StatusCompleted, b.record(t, b.seed.pending).Status)
		entries := b.audit(t, b.seed.pending)
		require.Len(t, entries, 1)
		assert.Equal(t, "oncall", entries[0].Actor) // Config.Actor, as the form left it empty
		assert.Equal(t, inbox.StatusPending, entries[0].StatusBefore)
		assert.Equal(t, inbox.StatusCompleted, entries[0].StatusAfter)
		a := c.get("/audit")
		assert.Contains(t, a.body, "charge ch_3Qy found at the provider")
		assert.Contains(t, a.body, b.seed.pending.Digest())

		// Forget, with the actor the form names, confirmed (see
		// TestForgetConfirms).
		r = c.post("/record/forget", actionForm(b.seed.failed, tok, "reason", "address fixed; ship again", "actor", "alice",
			"mode", "apply", "confirm", "yes"))
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		_, err := b.store.Get(context.Background(), b.store.DB(), b.seed.failed)
		require.ErrorIs(t, err, inbox.ErrNotFound)
		a = c.get(r.header.Get("Location"))
		assert.Contains(t, a.body, "Record forgotten")
		assert.Contains(t, a.body, "address fixed; ship again")
		entries = b.audit(t, b.seed.failed)
		require.Len(t, entries, 1)
		assert.Equal(t, "alice", entries[0].Actor)
		assert.Equal(t, "forget", entries[0].Action)
		// The forgotten record's page says so and keeps its history.
		g := c.get(recordPath(b.seed.failed))
		assert.Equal(t, http.StatusNotFound, g.status)
		assert.Contains(t, g.body, "address fixed; ship again")
	})
}

// TestActionsRefused checks what the console refuses and that a refused
// action changes nothing and writes no audit entry.
func TestActionsRefused(t *testing.T) {
	eachKind(t, func(t *testing.T, kind testdb.Kind) {
		b := setup(t, kind, console.Config{})
		c := b.client(t)
		tok := c.csrf(recordPath(b.seed.pending))
		for _, tc := range []struct {
			name   string
			path   string
			id     inbox.ID
			form   []string
			status int
			says   string
		}{
			{"no reason", "/record/resolve", b.seed.pending, []string{"to", "completed", "reason", "  "}, http.StatusBadRequest, "a reason is required"},
			{"bad target", "/record/resolve", b.seed.pending, []string{"to", "pending", "reason", "x"}, http.StatusBadRequest, "resolve to completed or failed"},
			{"reason too long", "/record/resolve", b.seed.pending, []string{"to", "failed", "reason", strings.Repeat("x", inbox.MaxReasonLen+1)}, http.StatusBadRequest, "more than"},
			{"live lease", "/record/resolve", b.seed.live, []string{"to", "completed", "reason", "x"}, http.StatusConflict, "live lease"},
			{"live lease forget", "/record/forget", b.seed.live, []string{"reason", "x"}, http.StatusConflict, "live lease"},
			{"finished", "/record/resolve", b.seed.completed, []string{"to", "failed", "reason", "x"}, http.StatusConflict, "Only a pending record"},
			{"attempt moved on", "/record/resolve", b.seed.pending, []string{"to", "completed", "reason", "x", "attempt", "7"}, http.StatusConflict, "changed since this page was loaded"},
			{"ref with failed", "/record/resolve", b.seed.pending, []string{"to", "failed", "reason", "x", "external_ref", "ch_1"}, http.StatusBadRequest, "external reference"},
			{"no such record", "/record/forget", inbox.ID{Operation: "ship_order", Key: "nope"}, []string{"reason", "x"}, http.StatusNotFound, "no such record"},
		} {
			before, _ := b.store.Get(context.Background(), b.store.DB(), tc.id)
			r := c.post(tc.path, actionForm(tc.id, tok, tc.form...))
			assert.Equal(t, tc.status, r.status, tc.name)
			assert.Contains(t, r.body, html.EscapeString(tc.says), tc.name)
			after, _ := b.store.Get(context.Background(), b.store.DB(), tc.id)
			assert.Equal(t, before, after, "%s changed the record", tc.name)
			assert.Empty(t, b.audit(t, tc.id), tc.name)
		}
		// The expired lease can be resolved.
		r := c.post("/record/resolve", actionForm(b.seed.expiredLease, tok, "to", "failed", "reason", "worker died; provider has no charge"))
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		assert.Equal(t, inbox.StatusFailed, b.record(t, b.seed.expiredLease).Status)
	})
}

// TestCSRF checks that no state-changing request succeeds without the
// CSRF token of a form this console rendered.
func TestCSRF(t *testing.T) {
	eachKind(t, func(t *testing.T, kind testdb.Kind) {
		b := setup(t, kind, console.Config{})
		c := b.client(t)
		tok := c.csrf(recordPath(b.seed.pending))

		other := setup(t, testdb.SQLite, console.Config{})
		oc := other.client(t)
		otherTok := oc.csrf(recordPath(other.seed.pending))

		resolve := func(c *client, tok string) response {
			return c.post("/record/resolve", actionForm(b.seed.pending, tok, "to", "completed", "reason", "x"))
		}
		fresh := b.client(t) // no cookie at all
		assert.Equal(t, http.StatusForbidden, resolve(fresh, "").status, "no cookie, no field")
		assert.Equal(t, http.StatusForbidden, resolve(fresh, tok).status, "field without its cookie")
		assert.Equal(t, http.StatusForbidden, resolve(c, "").status, "cookie without the field")
		assert.Equal(t, http.StatusForbidden, resolve(c, tok+"x").status, "wrong field")
		assert.Equal(t, http.StatusForbidden, resolve(c, otherTok).status, "another console's token")

		// Another console's cookie and field, consistent but not signed here.
		forged := b.client(t)
		u, _ := url.Parse(b.srv.URL)
		forged.http.Jar.SetCookies(u, []*http.Cookie{{Name: "inboxmill_csrf", Value: otherTok}})
		assert.Equal(t, http.StatusForbidden, resolve(forged, otherTok).status, "token signed by another process")

		// A browser's word that another site sent it.
		c.header.Set("Sec-Fetch-Site", "cross-site")
		assert.Equal(t, http.StatusForbidden, resolve(c, tok).status, "cross-site")
		c.header.Del("Sec-Fetch-Site")

		assert.Equal(t, http.StatusForbidden, c.post("/record/forget", actionForm(b.seed.pending, "", "reason", "x")).status)
		assert.Equal(t, inbox.StatusPending, b.record(t, b.seed.pending).Status)
		assert.Empty(t, b.audit(t, b.seed.pending))

		// State changes are POST only.
		assert.Equal(t, http.StatusMethodNotAllowed, c.get("/record/resolve?"+actionForm(b.seed.pending, tok, "to", "completed", "reason", "x").Encode()).status)
		assert.Equal(t, http.StatusMethodNotAllowed, c.get("/record/forget").status)

		// And with the token it works.
		r := resolve(c, tok)
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		assert.Equal(t, inbox.StatusCompleted, b.record(t, b.seed.pending).Status)
	})
}

// TestEscaping checks that a key made of markup is text on every page that
// shows it.
func TestEscaping(t *testing.T) {
	eachKind(t, func(t *testing.T, kind testdb.Kind) {
		b := setup(t, kind, console.Config{})
		c := b.client(t)
		tok := c.csrf(recordPath(b.seed.xss))
		r := c.post("/record/resolve", actionForm(b.seed.xss, tok, "to", "failed",
			"reason", `<script>alert("reason")</script>`, "actor", `<b onmouseover=alert(2)>eve</b>`))
		require.Equal(t, http.StatusSeeOther, r.status, r.body)

		escaped := html.EscapeString(xssKey)
		for _, path := range []string{
			"/records?operation=charge_card",
			recordPath(b.seed.xss),
			"/records/" + b.seed.xss.Digest(),
			"/audit",
		} {
			p := c.get(path)
			require.Equal(t, http.StatusOK, p.status, path)
			assert.NotContains(t, p.body, "<img src=x", path)
			assert.NotContains(t, p.body, "onerror=alert(1)>", path)
			assert.NotContains(t, p.body, "<script>", path)
			assert.NotContains(t, p.body, "<b onmouseover", path)
			assert.Contains(t, p.body, escaped, path)
		}
		rec := c.get(recordPath(b.seed.xss))
		assert.Contains(t, rec.body, `id="key">`+escaped+`<`)
		// The link the list page gives is the query-escaped ID.
		links := regexp.MustCompile(`<td class="key"[^>]*><a href="([^"]*)"`).FindAllStringSubmatch(c.get("/records?operation=charge_card").body, -1)
		var ids []inbox.ID
		for _, l := range links {
			u, err := url.Parse(html.UnescapeString(l[1]))
			require.NoError(t, err)
			assert.Equal(t, "/record", u.Path)
			q := u.Query()
			ids = append(ids, inbox.ID{Scope: q.Get("scope"), Operation: q.Get("operation"), Key: q.Get("key")})
		}
		assert.Contains(t, ids, b.seed.xss)
	})
}

// TestListFilters checks the filters and paging of the record list.
func TestListFilters(t *testing.T) {
	eachKind(t, func(t *testing.T, kind testdb.Kind) {
		b := setup(t, kind, console.Config{})
		c := b.client(t)
		keys := func(body string) []string {
			var out []string
			for _, m := range regexp.MustCompile(`<td class="key"[^>]*><a href="[^"]*" title="([^"]*)"`).FindAllStringSubmatch(body, -1) {
				out = append(out, html.UnescapeString(m[1]))
			}
			return out
		}
		r := c.get("/records?status=pending")
		require.Equal(t, http.StatusOK, r.status)
		assert.ElementsMatch(t, []string{b.seed.pending.Key, "pi_3QyU1kPz02nXq9cD", xssKey}, keys(r.body))
		r = c.get("/records?status=processing&operation=charge_card")
		assert.ElementsMatch(t, []string{b.seed.live.Key, b.seed.expiredLease.Key}, keys(r.body))
		r = c.get("/records?scope=globex")
		assert.ElementsMatch(t, []string{b.seed.failed.Key, "pi_3QyU1kPz02nXq9cD", b.seed.expiredLease.Key}, keys(r.body))
		assert.Empty(t, keys(c.get("/records?byscope=1").body), "the global scope is empty")
		// Created more than an hour ago: all but the live lease.
		assert.Len(t, keys(c.get("/records?older_than=1h").body), int(b.seed.total-1))
		assert.Empty(t, keys(c.get("/records?older_than=2d").body))
		assert.Empty(t, keys(c.get("/records?attempt_above=1").body))

		// Page through everything, two at a time.
		var all []string
		path := "/records?limit=2"
		for pages := 0; path != ""; pages++ {
			require.Less(t, pages, 20)
			r := c.get(path)
			require.Equal(t, http.StatusOK, r.status)
			got := keys(r.body)
			require.LessOrEqual(t, len(got), 2)
			all = append(all, got...)
			path = ""
			if m := regexp.MustCompile(`<a href="([^"]*)" rel="next">`).FindStringSubmatch(r.body); m != nil {
				path = html.UnescapeString(m[1])
			}
		}
		assert.Len(t, all, int(b.seed.total))

		for _, bad := range []string{"status=lost", "older_than=soon", "attempt_above=-1", "limit=5000", "after=garbage"} {
			r := c.get("/records?" + bad)
			assert.Equal(t, http.StatusBadRequest, r.status, bad)
			assert.Contains(t, r.body, `class="banner error"`, bad)
		}
	})
}

// TestFindByDigest checks the ways in by the digest a log line prints.
func TestFindByDigest(t *testing.T) {
	eachKind(t, func(t *testing.T, kind testdb.Kind) {
		b := setup(t, kind, console.Config{})
		c := b.client(t)
		d := b.seed.pending.Digest()
		r := c.get("/records?digest=" + strings.ToUpper(d))
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		assert.Equal(t, recordPath(b.seed.pending), r.header.Get("Location"))
		r = c.get("/records/" + d + "?operation=charge_card")
		require.Equal(t, http.StatusOK, r.status)
		assert.Contains(t, r.body, `id="key">`+b.seed.pending.Key+`<`)
		assert.Equal(t, http.StatusNotFound, c.get("/records/"+d+"?operation=ship_order").status)
		assert.Equal(t, http.StatusNotFound, c.get("/records/0123456789abcdef").status)
		assert.Equal(t, http.StatusBadRequest, c.get("/records/xyz").status)
		assert.Equal(t, http.StatusBadRequest, c.get("/record?operation=&key=").status)
	})
}

// TestAuth checks the token: as a bearer token, through the login form,
// and what needs it.
func TestAuth(t *testing.T) {
	t.Parallel()
	const token = "s3cr3t-console-token-0123456789"
	// Many wrong tokens from one address: the login limit has a test of
	// its own.
	b := setup(t, testdb.SQLite, console.Config{Token: token, LoginFailures: 1000})
	anon := b.client(t)
	for _, path := range []string{"/", "/records", recordPath(b.seed.pending), "/audit", "/metrics", "/nowhere"} {
		r := anon.get(path)
		assert.Equal(t, http.StatusUnauthorized, r.status, path)
		assert.Equal(t, `Bearer realm="inboxmill"`, r.header.Get("WWW-Authenticate"), path)
		for _, secret := range []string{"provider timed out", "ship_order", "<code>" + b.store.Table() + "</code>", "inboxmill_inbox_records"} {
			assert.NotContains(t, r.body, secret, path)
		}
	}
	assert.Contains(t, anon.get("/").body, `action="/login"`, "the 401 page is the login form")
	assert.Equal(t, http.StatusOK, anon.get("/healthz").status, "health checks need no token")
	assert.Equal(t, http.StatusOK, anon.get("/static/console.css").status)

	for name, auth := range map[string]string{
		"wrong token":  "Bearer " + token + "x",
		"prefix":       "Bearer " + token[:10],
		"empty":        "Bearer ",
		"other scheme": "Basic " + token,
		"no scheme":    token,
	} {
		c := b.client(t)
		c.header.Set("Authorization", auth)
		assert.Equal(t, http.StatusUnauthorized, c.get("/").status, name)
		// A POST with a wrong token is refused before its CSRF token is looked at.
		assert.Equal(t, http.StatusUnauthorized, c.post("/record/resolve", actionForm(b.seed.pending, "", "to", "completed", "reason", "x")).status, name)
	}
	bearer := b.client(t)
	bearer.header.Set("Authorization", "bearer "+token)
	assert.Equal(t, http.StatusOK, bearer.get("/").status)
	assert.Equal(t, http.StatusOK, bearer.get("/metrics").status)
	// A bearer token does not excuse a missing CSRF token.
	assert.Equal(t, http.StatusForbidden, bearer.post("/record/resolve", actionForm(b.seed.pending, "", "to", "completed", "reason", "x")).status)

	// The login form.
	c := b.client(t)
	tok := c.csrf("/login?next=" + url.QueryEscape("/audit"))
	assert.Equal(t, http.StatusForbidden, c.post("/login", url.Values{"token": {token}}).status, "login needs the CSRF token too")
	r := c.post("/login", url.Values{"token": {"guess"}, "csrf_token": {tok}, "next": {"/audit"}})
	assert.Equal(t, http.StatusUnauthorized, r.status)
	assert.Contains(t, r.body, "That token is not the console")
	r = c.post("/login", url.Values{"token": {token}, "csrf_token": {tok}, "next": {"/audit"}})
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	assert.Equal(t, "/audit", r.header.Get("Location"))
	var login *http.Cookie
	for _, ck := range (&http.Response{Header: r.header}).Cookies() {
		if ck.Name == "inboxmill_login" {
			login = ck
		}
	}
	require.NotNil(t, login)
	assert.True(t, login.HttpOnly)
	assert.Equal(t, http.SameSiteStrictMode, login.SameSite)
	assert.NotContains(t, login.Value, token)
	assert.Equal(t, http.StatusOK, c.get("/").status)
	// Logged in, the forms work.
	r = c.post("/record/resolve", actionForm(b.seed.pending, c.csrf(recordPath(b.seed.pending)), "to", "completed", "reason", "x"))
	assert.Equal(t, http.StatusSeeOther, r.status, r.body)
	// A wrong Authorization header is not rescued by a good cookie.
	c.header.Set("Authorization", "Bearer nope")
	assert.Equal(t, http.StatusUnauthorized, c.get("/").status)
	c.header.Del("Authorization")

	// A tampered login cookie.
	u, _ := url.Parse(b.srv.URL)
	tampered := b.client(t)
	exp, sig, _ := strings.Cut(login.Value, ".")
	tampered.http.Jar.SetCookies(u, []*http.Cookie{{Name: "inboxmill_login", Value: exp + "9." + sig}})
	assert.Equal(t, http.StatusUnauthorized, tampered.get("/").status)

	// The login form's next field stays on this site.
	for _, next := range []string{"https://evil.example/", "//evil.example/", `/\evil.example`, "/\t/evil.example/", "/\n/evil.example/", "///evil.example"} {
		c := b.client(t)
		tok := c.csrf("/login")
		r := c.post("/login", url.Values{"token": {token}, "csrf_token": {tok}, "next": {next}})
		require.Equal(t, http.StatusSeeOther, r.status)
		assert.Equal(t, "/", r.header.Get("Location"), next)
	}

	// Logging out ends the login.
	r = c.post("/logout", url.Values{"csrf_token": {c.csrf("/")}})
	require.Equal(t, http.StatusSeeOther, r.status)
	assert.Equal(t, http.StatusUnauthorized, c.get("/").status)
}

// TestReadOnly checks that a read-only console shows no forms and refuses
// their requests.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, testdb.SQLite, console.Config{ReadOnly: true})
	c := b.client(t)
	page := c.get(recordPath(b.seed.pending))
	require.Equal(t, http.StatusOK, page.status)
	assert.NotContains(t, page.body, `action="/record/resolve"`)
	assert.NotContains(t, page.body, `action="/record/forget"`)
	assert.Contains(t, page.body, "read-only")
	tok := "" // a read-only console renders no form to take a token from; it refuses before looking
	r := c.post("/record/resolve", actionForm(b.seed.pending, tok, "to", "completed", "reason", "x"))
	assert.Equal(t, http.StatusForbidden, r.status)
	assert.Contains(t, r.body, "read-only")
	assert.Equal(t, http.StatusForbidden, c.post("/record/forget", actionForm(b.seed.pending, tok, "reason", "x")).status)
	assert.Equal(t, inbox.StatusPending, b.record(t, b.seed.pending).Status)
	assert.Empty(t, b.audit(t, b.seed.pending))
	m := c.get("/metrics")
	assert.Contains(t, m.body, `inboxmill_console_actions_total{action="resolve",result="refused"`)
}

// TestSecurityHeaders checks the headers every response carries.
func TestSecurityHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, testdb.SQLite, console.Config{Token: "t0ken-t0ken-t0ken"})
	c := b.client(t)
	for _, path := range []string{"/", "/login", "/healthz", "/static/console.css", "/nowhere"} {
		r := c.get(path)
		csp := r.header.Get("Content-Security-Policy")
		assert.Contains(t, csp, "default-src 'self'", path)
		assert.Contains(t, csp, "frame-ancestors 'none'", path)
		assert.Contains(t, csp, "script-src 'none'", path)
		assert.Equal(t, "nosniff", r.header.Get("X-Content-Type-Options"), path)
		assert.Equal(t, "DENY", r.header.Get("X-Frame-Options"), path)
		assert.Equal(t, "no-referrer", r.header.Get("Referrer-Policy"), path)
	}
	assert.Equal(t, "no-store", c.get("/login").header.Get("Cache-Control"))
	var csrf *http.Cookie
	for _, ck := range (&http.Response{Header: b.client(t).get("/login").header}).Cookies() {
		if ck.Name == "inboxmill_csrf" {
			csrf = ck
		}
	}
	require.NotNil(t, csrf)
	assert.Equal(t, http.SameSiteStrictMode, csrf.SameSite)
	assert.True(t, csrf.HttpOnly)
}

// TestLogsCarryNoKeys checks that the console's log names records by
// digest and leaves keys, reasons and tokens out.
func TestLogsCarryNoKeys(t *testing.T) {
	t.Parallel()
	const token = "tok-9f8e7d6c5b4a"
	b := setup(t, testdb.SQLite, console.Config{Token: token})
	c := b.client(t)
	tok := c.csrf("/login")
	require.Equal(t, http.StatusUnauthorized, c.post("/login", url.Values{"token": {"guess-1234"}, "csrf_token": {tok}}).status)
	require.Equal(t, http.StatusSeeOther, c.post("/login", url.Values{"token": {token}, "csrf_token": {tok}}).status)
	tok = c.csrf(recordPath(b.seed.xss))
	r := c.post("/record/resolve", actionForm(b.seed.xss, tok, "to", "completed", "reason", "REASON-sensitive-note"))
	require.Equal(t, http.StatusSeeOther, r.status)
	r = c.post("/record/forget", actionForm(b.seed.live, tok, "reason", "REASON-two"))
	require.Equal(t, http.StatusConflict, r.status)
	c.get(recordPath(b.seed.pending))

	logs := b.logs.String()
	assert.Contains(t, logs, b.seed.xss.Digest())
	assert.Contains(t, logs, b.seed.live.Digest())
	assert.Contains(t, logs, "console resolve")
	for _, secret := range []string{xssKey, "img src", b.seed.pending.Key, b.seed.live.Key, "REASON", token, "guess-1234", tok} {
		assert.NotContains(t, logs, secret)
	}
}

// TestHealthz checks /healthz against a database that answers and one that
// is gone.
func TestHealthz(t *testing.T) {
	t.Parallel()
	b := setup(t, testdb.SQLite, console.Config{})
	c := b.client(t)
	r := c.get("/healthz")
	assert.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "ok\n", r.body)
	require.NoError(t, b.store.DB().Close())
	r = c.get("/healthz")
	assert.Equal(t, http.StatusServiceUnavailable, r.status)
	m := c.get("/metrics")
	assert.Equal(t, http.StatusOK, m.status)
	assert.Contains(t, m.body, fmt.Sprintf(`inboxmill_inbox_up{table=%q} 0`, b.store.Table()))
	assert.Equal(t, http.StatusInternalServerError, c.get("/").status)
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	_, err := console.New(console.Config{})
	require.ErrorIs(t, err, console.ErrInvalidConfig)

	b := setup(t, testdb.SQLite, console.Config{})
	_, err = console.New(console.Config{Store: b.store, PageSize: -1, Token: "two words"})
	require.ErrorIs(t, err, console.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "PageSize")
	assert.Contains(t, err.Error(), "white space")
	// The handler refuses a short token whatever the address: a caller
	// that skips CheckBind gets no weaker console.
	_, err = console.New(console.Config{Store: b.store, Token: "0123456789abcde"})
	require.ErrorIs(t, err, console.ErrTokenRequired)
	assert.Contains(t, err.Error(), "15 bytes")

	reg := prometheus.NewRegistry()
	_, err = console.New(console.Config{Store: b.store, Registry: reg})
	require.NoError(t, err)
	_, err = console.New(console.Config{Store: b.store, Registry: reg})
	var already prometheus.AlreadyRegisteredError
	require.True(t, errors.As(err, &already), "%v", err)
	families, err := reg.Gather()
	require.NoError(t, err)
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
	}
	assert.Contains(t, names, "inboxmill_inbox_records")
}

func TestCheckBind(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr, token string
		err         error
	}{
		{"127.0.0.1:8080", "", nil},
		{"127.0.0.9:8080", "", nil},
		{"[::1]:8080", "", nil},
		{"localhost:8080", "", nil},
		{":8080", "", console.ErrTokenRequired},
		{"0.0.0.0:8080", "", console.ErrTokenRequired},
		{"[::]:8080", "", console.ErrTokenRequired},
		{"10.1.2.3:8080", "", console.ErrTokenRequired},
		{"console.internal:8080", "", console.ErrTokenRequired},
		{"0.0.0.0:8080", "t", console.ErrTokenRequired},
		{"0.0.0.0:8080", "0123456789abcde", console.ErrTokenRequired}, // 15 bytes
		{"0.0.0.0:8080", "0123456789abcdef", nil},
		{":8080", strings.Repeat("f", 64), nil},
		// A token is optional on loopback, but one given must be as long
		// as anywhere: a short one is as guessable from a local process.
		{"127.0.0.1:8080", "t", console.ErrTokenRequired},
		{"[::1]:8080", "0123456789abcde", console.ErrTokenRequired},
		{"localhost:8080", "short", console.ErrTokenRequired},
		{"127.0.0.1:8080", "0123456789abcdef", nil},
		{"no-port", "", console.ErrInvalidConfig},
	} {
		err := console.CheckBind(tc.addr, tc.token)
		if tc.err == nil {
			assert.NoError(t, err, tc.addr)
		} else {
			assert.ErrorIs(t, err, tc.err, tc.addr)
		}
	}
}

// TestMain fails the binary when a test leaves a goroutine behind: the
// console starts none of its own.
func TestMain(m *testing.M) { testkit.MainWithLeakCheck(m) }

// TestForgetConfirms: the forget form asks for confirmation first — a
// page that says what will be deleted and what follows, with its own
// button — and only that button's request deletes the record.
func TestForgetConfirms(t *testing.T) {
	eachKind(t, func(t *testing.T, kind testdb.Kind) {
		b := setup(t, kind, console.Config{})
		c := b.client(t)
		tok := c.csrf(recordPath(b.seed.failed))
		for _, mode := range []string{"apply", ""} {
			r := c.post("/record/forget", actionForm(b.seed.failed, tok, "reason", "address fixed", "actor", "alice", "mode", mode))
			require.Equal(t, http.StatusOK, r.status, r.body)
			assert.Contains(t, r.body, "Forget this record?")
			assert.Contains(t, r.body, "runs the handler again")
			assert.Contains(t, r.body, `name="confirm" value="yes"`)
			assert.Contains(t, r.body, `value="address fixed"`, "the reason is carried over")
			assert.Contains(t, r.body, `href="`+html.EscapeString(recordPath(b.seed.failed))+`"`, "a way back")
			assert.Equal(t, inbox.StatusFailed, b.record(t, b.seed.failed).Status, "asked, not deleted")
			assert.Empty(t, b.audit(t, b.seed.failed))
		}
		assert.Equal(t, http.StatusBadRequest, c.post("/record/forget",
			actionForm(b.seed.failed, tok, "reason", "x", "mode", "apply", "confirm", "y")).status)

		// The confirmation page's own form deletes it.
		page := c.post("/record/forget", actionForm(b.seed.failed, tok, "reason", "address fixed", "mode", "apply"))
		form := url.Values{}
		for _, m := range regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`).FindAllStringSubmatch(page.body, -1) {
			form.Set(m[1], html.UnescapeString(m[2]))
		}
		require.Equal(t, "yes", form.Get("confirm"))
		r := c.post("/record/forget", form)
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		_, err := b.store.Get(context.Background(), b.store.DB(), b.seed.failed)
		require.ErrorIs(t, err, inbox.ErrNotFound)
		require.Len(t, b.audit(t, b.seed.failed), 1)
	})
}

// TestListSort: the record list sorts on the server by a column the
// sort parameter names from a fixed list, each way, and pages in that
// order; the column headers and the filter form link to the sorts.
func TestListSort(t *testing.T) {
	eachKind(t, func(t *testing.T, kind testdb.Kind) {
		b := setup(t, kind, console.Config{})
		c := b.client(t)
		// A record taken over, so that attempts differ.
		l, err := b.store.TakeOver(context.Background(), b.record(t, b.seed.expiredLease), inbox.TakeOverParams{Owner: "w2", Lease: time.Hour})
		require.NoError(t, err)
		require.NoError(t, l.Release(context.Background(), "handed back"))
		all, err := b.store.List(context.Background(), inbox.Filter{Limit: 1000})
		require.NoError(t, err)
		keyRe := regexp.MustCompile(`<td class="key"[^>]*><a href="[^"]*" title="([^"]*)"`)
		keys := func(body string) []string {
			var out []string
			for _, m := range keyRe.FindAllStringSubmatch(body, -1) {
				out = append(out, html.UnescapeString(m[1]))
			}
			return out
		}
		for sortParam, less := range map[string]func(a, b *inbox.Record) int{
			"created":  func(a, b *inbox.Record) int { return a.CreatedAt.Compare(b.CreatedAt) },
			"-created": func(a, b *inbox.Record) int { return b.CreatedAt.Compare(a.CreatedAt) },
			"updated":  func(a, b *inbox.Record) int { return a.UpdatedAt.Compare(b.UpdatedAt) },
			"-updated": func(a, b *inbox.Record) int { return b.UpdatedAt.Compare(a.UpdatedAt) },
			"attempt":  func(a, b *inbox.Record) int { return cmp.Compare(a.Attempt, b.Attempt) },
			"-attempt": func(a, b *inbox.Record) int { return cmp.Compare(b.Attempt, a.Attempt) },
		} {
			desc := strings.HasPrefix(sortParam, "-")
			sorted := slices.Clone(all.Records)
			slices.SortStableFunc(sorted, func(x, y *inbox.Record) int {
				if n := less(x, y); n != 0 {
					return n
				}
				n := cmp.Or(strings.Compare(x.Scope, y.Scope), strings.Compare(x.Operation, y.Operation), strings.Compare(x.Key, y.Key))
				if desc {
					return -n
				}
				return n
			})
			var want []string
			for _, r := range sorted {
				want = append(want, r.Key)
			}
			// One page, and pages of two.
			r := c.get("/records?sort=" + url.QueryEscape(sortParam))
			require.Equal(t, http.StatusOK, r.status, r.body)
			assert.Equal(t, want, keys(r.body), sortParam)
			var paged []string
			path := "/records?limit=2&sort=" + url.QueryEscape(sortParam)
			for pages := 0; path != ""; pages++ {
				require.Less(t, pages, 20)
				r := c.get(path)
				require.Equal(t, http.StatusOK, r.status, r.body)
				paged = append(paged, keys(r.body)...)
				path = ""
				if m := regexp.MustCompile(`<a href="([^"]*)" rel="next">`).FindStringSubmatch(r.body); m != nil {
					path = html.UnescapeString(m[1])
					assert.Contains(t, path, "sort="+url.QueryEscape(sortParam), "the next page keeps the sort")
				}
			}
			assert.Equal(t, want, paged, "%s in pages of two", sortParam)
		}
		// The headers link to the sorts: ascending first, then the other
		// way; the form offers them too.
		header := func(body, label string) string {
			m := regexp.MustCompile(`<a class="sort" href="([^"]*)">` + label).FindStringSubmatch(body)
			require.NotNil(t, m, "no sort link on %s", label)
			return html.UnescapeString(m[1])
		}
		r := c.get("/records?status=pending")
		link := header(r.body, "Created")
		assert.Contains(t, link, "sort=created")
		assert.Contains(t, link, "status=pending", "a sort keeps the filter")
		assert.Contains(t, r.body, `<option value="-updated"`)
		r = c.get("/records?sort=created")
		assert.Contains(t, header(r.body, "Created"), "sort=-created")
		assert.Contains(t, header(r.body, "Updated"), "sort=updated")
		assert.Contains(t, r.body, `<th aria-sort="ascending"><a class="sort"`)
		assert.Contains(t, r.body, `<option value="created" selected>`)
		assert.Contains(t, c.get("/records?sort=-created").body, `<th aria-sort="descending"><a class="sort"`)
		for _, bad := range []string{"payload_hash", "created_at;drop", "Created", "--created", " created"} {
			r := c.get("/records?sort=" + url.QueryEscape(bad))
			assert.Equal(t, http.StatusBadRequest, r.status, bad)
			assert.Contains(t, r.body, "is not one of", bad)
		}
		// A cursor of one order is refused in another.
		first := c.get("/records?limit=2&sort=created")
		m := regexp.MustCompile(`<a href="([^"]*)" rel="next">`).FindStringSubmatch(first.body)
		require.NotNil(t, m)
		next := strings.Replace(html.UnescapeString(m[1]), "sort=created", "sort=-created", 1)
		assert.Equal(t, http.StatusBadRequest, c.get(next).status)
	})
}

// TestOverviewActivity: the overview charts the records' outcomes over
// time — completed, failed and pending, by when they last changed — as an
// SVG the server renders, in hourly bars over a day or six-hour bars over
// a week, under the same strict Content-Security-Policy: no script, no
// inline style.
func TestOverviewActivity(t *testing.T) {
	eachKind(t, func(t *testing.T, kind testdb.Kind) {
		b := setup(t, kind, console.Config{})
		c := b.client(t)
		barRe := regexp.MustCompile(`<g class="bar" data-start="([^"]+)" data-completed="(\d+)" data-failed="(\d+)" data-pending="(\d+)">`)
		all, err := b.store.List(context.Background(), inbox.Filter{Limit: 1000})
		require.NoError(t, err)
		for window, w := range map[string]struct {
			width time.Duration
			n     int
		}{"": {time.Hour, 24}, "24h": {time.Hour, 24}, "7d": {6 * time.Hour, 28}} {
			path := "/"
			if window != "" {
				path += "?window=" + window
			}
			r := c.get(path)
			require.Equal(t, http.StatusOK, r.status, r.body)
			assert.Contains(t, r.body, `id="activity"`)
			assert.NotContains(t, r.body, "<script")
			assert.NotContains(t, r.body, " style=")
			csp := r.header.Get("Content-Security-Policy")
			assert.Equal(t, "default-src 'self'; script-src 'none'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'", csp)
			bars := barRe.FindAllStringSubmatch(r.body, -1)
			require.Len(t, bars, w.n, window)
			// The buckets end with the one that holds now, and each
			// record counts in the bucket of its last change.
			now := b.store.Now()
			start := now.Truncate(w.width).Add(w.width - time.Duration(w.n)*w.width)
			want := make([][3]int, w.n)
			for _, rec := range all.Records {
				i := int(rec.UpdatedAt.Sub(start) / w.width)
				if rec.UpdatedAt.Before(start) || i >= w.n {
					continue
				}
				switch rec.Status {
				case inbox.StatusCompleted:
					want[i][0]++
				case inbox.StatusFailed:
					want[i][1]++
				case inbox.StatusPending:
					want[i][2]++
				}
			}
			for i, bar := range bars {
				at, err := time.Parse(time.RFC3339, bar[1])
				require.NoError(t, err)
				assert.Equal(t, start.Add(time.Duration(i)*w.width).UTC(), at, "bar %d starts", i)
				got := [3]int{}
				for j := range got {
					_, err := fmt.Sscan(bar[2+j], &got[j])
					require.NoError(t, err)
				}
				assert.Equal(t, want[i], got, "%s bar %d (%s)", window, i, bar[1])
			}
		}
		r := c.get("/?window=1y")
		assert.Equal(t, http.StatusBadRequest, r.status)
		assert.Contains(t, r.body, "window")
	})
}
