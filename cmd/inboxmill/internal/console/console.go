package console

import (
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/inboxmill/inboxmill/inbox"
)

// ErrInvalidConfig: the console's configuration is unusable.
var ErrInvalidConfig = errors.New("console: invalid config")

// ErrTokenRequired: a console bound beyond the loopback interface has no
// token, or a console has a token shorter than [MinTokenLen] bytes,
// wherever it listens. See [CheckBind].
var ErrTokenRequired = errors.New("console: a token of at least 16 bytes is required")

// MinTokenLen is the shortest token the console accepts, in bytes: beyond
// the loopback interface, where one is required, and on it, where one is
// optional — a short token is no harder to guess for a local process or a
// browser's page than for a remote one. `openssl rand -hex 32` makes a
// good one.
const MinTokenLen = 16

// Config configures the console. Store is the only required field.
type Config struct {
	// Store is the inbox the console shows and changes. Required.
	Store *inbox.Store

	// Token, when not empty, is required of every request but /healthz,
	// /static/ and the login page: as an "Authorization: Bearer <token>"
	// header, or once through the login form, which then sets an HttpOnly
	// login cookie. It is compared in constant time. Empty: no
	// authentication, which is only safe on a loopback address; the
	// command serving the console calls [CheckBind] to refuse anything
	// else. Without a token the console also answers only requests
	// addressed to it by a loopback name — a Host header of "localhost",
	// an IP address in 127.0.0.0/8 or "[::1]", with any port, or one of
	// AllowedHosts — and 421 Misdirected Request to any other: a page on
	// another site whose name was rebound to 127.0.0.1 (DNS rebinding)
	// gets nothing.
	Token string

	// AllowedHosts are further host names (without a port, compared
	// case-insensitively; an IPv6 address without brackets) that a console
	// without a token answers, for instance the name an SSH tunnel or a
	// local proxy forwards under. Ignored with a Token, which every
	// request must carry anyway. Defaults to none.
	AllowedHosts []string

	// ReadOnly hides the resolve and forget forms and refuses their
	// requests (403). Defaults to false.
	ReadOnly bool

	// Actor is the name written to the audit trail for a resolve or forget
	// whose form leaves the actor field empty. Defaults to "console".
	Actor string

	// Logger receives one line per operator action and per failed
	// request, at Info and Error, and one per request at Debug. Lines name
	// records by operation and key digest, never by key, and carry no
	// reasons, payloads or tokens. Defaults to discarding everything.
	Logger *slog.Logger

	// Registry is where the console registers its metrics — gauges read
	// from [inbox.Store.Overview] (see MetricsMaxAge), and a counter of
	// operator actions — and what /metrics serves. Defaults to a new
	// registry that also holds the Go runtime and process collectors.
	// Registering twice in one registry fails New.
	Registry *prometheus.Registry

	// LoginFailures is how many wrong tokens in a row — through the login
	// form or as bearer tokens — one client may send before it is locked
	// out for LoginLockout. A client is its IP address (an IPv6 address
	// its /64 network); behind a reverse proxy every client is the
	// proxy. Defaults to 5.
	LoginFailures int

	// LoginLockout is how long a client is locked out after LoginFailures
	// wrong tokens: every token it sends meanwhile, the right one too, is
	// answered 429 with Retry-After and not checked. Each wrong token
	// after a lockout locks it out again, twice as long as the last time,
	// up to 16 times LoginLockout; a right token, or a quiet spell of 16
	// times LoginLockout, starts over. A client already logged in keeps
	// its session. Defaults to 1 minute (lockouts of 1, 2, 4, 8 and 16
	// minutes).
	LoginLockout time.Duration

	// LoginTTL is how long a login lasts. Defaults to 12 hours. Logins
	// also end at logout, on the server (a copy of the login cookie does
	// not outlive it), and when the process restarts: sessions are kept
	// and signed in memory only. At most 1000 are live at once; a new one
	// beyond that ends the one closest to its end.
	LoginTTL time.Duration

	// PageSize is how many records and audit entries a page lists unless
	// the request asks for another limit (at most 1000). Defaults to 50.
	PageSize int

	// Timeout bounds the database work of one request and of one metrics
	// scrape. Defaults to 10 seconds.
	Timeout time.Duration

	// MetricsMaxAge is how long the inbox gauges /metrics serves may be
	// reused: a scrape reads [inbox.Store.Overview] (a count over the
	// whole table) only when the last read is older, and concurrent
	// scrapes share one read. A failed read is reused the same way, so a
	// struggling database is not asked again by every scraper. Defaults
	// to 15 seconds; set it below the scrape interval for gauges read
	// afresh at every scrape.
	MetricsMaxAge time.Duration
}

