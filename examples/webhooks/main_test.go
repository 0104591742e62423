package main

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/tests/testdb"
)

var lastLine = regexp.MustCompile(`(?m)^received=(\d+) rejected=(\d+) published=(\d+) executed=(\d+) duplicates=(\d+)\n\z`)

// 10 events; Stripe sends one twice, two attempts time out on the sender's
// side after the receiver enqueued them and are retried, one GitHub
// delivery is redelivered twice at once: 15 verified deliveries. Four
// forged, replayed or tampered requests are refused.
var want = summary{received: 19, rejected: 4, published: 15, executed: 10, duplicates: 5, effects: 10, distinctEffects: 10}

// TestWebhooks runs the program as `go run ./examples/webhooks` does, on
// GoChannel and SQLite, then again on the same SQLite file: a provider
// re-sending every event later executes nothing again.
func TestWebhooks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := config{dbPath: filepath.Join(t.TempDir(), "webhooks.db")}

	var out bytes.Buffer
	sum, err := run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Regexp(t, lastLine, out.String())
	require.Equal(t, want, sum, out.String())
	require.Contains(t, out.String(), "received=19 rejected=4 published=15 executed=10 duplicates=5\n")
	require.Equal(t, 4, bytes.Count(out.Bytes(), []byte(": 401 Unauthorized\n")))

	require.Contains(t, out.String(), "inbox: table inbox holds no records from earlier runs\n")

	out.Reset()
	sum, err = run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Equal(t, summary{received: 19, rejected: 4, published: 15, executed: 0, duplicates: 15, effects: 10, distinctEffects: 10},
		sum, out.String())
	require.Contains(t, out.String(), "note: 10 events (record_payment: 6, start_build: 4) were already recorded by an earlier run "+
		"in table inbox; they are acknowledged as duplicates (executed=0 is expected). Run with -reset to start over.\n")

	out.Reset()
	cfg.reset = true
	sum, err = run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Equal(t, want, sum, "after -reset every event takes effect again, once: %s", out.String())
	require.Contains(t, out.String(), "reset: dropped the inbox inbox and webhook_effects\n")
}

// Without -db every run has a file of its own: nothing to report, nothing
// to reset.
func TestWebhooksTemporaryFile(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	sum, err := run(ctx, config{reset: true}, &out)
	require.NoError(t, err, out.String())
	require.Equal(t, want, sum, out.String())
	require.NotContains(t, out.String(), "reset:")
	require.NotContains(t, out.String(), "note:")
}

// An error names the database it could not reach without its password.
func TestWebhooksRedactsPassword(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := cli([]string{"-dsn", "postgres://app:s3cret@127.0.0.1:1/x?sslmode=disable"}, &stdout, &stderr)
	require.Equal(t, 1, code, stderr.String())
	require.Contains(t, stderr.String(), "webhooks: PostgreSQL at postgres://app:xxxxx@127.0.0.1:1/x?sslmode=disable: ")
	require.NotContains(t, stdout.String()+stderr.String(), "s3cret")
}

// TestWebhooksPostgres runs it with -dsn: watermill-sql's queue and the
// PostgreSQL inbox.
func TestWebhooksPostgres(t *testing.T) {
	testdb.Open(t, testdb.PostgresPGX) // skips, or fails under CI, when PostgreSQL does not answer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	sum, err := run(ctx, config{dsn: testdb.PostgresDSN()}, &out)
	require.NoError(t, err, out.String())
	require.Regexp(t, lastLine, out.String())
	require.Equal(t, want, sum, out.String())
}
