package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
)

func TestResolve(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		pend := e.pending(t, id("charge", "pi-1"), false)
		gone := e.abandoned(t, id("charge", "pi-2"))

		// A dry run checks and changes nothing.
		out := e.ok(t, "resolve", "--operation", "charge", "--key", "pi-1", "--attempt", "1", "--to", "completed",
			"--external-ref", "ch_1", "--reason", "found in the dashboard", "--actor", "alice", "--dry-run")
		require.Equal(t, "dry run: would resolve charge/"+pend.Digest()+" (key pi-1): pending at attempt 1 -> completed\n"+
			"nothing changed; no audit entry written\n", out)
		require.Equal(t, pend, e.get(t, pend.ID))
		require.Empty(t, e.audit(t))

		out = e.ok(t, "resolve", "--operation", "charge", "--key", "pi-1", "--attempt", "1", "--to", "completed",
			"--external-ref", "ch_1", "--reason", "found in the dashboard", "--actor", "alice")
		require.Equal(t, "resolved charge/"+pend.Digest()+" (key pi-1): pending at attempt 1 -> completed\n"+
			"audit: resolve by alice, reason found in the dashboard\n", out)
		rec := e.get(t, pend.ID)
		require.Equal(t, inbox.StatusCompleted, rec.Status)
		require.Equal(t, "ch_1", rec.ExternalRef)
		entries := e.audit(t)
		require.Len(t, entries, 1)
		a := entries[0]
		require.Equal(t, "alice", a.Actor)
		require.Equal(t, "resolve", a.Action)
		require.Equal(t, pend.ID, a.Record)
		require.Equal(t, inbox.StatusPending, a.StatusBefore)
		require.EqualValues(t, 1, a.AttemptBefore)
		require.Equal(t, inbox.StatusCompleted, a.StatusAfter)
		require.Equal(t, "found in the dashboard", a.Reason)
		var before map[string]any
		require.NoError(t, json.Unmarshal([]byte(a.Before), &before))
		require.Equal(t, "pending", before["status"])

		// Resolved already: refused, exit 3.
		r := e.run(t, "resolve", "--operation", "charge", "--key", "pi-1", "--to", "failed", "--reason", "again", "--actor", "bob")
		require.Equal(t, exitRefused, r.code, r.String())
		require.Contains(t, r.stderr, "refused to resolve charge/"+pend.Digest()+": it is completed; only pending records")
		require.Len(t, e.audit(t), 1)

		// An abandoned record, by digest, to failed; the actor defaults to
		// the OS user.
		out = e.ok(t, "resolve", "--digest", gone.Digest(), "--to", "failed", "--error", "never charged", "--reason", "provider says no")
		require.Contains(t, out, "resolved charge/"+gone.Digest()+" (key pi-2): processing at attempt 1 -> failed\n")
		rec = e.get(t, gone.ID)
		require.Equal(t, inbox.StatusFailed, rec.Status)
		require.Equal(t, "never charged", rec.Error)
		require.Empty(t, rec.LeaseOwner)
		entries = e.audit(t)
		require.Len(t, entries, 2)
		require.Equal(t, osUser(), entries[0].Actor)
		require.Equal(t, inbox.StatusProcessing, entries[0].StatusBefore)

		// A live lease is never touched.
		held := e.live(t, id("charge", "pi-3"))
		r = e.run(t, "resolve", "--operation", "charge", "--key", "pi-3", "--to", "completed", "--reason", "r", "--actor", "bob")
		require.Equal(t, exitRefused, r.code, r.String())
		require.Contains(t, r.stderr, "refused to resolve charge/"+held.ID().Digest()+": a worker holds it under a live lease (worker-live, live, ")
		require.Contains(t, r.stderr, "let it finish, or try again once the lease has expired")
		require.Equal(t, inbox.StatusProcessing, e.get(t, held.ID()).Status)
		r = e.run(t, "resolve", "--operation", "charge", "--key", "pi-3", "--to", "completed", "--reason", "r", "--dry-run")
		require.Equal(t, exitRefused, r.code, "a dry run refuses what the change would")

		r = e.run(t, "resolve", "--operation", "charge", "--key", "nope", "--to", "completed", "--reason", "r")
		require.Equal(t, exitNotFound, r.code)
		require.Contains(t, r.stderr, "no record in table "+e.table)
		r = e.run(t, "resolve", "--operation", "charge", "--key", "pi-3", "--to", "failed", "--external-ref", "x", "--reason", "r")
		require.Equal(t, exitUsage, r.code, "the store's ErrInvalidParams is a usage error")
		require.Contains(t, r.stderr, "--external-ref is stored only with --to completed")
		require.Len(t, e.audit(t), 2)
	})
}