// DefaultActor is Config.Actor's default.
const DefaultActor = "console"

// DefaultMetricsMaxAge is Config.MetricsMaxAge's default.
const DefaultMetricsMaxAge = 15 * time.Second

func (c Config) withDefaults() Config {
	if c.Actor == "" {
		c.Actor = DefaultActor
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.LoginFailures == 0 {
		c.LoginFailures = DefaultLoginFailures
	}
	if c.LoginLockout == 0 {
		c.LoginLockout = DefaultLoginLockout
	}
	if c.LoginTTL == 0 {
		c.LoginTTL = 12 * time.Hour
	}
	if c.PageSize == 0 {
		c.PageSize = 50
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	if c.MetricsMaxAge == 0 {
		c.MetricsMaxAge = DefaultMetricsMaxAge
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, fmt.Errorf("%w: Store is nil", ErrInvalidConfig))
	}
	if c.LoginFailures < 0 {
		errs = append(errs, fmt.Errorf("%w: LoginFailures is negative", ErrInvalidConfig))
	}
	if c.LoginLockout < 0 || c.LoginLockout > 24*time.Hour {
		errs = append(errs, fmt.Errorf("%w: LoginLockout %v is not between 0 and 24h", ErrInvalidConfig, c.LoginLockout))
	}
	if c.LoginTTL < 0 {
		errs = append(errs, fmt.Errorf("%w: LoginTTL is negative", ErrInvalidConfig))
	}
	if c.PageSize < 0 || c.PageSize > maxLimit {
		errs = append(errs, fmt.Errorf("%w: PageSize %d is not between 1 and %d", ErrInvalidConfig, c.PageSize, maxLimit))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("%w: Timeout is negative", ErrInvalidConfig))
	}
	if c.MetricsMaxAge < 0 {
		errs = append(errs, fmt.Errorf("%w: MetricsMaxAge is negative", ErrInvalidConfig))
	}
	for _, host := range c.AllowedHosts {
		if host == "" || strings.ContainsAny(host, " \t\r\n/[]") {
			errs = append(errs, fmt.Errorf("%w: AllowedHosts entry %q is not a host name", ErrInvalidConfig, host))
		} else if _, _, err := net.SplitHostPort(host); err == nil {
			errs = append(errs, fmt.Errorf("%w: AllowedHosts entry %q has a port; give the host alone", ErrInvalidConfig, host))
		}
	}
	if err := inbox.CheckText(c.Actor, inbox.MaxActorLen); err != nil {
		errs = append(errs, fmt.Errorf("%w: Actor %w", ErrInvalidConfig, err))
	}
	if c.Token != "" && len(c.Token) < MinTokenLen {
		errs = append(errs, fmt.Errorf("%w: the token has %d bytes; `openssl rand -hex 32` makes a good one", ErrTokenRequired, len(c.Token)))
	}
	if strings.ContainsAny(c.Token, " \t\r\n") {
		errs = append(errs, fmt.Errorf("%w: Token contains white space, which an Authorization header cannot carry", ErrInvalidConfig))
	}
	return errors.Join(errs...)
}

const (
	// maxLimit is the store's largest page.
	maxLimit = 1000
	// maxFormBytes bounds a POST body.
	maxFormBytes = 64 << 10
)

//go:embed templates/*.html static/*
var assets embed.FS

// handler is the console. It keeps no per-request state.
type handler struct {
	cfg     Config
	store   *inbox.Store
	log     *slog.Logger
	secret  []byte // signs login cookies and CSRF tokens; this process only
	pages   *pages
	actions *prometheus.CounterVec
	gauges  *overviewCollector
	mux     *http.ServeMux
	// origins refuses a state-changing request from another origin, by
	// its Sec-Fetch-Site header or, from a browser that sends none, by
	// its Origin header against its Host.
	origins *http.CrossOriginProtection
	// limiter locks out clients that send wrong tokens; sessions are the
	// live logins.
	limiter  *loginLimiter
	sessions *sessionStore
	now      func() time.Time // the clock of logins and of the login limit
}

