package console

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/inboxmill/inboxmill/inbox"
)

// statuses in the order pages show them: the ones that need an operator
// first.
var statuses = []inbox.Status{inbox.StatusPending, inbox.StatusProcessing, inbox.StatusFailed, inbox.StatusCompleted}

func (h *handler) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), h.cfg.Timeout)
}

// storeFailed renders a 500 for a database error. The error goes to the
// log, not to the page: a driver's message can name hosts and users.
func (h *handler) storeFailed(w http.ResponseWriter, r *http.Request, what string, err error) {
	h.log.Error("console: "+what, "path", r.URL.Path, "error", err)
	status, msg := http.StatusInternalServerError, "The database did not answer: "+what+" failed. The console's log has the error."
	if errors.Is(err, context.DeadlineExceeded) {
		status, msg = http.StatusGatewayTimeout, "The database took longer than "+h.cfg.Timeout.String()+" to answer: "+what+" gave up."
	}
	if errors.Is(err, inbox.ErrSchemaOutdated) {
		msg = "The inbox table's schema is older than this console. Run `inboxmill migrate`."
	}
	h.render(w, r, status, "error", &view{Title: "Error", Error: msg})
}

// ---- overview ----

type statusBar struct {
	Status inbox.Status
	N      int64
	Width  int // of the chart's bar, in SVG units
	Y      int
	URL    string
}

type opRow struct {
	Operation string
	ByStatus  []opCell // in the order of statuses
	Total     int64
}

type opCell struct {
	Status inbox.Status
	N      int64
	URL    string
}

type overviewView struct {
	Activity  activityChart
	Overview  inbox.Overview
	Bars      []statusBar
	ChartH    int
	Ops       []opRow
	Statuses  []inbox.Status
	PurgeLag  time.Duration
	Attention bool // something waits for an operator: pending records or an expired lease
	Pending   int64
	Failed    int64
}

const (
	chartBarW = 300 // longest bar, as the template's track
	chartRowH = 32
)

func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	q, ok := h.query(w, r)
	if !ok {
		return
	}
	win, ok := activityWindows[q.Get("window")]
	if !ok {
		h.badInput(w, r, fmt.Sprintf("The window %q is not 24h or 7d.", q.Get("window")))
		return
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	ov, err := h.store.Overview(ctx)
	if err != nil {
		h.storeFailed(w, r, "reading the overview", err)
		return
	}
	v := overviewView{Overview: ov, Statuses: statuses, ChartH: chartRowH * len(statuses)}
	v.Activity = h.activity(ctx, win, ov.Now)
	byStatus := map[inbox.Status]int64{}
	var max int64
	var rows []opRow
	for _, c := range ov.Counts {
		byStatus[c.Status] += c.N
		if len(rows) == 0 || rows[len(rows)-1].Operation != c.Operation {
			row := opRow{Operation: c.Operation}
			for _, s := range statuses {
				row.ByStatus = append(row.ByStatus, opCell{Status: s, URL: listURL(inbox.Filter{Operation: c.Operation, Status: s})})
			}
			rows = append(rows, row)
		}
		row := &rows[len(rows)-1]
		for i := range row.ByStatus {
			if row.ByStatus[i].Status == c.Status {
				row.ByStatus[i].N += c.N
			}
		}
		row.Total += c.N
	}
	for _, s := range statuses {
		max = maxInt64(max, byStatus[s])
	}
	for i, s := range statuses {
		b := statusBar{Status: s, N: byStatus[s], Y: i * chartRowH, URL: listURL(inbox.Filter{Status: s})}
		if max > 0 {
			b.Width = int(float64(chartBarW) * float64(b.N) / float64(max))
			if b.N > 0 && b.Width < 2 {
				b.Width = 2
			}
		}
		v.Bars = append(v.Bars, b)
	}
	v.Ops = rows
	v.Pending, v.Failed = byStatus[inbox.StatusPending], byStatus[inbox.StatusFailed]
	if !ov.OldestExpired.IsZero() && ov.Now.After(ov.OldestExpired) {
		v.PurgeLag = ov.Now.Sub(ov.OldestExpired)
	}
	v.Attention = ov.OldestPending != nil || ov.OldestExpiredLease != nil
	h.render(w, r, http.StatusOK, "overview", &view{Title: "Overview", Nav: "overview", Data: v})
}

