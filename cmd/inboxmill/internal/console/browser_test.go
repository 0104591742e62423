package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/cmd/inboxmill/internal/console"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// chromium returns the browser to drive: INBOXMILL_CHROMIUM, or Chromium
// (Debian's package chromium) or Chrome on the PATH. Without one the test
// skips, and fails under CI, which must run it.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{os.Getenv("INBOXMILL_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"} {
		if name == "" {
			continue
		}
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no Chromium found (apt-get install -y chromium, or set INBOXMILL_CHROMIUM) and CI is set: the console's browser test must run")
	}
	t.Skip("no Chromium found (apt-get install -y chromium, or set INBOXMILL_CHROMIUM): skipping the console's browser test; set CI=1 to fail instead")
	return ""
}

// browser starts a headless Chromium with a fresh profile and returns a
// context with one tab. Background networking is off: on a closed network
// its connections would be refused and slow everything down.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1360, 900),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	require.NoError(t, chromedp.Do(ctx), "starting %s", chromium(t)) // starts the browser, without a timeout
	return ctx
}

// js quotes v as a JavaScript literal.
func js(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestBrowser drives the console in headless Chromium against a seeded
// SQLite inbox: log in, read the overview, resolve a pending record
// through its form and find it in the audit trail, have requests without
// the CSRF token or with a wrong bearer token refused, and see a key made
// of markup rendered as text. With INBOXMILL_SCREENSHOTS=1 it writes the
// overview and a record page to docs/img.
func TestBrowser(t *testing.T) {
	t.Parallel()
	const token = "browser-test-token-6b1f0c"
	b := setup(t, testdb.SQLite, console.Config{Token: token, Actor: "oncall"})
	ctx := browser(t)
	step := func(name string) context.Context {
		t.Log(name)
		c, cancel := context.WithTimeout(ctx, 60*time.Second)
		t.Cleanup(cancel)
		return c
	}

	// No page may open a dialog: an escaped key runs no script.
	var dialogs atomic.Int32
	opened := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for _, err := range opened {
			if err != nil {
				return
			}
			dialogs.Add(1)
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()

	// Without the token the console answers 401 with its login form.
	c := step("login")
	res, err := chromedp.Run(c, chromedp.NavigateResponse(b.srv.URL+"/"))
	require.NoError(t, err)
	assert.Equal(t, int64(http.StatusUnauthorized), res.Status)
	res, err = chromedp.RunResponse(c,
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.CSS(`.login button[type=submit]`)))
	require.NoError(t, err)
	require.Equal(t, int64(http.StatusOK), res.Status)

	// The overview's counts are the seeded ones.
	c = step("overview")
	require.NoError(t, chromedp.Do(c, chromedp.WaitVisible(chromedp.ID("counts"))))
	type overview struct {
		Total, AwaitingPurge string
		Counts               map[string]map[string]string
		Bars                 []string
	}
	ov, err := chromedp.Run(c, chromedp.Evaluate[overview](`(() => {
		const counts = {};
		for (const tr of document.querySelectorAll('#counts tbody tr')) {
			const op = counts[tr.dataset.operation] = {};
			for (const td of tr.querySelectorAll('td[data-status]')) op[td.dataset.status] = td.textContent.trim();
		}
		return {
			Total: document.getElementById('total').textContent.trim(),
			AwaitingPurge: document.getElementById('awaiting-purge').textContent.trim(),
			Counts: counts,
			Bars: [...document.querySelectorAll('svg.chart g.row')].map(g => g.dataset.status + '=' + g.querySelector('.count').textContent),
		};
	})()`))
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprint(b.seed.total), ov.Total)
	assert.Equal(t, fmt.Sprint(b.seed.awaitingPurge), ov.AwaitingPurge)
	byStatus := map[inbox.Status]int64{}
	for op, want := range b.seed.counts {
		for _, st := range []inbox.Status{inbox.StatusPending, inbox.StatusProcessing, inbox.StatusFailed, inbox.StatusCompleted} {
			assert.Equal(t, fmt.Sprint(want[st]), ov.Counts[op][string(st)], "%s %s", op, st)
			byStatus[st] += want[st]
		}
	}
	assert.Len(t, ov.Counts, len(b.seed.counts))
	assert.Equal(t, []string{
		fmt.Sprintf("pending=%d", byStatus[inbox.StatusPending]), fmt.Sprintf("processing=%d", byStatus[inbox.StatusProcessing]),
		fmt.Sprintf("failed=%d", byStatus[inbox.StatusFailed]), fmt.Sprintf("completed=%d", byStatus[inbox.StatusCompleted]),
	}, ov.Bars)
	screenshot(t, c, "console-overview.png")

	// Resolve a pending record through its form.
	c = step("resolve")
	require.NoError(t, chromedp.Do(c, chromedp.Navigate(b.srv.URL+recordPath(b.seed.pending))))
	status, err := chromedp.Run(c, chromedp.Text(chromedp.ID("status")))
	require.NoError(t, err)
	require.Equal(t, "pending", status)
	require.NoError(t, chromedp.Do(c,
		chromedp.SendKeys(chromedp.CSS(`#resolve textarea[name=reason]`), "Charge ch_3QyT8fLkd81mZ2aB0x7 succeeded at the provider (INC-4211)"),
		chromedp.SendKeys(chromedp.CSS(`#resolve input[name=external_ref]`), "ch_3QyT8fLkd81mZ2aB0x7")))
	screenshot(t, c, "console-record.png")
	res, err = chromedp.RunResponse(c, chromedp.Click(chromedp.ID("resolve-submit")))
	require.NoError(t, err)
	require.Equal(t, int64(http.StatusOK), res.Status)
	status, err = chromedp.Run(c, chromedp.Text(chromedp.ID("status")))
	require.NoError(t, err)
	assert.Equal(t, "completed", status)
	notice, err := chromedp.Run(c, chromedp.Text(chromedp.CSS(".banner.notice")))
	require.NoError(t, err)
	assert.Contains(t, notice, "Record resolved")
	assert.Equal(t, inbox.StatusCompleted, b.record(t, b.seed.pending).Status)

	// ... and it is in the audit trail.
	c = step("audit")
	require.NoError(t, chromedp.Do(c, chromedp.Navigate(b.srv.URL+"/audit")))
	type row struct{ Action, Record, Change, Actor, Reason string }
	rows, err := chromedp.Run(c, chromedp.Evaluate[[]row](`[...document.querySelectorAll('#audit tbody tr')].map(tr => {
		const td = tr.querySelectorAll('td');
		return {Action: td[1].textContent.trim(), Record: td[2].textContent.trim(), Change: td[3].textContent.replace(/\s+/g, ' ').trim(),
			Actor: td[5].textContent.trim(), Reason: td[6].textContent.trim()};
	})`))
	require.NoError(t, err)
	require.Len(t, rows, 1)
	assert.Equal(t, row{Action: "resolve", Record: "charge_card · " + b.seed.pending.Digest(), Change: "pending → completed",
		Actor: "oncall", Reason: "Charge ch_3QyT8fLkd81mZ2aB0x7 succeeded at the provider (INC-4211)"}, rows[0])

	// Forget asks first: its button leads to a confirmation page, and
	// only that page's button deletes the record.
	c = step("forget")
	forgotten := b.seed.completed
	require.NoError(t, chromedp.Do(c,
		chromedp.Navigate(b.srv.URL+recordPath(forgotten)),
		chromedp.SendKeys(chromedp.CSS(`#forget textarea[name=reason]`), "run it again on purpose")))
	res, err = chromedp.RunResponse(c, chromedp.Click(chromedp.CSS(`#forget button.danger`)))
	require.NoError(t, err)
	require.Equal(t, int64(http.StatusOK), res.Status)
	heading, err := chromedp.Run(c, chromedp.Text(chromedp.CSS("#confirm h1")))
	require.NoError(t, err)
	assert.Equal(t, "Forget this record?", heading)
	assert.Equal(t, inbox.StatusCompleted, b.record(t, forgotten).Status, "asked, not deleted")
	res, err = chromedp.RunResponse(c, chromedp.Click(chromedp.ID("confirm-forget")))
	require.NoError(t, err)
	require.Equal(t, int64(http.StatusOK), res.Status)
	notice, err = chromedp.Run(c, chromedp.Text(chromedp.CSS(".banner.notice")))
	require.NoError(t, err)
	assert.Contains(t, notice, "Record forgotten")
	_, err = b.store.Get(context.Background(), b.store.DB(), forgotten)
	require.ErrorIs(t, err, inbox.ErrNotFound)

	// A form submitted without its CSRF token is refused with 403, and the
	// record stays.
	c = step("csrf")
	require.NoError(t, chromedp.Do(c,
		chromedp.Navigate(b.srv.URL+recordPath(b.seed.failed)),
		chromedp.SendKeys(chromedp.CSS(`#forget textarea[name=reason]`), "run it again"),
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#forget input[name=csrf_token]').remove()`)))
	res, err = chromedp.RunResponse(c, chromedp.Click(chromedp.CSS(`#forget button.danger`)))
	require.NoError(t, err)
	assert.Equal(t, int64(http.StatusForbidden), res.Status)
	assert.Equal(t, inbox.StatusFailed, b.record(t, b.seed.failed).Status)
	// The same from a script of the page, with the login cookie.
	code, err := chromedp.Run(c, chromedp.Evaluate[int](`fetch('/record/forget', {method: 'POST', body: new URLSearchParams(`+
		js(map[string]string{"scope": b.seed.failed.Scope, "operation": b.seed.failed.Operation, "key": b.seed.failed.Key, "reason": "x"})+
		`)}).then(r => r.status)`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Equal(t, inbox.StatusFailed, b.record(t, b.seed.failed).Status)

	// A wrong bearer token is refused with 401, even next to a good login
	// cookie; the cookie alone passes.
	c = step("bearer")
	code, err = chromedp.Run(c, chromedp.Evaluate[int](`fetch('/', {headers: {Authorization: 'Bearer not-the-token'}}).then(r => r.status)`,
		chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	assert.Equal(t, http.StatusUnauthorized, code)
	code, err = chromedp.Run(c, chromedp.Evaluate[int](`fetch('/').then(r => r.status)`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)

	// A key made of markup is text: in the list and on its page.
	c = step("escaping")
	require.NoError(t, chromedp.Do(c, chromedp.Navigate(b.srv.URL+"/records?status=pending")))
	type dom struct {
		Keys            []string
		Images, OnError int
	}
	probe := `({
		Keys: [...document.querySelectorAll('td.key a, #key')].map(e => e.textContent),
		Images: [...document.images].filter(i => i.getAttribute('src') === 'x').length,
		OnError: document.querySelectorAll('[onerror]').length,
	})`
	got, err := chromedp.Run(c, chromedp.Evaluate[dom](probe))
	require.NoError(t, err)
	assert.Contains(t, got.Keys, xssKey)
	assert.Zero(t, got.Images, "an <img> from the key")
	assert.Zero(t, got.OnError)
	// Follow the list's own link to the record.
	res, err = chromedp.RunResponse(c, chromedp.Evaluate[chromedp.Void](
		`[...document.querySelectorAll('td.key a')].find(a => a.textContent === `+js(xssKey)+`).click()`))
	require.NoError(t, err)
	require.Equal(t, int64(http.StatusOK), res.Status)
	got, err = chromedp.Run(c, chromedp.Evaluate[dom](probe))
	require.NoError(t, err)
	assert.Equal(t, []string{xssKey}, got.Keys)
	assert.Zero(t, got.Images)
	assert.Zero(t, got.OnError)
	title, err := chromedp.Run(c, chromedp.Title())
	require.NoError(t, err)
	assert.Equal(t, "Record "+b.seed.xss.Digest()+" · inboxmill", title)
	assert.Zero(t, dialogs.Load(), "a page opened a JavaScript dialog")
}

// screenshot writes the page to docs/img/name when INBOXMILL_SCREENSHOTS
// is set.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if os.Getenv("INBOXMILL_SCREENSHOTS") == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	dir := filepath.Join("..", "..", "docs", "img")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), png, 0o644))
	t.Logf("wrote %s", filepath.Join(dir, name))
}

// TestBrowserHostilePage plays another site's page against a console the
// operator is logged in to, in headless Chromium. The page is served from
// another port of the same host (same site, another origin, so the
// browser sends the console's SameSite=Strict login cookie along), and
// its server has fetched a CSRF token of the console's own — any client
// can, from the login page — and plants it as the CSRF cookie. The page
// then submits a forget form carrying that token, and a script POSTs it
// with fetch. Both are refused as sent by another site, and the record
// stays; the same from a page on another site. (Chromium always sends
// Sec-Fetch-Site; TestOriginCheck covers a browser that sends only
// Origin.)
func TestBrowserHostilePage(t *testing.T) {
	t.Parallel()
	const token = "hostile-page-test-token-0123"
	b := setup(t, testdb.SQLite, console.Config{Token: token})
	ctx := browser(t)
	step := func(name string) context.Context {
		t.Log(name)
		c, cancel := context.WithTimeout(ctx, 60*time.Second)
		t.Cleanup(cancel)
		return c
	}

	// The operator logs in.
	c := step("login")
	require.NoError(t, chromedp.Do(c, chromedp.Navigate(b.srv.URL+"/login")))
	res, err := chromedp.RunResponse(c,
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.CSS(`.login button[type=submit]`)))
	require.NoError(t, err)
	require.Equal(t, int64(http.StatusOK), res.Status)

	// The attacker's server takes a CSRF token from the console as any
	// client may, and serves a page that plants it and submits a forget.
	res2, err := http.Get(b.srv.URL + "/login")
	require.NoError(t, err)
	_ = res2.Body.Close()
	var stolen string
	for _, ck := range res2.Cookies() {
		if ck.Name == "inboxmill_csrf" {
			stolen = ck.Value
		}
	}
	require.NotEmpty(t, stolen)
	form := map[string]string{"scope": b.seed.failed.Scope, "operation": b.seed.failed.Operation, "key": b.seed.failed.Key,
		"reason": "hostile", "mode": "apply", "confirm": "yes", "csrf_token": stolen}
	var hits atomic.Int32
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		hits.Add(1)
		// Cookies do not keep ports apart: this one reaches the console.
		http.SetCookie(w, &http.Cookie{Name: "inboxmill_csrf", Value: stolen, Path: "/", SameSite: http.SameSiteLaxMode})
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		var fields strings.Builder
		for k, v := range form {
			fmt.Fprintf(&fields, `<input type="hidden" name="%s" value="%s">`, html.EscapeString(k), html.EscapeString(v))
		}
		fmt.Fprintf(w, `<!doctype html><html><body>
<form id="f" method="post" action="%s/record/forget">%s</form>
<script>
fetch(%s, {method: 'POST', mode: 'no-cors', credentials: 'include', body: new URLSearchParams(%s)})
	.finally(() => document.getElementById('f').submit());
</script></body></html>`, b.srv.URL, fields.String(), js(b.srv.URL+"/record/forget"), js(form))
	}))
	t.Cleanup(evil.Close)

	attack := func(name, pageURL string) {
		t.Helper()
		before := strings.Count(b.logs.String(), "sent by another site")
		c := step(name)
		_, err := chromedp.RunResponse(c, chromedp.Navigate(pageURL))
		require.NoError(t, err)
		// Both the fetch and the form reach the console and are refused
		// as another site's (not merely for a CSRF token: the planted one
		// is valid).
		waitTrue(t, name, func() bool { return strings.Count(b.logs.String(), "sent by another site")-before >= 2 })
		// The form's submission navigated to the console's answer.
		var body string
		waitTrue(t, name+": the console's answer", func() bool {
			body, err = chromedp.Run(c, chromedp.Evaluate[string](`location.href === `+js(b.srv.URL+"/record/forget")+
				` ? document.body.textContent : ""`))
			return err == nil && body != ""
		})
		assert.Contains(t, body, "another site", name)
		assert.Equal(t, inbox.StatusFailed, b.record(t, b.seed.failed).Status, name)
		assert.Empty(t, b.audit(t, b.seed.failed), name)
	}
	// Another port of the console's host: the same site, another origin.
	attack("hostile page on the same host", evil.URL)
	// Another host name for the same server: another site.
	attack("hostile page on another site", strings.Replace(evil.URL, "127.0.0.1", "localhost", 1))
	require.EqualValues(t, 2, hits.Load())
}

// waitTrue polls cond for up to 30 seconds.
func waitTrue(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// overflowProbe lists what sticks out sideways on the page: the page
// itself wider than the viewport, and any element wider than the box that
// scrolls or clips it, or reaching past the viewport's right edge. Text
// that a rule deliberately cuts with an ellipsis does not count.
const overflowProbe = `(() => {
	const vw = document.documentElement.clientWidth, out = [];
	const name = e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (e.className && typeof e.className === 'string' ? '.' + e.className.trim().split(/\s+/).join('.') : '');
	if (document.documentElement.scrollWidth > vw + 1) out.push('page ' + document.documentElement.scrollWidth + 'px > ' + vw + 'px');
	const bad = new Set();
	for (const e of document.body.querySelectorAll('*')) {
		const s = getComputedStyle(e);
		if (s.display === 'none' || s.visibility === 'hidden' || s.textOverflow === 'ellipsis') continue;
		let why = '';
		if (['auto', 'scroll', 'hidden'].includes(s.overflowX) && e.scrollWidth > e.clientWidth + 1) why = ' scrolls ' + e.scrollWidth + '>' + e.clientWidth;
		const r = e.getBoundingClientRect();
		if (!why && r.width > 0 && r.right > vw + 1) why = ' reaches ' + Math.round(r.right) + 'px';
		if (!why) continue;
		bad.add(e);
		// The outermost offender says it; its children would repeat it.
		if (!bad.has(e.parentElement) && out.length < 12) out.push(name(e) + why);
	}
	return out;
})()`

// TestBrowserPhone opens every page of the console in a phone-sized
// viewport (390 by 844 CSS pixels, as an iPhone 12 to 15) and requires that
// nothing overflows sideways: the tabs, tables and forms reflow. With
// INBOXMILL_SCREENSHOTS=1 it writes the overview to docs/img.
func TestBrowserPhone(t *testing.T) {
	t.Parallel()
	const token = "phone-test-token-0123456789"
	b := setup(t, testdb.SQLite, console.Config{Token: token})
	// An audit entry, so that the audit table has a row.
	_, _, err := b.store.Resolve(context.Background(), inbox.ResolveParams{ID: b.seed.expiredLease, To: inbox.StatusFailed,
		Actor: inbox.Actor{Name: "oncall", Reason: "worker died; the provider has no charge for it (INC-4211)"}})
	require.NoError(t, err)
	ctx := browser(t)
	step := func(name string) context.Context {
		t.Log(name)
		c, cancel := context.WithTimeout(ctx, 60*time.Second)
		t.Cleanup(cancel)
		return c
	}
	c := step("viewport")
	require.NoError(t, chromedp.Do(c, chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulateTouch, chromedp.EmulateScale(2))))

	check := func(name, path string, wantStatus int64) {
		t.Helper()
		c := step(name)
		res, err := chromedp.Run(c, chromedp.NavigateResponse(b.srv.URL+path))
		require.NoError(t, err)
		require.Equal(t, wantStatus, res.Status, name)
		width, err := chromedp.Run(c, chromedp.Evaluate[int](`document.documentElement.clientWidth`))
		require.NoError(t, err)
		require.Equal(t, 390, width, "the viewport is a phone's")
		over, err := chromedp.Run(c, chromedp.Evaluate[[]string](overflowProbe))
		require.NoError(t, err)
		assert.Empty(t, over, "%s overflows sideways at 390px", name)
		if dir := os.Getenv("INBOXMILL_PHONE_SHOTS"); dir != "" {
			png, err := chromedp.Run(c, chromedp.FullScreenshot(100))
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644))
		}
	}
	check("login", "/login", http.StatusOK)
	c = step("log in")
	_, err = chromedp.RunResponse(c,
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.CSS(`.login button[type=submit]`)))
	require.NoError(t, err)
	check("overview", "/", http.StatusOK)
	check("overview-week", "/?window=7d", http.StatusOK)
	screenshot(t, step("overview shot"), "console-phone-overview.png")
	check("records", "/records", http.StatusOK)
	check("records-filtered", "/records?status=pending&operation=charge_card", http.StatusOK)
	check("record", recordPath(b.seed.pending), http.StatusOK)
	check("record-xss", recordPath(b.seed.xss), http.StatusOK)
	check("record-failed", recordPath(b.seed.failed), http.StatusOK)
	check("audit", "/audit", http.StatusOK)
	check("not-found", "/nowhere", http.StatusNotFound)

	// The confirmation page of a forget.
	c = step("confirm")
	require.NoError(t, chromedp.Do(c,
		chromedp.Navigate(b.srv.URL+recordPath(b.seed.failed)),
		chromedp.SendKeys(chromedp.CSS(`#forget textarea[name=reason]`), "address fixed; ship it again")))
	res, err := chromedp.RunResponse(c, chromedp.Click(chromedp.CSS(`#forget button.danger`)))
	require.NoError(t, err)
	require.Equal(t, int64(http.StatusOK), res.Status)
	over, err := chromedp.Run(c, chromedp.Evaluate[[]string](overflowProbe))
	require.NoError(t, err)
	assert.Empty(t, over, "the confirmation page overflows sideways at 390px")
}