// New returns the console as an http.Handler to mount at the root of a
// server (it links to absolute paths). Its routes:
//
//	GET  /                   overview: counts by status and operation, oldest pending, purge backlog
//	GET  /records            records, filtered (status, operation, scope, older_than, attempt_above), paged;
//	                         ?digest=<16 hex> jumps to the record with that key digest
//	GET  /record             one record by ?scope=&operation=&key=, with its audit history
//	GET  /records/{digest}   one record by the key digest logs print (?operation= narrows the search)
//	POST /record/resolve     resolve a pending record, or a processing one whose lease expired
//	POST /record/forget      delete a record so that the next delivery runs again; without
//	                         confirm=yes (and not a dry run) it answers a page that asks first
//	GET  /audit              the audit trail, newest first (?action= filters), paged
//	GET  /login, POST /login, POST /logout   the token login (with Config.Token)
//	GET  /metrics            Prometheus metrics (authenticated like the pages)
//	GET  /healthz            200 when the database answers a ping, 503 otherwise (never authenticated)
//	GET  /static/...         the embedded stylesheet
//
// Every POST needs the CSRF token of a form the console rendered (403
// otherwise); with a Token every route but /healthz, /static/ and /login
// needs it too (401 otherwise). Without a Token, a request addressed to a
// host that is not a loopback name gets 421 (see [Config.Token]). A
// request a browser marks as sent by another site (Sec-Fetch-Site:
// cross-site) gets 403 unless it is a top-level GET navigation (a link
// followed; Sec-Fetch-Mode: navigate and Sec-Fetch-Dest: document) or for
// /static/ or /healthz: another site's page cannot make the console run
// queries behind an image or a script. A POST gets 403 too when
// Sec-Fetch-Site is not same-origin or, from a browser that sends no
// Sec-Fetch-Site, when its Origin header names another host than its Host
// header ([http.CrossOriginProtection]).
func New(cfg Config) (http.Handler, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	h := &handler{cfg: cfg, store: cfg.Store, log: cfg.Logger, secret: make([]byte, 32), origins: http.NewCrossOriginProtection(),
		limiter: newLoginLimiter(cfg.LoginFailures, cfg.LoginLockout), sessions: newSessionStore(), now: time.Now}
	if _, err := rand.Read(h.secret); err != nil {
		return nil, fmt.Errorf("console: secret: %w", err)
	}
	var err error
	if h.pages, err = loadPages(); err != nil {
		return nil, err
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		if err := errors.Join(
			reg.Register(collectors.NewGoCollector()),
			reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})),
		); err != nil {
			return nil, fmt.Errorf("console: metrics: %w", err)
		}
	}
	h.actions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "inboxmill_console_actions_total",
		Help:        "Operator actions submitted through the console, by action (resolve, forget) and result (applied, dry_run, refused, error).",
		ConstLabels: prometheus.Labels{"table": h.store.Table()},
	}, []string{"action", "result"})
	h.gauges = newOverviewCollector(h)
	if err := errors.Join(reg.Register(h.gauges), reg.Register(h.actions)); err != nil {
		return nil, fmt.Errorf("console: metrics: %w", err)
	}

	static, err := fs.Sub(assets, "static")
	if err != nil {
		return nil, fmt.Errorf("console: assets: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", h.protect(h.overview))
	mux.Handle("GET /records", h.protect(h.list))
	mux.Handle("GET /record", h.protect(h.recordByID))
	mux.Handle("GET /records/{digest}", h.protect(h.recordByDigest))
	mux.Handle("POST /record/resolve", h.protect(h.resolve))
	mux.Handle("POST /record/forget", h.protect(h.forget))
	mux.Handle("GET /audit", h.protect(h.audit))
	mux.HandleFunc("GET /login", h.loginPage)
	mux.HandleFunc("POST /login", h.login)
	mux.Handle("POST /logout", h.protect(h.logout))
	for _, path := range []string{"/record/resolve", "/record/forget", "/logout"} {
		mux.HandleFunc(path, postOnly)
	}
	mux.Handle("GET /metrics", h.protect(h.metrics(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slogPrinter{h.log}}))))
	mux.HandleFunc("GET /healthz", h.healthz)
	files := http.StripPrefix("/static/", http.FileServerFS(static))
	mux.HandleFunc("GET /static/", func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/") { // no directory listings
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Cache-Control", "public, max-age=3600")
		files.ServeHTTP(w, r)
	})
	mux.HandleFunc("/", h.notFound)
	h.mux = mux
	return h, nil
}

