package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
)

func TestPurge(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		for n := range 7 {
			status := inbox.StatusCompleted
			if n%3 == 0 {
				status = inbox.StatusFailed
			}
			e.expired(t, id("ship", fmt.Sprintf("old-%d", n)), status)
		}
		old := e.pending(t, id("ship", "stuck"), true) // expired long ago, but pending: kept
		fresh := e.completed(t, id("ship", "new"))

		out := e.ok(t, "purge", "--dry-run", "--reason", "check")
		require.Contains(t, out, "dry run: a purge would delete 7 records from table "+e.table+
			" (completed and failed, past expires_at; the oldest expired 696h")
		require.Contains(t, out, "nothing changed; no audit entry written")
		require.Equal(t, int64(9), e.total(t))
		require.Empty(t, e.audit(t))

		r := e.run(t, "purge", "--yes", "--batch-size", "3", "--reason", "backlog", "--actor", "dave")
		require.Equal(t, exitOK, r.code, r.String())
		require.Equal(t, "purged 7 records from table "+e.table+" in 3 batches\naudit: purge by dave, reason backlog\n", r.stdout)
		require.Contains(t, r.stderr, "purging "+e.table)
		require.Contains(t, r.stderr, "(7/7")
		require.Equal(t, int64(2), e.total(t))
		require.Equal(t, inbox.StatusPending, e.get(t, old.ID).Status)
		require.Equal(t, fresh.Status, e.get(t, fresh.ID).Status)
		entries := e.audit(t)
		require.Len(t, entries, 1)
		require.Equal(t, "purge", entries[0].Action)
		require.Equal(t, "dave", entries[0].Actor)
		require.EqualValues(t, 7, entries[0].Count)
		require.Equal(t, inbox.ID{}, entries[0].Record)

		// Nothing left: a run deletes nothing, without a bar, and is no
		// audit event.
		r = e.run(t, "purge", "--yes", "--reason", "again", "--progress=false")
		require.Equal(t, exitOK, r.code, r.String())
		require.Equal(t, "nothing to purge: no completed or failed record of table "+e.table+" is past expires_at; "+
			"no audit entry written\n", r.stdout)
		require.Empty(t, r.stderr)
		r = e.run(t, "purge", "--yes", "--reason", "again")
		require.Equal(t, exitOK, r.code, r.String())
		require.Contains(t, r.stdout, "nothing to purge")
		require.Len(t, e.audit(t), 1, "only the purge that deleted something is in the audit trail")
	})
}

// TestPurgeInterrupted: Ctrl-C stops a purge between batches; what it
// deleted stays deleted, the audit entry counts it, and the next run goes
// on.
func TestPurgeInterrupted(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		for n := range 6 {
			e.expired(t, id("ship", fmt.Sprintf("old-%d", n)), inbox.StatusCompleted)
		}
		ctx, interrupt := context.WithCancel(context.Background())
		defer interrupt()
		done := make(chan result, 1)
		go func() {
			// An hour's rest after each batch: only the interrupt ends it.
			done <- runCtx(ctx, "purge", "--yes", "--batch-size", "2", "--pause", "1h", "--reason", "backlog",
				"--dsn", e.dsn, "--table", e.table)
		}()
		require.Eventually(t, func() bool { return e.total(t) == 4 }, time.Minute, 10*time.Millisecond)
		interrupt()
		var r result
		select {
		case r = <-done:
		case <-time.After(time.Minute):
			t.Fatal("the purge did not stop")
		}
		require.Equal(t, exitInterrupted, r.code, r.String())
		require.Equal(t, "interrupted after 1 batch: purged 2 records from table "+e.table+"; run purge again to go on\n", r.stdout)
		require.Contains(t, r.stderr, "inboxmill purge: interrupted; 2 records purged")
		require.Equal(t, int64(4), e.total(t))
		entries := e.audit(t)
		require.Len(t, entries, 1)
		require.EqualValues(t, 2, entries[0].Count)

		out := e.ok(t, "purge", "--yes", "--batch-size", "2", "--pause", "-1ns", "--reason", "the rest")
		require.Contains(t, out, "purged 4 records from table "+e.table+" in 3 batches\n")
		require.Zero(t, e.total(t))
		entries = e.audit(t)
		require.Len(t, entries, 2)
		require.EqualValues(t, 4, entries[0].Count)
	})
}

// total counts e's records.
func (e *env) total(t *testing.T) int64 {
	t.Helper()
	ov, err := e.store.Overview(context.Background())
	require.NoError(t, err)
	return ov.Total
}
