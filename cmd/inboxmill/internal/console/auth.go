package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

const (
	loginCookie = "inboxmill_login"
	csrfCookie  = "inboxmill_csrf"
	csrfField   = "csrf_token"
)

// protect wraps a route that needs the token (when one is configured):
// 401 with the login page for a request without a valid bearer token or
// login cookie, 429 for a bearer token from a client locked out by the
// login limit.
func (h *handler) protect(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok, wait := h.authenticate(r)
		switch {
		case wait > 0:
			h.tooMany(w, r, wait)
		case !ok:
			h.unauthorized(w, r, "")
		default:
			next(w, r)
		}
	})
}

// authenticate reports whether r carries the token: in an Authorization
// header, which when present decides alone, or as the login cookie of a
// live session. A bearer token counts as a login attempt: a wrong one is
// a failure for the login limit, and a client locked out by it gets the
// time it must wait, its token unchecked.
func (h *handler) authenticate(r *http.Request) (ok bool, wait time.Duration) {
	if h.cfg.Token == "" {
		return true, 0
	}
	if a := r.Header.Get("Authorization"); a != "" {
		client, now := clientOf(r.RemoteAddr), h.now()
		if wait := h.limiter.wait(client, now); wait > 0 {
			return false, wait
		}
		scheme, cred, ok := strings.Cut(a, " ")
		if ok && strings.EqualFold(scheme, "Bearer") && h.tokenMatches(strings.TrimSpace(cred)) {
			h.limiter.succeeded(client)
			return true, 0
		}
		return false, h.failedToken(r, client, now)
	}
	c, err := r.Cookie(loginCookie)
	if err != nil {
		return false, 0
	}
	_, ok = h.validLogin(c.Value, h.now())
	return ok, 0
}

// authenticated is authenticate without the wait.
func (h *handler) authenticated(r *http.Request) bool {
	ok, _ := h.authenticate(r)
	return ok
}

// failedToken records a wrong token from client and returns the lockout
// it started (0: none), which it logs.
func (h *handler) failedToken(r *http.Request, client string, now time.Time) time.Duration {
	wait := h.limiter.failed(client, now)
	if wait > 0 {
		h.log.Info("console login locked out: too many wrong tokens", "client", client, "remote", r.RemoteAddr, "for", wait)
	}
	return wait
}