// ServeHTTP sets the security headers every response carries and routes
// the request.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'self'; script-src 'none'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	// Record URLs carry keys in their query: never hand them to another site.
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
	hd.Set("Cross-Origin-Resource-Policy", "same-origin")
	if !strings.HasPrefix(r.URL.Path, "/static/") {
		hd.Set("Cache-Control", "no-store")
	}
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	start := time.Now()
	switch {
	case !h.hostAllowed(r.Host):
		h.log.Info("console request refused: not addressed to a loopback name", "method", r.Method, "path", r.URL.Path,
			"host", r.Host, "remote", r.RemoteAddr)
		http.Error(sw, "421 misdirected request: this console has no token, so it answers only requests addressed to "+
			"127.0.0.1, [::1] or localhost. Open it by one of those names, or serve it with a token.", http.StatusMisdirectedRequest)
	case crossSite(r):
		h.log.Info("console request refused: sent by another site", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
		http.Error(sw, "403 forbidden: the console does not answer requests another site's page makes; open it directly.",
			http.StatusForbidden)
	case h.origins.Check(r) != nil:
		// A POST from another origin, which the CSRF token alone would
		// not stop if the token ever leaked.
		h.log.Info("console request refused: sent by another site (its Origin is not this console's)", "method", r.Method,
			"path", r.URL.Path, "remote", r.RemoteAddr)
		http.Error(sw, "403 forbidden: this change was sent by another site's page (its Origin is not this console's); "+
			"open the console directly. Behind a reverse proxy, pass the Host header through.", http.StatusForbidden)
	default:
		h.mux.ServeHTTP(sw, r)
	}
	// The path only: a record's query names its key.
	h.log.Debug("console request", "method", r.Method, "path", r.URL.Path, "status", sw.status,
		"duration", time.Since(start).Round(time.Microsecond))
}

type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// postOnly answers any other method on a route that changes state.
func postOnly(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Allow", http.MethodPost)
	http.Error(w, "405 method not allowed: this changes state, and only a POST does that", http.StatusMethodNotAllowed)
}

// slogPrinter adapts promhttp's error log to slog.
type slogPrinter struct{ log *slog.Logger }

func (p slogPrinter) Println(v ...any) { p.log.Error("console metrics", "error", fmt.Sprint(v...)) }

// CheckBind refuses to serve the console on addr without a token of at
// least [MinTokenLen] bytes unless addr is a loopback address:
// "127.0.0.1:8080", "[::1]:8080" and "localhost:8080" pass without one;
// ":8080", "0.0.0.0:8080" and any other host need a token. A token that is
// given must have MinTokenLen bytes on a loopback address too. The host
// must be an IP address or "localhost": another name could resolve
// anywhere. ("localhost" is trusted by name here; a caller should check
// that the listener it gets is on a loopback address.)
func CheckBind(addr, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: address %q: %w", ErrInvalidConfig, addr, err)
	}
	where := host
	if host == "" {
		where = "every interface"
	}
	switch {
	case token == "" && isLoopback(host):
		return nil
	case token == "":
		return fmt.Errorf("%w to listen beyond the loopback interface: %s is not a loopback address; pass a token (--token or INBOXMILL_TOKEN; `openssl rand -hex 32` makes one) or bind to 127.0.0.1", ErrTokenRequired, where)
	case len(token) < MinTokenLen:
		return fmt.Errorf("%w: the token has %d bytes, too few to guard %s; `openssl rand -hex 32` makes a good one", ErrTokenRequired, len(token), where)
	}
	return nil
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// hostAllowed reports whether a console answers a request whose Host
// header is hostport: always with a token; without one, only when the
// host is "localhost", a loopback IP address (IPv6 in brackets) or one of
// Config.AllowedHosts.
func (h *handler) hostAllowed(hostport string) bool {
	if h.cfg.Token != "" {
		return true
	}
	host, ok := hostOnly(hostport)
	if !ok {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return true
	}
	for _, allowed := range h.cfg.AllowedHosts {
		if strings.EqualFold(host, allowed) {
			return true
		}
	}
	return false
}

// hostOnly returns the host of a Host header, without its port and an
// IPv6 address without its brackets. It refuses an IPv6 address without
// brackets, which a Host header cannot carry.
func hostOnly(hostport string) (string, bool) {
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		return host, host != ""
	}
	if strings.HasPrefix(hostport, "[") && strings.HasSuffix(hostport, "]") {
		host := hostport[1 : len(hostport)-1]
		return host, strings.Contains(host, ":")
	}
	return hostport, hostport != "" && !strings.ContainsAny(hostport, ":[]")
}

// crossSite reports whether a browser says another site's page sent r,
// and r is not one the console answers anyway: a top-level GET
// navigation (a link followed, a URL pasted) or a request for /static/
// or /healthz.
func crossSite(r *http.Request) bool {
	if r.Header.Get("Sec-Fetch-Site") != "cross-site" {
		return false
	}
	if r.URL.Path == "/healthz" || strings.HasPrefix(r.URL.Path, "/static/") {
		return false
	}
	navigation := r.Header.Get("Sec-Fetch-Mode") == "navigate" && r.Header.Get("Sec-Fetch-Dest") == "document"
	return !(navigation && (r.Method == http.MethodGet || r.Method == http.MethodHead))
}
