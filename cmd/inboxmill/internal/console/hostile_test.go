package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/cmd/inboxmill/internal/console"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// hostileValues are what a careless or hostile client puts in a field:
// nothing, too much, bytes no database stores as text, numbers too big
// for any integer, negative and absurd durations, times with odd zones.
var hostileValues = []string{
	"", " ", strings.Repeat("x", 70_000), strings.Repeat("é", 3_000), "a\x00b", "\x00", "\xff\xfe\xfd", "a\xc3",
	"99999999999999999999999999", "-1", "-9223372036854775808", "9223372036854775807", "1e308", "NaN", "Inf", "-0",
	"-5m", "-1d", "1e10d", "Infd", "NaNd", "9223372036854775807ns", "106751d", "1e400d", "0x10", "1h+05:45",
	"2024-01-01T00:00:00+14:00", "2024-01-01T00:00:00-12:00", "Pacific/Chatham", "\u0661h", "<script>alert(1)</script>",
	"../../etc/passwd", "%00", "\u202e", "pending\x00", "completed ",
}

// okStatus reports whether a console answering status to a hostile
// request did what it should: a clear 4xx, or the page.
func okStatus(status int) bool {
	return status == http.StatusOK || status == http.StatusSeeOther || (status >= 400 && status < 500)
}

// TestHostileQueries sends hostile values in every query parameter of
// every page, alone and twice over: each gets a clear 4xx or the page,
// never a 5xx, and the page's banner names the problem.
func TestHostileQueries(t *testing.T) {
	eachKind(t, func(t *testing.T, kind testdb.Kind) {
		b := setup(t, kind, console.Config{})
		c := b.client(t)
		pages := map[string][]string{
			"/records":                            {"status", "operation", "scope", "byscope", "older_than", "attempt_above", "limit", "after", "digest", "sort"},
			"/record":                             {"scope", "operation", "key", "done"},
			"/records/" + b.seed.pending.Digest(): {"operation"},
			"/audit":                              {"action", "scope", "operation", "key", "after", "done"},
			"/login":                              {"next"},
			"/":                                   {"x", "window"},
		}
		for path, params := range pages {
			for _, param := range params {
				for _, v := range hostileValues {
					q := url.Values{param: {v}}
					if path == "/record" && param != "key" {
						q.Set("key", b.seed.pending.Key) // a record page needs a key
					}
					name := fmt.Sprintf("%s %s=%.40q", path, param, v)
					r := c.get(path + "?" + q.Encode())
					assert.True(t, okStatus(r.status), "%s: %d %.300s", name, r.status, r.body)
					if r.status == http.StatusBadRequest && strings.HasPrefix(r.header.Get("Content-Type"), "text/html") {
						assert.Contains(t, r.body, `class="banner error"`, name)
					}
				}
			}
		}
		// The same parameter twice is refused: which one counts is not
		// guessed.
		for _, dup := range []string{"/records?status=pending&status=failed", "/records?limit=1&limit=2",
			"/record?key=a&key=b&operation=x", "/audit?action=forget&action=resolve", "/records?sort=created&sort=-created"} {
			r := c.get(dup)
			assert.Equal(t, http.StatusBadRequest, r.status, dup)
			assert.Contains(t, r.body, "more than once", dup)
		}
		// A query that is not a query.
		for _, raw := range []string{"/records?status=%zz", "/records?status=pending;operation=x", "/audit?action=%"} {
			r := c.get(raw)
			assert.Equal(t, http.StatusBadRequest, r.status, raw)
		}
		// An age too large for a duration, and a negative one, say so.
		for _, v := range []string{"1e10d", "Infd", "106752d", "9999999999h", "-1h", "-1d", "0x10d", "1e2d", "+1d"} {
			r := c.get("/records?older_than=" + url.QueryEscape(v))
			require.Equal(t, http.StatusBadRequest, r.status, v)
			assert.Contains(t, r.body, "is not a duration such as", v)
		}
	})
}

// TestHostileForms posts hostile values in every field of the resolve
// and forget forms, with a valid CSRF token: each gets a clear 4xx, or is
// a valid change that is made as asked; none is a 5xx, and a refused one
// changes nothing.
func TestHostileForms(t *testing.T) {
	eachKind(t, func(t *testing.T, kind testdb.Kind) {
		b := setup(t, kind, console.Config{})
		c := b.client(t)
		tok := c.csrf(recordPath(b.seed.pending))
		forms := map[string][]string{
			"/record/resolve": {"scope", "operation", "key", "attempt", "to", "reason", "actor", "external_ref", "mode"},
			"/record/forget":  {"scope", "operation", "key", "attempt", "reason", "actor", "mode", "confirm"},
		}
		for path, fields := range forms {
			for _, field := range fields {
				for _, v := range hostileValues {
					if field == "mode" && v == "" {
						continue // no mode is the apply button's
					}
					// Dry runs, so that nothing may change; a mode that
					// is neither dry-run nor apply must be refused.
					form := actionForm(b.seed.pending, tok, "to", "completed", "reason", "checked", "mode", "dry-run")
					form.Set(field, v)
					before := b.record(t, b.seed.pending)
					name := fmt.Sprintf("%s %s=%.40q", path, field, v)
					r := c.post(path, form)
					assert.True(t, okStatus(r.status) && r.status != http.StatusSeeOther, "%s: %d %.300s", name, r.status, r.body)
					assert.Equal(t, before, b.record(t, b.seed.pending), "%s changed the record", name)
				}
			}
		}
		assert.Empty(t, b.audit(t, b.seed.pending))

		// Fields given twice are refused.
		for _, field := range []string{"key", "scope", "operation", "attempt", "to", "mode", "csrf_token", "reason"} {
			form := actionForm(b.seed.failed, tok, "reason", "x", "mode", "apply", "confirm", "yes", "to", "failed", "attempt", "1")
			form.Add(field, form.Get(field))
			r := c.post("/record/forget", form)
			assert.Equal(t, http.StatusBadRequest, r.status, field)
			assert.Contains(t, r.body, "more than once", field)
		}
		assert.Equal(t, inbox.StatusFailed, b.record(t, b.seed.failed).Status)

		// A body larger than a form may be is 413, and says so.
		big := actionForm(b.seed.failed, tok, "reason", strings.Repeat("x", 70<<10))
		r := c.post("/record/forget", big)
		assert.Equal(t, http.StatusRequestEntityTooLarge, r.status)
		assert.Contains(t, r.body, "too large")
		// A body that is not a form is 400.
		r = c.do(http.MethodPost, "/record/forget", url.Values{"reason": {"%zz"}})
		assert.NotEqual(t, http.StatusSeeOther, r.status)
		assert.Equal(t, inbox.StatusFailed, b.record(t, b.seed.failed).Status)
	})
}
