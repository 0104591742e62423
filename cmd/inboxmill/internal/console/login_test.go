package console_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/cmd/inboxmill/internal/console"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

const loginToken = "login-limit-token-0123456789"

// loginSetup serves a console with a token whose clock the test moves.
func loginSetup(t *testing.T, cfg console.Config) (*bundle, *inboxtest.Clock) {
	t.Helper()
	b := setup(t, testdb.SQLite, console.Config{})
	clock := &inboxtest.Clock{}
	cfg.Store, cfg.Token = b.store, loginToken
	cfg.Logger = slog.New(slog.NewTextHandler(b.logs, nil))
	h, err := console.New(cfg)
	require.NoError(t, err)
	console.SetClock(h, clock.Now)
	b.srv = httptest.NewServer(h)
	t.Cleanup(b.srv.Close)
	return b, clock
}

// from makes c connect from local address ip (another address of the
// loopback network is another client).
func (c *client) from(ip string) *client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
	c.http.Transport = &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}}
	return c
}

func (c *client) login(token string) response {
	c.t.Helper()
	page := "/login"
	if c.get(page).status == http.StatusSeeOther {
		page = "/" // logged in already
	}
	tok := c.csrf(page)
	return c.post("/login", url.Values{"token": {token}, "csrf_token": {tok}})
}

// TestLoginRateLimit: five failed logins in a row from one client lock it
// out for a minute: its token is not even checked, the right one included,
// until the minute is over; each failure after that locks it out again,
// twice as long. Another client, and a logged-in session of the locked
// one, are not affected; a bearer token counts as a login.
func TestLoginRateLimit(t *testing.T) {
	t.Parallel()
	b, clock := loginSetup(t, console.Config{})
	c := b.client(t)
	for i := range 4 {
		r := c.login("guess-" + strconv.Itoa(i))
		require.Equal(t, http.StatusUnauthorized, r.status, "failure %d", i+1)
		assert.Empty(t, r.header.Get("Retry-After"))
	}
	// Logged in from another address meanwhile.
	other := b.client(t).from("127.0.0.2")
	require.Equal(t, http.StatusSeeOther, other.login(loginToken).status)

	r := c.login("guess-5")
	require.Equal(t, http.StatusTooManyRequests, r.status, "the fifth failure")
	assert.Equal(t, "60", r.header.Get("Retry-After"))
	assert.Contains(t, r.body, "Too many failed logins")

	// The right token waits it out too, as a form and as a bearer token.
	clock.Advance(30 * time.Second)
	r = c.login(loginToken)
	require.Equal(t, http.StatusTooManyRequests, r.status, "the right token while locked out")
	assert.Equal(t, "30", r.header.Get("Retry-After"))
	assert.Equal(t, http.StatusUnauthorized, c.get("/").status, "no login cookie was set")
	bearer := b.client(t)
	bearer.header.Set("Authorization", "Bearer "+loginToken)
	r = bearer.get("/")
	require.Equal(t, http.StatusTooManyRequests, r.status, "a bearer token from the locked-out address")
	assert.Equal(t, "30", r.header.Get("Retry-After"))
	assert.Contains(t, b.logs.String(), "console login locked out")

	// Another client logs in, and one already logged in stays so.
	assert.Equal(t, http.StatusSeeOther, b.client(t).from("127.0.0.3").login(loginToken).status)
	assert.Equal(t, http.StatusOK, other.get("/").status)

	// After the minute the right token passes, and a success starts over.
	clock.Advance(31 * time.Second)
	require.Equal(t, http.StatusSeeOther, c.login(loginToken).status)
	assert.Equal(t, http.StatusOK, c.get("/").status)
	for i := range 4 {
		require.Equal(t, http.StatusUnauthorized, c.login("again-"+strconv.Itoa(i)).status, "failure %d after a success", i+1)
	}
	require.Equal(t, http.StatusTooManyRequests, c.login("again-5").status)

	// A failure right after a lockout locks out again, twice as long.
	clock.Advance(61 * time.Second)
	r = c.login("after-the-lockout")
	require.Equal(t, http.StatusTooManyRequests, r.status)
	assert.Equal(t, "120", r.header.Get("Retry-After"))
	clock.Advance(121 * time.Second)
	// ... and a wrong bearer token counts as a failure.
	bearer.header.Set("Authorization", "Bearer nope-nope-nope-nope")
	r = bearer.get("/")
	require.Equal(t, http.StatusTooManyRequests, r.status)
	assert.Equal(t, "240", r.header.Get("Retry-After"))

	// The lockout stops growing at 16 minutes.
	for _, want := range []string{"480", "960", "960"} {
		wait, err := strconv.Atoi(r.header.Get("Retry-After"))
		require.NoError(t, err)
		clock.Advance(time.Duration(wait)*time.Second + time.Second)
		r = bearer.get("/")
		require.Equal(t, http.StatusTooManyRequests, r.status)
		assert.Equal(t, want, r.header.Get("Retry-After"))
	}
	// A quiet spell as long as the longest lockout starts over.
	clock.Advance(16*time.Minute + 16*time.Minute + time.Second)
	for i := range 4 {
		require.Equal(t, http.StatusUnauthorized, c.login("quiet-"+strconv.Itoa(i)).status, "failure %d after a quiet spell", i+1)
	}

	_, err := console.New(console.Config{Store: b.store, LoginFailures: -1, LoginLockout: -time.Second})
	require.ErrorIs(t, err, console.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "LoginFailures")
	assert.Contains(t, err.Error(), "LoginLockout")
}

// TestLogoutRevokes: logging out ends the session on the server, so that
// a copy of the login cookie taken before does not work after it; other
// sessions stay.
func TestLogoutRevokes(t *testing.T) {
	t.Parallel()
	b, clock := loginSetup(t, console.Config{LoginTTL: time.Hour})
	c := b.client(t)
	require.Equal(t, http.StatusSeeOther, c.login(loginToken).status)
	second := b.client(t)
	require.Equal(t, http.StatusSeeOther, second.login(loginToken).status)

	u, err := url.Parse(b.srv.URL)
	require.NoError(t, err)
	var login *http.Cookie
	for _, ck := range c.http.Jar.Cookies(u) {
		if ck.Name == "inboxmill_login" {
			login = ck
		}
	}
	require.NotNil(t, login)
	thief := b.client(t)
	thief.http.Jar.SetCookies(u, []*http.Cookie{{Name: "inboxmill_login", Value: login.Value}})
	require.Equal(t, http.StatusOK, thief.get("/").status, "the copied cookie works before the logout")

	r := c.post("/logout", url.Values{"csrf_token": {c.csrf("/")}})
	require.Equal(t, http.StatusSeeOther, r.status)
	assert.Equal(t, http.StatusUnauthorized, c.get("/").status)
	assert.Equal(t, http.StatusUnauthorized, thief.get("/").status, "the copied cookie after the logout")
	assert.Equal(t, http.StatusOK, second.get("/").status, "another session")

	// A session also ends at its TTL.
	clock.Advance(time.Hour)
	assert.Equal(t, http.StatusUnauthorized, second.get("/").status)
}
