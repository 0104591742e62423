package main

import (
	"bytes"
	"context"
	"database/sql"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

var lastLine = regexp.MustCompile(`(?m)^delivered=(\d+) executed=(\d+) duplicates=(\d+) conflicts=(\d+)\n\z`)

// TestQuickstart runs the program three times on one SQLite file: the
// first run ships every event once despite retries, failures and lost
// acks; the second, a restart, ships nothing new and says why; the third,
// with -reset, starts over and ships every event once again.
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
	first := summary{published: 25, delivered: 33, executed: 20, duplicates: 7, conflicts: 1, poisoned: 1,
		shipments: 20, distinctShipments: 20}
	require.Equal(t, first, sum)
	require.Contains(t, out.String(), "delivered=33 executed=20 duplicates=7 conflicts=1\n")
	require.Contains(t, out.String(), "inbox: table inbox holds no records from earlier runs\n")

	out.Reset()
	sum, err = run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Regexp(t, lastLine, out.String())
	require.Equal(t, summary{published: 25, delivered: 28, executed: 0, duplicates: 27, conflicts: 1, poisoned: 1,
		shipments: 20, distinctShipments: 20}, sum, "a restart executes nothing again")
	require.Contains(t, out.String(), "note: 20 events were already recorded by an earlier run in table inbox; "+
		"they are acknowledged as duplicates (executed=0 is expected). Run with -reset to start over.\n")

	out.Reset()
	cfg.reset = true
	sum, err = run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Equal(t, first, sum, "after -reset every event ships again, once")
	require.Contains(t, out.String(), "reset: dropped the inbox inbox and shipments\n")
	require.Contains(t, out.String(), "inbox: table inbox holds no records from earlier runs\n")
}

// TestQuickstartManyEvents runs more events than may be in flight at once:
// the producer waits for acks instead of burying SQLite's writer lock
// under hundreds of handlers, and every event still ships once, with no
// handler run failing but the injected ones.
func TestQuickstartManyEvents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), runDeadline.For(500))
	defer cancel()
	var out bytes.Buffer
	sum, err := run(ctx, config{dbPath: filepath.Join(t.TempDir(), "qs.db"), events: 500}, &out)
	require.NoError(t, err, out.String())
	// 500 events + 100 producer retries + 1 reused key = 601 messages; 125
	// handler failures and 83 lost acks come back once each.
	require.Equal(t, summary{published: 601, delivered: 809, executed: 500, duplicates: 183, conflicts: 1, poisoned: 1,
		shipments: 500, distinctShipments: 500}, sum)
	require.Contains(t, out.String(), "; 125 handler runs failed and were rolled back\n")
}

// The deadline grows with -events from a floor the default run is far
// below, and -h says so.
func TestQuickstartDeadline(t *testing.T) {
	t.Parallel()
	require.Equal(t, 2*time.Minute, runDeadline.For(20))
	require.Equal(t, 2*time.Minute, runDeadline.For(4000))
	require.Equal(t, 5*time.Minute, runDeadline.For(10_000))
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, cli([]string{"-h"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "the run gives up after 2m0s or 30ms per event, whichever is longer")
	require.Contains(t, stderr.String(), "-reset")
	require.Equal(t, 2, cli([]string{"-events", "many"}, &stdout, &stderr), "a bad flag is a usage error")
}

// TestQuickstartOperator: -operator leaves one pending and one failed
// record of operation book_carrier, beside the shipments, and says how to
// find them; a second run leaves them as they are and ships nothing new.
func TestQuickstartOperator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := config{dbPath: filepath.Join(t.TempDir(), "qs db.db"), events: 20, operator: true}
	pending := inbox.ID{Scope: "shop-1", Operation: "book_carrier", Key: "evt-0003"}
	failed := inbox.ID{Scope: "shop-1", Operation: "book_carrier", Key: "evt-0005"}
	for round := range 2 {
		var out bytes.Buffer
		sum, err := run(ctx, cfg, &out)
		require.NoError(t, err, out.String())
		require.Regexp(t, lastLine, out.String(), "the summary is still the last line")
		require.Equal(t, 20, sum.distinctShipments)
		require.Contains(t, out.String(), "operator: book_carrier evt-0003 is pending (key_digest "+pending.Digest()+"): ")
		require.Contains(t, out.String(), "operator: book_carrier evt-0005 is failed (key_digest "+failed.Digest()+"): ")
		require.Contains(t, out.String(), "go run ./cmd/inboxmill list --dsn '"+cfg.dbPath+"' --operation book_carrier")
		if round == 1 {
			require.Contains(t, out.String(), "note: 22 events (book_carrier: 2, ship_order: 20) were already recorded")
			require.Contains(t, out.String(), "executed=0 is expected")
		}

		db, err := sql.Open("sqlite", sqlite.DSN(cfg.dbPath))
		require.NoError(t, err)
		store, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{Table: "inbox"})
		require.NoError(t, err)
		rec, err := store.Get(ctx, db, pending)
		require.NoError(t, err)
		require.Equal(t, inbox.StatusPending, rec.Status)
		require.EqualValues(t, 1, rec.Attempt)
		rec, err = store.Get(ctx, db, failed)
		require.NoError(t, err)
		require.Equal(t, inbox.StatusFailed, rec.Status)
		require.Contains(t, rec.Error, "the carrier refuses the delivery address")
		require.NoError(t, store.Close())
		require.NoError(t, db.Close())
	}
}