// TestResolveAfterTakeOver: the operator inspects an abandoned record at
// attempt 1, a redelivery takes it over meanwhile, and the resolve the
// operator then runs with --attempt 1 is refused and changes nothing.
func TestResolveAfterTakeOver(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		rec := e.abandoned(t, id("charge", "pi-1"))
		out := e.ok(t, "inspect", "--digest", rec.Digest())
		require.Contains(t, out, "--attempt 1 --to completed")

		lease, err := e.store.TakeOver(context.Background(), rec, inbox.TakeOverParams{Owner: "worker-2", Lease: time.Hour})
		require.NoError(t, err)
		require.EqualValues(t, 2, lease.Attempt())

		for _, args := range [][]string{
			{"resolve", "--digest", rec.Digest(), "--attempt", "1", "--to", "completed", "--reason", "seen in dashboard"},
			{"resolve", "--digest", rec.Digest(), "--attempt", "1", "--to", "completed", "--reason", "seen in dashboard", "--dry-run"},
			{"forget", "--digest", rec.Digest(), "--attempt", "1", "--yes", "--reason", "run it again"},
		} {
			r := e.run(t, args...)
			require.Equal(t, exitRefused, r.code, r.String())
			require.Contains(t, r.stderr, "it is no longer at attempt 1: a worker took it over, it is processing at attempt 2 (live, ")
			require.Contains(t, r.stderr, "inspect it again before acting")
		}
		now := e.get(t, rec.ID)
		require.Equal(t, inbox.StatusProcessing, now.Status)
		require.EqualValues(t, 2, now.Attempt)
		require.Equal(t, "worker-2", now.LeaseOwner)
		require.Empty(t, e.audit(t))

		// The worker finishes: the record is completed, at attempt 2.
		require.NoError(t, lease.Complete(context.Background(), inbox.Outcome{}))
		r := e.run(t, "resolve", "--digest", rec.Digest(), "--attempt", "2", "--to", "failed", "--reason", "too late")
		require.Equal(t, exitRefused, r.code)
		require.Contains(t, r.stderr, "it is completed")
	})
}

// TestResolveRacesTakeOver runs resolve and a worker's take-over of the
// same abandoned record at once, several times: exactly one wins, the
// loser is told, and an audit entry exists exactly when resolve won.
func TestResolveRacesTakeOver(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		wins := map[string]int{}
		for n := range 8 {
			rec := e.abandoned(t, id("charge", fmt.Sprintf("race-%d", n)))
			var (
				wg      sync.WaitGroup
				r       result
				takeErr error
			)
			wg.Go(func() {
				r = e.run(t, "resolve", "--digest", rec.Digest(), "--attempt", "1", "--to", "completed", "--reason", "race")
			})
			wg.Go(func() {
				// The command takes a few milliseconds to open the
				// database: start the take-over at different points of it.
				time.Sleep(time.Duration(n) * 15 * time.Millisecond)
				_, takeErr = e.store.TakeOver(context.Background(), rec, inbox.TakeOverParams{Owner: "worker-2", Lease: time.Hour})
			})
			wg.Wait()
			now := e.get(t, rec.ID)
			entries, _, err := e.store.ListAudit(context.Background(), inbox.AuditFilter{Record: &rec.ID})
			require.NoError(t, err)
			switch {
			case r.code == exitOK:
				require.Error(t, takeErr, "both won")
				require.True(t, errors.Is(takeErr, inbox.ErrLeaseLost) || errors.Is(takeErr, inbox.ErrIllegalTransition), takeErr)
				require.Equal(t, inbox.StatusCompleted, now.Status)
				require.Len(t, entries, 1)
				wins["resolve"]++
			default:
				require.NoError(t, takeErr, "both lost: %s", r)
				require.Equal(t, exitRefused, r.code, r.String())
				require.Equal(t, inbox.StatusProcessing, now.Status)
				require.EqualValues(t, 2, now.Attempt)
				require.Empty(t, entries)
				wins["take-over"]++
			}
		}
		t.Logf("wins: %v", wins)
	})
}

