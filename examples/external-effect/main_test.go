package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

var lastLine = regexp.MustCompile(`(?m)^intents=(\d+) charges=(\d+) pending_resolved=(\d+) double_charges=0\n\z`)

// TestExternalEffect runs the program with a few seeds: every chargeable
// intent is charged exactly once, although workers crash after charging,
// the provider times out after charging, and producers publish twice.
func TestExternalEffect(t *testing.T) {
	for _, seed := range []int64{1, 2, 3} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var out bytes.Buffer
			// Timings three times the program's: under a loaded machine
			// and the race detector, a fast answer of the provider can miss
			// a 100 ms timeout, and a run whose first charges all time out
			// exercises no crash after charging.
			sum, err := run(ctx, config{intents: 40, workers: 4, seed: seed, slowdown: 3}, &out)
			require.NoError(t, err, out.String())
			require.Regexp(t, lastLine, out.String())
			require.Zero(t, sum.doubleCharges)
			require.Equal(t, 40, sum.intents)
			require.Equal(t, 3, sum.declined, "intents 11, 22 and 33 are over the limit")
			require.Equal(t, sum.intents-sum.declined, sum.charges)
			require.Positive(t, sum.crashes, "the run exercised crashes after charging")
			require.Equal(t, sum.crashes, sum.fenced, "every crashed worker's late result was refused")
			require.Positive(t, sum.pendingResolved, "the run exercised uncertain outcomes")
			require.GreaterOrEqual(t, sum.takeovers, sum.crashes)
			require.Equal(t, 3, sum.inReview, "intents 13, 26 and 39 are held for review")
			require.GreaterOrEqual(t, sum.deadLettered, sum.inReview)
			// The inbox is a temporary file, gone when the program ends:
			// no command is printed that could only fail.
			require.NotContains(t, out.String(), "inboxmill ")
			require.Contains(t, out.String(), "left pending: 3 intents whose charges the provider holds for review")
			require.Contains(t, out.String(), "this run's inbox is a temporary file, removed on exit: "+
				"run with -db FILE to keep it, and the commands that settle them are printed")
		})
	}
}

// TestOperatorCommands runs the inboxmill commands the program prints
// against the inbox it kept: they inspect and resolve the pending intents.
func TestOperatorCommands(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "inboxmill")
	build := exec.Command("go", "build", "-o", bin, "./cmd/inboxmill")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/inboxmill: %v\n%s", err, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dbPath := filepath.Join(dir, "payments inbox.db") // a path the commands must quote
	var out bytes.Buffer
	sum, err := run(ctx, config{intents: 40, workers: 4, seed: 1, dbPath: dbPath}, &out)
	require.NoError(t, err, out.String())
	require.NotContains(t, out.String(), "temporary file")
	for _, key := range []string{"pi_0013", "pi_0026", "pi_0039"} {
		rid := inbox.ID{Operation: "charge_card", Key: key}
		require.Regexp(t, `(?m)^  inboxmill inspect --dsn '.+' --table payment_inbox --digest `+rid.Digest()+`$`, out.String())
		require.Regexp(t, `(?m)^  inboxmill resolve --dsn '.+' --table payment_inbox --operation charge_card --key `+key+
			` --attempt \d --to completed --external-ref ch_\d{5} --reason 'provider approved the charge after review'$`, out.String())
	}

	var ran int
	for _, line := range strings.Split(out.String(), "\n") {
		cmdline, ok := strings.CutPrefix(line, "  inboxmill ")
		if !ok {
			continue
		}
		if strings.HasPrefix(cmdline, "resolve") {
			cmdline += " --actor ops"
		}
		cmd := exec.CommandContext(ctx, "sh", "-c", shellQuote(bin)+" "+cmdline)
		got, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s\n%s", line, got)
		if strings.HasPrefix(cmdline, "inspect") {
			require.Regexp(t, `(?m)^  status\s+pending$`, string(got))
			require.Regexp(t, `(?m)^  external ref\s+ch_\d{5}$`, string(got))
		} else {
			require.Regexp(t, `pending at attempt \d -> completed`, string(got))
		}
		ran++
	}
	require.Equal(t, 2*sum.inReview, ran)

	db, err := sql.Open("sqlite", sqlite.DSN(dbPath))
	require.NoError(t, err)
	defer db.Close()
	store, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{Table: table})
	require.NoError(t, err)
	defer store.Close()
	left, err := store.ListPending(ctx, 100)
	require.NoError(t, err)
	require.Empty(t, left)
	entries, _, err := store.ListAudit(ctx, inbox.AuditFilter{Action: inbox.ActionResolve})
	require.NoError(t, err)
	require.Len(t, entries, sum.inReview)
	for _, e := range entries {
		require.Equal(t, "ops", e.Actor)
		require.Equal(t, inbox.StatusCompleted, e.StatusAfter)
	}
}
