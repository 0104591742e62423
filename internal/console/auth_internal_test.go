package console

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func testHandler(token string) *handler {
	return &handler{cfg: Config{Token: token, LoginTTL: time.Hour}, secret: []byte("0123456789abcdef0123456789abcdef")}
}

// TestLoginCookie checks the login cookie's expiry and signature.
func TestLoginCookie(t *testing.T) {
	t.Parallel()
	h := testHandler("tok")
	now := time.Unix(1_700_000_000, 0)
	s := h.newLogin(now)
	assert.True(t, h.validLogin(s, now))
	assert.True(t, h.validLogin(s, now.Add(59*time.Minute)))
	assert.False(t, h.validLogin(s, now.Add(time.Hour)), "expired")
	exp, sig, _ := strings.Cut(s, ".")
	assert.False(t, h.validLogin("9"+exp+"."+sig, now), "a later expiry under the old signature")
	assert.False(t, h.validLogin(exp, now))
	assert.False(t, h.validLogin("", now))
	assert.False(t, testHandler("other").validLogin(s, now), "a login of another token")
	other := testHandler("tok")
	other.secret = []byte("another process's secret........")
	assert.False(t, other.validLogin(s, now), "a login of another process")
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
