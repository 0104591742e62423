package main

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var lastLine = regexp.MustCompile(`(?m)^delivered=(\d+) executed=(\d+) duplicates=(\d+) conflicts=(\d+)\n\z`)

// TestQuickstart runs the program twice on one SQLite file: the first run
// ships every event once despite retries, failures and lost acks; the
// second, a restart, ships nothing new.
func TestQuickstart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := config{dbPath: filepath.Join(t.TempDir(), "qs.db"), events: 20}

	var out bytes.Buffer
	sum, err := run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Regexp(t, lastLine, out.String())
	// 20 events + 4 producer retries + 1 reused key = 25 messages; 5 handler
	// failures and 3 lost acks come back once each.
	require.Equal(t, summary{published: 25, delivered: 33, executed: 20, duplicates: 7, conflicts: 1, poisoned: 1,
		shipments: 20, distinctShipments: 20}, sum)
	require.Contains(t, out.String(), "delivered=33 executed=20 duplicates=7 conflicts=1\n")

	out.Reset()
	sum, err = run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Regexp(t, lastLine, out.String())
	require.Equal(t, summary{published: 25, delivered: 28, executed: 0, duplicates: 27, conflicts: 1, poisoned: 1,
		shipments: 20, distinctShipments: 20}, sum, "a restart executes nothing again")
}