func maxInt64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// ---- record list ----

type recordsView struct {
	Form     listForm
	Records  []*inbox.Record
	Now      time.Time
	NextURL  string
	Paged    bool // not the first page
	FirstURL string
	Headers  []sortHeader
	Sorts    []sortOption
}

// sortHeader is a column header of the record list: a link to its sort
// when it has one.
type sortHeader struct {
	Label string
	Class string
	URL   string // "" for a column the list does not sort by
	// Sort is "ascending" or "descending" when the list is sorted by this
	// column (aria-sort), "" otherwise.
	Sort string
}

// sortOption is an entry of the filter form's sort menu.
type sortOption struct {
	Value, Label string
	Selected     bool
}

// sorts are the values of the list's sort parameter, in the order the
// menu offers them: a whitelist, each naming one store order.
var sorts = []struct {
	value, label string
	order        inbox.ListOrder
}{
	{"", "key (scope, operation, key)", inbox.ListOrder{}},
	{"created", "created, oldest first", inbox.ListOrder{Column: inbox.OrderByCreated}},
	{"-created", "created, newest first", inbox.ListOrder{Column: inbox.OrderByCreated, Desc: true}},
	{"updated", "updated, least recently first", inbox.ListOrder{Column: inbox.OrderByUpdated}},
	{"-updated", "updated, most recently first", inbox.ListOrder{Column: inbox.OrderByUpdated, Desc: true}},
	{"attempt", "attempt, lowest first", inbox.ListOrder{Column: inbox.OrderByAttempt}},
	{"-attempt", "attempt, highest first", inbox.ListOrder{Column: inbox.OrderByAttempt, Desc: true}},
}

// parseSort returns the store order of a sort parameter.
func parseSort(s string) (inbox.ListOrder, error) {
	if s == "key" {
		s = ""
	}
	var names []string
	for _, o := range sorts {
		if o.value == s {
			return o.order, nil
		}
		if o.value != "" {
			names = append(names, o.value)
		}
	}
	return inbox.ListOrder{}, fmt.Errorf("sort %q is not one of key, %s", s, strings.Join(names, ", "))
}

// sortValue is the sort parameter of a store order.
func sortValue(o inbox.ListOrder) string {
	for _, s := range sorts {
		if s.order == o {
			return s.value
		}
	}
	return ""
}

// headers returns the record list's column headers for filter f: the
// created, updated and attempt columns link to their sort, ascending, or
// descending when the list is sorted by them ascending already.
func headers(f inbox.Filter) []sortHeader {
	out := []sortHeader{{Label: "Status"}, {Label: "Operation"}, {Label: "Scope"}, {Label: "Key"}}
	for _, c := range []struct {
		label, class string
		col          inbox.OrderColumn
	}{{"Attempt", "n", inbox.OrderByAttempt}, {"Created", "", inbox.OrderByCreated}, {"Updated", "", inbox.OrderByUpdated}} {
		h := sortHeader{Label: c.label, Class: c.class}
		link := f
		link.After = ""
		link.Order = inbox.ListOrder{Column: c.col}
		if f.Order.Column == c.col {
			h.Sort = "ascending"
			if f.Order.Desc {
				h.Sort = "descending"
			} else {
				link.Order.Desc = true
			}
		}
		h.URL = listURL(link)
		out = append(out, h)
	}
	if f.Order == (inbox.ListOrder{}) {
		out[3].Sort = "ascending" // the key
	}
	return append(out, sortHeader{Label: "Lease"})
}

// listForm is the filter as the form shows it.
type listForm struct {
	Status       string
	Operation    string
	Scope        string
	ByScope      bool
	OlderThan    string
	AttemptAbove string
	Limit        string
	Sort         string
}