// tooMany answers a client locked out by the login limit: 429 with
// Retry-After, and on the login page the login form saying so.
func (h *handler) tooMany(w http.ResponseWriter, r *http.Request, wait time.Duration) {
	secs := int64((wait + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	msg := fmt.Sprintf("Too many failed logins from your address: try again in %s.", human(time.Duration(secs)*time.Second))
	if r.URL.Path != "/login" {
		http.Error(w, "429 too many requests: "+msg, http.StatusTooManyRequests)
		return
	}
	h.render(w, r, http.StatusTooManyRequests, "login", &view{Title: "Log in", Error: msg,
		Data: loginView{Next: localPath(r.PostFormValue("next"))}})
}

// tokenMatches compares in constant time. Both sides are hashed first so
// that the comparison does not even reveal the token's length.
func (h *handler) tokenMatches(got string) bool {
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(h.cfg.Token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// mac signs parts with the process secret. The parts are separated by a
// NUL byte, which none of them contains.
func (h *handler) mac(parts ...string) []byte {
	m := hmac.New(sha256.New, h.secret)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

var b64 = base64.RawURLEncoding

// newLogin starts a session and returns its login cookie value: the
// session's ID, its expiry in Unix seconds and a MAC of both (and of the
// token, so that a console restarted with another token refuses it even
// under the same secret).
func (h *handler) newLogin(now time.Time) string {
	expAt := now.Add(h.cfg.LoginTTL)
	exp := strconv.FormatInt(expAt.Unix(), 10)
	id := h.sessions.add(now, time.Unix(expAt.Unix(), 0))
	return id + "." + exp + "." + b64.EncodeToString(h.mac("login", id, exp, h.cfg.Token))
}

// parseLogin returns the session ID of a login cookie value this process
// signed, expired or not.
func (h *handler) parseLogin(v string) (id string, exp int64, ok bool) {
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return "", 0, false
	}
	unix, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return "", 0, false
	}
	got, err := b64.DecodeString(parts[2])
	if err != nil || !hmac.Equal(got, h.mac("login", parts[0], parts[1], h.cfg.Token)) {
		return "", 0, false
	}
	return parts[0], unix, true
}

// validLogin reports whether v is the login cookie of a session that is
// live at now, and returns its ID.
func (h *handler) validLogin(v string, now time.Time) (string, bool) {
	id, exp, ok := h.parseLogin(v)
	if !ok || now.Unix() >= exp || !h.sessions.live(id, now) {
		return "", false
	}
	return id, true
}

// csrfToken returns the CSRF token for the forms of the page being
// rendered: the one in the request's cookie when the console signed it,
// or a new one, which it sets as the cookie. The token is a random nonce
// and its MAC; a POST must send it both as the cookie and as the form
// field (a signed double-submit token). A page on another site can
// neither read the cookie nor, SameSite=Strict, make the browser send it.
func (h *handler) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && h.validCSRF(c.Value) {
		return c.Value
	}
	var nonce [24]byte
	_, _ = rand.Read(nonce[:])
	n := b64.EncodeToString(nonce[:])
	tok := n + "." + b64.EncodeToString(h.mac("csrf", n))
	http.SetCookie(w, &http.Cookie{
		Name: csrfCookie, Value: tok, Path: "/",
		HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode,
	})
	return tok
}

func (h *handler) validCSRF(tok string) bool {
	n, sig, ok := strings.Cut(tok, ".")
	if !ok {
		return false
	}
	got, err := b64.DecodeString(sig)
	return err == nil && hmac.Equal(got, h.mac("csrf", n))
}

// checkCSRF reports whether a POST carries the CSRF token in its cookie and
// in its form, the same in both and signed by this process. The form must
// have been read (readForm).
func (h *handler) checkCSRF(r *http.Request) bool {
	// A browser says where a request comes from; refuse what another site
	// sent even before looking at the token.
	if site := r.Header.Get("Sec-Fetch-Site"); site == "cross-site" || site == "same-site" {
		return false
	}
	c, err := r.Cookie(csrfCookie)
	if err != nil || !h.validCSRF(c.Value) {
		return false
	}
	field := r.PostForm.Get(csrfField)
	return subtle.ConstantTimeCompare([]byte(field), []byte(c.Value)) == 1
}

// secure reports whether the request reached the console over TLS
// (directly or through a proxy that says so), so that its cookies are
// marked Secure.
func secure(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

func (h *handler) unauthorized(w http.ResponseWriter, r *http.Request, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="inboxmill"`)
	if r.URL.Path == "/metrics" || r.Method == http.MethodPost && r.URL.Path != "/login" {
		http.Error(w, "401 unauthorized: send the console token as \"Authorization: Bearer <token>\" or log in", http.StatusUnauthorized)
		return
	}
	next := r.URL.RequestURI()
	if r.URL.Path == "/login" {
		next = r.PostFormValue("next")
	}
	h.render(w, r, http.StatusUnauthorized, "login", &view{Title: "Log in", Error: msg, Data: loginView{Next: localPath(next)}})
}

type loginView struct{ Next string }

// localPath returns p when it is a path on this server, "/" otherwise, so
// that the login form's next field cannot send anyone elsewhere. A
// browser drops tabs and newlines from a Location and reads a backslash
// as a slash, so "/\t/evil.example" or "/\\evil.example" would be
// "//evil.example", another host: p may hold no control byte and no
// backslash, and must parse as a bare path (no scheme, no host) that
// starts with one slash, not two. Percent-escapes stay escaped in the
// redirect, so "/%2F%2Fevil.example" is a path here.
func localPath(p string) string {
	for i := 0; i < len(p); i++ {
		if c := p[i]; c < 0x20 || c == 0x7f || c == '\\' {
			return "/"
		}
	}
	u, err := url.Parse(p)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" ||
		!strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.HasPrefix(u.EscapedPath(), "//") ||
		strings.HasPrefix(u.Path, "/login") {
		return "/"
	}
	return p
}

func (h *handler) loginPage(w http.ResponseWriter, r *http.Request) {
	q, ok := h.query(w, r)
	if !ok {
		return
	}
	if h.cfg.Token == "" || h.authenticated(r) {
		http.Redirect(w, r, localPath(q.Get("next")), http.StatusSeeOther)
		return
	}
	h.render(w, r, http.StatusOK, "login", &view{Title: "Log in", Data: loginView{Next: localPath(q.Get("next"))}})
}

func (h *handler) login(w http.ResponseWriter, r *http.Request) {
	if !h.readForm(w, r) {
		return
	}
	if !h.checkCSRF(r) {
		h.forbidden(w, r)
		return
	}
	if h.cfg.Token == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	client, now := clientOf(r.RemoteAddr), h.now()
	if wait := h.limiter.wait(client, now); wait > 0 {
		// Locked out: not even the right token is looked at.
		h.log.Info("console login refused: locked out", "client", client, "remote", r.RemoteAddr)
		h.tooMany(w, r, wait)
		return
	}
	if !h.tokenMatches(r.PostForm.Get("token")) {
		if wait := h.failedToken(r, client, now); wait > 0 {
			h.tooMany(w, r, wait)
			return
		}
		h.log.Info("console login refused", "remote", r.RemoteAddr)
		h.unauthorized(w, r, "That token is not the console's token.")
		return
	}
	h.limiter.succeeded(client)
	http.SetCookie(w, &http.Cookie{
		Name: loginCookie, Value: h.newLogin(now), Path: "/", MaxAge: int(h.cfg.LoginTTL / time.Second),
		HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode,
	})
	h.log.Info("console login", "remote", r.RemoteAddr)
	http.Redirect(w, r, localPath(r.PostForm.Get("next")), http.StatusSeeOther)
}

func (h *handler) logout(w http.ResponseWriter, r *http.Request) {
	if !h.readForm(w, r) {
		return
	}
	if !h.checkCSRF(r) {
		h.forbidden(w, r)
		return
	}
	// End the session on the server too, so that no copy of the cookie
	// outlives the logout.
	if c, err := r.Cookie(loginCookie); err == nil {
		if id, _, ok := h.parseLogin(c.Value); ok {
			h.sessions.end(id)
		}
	}
	http.SetCookie(w, &http.Cookie{Name: loginCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode})
	target := "/"
	if h.cfg.Token != "" {
		target = "/login"
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}

// forbidden answers a POST whose CSRF token is missing or wrong.
func (h *handler) forbidden(w http.ResponseWriter, r *http.Request) {
	h.log.Info("console request refused: CSRF token missing or wrong", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
	h.render(w, r, http.StatusForbidden, "error", &view{Title: "Refused",
		Error: "This form's security token is missing or out of date (the console may have restarted). Go back, reload the page and submit again."})
}
