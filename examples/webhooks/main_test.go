package main

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/internal/testdb"
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

	out.Reset()
	sum, err = run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Equal(t, summary{received: 19, rejected: 4, published: 15, executed: 0, duplicates: 15, effects: 10, distinctEffects: 10},
		sum, out.String())
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