func (h *handler) list(w http.ResponseWriter, r *http.Request) {
	q, ok := h.query(w, r)
	if !ok {
		return
	}
	if d := strings.TrimSpace(q.Get("digest")); d != "" {
		h.findDigest(w, r, d, strings.TrimSpace(q.Get("operation")))
		return
	}
	form := listForm{
		Status: q.Get("status"), Operation: q.Get("operation"), Scope: q.Get("scope"),
		ByScope: q.Get("byscope") != "", OlderThan: q.Get("older_than"), AttemptAbove: q.Get("attempt_above"),
		Limit: q.Get("limit"), Sort: q.Get("sort"),
	}
	v := recordsView{Form: form, Headers: headers(inbox.Filter{}), Sorts: sortOptions(form.Sort)}
	f, err := parseFilter(q, h.cfg.PageSize)
	if err != nil {
		h.render(w, r, http.StatusBadRequest, "records", &view{Title: "Records", Nav: "records", Error: err.Error(), Data: v})
		return
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	page, err := h.store.List(ctx, f)
	if err != nil {
		if errors.Is(err, inbox.ErrInvalidKey) || errors.Is(err, inbox.ErrInvalidParams) {
			h.render(w, r, http.StatusBadRequest, "records", &view{Title: "Records", Nav: "records", Error: err.Error(), Data: v})
			return
		}
		h.storeFailed(w, r, "listing records", err)
		return
	}
	v.Records, v.Now, v.Headers = page.Records, h.store.Now(), headers(f)
	if page.Next != "" {
		next := f
		next.After = page.Next
		v.NextURL = listURL(next)
	}
	if f.After != "" {
		first := f
		first.After = ""
		v.Paged, v.FirstURL = true, listURL(first)
	}
	h.render(w, r, http.StatusOK, "records", &view{Title: "Records", Nav: "records", Data: v})
}

// sortOptions are the sort menu's entries, with selected chosen.
func sortOptions(selected string) []sortOption {
	var out []sortOption
	for _, s := range sorts {
		out = append(out, sortOption{Value: s.value, Label: s.label, Selected: s.value == selected})
	}
	return out
}

// parseFilter reads a list filter from the query, reporting every bad
// field at once.
func parseFilter(q url.Values, pageSize int) (inbox.Filter, error) {
	f := inbox.Filter{
		Status: inbox.Status(q.Get("status")), Operation: q.Get("operation"), Scope: q.Get("scope"),
		After: q.Get("after"), Limit: pageSize,
	}
	f.ByScope = f.Scope != "" || q.Get("byscope") != ""
	var errs []error
	if f.Status != "" && !f.Status.Valid() {
		errs = append(errs, fmt.Errorf("status %q is not one of pending, processing, failed, completed", f.Status))
	}
	if s := strings.TrimSpace(q.Get("older_than")); s != "" {
		d, err := parseAge(s)
		if err != nil {
			errs = append(errs, err)
		}
		f.OlderThan = d
	}
	if s := strings.TrimSpace(q.Get("attempt_above")); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Errorf("attempt above %q is not a whole number of at least 0", s))
		}
		f.AttemptAbove = n
	}
	if o, err := parseSort(q.Get("sort")); err != nil {
		errs = append(errs, err)
	} else {
		f.Order = o
	}
	if s := strings.TrimSpace(q.Get("limit")); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxLimit {
			errs = append(errs, fmt.Errorf("limit %q is not between 1 and %d", s, maxLimit))
		}
		f.Limit = n
	}
	return f, errors.Join(errs...)
}

