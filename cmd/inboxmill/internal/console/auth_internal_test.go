package console

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func testHandler(token string) *handler {
	return &handler{cfg: Config{Token: token, LoginTTL: time.Hour}, secret: []byte("0123456789abcdef0123456789abcdef"),
		sessions: newSessionStore()}
}

// TestLoginCookie checks the login cookie's expiry, signature and session.
func TestLoginCookie(t *testing.T) {
	t.Parallel()
	h := testHandler("tok")
	now := time.Unix(1_700_000_000, 0)
	s := h.newLogin(now)
	_, ok := h.validLogin(s, now)
	assert.True(t, ok)
	_, ok = h.validLogin(s, now.Add(59*time.Minute))
	assert.True(t, ok)
	_, ok = h.validLogin(s, now.Add(time.Hour))
	assert.False(t, ok, "expired")
	parts := strings.Split(s, ".")
	require.Len(t, parts, 3)
	for name, v := range map[string]string{
		"a later expiry under the old signature":  parts[0] + ".9" + parts[1] + "." + parts[2],
		"another session under the old signature": "x" + parts[0] + "." + parts[1] + "." + parts[2],
		"no signature": parts[0] + "." + parts[1],
		"empty":        "",
	} {
		_, ok := h.validLogin(v, now)
		assert.False(t, ok, name)
	}
	other := testHandler("other")
	other.sessions = h.sessions
	_, ok = other.validLogin(s, now)
	assert.False(t, ok, "a login of another token")
	other = testHandler("tok")
	other.secret = []byte("another process's secret........")
	other.sessions = h.sessions
	_, ok = other.validLogin(s, now)
	assert.False(t, ok, "a login of another process")
	// A signed cookie whose session ended.
	id, _, ok := h.parseLogin(s)
	require.True(t, ok)
	h.sessions.end(id)
	_, ok = h.validLogin(s, now)
	assert.False(t, ok, "a session that ended")
}

// TestCSRFToken checks that only tokens this process signed pass.
func TestCSRFToken(t *testing.T) {
	t.Parallel()
	h := testHandler("")
	nonce := "bm9uY2Vub25jZW5vbmNl"
	tok := nonce + "." + b64.EncodeToString(h.mac("csrf", nonce))
	assert.True(t, h.validCSRF(tok))
	assert.False(t, h.validCSRF(nonce+"x."+b64.EncodeToString(h.mac("csrf", nonce))))
	assert.False(t, h.validCSRF(nonce))
	assert.False(t, h.validCSRF("."))
	// A login signature is not a CSRF token, and the other way round.
	assert.False(t, h.validCSRF(nonce+"."+b64.EncodeToString(h.mac("login", nonce, ""))))
}

// TestLocalPath checks the login form's next field: what stays on this
// server passes, and whatever a browser could read as another host (after
// dropping tabs and newlines and turning backslashes into slashes) is "/".
func TestLocalPath(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"/audit": "/audit", "/record?key=a": "/record?key=a", "/records?status=pending&limit=2": "/records?status=pending&limit=2",
		"/record?key=a%2Fb#top": "/record?key=a%2Fb#top", "": "/", "audit": "/", "/login?next=/": "/", "/login": "/",
		"https://x.example/": "/", "http:/x.example": "/", "javascript:alert(1)": "/", "mailto:a@x.example": "/",
		"//x.example": "/", "///x.example": "/", "////x.example": "/", "//user@x.example/": "/",
		`/\x.example`: "/", `\\x.example`: "/", `/\/x.example`: "/", `/a\b`: "/", `\/x.example`: "/",
		"/\t/x.example/": "/", "/\n/x.example": "/", "/\r/x.example": "/", "\t//x.example": "/", "/\x00/x.example": "/",
		"/\x7f/x.example": "/", "/\x1f/x.example": "/", "/ok\tpath": "/",
		"/%zz": "/", // does not parse
		// Percent-escapes stay escaped in the Location a redirect sends, so
		// these are paths on this server, not other hosts.
		"/%2F%2Fx.example": "/%2F%2Fx.example", "/%09/x.example/": "/%09/x.example/", "/%5Cx.example": "/%5Cx.example",
		"/caf%C3%A9": "/caf%C3%A9", "/ün": "/ün",
	} {
		assert.Equal(t, want, localPath(in), "%q", in)
	}
}

func TestHuman(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		250 * time.Millisecond: "250ms", 45 * time.Second: "45s", 12*time.Minute + 5*time.Second: "12m 5s",
		5*time.Hour + 3*time.Minute: "5h 3m", 76*time.Hour + 10*time.Minute: "3d 4h", -90 * time.Second: "1m 30s",
	} {
		assert.Equal(t, want, human(d), d.String())
	}
	assert.Equal(t, "1,234,567", thousands(1234567))
	assert.Equal(t, "999", thousands(999))
	assert.Equal(t, "-1,000", thousands(-1000))
}

// TestLoginLimiterBounded: the limiter remembers at most
// maxLimitedClients clients; past that a new client is refused as if
// locked out until old ones have been quiet long enough to be forgotten.
func TestLoginLimiterBounded(t *testing.T) {
	t.Parallel()
	l := newLoginLimiter(5, time.Minute)
	now := time.Unix(1_700_000_000, 0)
	for i := range maxLimitedClients {
		assert.Zero(t, l.failed(fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), now))
	}
	assert.Equal(t, time.Minute, l.wait("192.0.2.1", now), "a new client when the table is full")
	assert.Equal(t, time.Minute, l.failed("192.0.2.1", now))
	assert.Zero(t, l.wait("10.0.0.1", now), "a known client below its limit")
	assert.Len(t, l.clients, maxLimitedClients)

	later := now.Add(16*time.Minute + time.Second)
	assert.Zero(t, l.wait("192.0.2.1", later), "the quiet ones were forgotten")
	assert.Zero(t, l.failed("192.0.2.1", later))
	assert.Len(t, l.clients, 1)
}

func TestClientOf(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"127.0.0.1:5555": "127.0.0.1", "[::1]:80": "::/64", "[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:1": "2001:db8:1:2::/64", "[::ffff:192.0.2.7]:9": "192.0.2.7", "garbage": "garbage",
	} {
		assert.Equal(t, want, clientOf(in), in)
	}
}
