package console

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/inboxmill/inboxmill/inbox"
)

// view is what every page template gets. Data is the page's own.
type view struct {
	Title string
	Nav   string // "overview", "records", "audit": the highlighted tab
	// Notice and Error are banners. Both are fixed sentences or store
	// errors, which name records by digest; html/template escapes them.
	Notice string
	Error  string
	Data   any

	// Set by render.
	CSRF     string
	ReadOnly bool
	Auth     bool
	Table    string
	Dialect  string
	Actor    string // the default actor, the forms' placeholder
}

type pages struct{ byName map[string]*template.Template }

var pageNames = []string{"overview", "records", "record", "audit", "login", "error", "confirm"}

func loadPages() (*pages, error) {
	p := &pages{byName: map[string]*template.Template{}}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/audit-table.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		p.byName[name] = t
	}
	return p, nil
}

// render writes page name with status. It renders into a buffer first, so
// that a template error becomes a 500 rather than half a page.
func (h *handler) render(w http.ResponseWriter, r *http.Request, status int, name string, v *view) {
	v.CSRF = h.csrfToken(w, r)
	v.ReadOnly = h.cfg.ReadOnly
	v.Auth = h.cfg.Token != ""
	v.Table = h.store.Table()
	v.Dialect = h.store.Dialect().Name()
	v.Actor = h.cfg.Actor
	var buf bytes.Buffer
	if err := h.pages.byName[name].Execute(&buf, v); err != nil {
		h.log.Error("console template", "page", name, "error", err)
		http.Error(w, "500 internal error: the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

func (h *handler) notFound(w http.ResponseWriter, r *http.Request) {
	if ok, wait := h.authenticate(r); wait > 0 {
		h.tooMany(w, r, wait)
		return
	} else if !ok {
		h.unauthorized(w, r, "")
		return
	}
	h.render(w, r, http.StatusNotFound, "error", &view{Title: "Not found", Error: "There is no such page."})
}

// recordURL is the link to a record's page: its ID, query-escaped.
func recordURL(id inbox.ID) string {
	return "/record?" + url.Values{"scope": {id.Scope}, "operation": {id.Operation}, "key": {id.Key}}.Encode()
}

var funcs = template.FuncMap{
	"recordURL": recordURL,
	"digest":    func(id inbox.ID) string { return id.Digest() },
	"hex":       func(b []byte) string { return hex.EncodeToString(b) },
	"statusClass": func(s inbox.Status) string {
		if s.Valid() {
			return "st-" + string(s)
		}
		return "st-none"
	},
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05 UTC")
	},
	// rel says how far t is from now: "3m 20s ago", "in 45s".
	"rel": func(now, t time.Time) string {
		if t.IsZero() {
			return ""
		}
		d := now.Sub(t)
		if d >= 0 {
			return human(d) + " ago"
		}
		return "in " + human(-d)
	},
	"dur":   human,
	"since": func(now, t time.Time) string { return human(now.Sub(t)) },
	"num":   thousands,
	"bytes": func(n int) string {
		switch {
		case n < 1024:
			return strconv.Itoa(n) + " B"
		case n < 1<<20:
			return fmt.Sprintf("%.1f KiB", float64(n)/1024)
		}
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	},
	"list": func(s ...string) []string { return s },
}

// human formats d to the two largest units that matter to an operator:
// "45s", "12m 5s", "5h 3m", "3d 4h".
func human(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	s := int64(d / time.Second)
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d/time.Millisecond)
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm %ds", s/60, s%60)
	case s < 86400:
		return fmt.Sprintf("%dh %dm", s/3600, s%3600/60)
	}
	return fmt.Sprintf("%dd %dh", s/86400, s%86400/3600)
}

// thousands writes n with thin separators: 1 234 567.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	var out []byte
	for i, c := range []byte(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, c)
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