// parseAge reads a duration as time.ParseDuration does, plus a number of
// days written in decimal ("2d", "1.5d"). It refuses a negative one and
// one too long for a time.Duration (about 292 years), which a conversion
// from days would silently wrap.
func parseAge(s string) (time.Duration, error) {
	bad := fmt.Errorf("older than %q is not a duration such as 90s, 15m, 2h or 3d (from 0 to 106,751 days)", s)
	if n, ok := strings.CutSuffix(s, "d"); ok && decimal(n) {
		days, err := strconv.ParseFloat(n, 64)
		if err != nil || days*float64(24*time.Hour) >= math.MaxInt64 {
			return 0, bad
		}
		return time.Duration(days * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, bad
	}
	return d, nil
}

// decimal reports whether s is digits with at most one decimal point
// between them: no sign, exponent, hexadecimal or underscore, which
// strconv.ParseFloat would take.
func decimal(s string) bool {
	digits, point := 0, false
	for i, c := range s {
		switch {
		case c >= '0' && c <= '9':
			digits++
		case c == '.' && !point && i > 0 && i < len(s)-1:
			point = true
		default:
			return false
		}
	}
	return digits > 0
}

// listURL is the link to the record list with filter f.
func listURL(f inbox.Filter) string {
	q := url.Values{}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("status", string(f.Status))
	set("operation", f.Operation)
	if f.ByScope {
		q.Set("scope", f.Scope)
		q.Set("byscope", "1")
	}
	if f.OlderThan > 0 {
		q.Set("older_than", f.OlderThan.String())
	}
	if f.AttemptAbove > 0 {
		q.Set("attempt_above", strconv.FormatInt(f.AttemptAbove, 10))
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	set("sort", sortValue(f.Order))
	set("after", f.After)
	if len(q) == 0 {
		return "/records"
	}
	return "/records?" + q.Encode()
}

// ---- one record ----

type recordView struct {
	ID          inbox.ID
	Record      *inbox.Record // nil: no such record (forgotten, purged, never there)
	Now         time.Time
	Live        bool // processing under a live lease
	Resolvable  bool
	Forgettable bool
	Audit       []inbox.AuditEntry
	AuditMore   string // link to the rest of the record's audit entries
	AuditErr    string // why the history could not be read
	Form        actionForm
}

// actionForm is what the resolve and forget forms resubmit after an error.
type actionForm struct {
	To          string
	Reason      string
	Actor       string
	ExternalRef string
}

func (h *handler) recordByID(w http.ResponseWriter, r *http.Request) {
	q, ok := h.query(w, r)
	if !ok {
		return
	}
	id := inbox.ID{Scope: q.Get("scope"), Operation: q.Get("operation"), Key: q.Get("key")}
	if err := id.Validate(); err != nil {
		h.render(w, r, http.StatusBadRequest, "error", &view{Title: "Bad record", Error: "This link does not name a record: " + err.Error()})
		return
	}
	h.showRecord(w, r, id, nil, http.StatusOK, &view{Notice: notices[q.Get("done")]})
}

func (h *handler) recordByDigest(w http.ResponseWriter, r *http.Request) {
	q, ok := h.query(w, r)
	if !ok {
		return
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	rec, err := h.store.FindByDigest(ctx, r.PathValue("digest"), q.Get("operation"))
	if err != nil {
		h.digestFailed(w, r, err)
		return
	}
	h.showRecord(w, r, rec.ID, rec, http.StatusOK, &view{})
}

// findDigest sends the digest search box to the record's page.
func (h *handler) findDigest(w http.ResponseWriter, r *http.Request, digest, operation string) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	rec, err := h.store.FindByDigest(ctx, strings.ToLower(digest), operation)
	if err != nil {
		h.digestFailed(w, r, err)
		return
	}
	http.Redirect(w, r, recordURL(rec.ID), http.StatusSeeOther)
}

func (h *handler) digestFailed(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, inbox.ErrInvalidKey):
		h.render(w, r, http.StatusBadRequest, "error", &view{Title: "Bad digest", Nav: "records",
			Error: "A key digest is the 16 lowercase hex characters that log lines carry as key_digest."})
	case errors.Is(err, inbox.ErrNotFound):
		h.render(w, r, http.StatusNotFound, "error", &view{Title: "Not found", Nav: "records",
			Error: "No record has that key digest (it may have been purged or forgotten)."})
	default:
		h.storeFailed(w, r, "finding the record by digest", err)
	}
}

