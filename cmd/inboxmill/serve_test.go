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

	"github.com/stretchr/testify/require"
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
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
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

		// A token, from the environment or the flag, guards every page
		// but /healthz.
		url, stop = e.serve(t, "--token", "s3cret-token", "--read-only")
		code, _ = get(t, url+"/", "")
		require.Equal(t, http.StatusUnauthorized, code)
		code, _ = get(t, url+"/", "wrong")
		require.Equal(t, http.StatusUnauthorized, code)
		code, body = get(t, url+"/", "s3cret-token")
		require.Equal(t, http.StatusOK, code)
		require.NotContains(t, body, "s3cret-token")
		code, _ = get(t, url+"/healthz", "")
		require.Equal(t, http.StatusOK, code)
		r = stop()
		require.Equal(t, exitOK, r.code, r.String())
		require.Contains(t, r.stdout, ", read-only, token required\n")
		require.NotContains(t, r.stdout+r.stderr, "s3cret-token")
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