func TestForget(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		done := e.completed(t, id("ship", "evt-1"))
		held := e.live(t, id("ship", "evt-2"))
		pend := e.pending(t, id("ship", "evt-3"), false)

		out := e.ok(t, "forget", "--operation", "ship", "--key", "evt-1", "--reason", "carrier lost it", "--actor", "carol", "--dry-run")
		require.Equal(t, "dry run: would forget ship/"+done.Digest()+" (key evt-1), completed at attempt 1\n"+
			"nothing changed; no audit entry written\n", out)
		require.Equal(t, done, e.get(t, done.ID))
		require.Empty(t, e.audit(t))

		out = e.ok(t, "forget", "--operation", "ship", "--key", "evt-1", "--attempt", "1", "--yes", "--reason", "carrier lost it", "--actor", "carol")
		require.Equal(t, "forgot ship/"+done.Digest()+" (key evt-1), completed at attempt 1: its next delivery runs the handler again\n"+
			"audit: forget by carol, reason carrier lost it\n", out)
		e.gone(t, done.ID)
		entries := e.audit(t)
		require.Len(t, entries, 1)
		require.Equal(t, "forget", entries[0].Action)
		require.Equal(t, inbox.StatusCompleted, entries[0].StatusBefore)
		require.Empty(t, entries[0].StatusAfter)

		// A live lease: refused, dry run or not.
		for _, dry := range []string{"--dry-run=false", "--dry-run"} {
			r := e.run(t, "forget", "--digest", held.ID().Digest(), "--reason", "r", "--yes", dry)
			require.Equal(t, exitRefused, r.code, r.String())
			require.Contains(t, r.stderr, "refused to forget ship/"+held.ID().Digest()+": a worker holds it under a live lease")
		}
		require.Equal(t, inbox.StatusProcessing, e.get(t, held.ID()).Status)

		// A pending record can be forgotten (run it again).
		e.ok(t, "forget", "--digest", pend.Digest(), "--operation", "ship", "--yes", "--reason", "provider never got it")
		e.gone(t, pend.ID)
		require.Len(t, e.audit(t), 2)

		r := e.run(t, "forget", "--operation", "ship", "--key", "evt-1", "--yes", "--reason", "again")
		require.Equal(t, exitNotFound, r.code)
		require.Contains(t, r.stderr, "no record in table "+e.table)
	})
}

// TestWrongAttemptIsNotATakeOver: an --attempt above the record's is a
// mistake of the operator's (or the record was forgotten and claimed anew
// since), never a worker's take-over, and the refusal says so; an attempt
// a worker has moved past is still told as a take-over.
func TestWrongAttemptIsNotATakeOver(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		pend := e.pending(t, id("charge", "pi-1"), false)
		done := e.completed(t, id("ship", "evt-1"))
		for _, args := range [][]string{
			{"resolve", "--digest", pend.Digest(), "--attempt", "5", "--to", "completed", "--reason", "r"},
			{"resolve", "--digest", pend.Digest(), "--attempt", "5", "--to", "completed", "--reason", "r", "--dry-run"},
			{"forget", "--digest", done.Digest(), "--attempt", "5", "--reason", "r", "--dry-run"},
		} {
			r := e.run(t, args...)
			require.Equal(t, exitRefused, r.code, r.String())
			require.NotContains(t, r.stderr, "a worker took it over", r.String())
			require.Contains(t, r.stderr, "at attempt 1, not 5: no worker took it over (attempts only grow);", r.String())
			require.Contains(t, r.stderr, "check --attempt against inspect", r.String())
		}
		require.Equal(t, pend, e.get(t, pend.ID))
		require.Empty(t, e.audit(t))
	})
}
