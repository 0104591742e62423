package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/cmd/inboxmill/internal/console"
)

// syncBuffer is a bytes.Buffer the command writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var servingAt = regexp.MustCompile(`at (http://127\.0\.0\.1:\d+)/`)

// serve starts `inboxmill serve` on a free port and returns its URL and a
// function that stops it and returns what it did.
func (e *env) serve(t *testing.T, args ...string) (string, func() result) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		args := append([]string{"serve", "--addr", "127.0.0.1:0", "--dsn", e.dsn, "--table", e.table}, args...)
		done <- run(ctx, args, strings.NewReader(""), &stdout, &stderr)
	}()
	var url string
	require.Eventually(t, func() bool {
		select {
		case code := <-done:
			done <- code
			return true
		default:
		}
		if m := servingAt.FindStringSubmatch(stdout.String()); m != nil {
			url = m[1]
			return true
		}
		return false
	}, time.Minute, 10*time.Millisecond)
	require.NotEmpty(t, url, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	stopped := false
	halt := func() result {
		if !stopped {
			stopped = true
			stop()
		}
		select {
		case code := <-done:
			done <- code
			return result{code, stdout.String(), stderr.String()}
		case <-time.After(time.Minute):
			t.Fatal("serve did not stop")
			return result{}
		}
	}
	t.Cleanup(func() { halt() })
	return url, halt
}

func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	return getHost(t, url, "", token)
}

// getHost is get with the Host header host (when not empty).
func getHost(t *testing.T, url, host, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if host != "" {
		req.Host = host
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func TestServe(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		pend := e.pending(t, id("charge", "pi-1"), false)
		url, stop := e.serve(t)
		code, _ := get(t, url+"/healthz", "")
		require.Equal(t, http.StatusOK, code)
		code, body := get(t, url+"/", "")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, e.table)
		code, body = get(t, url+"/records/"+pend.Digest(), "")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "pi-1")
		r := stop()
		require.Equal(t, exitOK, r.code, r.String())
		require.Contains(t, r.stdout, "serving the console of table "+e.table+" ("+dialectFlag(e.kind)+") at http://127.0.0.1:")
		require.Contains(t, r.stdout, "console stopped\n")
		require.NotContains(t, r.stderr, "pi-1", "the console logs no keys")

		// Without a token, only loopback names (and --allow-host) reach it.
		url, stop = e.serve(t, "--allow-host", "tunnel.example")
		code, body = getHost(t, url+"/", "attacker.example:8080", "")
		require.Equal(t, http.StatusMisdirectedRequest, code, body)
		code, _ = getHost(t, url+"/", "tunnel.example:9000", "")
		require.Equal(t, http.StatusOK, code)
		code, _ = getHost(t, url+"/", "localhost:9000", "")
		require.Equal(t, http.StatusOK, code)
		r = stop()
		require.Equal(t, exitOK, r.code, r.String())

		// A token, from the environment or the flag, guards every page
		// but /healthz.
		url, stop = e.serve(t, "--token", "s3cret-token-0123456789", "--read-only")
		code, _ = get(t, url+"/", "")
		require.Equal(t, http.StatusUnauthorized, code)
		code, _ = get(t, url+"/", "wrong")
		require.Equal(t, http.StatusUnauthorized, code)
		code, body = get(t, url+"/", "s3cret-token-0123456789")
		require.Equal(t, http.StatusOK, code)
		require.NotContains(t, body, "s3cret-token-0123456789")
		code, _ = get(t, url+"/healthz", "")
		require.Equal(t, http.StatusOK, code)
		r = stop()
		require.Equal(t, exitOK, r.code, r.String())
		require.Contains(t, r.stdout, ", read-only, token required\n")
		require.NotContains(t, r.stdout+r.stderr, "s3cret-token-0123456789")
	})
}

// TestServeAddressTaken: a port in use is an error that names it.
func TestServeAddressTaken(t *testing.T) {
	e := setup(t, "sqlite")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	r := e.run(t, "serve", "--addr", ln.Addr().String())
	require.Equal(t, exitFailed, r.code, r.String())
	require.Contains(t, r.stderr, "listen on "+ln.Addr().String())
}

// TestServeShortToken: a token needs 16 bytes, beyond the loopback
// interface and on it.
func TestServeShortToken(t *testing.T) {
	e := setup(t, "sqlite")
	for _, addr := range []string{"0.0.0.0:0", "127.0.0.1:0"} {
		r := e.run(t, "serve", "--addr", addr, "--token", "short")
		require.Equal(t, exitUsage, r.code, r.String())
		require.Contains(t, r.stderr, "at least 16 bytes", addr)
		require.Contains(t, r.stderr, "openssl rand -hex 32", addr)
	}
}

// TestCheckLoopbackListener: without a token, what "localhost" resolved
// to must be a loopback address.
func TestCheckLoopbackListener(t *testing.T) {
	t.Parallel()
	for _, ok := range []net.Addr{
		&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080},
		&net.TCPAddr{IP: net.IPv4(127, 3, 2, 1), Port: 8080},
		&net.TCPAddr{IP: net.IPv6loopback, Port: 8080},
	} {
		assert.NoError(t, checkLoopbackListener("localhost:8080", ok), ok.String())
	}
	for _, bad := range []net.Addr{
		&net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 8080},
		&net.TCPAddr{IP: net.IPv4zero, Port: 8080},
		&net.TCPAddr{IP: net.IPv6unspecified, Port: 8080},
		&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 8080},
		&net.TCPAddr{Port: 8080},
		&net.UnixAddr{Name: "/tmp/console.sock", Net: "unix"},
	} {
		err := checkLoopbackListener("localhost:8080", bad)
		require.ErrorIs(t, err, console.ErrTokenRequired, bad.String())
		assert.Contains(t, err.Error(), "localhost:8080 is listening on "+bad.String())
	}
	// A real listener on loopback passes.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	require.NoError(t, checkLoopbackListener("127.0.0.1:0", ln.Addr()))
}