// showRecord renders the page of id; rec is the record when the caller
// has just read it, nil to read it here. v carries banners and status the
// page's status code.
func (h *handler) showRecord(w http.ResponseWriter, r *http.Request, id inbox.ID, rec *inbox.Record, status int, v *view) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	if rec == nil {
		var err error
		rec, err = h.store.Get(ctx, h.store.DB(), id)
		if err != nil && !errors.Is(err, inbox.ErrNotFound) {
			h.storeFailed(w, r, "reading the record", err)
			return
		}
	}
	rv, _ := v.Data.(recordView)
	rv.ID, rv.Record, rv.Now = id, rec, h.store.Now()
	if rec != nil {
		rv.Live = rec.Status == inbox.StatusProcessing && !rec.LeaseExpired(rv.Now)
		rv.Resolvable = rec.Status == inbox.StatusPending || rec.LeaseExpired(rv.Now)
		rv.Forgettable = !rv.Live
	} else if status == http.StatusOK {
		status = http.StatusNotFound
		if v.Error == "" {
			v.Error = "There is no such record: it was forgotten or purged, or never claimed. Its audit history, if any, is below."
		}
	}
	// The record is worth showing even when its history cannot be read
	// (a table migrated before the audit trail existed).
	entries, next, err := h.store.ListAudit(ctx, inbox.AuditFilter{Record: &id, Limit: 20})
	if err != nil {
		h.log.Error("console: reading the record's audit history", "operation", id.Operation, "key_digest", id.Digest(), "error", err)
		rv.AuditErr = "The audit history could not be read; if the audit table is missing, run `inboxmill migrate`. The console's log has the error."
	}
	rv.Audit = entries
	if next != "" {
		rv.AuditMore = auditURL("", &id, next)
	}
	v.Title, v.Nav, v.Data = "Record "+id.Digest(), "records", rv
	h.render(w, r, status, "record", v)
}

// notices are the banners a redirect after an action asks for by name, so
// that no text of a request is reflected into a page.
var notices = map[string]string{
	"resolved":  "Record resolved. The audit entry is below.",
	"forgotten": "Record forgotten: the next delivery of its message runs the handler again.",
}

// ---- audit ----

type auditView struct {
	Action   string
	Record   *inbox.ID // entries of this record only
	Entries  []inbox.AuditEntry
	NextURL  string
	FirstURL string
}

var auditActions = map[string]bool{"": true, "resolve": true, "forget": true, "purge": true}

func (h *handler) audit(w http.ResponseWriter, r *http.Request) {
	q, ok := h.query(w, r)
	if !ok {
		return
	}
	action := q.Get("action")
	v := auditView{Action: action}
	if q.Get("key") != "" {
		v.Record = &inbox.ID{Scope: q.Get("scope"), Operation: q.Get("operation"), Key: q.Get("key")}
	}
	if !auditActions[action] {
		h.render(w, r, http.StatusBadRequest, "audit", &view{Title: "Audit", Nav: "audit", Data: v,
			Error: "The action filter is one of resolve, forget and purge."})
		return
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	entries, next, err := h.store.ListAudit(ctx, inbox.AuditFilter{Record: v.Record, Action: action, After: q.Get("after"), Limit: h.cfg.PageSize})
	if err != nil {
		if errors.Is(err, inbox.ErrInvalidParams) {
			h.render(w, r, http.StatusBadRequest, "audit", &view{Title: "Audit", Nav: "audit", Data: v, Error: err.Error()})
			return
		}
		h.storeFailed(w, r, "reading the audit trail", err)
		return
	}
	v.Entries = entries
	if next != "" {
		v.NextURL = auditURL(action, v.Record, next)
	}
	if q.Get("after") != "" {
		v.FirstURL = auditURL(action, v.Record, "")
	}
	h.render(w, r, http.StatusOK, "audit", &view{Title: "Audit", Nav: "audit", Data: v, Notice: notices[q.Get("done")]})
}

// auditURL is the link to the audit trail: of one action, of one record
// (nil: every record), from cursor after.
func auditURL(action string, id *inbox.ID, after string) string {
	q := url.Values{}
	if action != "" {
		q.Set("action", action)
	}
	if id != nil {
		q.Set("scope", id.Scope)
		q.Set("operation", id.Operation)
		q.Set("key", id.Key)
	}
	if after != "" {
		q.Set("after", after)
	}
	if len(q) == 0 {
		return "/audit"
	}
	return "/audit?" + q.Encode()
}

// ---- health ----

func (h *handler) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), min(h.cfg.Timeout, 5*time.Second))
	defer cancel()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := h.store.DB().PingContext(ctx); err != nil {
		h.log.Error("console health check: database unreachable", "error", err)
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintln(w, "database unreachable")
		return
	}
	_, _ = fmt.Fprintln(w, "ok")
}
