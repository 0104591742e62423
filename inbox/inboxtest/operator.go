package inboxtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
)

// operator is the actor of the suite's operator actions.
var operator = inbox.Actor{Name: "alice@example.com", Reason: "OPS-42: settled with the provider"}

// audit returns every audit entry of rec, newest first.
func (b *bundle) audit(t *testing.T, rec inbox.ID) []inbox.AuditEntry {
	t.Helper()
	entries, next, err := b.store.ListAudit(b.ctx, inbox.AuditFilter{Record: &rec, Limit: inbox.MaxListLimit})
	require.NoError(t, err)
	require.Empty(t, next)
	return entries
}

// allAudit returns every audit entry of the table, newest first, read a
// page of limit at a time.
func (b *bundle) allAudit(t *testing.T, f inbox.AuditFilter) []inbox.AuditEntry {
	t.Helper()
	var out []inbox.AuditEntry
	for {
		page, next, err := b.store.ListAudit(b.ctx, f)
		require.NoError(t, err)
		out = append(out, page...)
		if next == "" {
			return out
		}
		require.NotEmpty(t, page, "a page before the last is not empty")
		f.After = next
	}
}

// snapshot decodes an audit entry's Before.
func snapshot(t *testing.T, e inbox.AuditEntry) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(e.Before), &m), e.Before)
	return m
}

// snapshotColumns are the keys of AuditEntry.Before: every column of the
// inbox table but result, and result_bytes.
var snapshotColumns = []string{"attempt", "correlation_id", "created_at", "error", "expires_at", "external_ref",
	"key", "lease_owner", "lease_until", "operation", "payload_hash", "resource_id", "result_bytes", "scope",
	"status", "updated_at"}

// runOperator checks the operator tools: listing, overview and lookup,
// and the audited actions (resolve, forget, purge) with their fencing
// against workers that race them.
func runOperator(t *testing.T, h Harness) {
	t.Run("ResolvePendingAsCompleted", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		k := inbox.ID{Scope: "tenant-1", Operation: "charge", Key: "pay-1"}
		rec := b.pending(t, k, time.Hour)
		// Pending longer than its retention: resolved now, it is kept for
		// its retention from now, not purged at once.
		clk.Advance(2 * time.Hour)
		before, after, err := b.store.Resolve(b.ctx, inbox.ResolveParams{ID: k, To: inbox.StatusCompleted,
			Attempt: rec.Attempt, Actor: operator, ExternalRef: "ch_9"})
		require.NoError(t, err)
		require.Equal(t, rec, before)
		stored := b.get(t, k)
		require.Equal(t, stored, after, "Resolve reports what it stored")
		require.Equal(t, inbox.StatusCompleted, stored.Status)
		require.Equal(t, "ch_9", stored.ExternalRef)
		require.Empty(t, stored.Error, "completed clears the pending record's error")
		require.Equal(t, rec.Attempt, stored.Attempt)
		require.Empty(t, stored.LeaseOwner)
		require.True(t, stored.LeaseUntil.IsZero())
		now := usec(clk.Now())
		require.WithinDuration(t, now, stored.UpdatedAt, 0)
		require.WithinDuration(t, now.Add(time.Hour), stored.ExpiresAt, 0)
		require.Equal(t, rec.CreatedAt, stored.CreatedAt)
		res, err := b.store.Purge(b.ctx, inbox.PurgeParams{})
		require.NoError(t, err)
		require.Zero(t, res.Deleted, "kept for its retention from the resolve")

		entries := b.audit(t, k)
		require.Len(t, entries, 1)
		e := entries[0]
		require.Len(t, e.ID, 24)
		require.WithinDuration(t, now, e.At, 0)
		require.Equal(t, operator.Name, e.Actor)
		require.Equal(t, operator.Reason, e.Reason)
		require.Equal(t, inbox.ActionResolve, e.Action)
		require.Equal(t, k, e.Record)
		require.Equal(t, inbox.StatusPending, e.StatusBefore)
		require.Equal(t, rec.Attempt, e.AttemptBefore)
		require.Equal(t, inbox.StatusCompleted, e.StatusAfter)
		require.EqualValues(t, 1, e.Count)
		snap := snapshot(t, e)
		var keys []string
		for c := range snap {
			keys = append(keys, c)
		}
		sort.Strings(keys)
		require.Equal(t, snapshotColumns, keys)
		require.Equal(t, "pending", snap["status"])
		require.Equal(t, "ref-1", snap["external_ref"])
		require.Equal(t, "timeout", snap["error"])
		require.Equal(t, "pay-1", snap["key"])
		require.Equal(t, "tenant-1", snap["scope"])
		require.EqualValues(t, 0, snap["result_bytes"])
		require.Nil(t, snap["lease_until"])

		_, _, err = b.store.Resolve(b.ctx, inbox.ResolveParams{ID: k, To: inbox.StatusFailed, Actor: operator})
		require.ErrorIs(t, err, inbox.ErrNotResolvable)
		require.Equal(t, stored, b.get(t, k))
		require.Len(t, b.audit(t, k), 1, "a refused resolve writes no audit entry")

		dup, err := b.store.Reserve(b.ctx, inbox.ReserveParams{ID: k, PayloadHash: hash("x"), Owner: "w2", Lease: time.Minute})
		require.NoError(t, err)
		require.Nil(t, dup.Lease, "a resolved intent is a duplicate")
	})

	t.Run("ResolveExpiredOrReleasedLeaseAsFailed", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		k := id("charge", "expired")
		zombie := b.reserve(t, k, "w1", time.Minute, 0) // kept forever
		clk.Advance(2 * time.Minute)
		_, after, err := b.store.Resolve(b.ctx, inbox.ResolveParams{ID: k, To: inbox.StatusFailed, Attempt: 1, Actor: operator})
		require.NoError(t, err)
		stored := b.get(t, k)
		require.Equal(t, stored, after)
		require.Equal(t, inbox.StatusFailed, stored.Status)
		require.Equal(t, "resolved as failed by "+operator.Name+": "+operator.Reason, stored.Error)
		require.True(t, stored.ExpiresAt.IsZero(), "a record kept forever stays so")
		require.Empty(t, stored.LeaseOwner)
		require.True(t, stored.LeaseUntil.IsZero())
		require.ErrorIs(t, zombie.Complete(b.ctx, inbox.Outcome{Result: []byte("late")}), inbox.ErrLeaseLost)
		require.Equal(t, stored, b.get(t, k), "the worker whose lease expired changes nothing")
		entries := b.audit(t, k)
		require.Len(t, entries, 1)
		require.Equal(t, inbox.StatusProcessing, entries[0].StatusBefore)
		require.Equal(t, inbox.StatusFailed, entries[0].StatusAfter)
		require.Equal(t, "w1", snapshot(t, entries[0])["lease_owner"])

		// A released lease (no lease_until) is resolvable at once, with an
		// error of the operator's own.
		k2 := id("charge", "released")
		l := b.reserve(t, k2, "w1", time.Hour, time.Hour)
		require.NoError(t, l.Release(b.ctx, "never sent"))
		_, after, err = b.store.Resolve(b.ctx, inbox.ResolveParams{ID: k2, To: inbox.StatusFailed, Actor: operator,
			Error: "refunded by hand"})
		require.NoError(t, err)
		require.Equal(t, "refunded by hand", after.Error)
		require.Equal(t, b.get(t, k2), after)
		require.WithinDuration(t, usec(clk.Now()).Add(time.Hour), after.ExpiresAt, 0)
	})

	t.Run("ResolveAndForgetRefuse", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		live := id("charge", "live")
		b.reserve(t, live, "w1", time.Minute, time.Hour)
		done := id("charge", "done")
		_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: done, PayloadHash: hash("x"), Retention: time.Hour})
		require.NoError(t, err)
		failed := id("charge", "failed")
		_, err = b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: failed, PayloadHash: hash("x"), Status: inbox.StatusFailed})
		require.NoError(t, err)
		pend := b.pending(t, id("charge", "pending"), time.Hour)
		records := map[inbox.ID]*inbox.Record{}
		for _, k := range []inbox.ID{live, done, failed, pend.ID} {
			records[k] = b.get(t, k)
		}

		resolve := func(p inbox.ResolveParams) error {
			before, after, err := b.store.Resolve(b.ctx, p)
			if err != nil {
				require.Nil(t, before)
				require.Nil(t, after)
			}
			return err
		}
		forget := func(p inbox.ForgetParams) error {
			rec, err := b.store.Forget(b.ctx, p)
			if err != nil {
				require.Nil(t, rec)
			}
			return err
		}
		for _, dry := range []bool{false, true} {
			require.ErrorIs(t, resolve(inbox.ResolveParams{ID: live, To: inbox.StatusCompleted, Actor: operator, DryRun: dry}),
				inbox.ErrLeaseLive)
			require.ErrorIs(t, forget(inbox.ForgetParams{ID: live, Actor: operator, DryRun: dry}), inbox.ErrLeaseLive)
			for _, k := range []inbox.ID{done, failed} {
				require.ErrorIs(t, resolve(inbox.ResolveParams{ID: k, To: inbox.StatusCompleted, Actor: operator, DryRun: dry}),
					inbox.ErrNotResolvable)
			}
			missing := id("charge", "missing")
			require.ErrorIs(t, resolve(inbox.ResolveParams{ID: missing, To: inbox.StatusFailed, Actor: operator, DryRun: dry}),
				inbox.ErrNotFound)
			require.ErrorIs(t, forget(inbox.ForgetParams{ID: missing, Actor: operator, DryRun: dry}), inbox.ErrNotFound)
			require.ErrorIs(t, resolve(inbox.ResolveParams{ID: pend.ID, To: inbox.StatusFailed, Attempt: 2, Actor: operator,
				DryRun: dry}), inbox.ErrLeaseLost, "the operator saw another attempt")
			require.ErrorIs(t, forget(inbox.ForgetParams{ID: done, Attempt: 2, Actor: operator, DryRun: dry}), inbox.ErrLeaseLost)
		}

		// A lease that runs until exactly now is live, as for TakeOver.
		clk.Advance(time.Minute)
		require.ErrorIs(t, resolve(inbox.ResolveParams{ID: live, To: inbox.StatusCompleted, Actor: operator}), inbox.ErrLeaseLive)
		require.ErrorIs(t, forget(inbox.ForgetParams{ID: live, Actor: operator}), inbox.ErrLeaseLive)
		clk.Advance(time.Microsecond)
		require.NoError(t, resolve(inbox.ResolveParams{ID: live, To: inbox.StatusCompleted, Actor: operator, DryRun: true}))
		require.NoError(t, forget(inbox.ForgetParams{ID: live, Actor: operator, DryRun: true}))

		long := strings.Repeat("x", inbox.MaxReasonLen+1)
		for name, p := range map[string]inbox.ResolveParams{
			"no target":          {ID: pend.ID, Actor: operator},
			"to processing":      {ID: pend.ID, To: inbox.StatusProcessing, Actor: operator},
			"to pending":         {ID: pend.ID, To: inbox.StatusPending, Actor: operator},
			"no actor":           {ID: pend.ID, To: inbox.StatusCompleted, Actor: inbox.Actor{Reason: "r"}},
			"no reason":          {ID: pend.ID, To: inbox.StatusCompleted, Actor: inbox.Actor{Name: "bob", Reason: " \t"}},
			"NUL in the reason":  {ID: pend.ID, To: inbox.StatusCompleted, Actor: inbox.Actor{Name: "bob", Reason: "a\x00b"}},
			"reason not UTF-8":   {ID: pend.ID, To: inbox.StatusCompleted, Actor: inbox.Actor{Name: "bob", Reason: "\xff"}},
			"reason too long":    {ID: pend.ID, To: inbox.StatusCompleted, Actor: inbox.Actor{Name: "bob", Reason: long}},
			"name too long":      {ID: pend.ID, To: inbox.StatusCompleted, Actor: inbox.Actor{Name: long[:inbox.MaxActorLen+1], Reason: "r"}},
			"ref with failed":    {ID: pend.ID, To: inbox.StatusFailed, Actor: operator, ExternalRef: "ch_1"},
			"error on completed": {ID: pend.ID, To: inbox.StatusCompleted, Actor: operator, Error: "boom"},
			"ref too long":       {ID: pend.ID, To: inbox.StatusCompleted, Actor: operator, ExternalRef: long},
			"error with NUL":     {ID: pend.ID, To: inbox.StatusFailed, Actor: operator, Error: "a\x00"},
			"negative attempt":   {ID: pend.ID, To: inbox.StatusFailed, Actor: operator, Attempt: -1},
			"no key":             {ID: id("charge", ""), To: inbox.StatusFailed, Actor: operator},
		} {
			err := resolve(p)
			require.ErrorIs(t, err, inbox.ErrInvalidParams, name)
			require.NotErrorIs(t, err, inbox.ErrNotFound, name)
		}
		for name, p := range map[string]inbox.ForgetParams{
			"no actor":         {ID: done},
			"no reason":        {ID: done, Actor: inbox.Actor{Name: "bob"}},
			"negative attempt": {ID: done, Actor: operator, Attempt: -1},
			"key too long":     {ID: id("charge", long), Actor: operator},
		} {
			require.ErrorIs(t, forget(p), inbox.ErrInvalidParams, name)
		}

		for k, rec := range records {
			require.Equal(t, rec, b.get(t, k), "refusals change nothing")
		}
		require.Empty(t, b.allAudit(t, inbox.AuditFilter{}), "refusals and dry runs write no audit entry")
	})

	t.Run("DryRunChangesNothing", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		rec := b.pending(t, id("charge", "p"), time.Hour)
		clk.Advance(time.Minute)
		before, after, err := b.store.Resolve(b.ctx, inbox.ResolveParams{ID: rec.ID, To: inbox.StatusCompleted,
			Actor: operator, ExternalRef: "ch_2", DryRun: true})
		require.NoError(t, err)
		require.Equal(t, rec, before)
		require.Equal(t, inbox.StatusCompleted, after.Status)
		require.Equal(t, "ch_2", after.ExternalRef)
		require.WithinDuration(t, usec(clk.Now()), after.UpdatedAt, 0)
		require.WithinDuration(t, usec(clk.Now()).Add(time.Hour), after.ExpiresAt, 0)
		require.Equal(t, rec, b.get(t, rec.ID))

		got, err := b.store.Forget(b.ctx, inbox.ForgetParams{ID: rec.ID, Attempt: rec.Attempt, Actor: operator, DryRun: true})
		require.NoError(t, err)
		require.Equal(t, rec, got)
		require.Equal(t, rec, b.get(t, rec.ID))
		require.Empty(t, b.allAudit(t, inbox.AuditFilter{}))

		// What the dry run said is what the real run does.
		_, real, err := b.store.Resolve(b.ctx, inbox.ResolveParams{ID: rec.ID, To: inbox.StatusCompleted,
			Actor: operator, ExternalRef: "ch_2"})
		require.NoError(t, err)
		require.Equal(t, after, real)
	})

	t.Run("ForgetDeletesAndAudits", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		done := id("ship", "done")
		res, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: done, PayloadHash: hash("x"), Retention: time.Hour})
		require.NoError(t, err)
		require.NoError(t, b.store.SaveOutput(b.ctx, b.db, res.Record, []byte("secret")))
		rec := b.get(t, done)
		clk.Advance(time.Second)
		got, err := b.store.Forget(b.ctx, inbox.ForgetParams{ID: done, Attempt: 1, Actor: operator})
		require.NoError(t, err)
		require.Equal(t, rec, got)
		_, err = b.store.Get(b.ctx, b.db, done)
		require.ErrorIs(t, err, inbox.ErrNotFound)
		entries := b.audit(t, done)
		require.Len(t, entries, 1)
		e := entries[0]
		require.Equal(t, inbox.ActionForget, e.Action)
		require.Equal(t, inbox.StatusCompleted, e.StatusBefore)
		require.Empty(t, e.StatusAfter)
		require.EqualValues(t, 1, e.Count)
		require.EqualValues(t, 6, snapshot(t, e)["result_bytes"])
		require.NotContains(t, e.Before, "secret", "the result itself is not copied")
		_, err = b.store.Forget(b.ctx, inbox.ForgetParams{ID: done, Actor: operator})
		require.ErrorIs(t, err, inbox.ErrNotFound)

		again, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: done, PayloadHash: hash("y")})
		require.NoError(t, err)
		require.True(t, again.Claimed, "a forgotten intent runs again, whatever its payload")

		// A pending record and an expired lease can be forgotten; the
		// zombie worker then finds its record gone.
		pend := b.pending(t, id("ship", "pending"), time.Hour)
		_, err = b.store.Forget(b.ctx, inbox.ForgetParams{ID: pend.ID, Actor: operator})
		require.NoError(t, err)
		zombie := b.reserve(t, id("ship", "expired"), "w1", time.Minute, time.Hour)
		clk.Advance(2 * time.Minute)
		_, err = b.store.Forget(b.ctx, inbox.ForgetParams{ID: zombie.ID(), Actor: operator})
		require.NoError(t, err)
		err = zombie.Complete(b.ctx, inbox.Outcome{})
		require.True(t, errors.Is(err, inbox.ErrNotFound) || errors.Is(err, inbox.ErrLeaseLost), "%v", err)
		require.Equal(t, 1, b.records(t), "only the claim made again")
		require.Len(t, b.allAudit(t, inbox.AuditFilter{Action: inbox.ActionForget}), 3)
	})

	t.Run("ResolveRacesTakeOver", func(t *testing.T) {
		t.Parallel()
		b, clk, worker := raceSetup(t, h)
		wins := map[string]int{}
		for i := range raceRounds() {
			k := id("race", fmt.Sprintf("r%d", i))
			b.reserve(t, k, "w1", time.Minute, time.Hour)
			clk.Advance(2 * time.Minute)
			rec := b.get(t, k)
			attempt := rec.Attempt * int64(i%2) // 0 (current) every other round
			var takeErr, resolveErr error
			race(func() {
				_, takeErr = worker.TakeOver(b.ctx, rec, inbox.TakeOverParams{Owner: "w2", Lease: time.Minute})
			}, func() {
				_, _, resolveErr = b.store.Resolve(b.ctx, inbox.ResolveParams{ID: k, To: inbox.StatusCompleted,
					Attempt: attempt, Actor: operator})
			})
			require.True(t, (takeErr == nil) != (resolveErr == nil), "exactly one wins: take over %v, resolve %v", takeErr, resolveErr)
			now := b.get(t, k)
			if resolveErr == nil {
				wins["resolve"]++
				require.ErrorIs(t, takeErr, inbox.ErrLeaseLost)
				require.Equal(t, inbox.StatusCompleted, now.Status)
				require.Equal(t, int64(1), now.Attempt)
				require.Len(t, b.audit(t, k), 1)
			} else {
				wins["take over"]++
				require.True(t, errors.Is(resolveErr, inbox.ErrLeaseLost) || errors.Is(resolveErr, inbox.ErrLeaseLive),
					"%v", resolveErr)
				require.Equal(t, inbox.StatusProcessing, now.Status)
				require.Equal(t, int64(2), now.Attempt)
				require.Equal(t, "w2", now.LeaseOwner)
				require.Empty(t, b.audit(t, k), "no audit entry without the change")
			}
		}
		t.Logf("wins: %v", wins)
	})

	t.Run("ForgetRacesTakeOver", func(t *testing.T) {
		t.Parallel()
		b, clk, worker := raceSetup(t, h)
		wins := map[string]int{}
		for i := range raceRounds() {
			k := id("race", fmt.Sprintf("f%d", i))
			b.reserve(t, k, "w1", time.Minute, time.Hour)
			clk.Advance(2 * time.Minute)
			rec := b.get(t, k)
			attempt := rec.Attempt * int64(i%2)
			var takeErr, forgetErr error
			race(func() {
				_, takeErr = worker.TakeOver(b.ctx, rec, inbox.TakeOverParams{Owner: "w2", Lease: time.Minute})
			}, func() {
				_, forgetErr = b.store.Forget(b.ctx, inbox.ForgetParams{ID: k, Attempt: attempt, Actor: operator})
			})
			require.True(t, (takeErr == nil) != (forgetErr == nil), "exactly one wins: take over %v, forget %v", takeErr, forgetErr)
			now, err := b.store.Get(b.ctx, b.db, k)
			if forgetErr == nil {
				wins["forget"]++
				require.ErrorIs(t, takeErr, inbox.ErrLeaseLost)
				require.ErrorIs(t, err, inbox.ErrNotFound)
				require.Len(t, b.audit(t, k), 1)
			} else {
				wins["take over"]++
				require.True(t, errors.Is(forgetErr, inbox.ErrLeaseLost) || errors.Is(forgetErr, inbox.ErrLeaseLive),
					"%v", forgetErr)
				require.NoError(t, err)
				require.Equal(t, int64(2), now.Attempt)
				require.Equal(t, "w2", now.LeaseOwner)
				require.Empty(t, b.audit(t, k))
			}
		}
		t.Logf("wins: %v", wins)
	})

	t.Run("ResolveNeverBeatsALiveWorker", func(t *testing.T) {
		t.Parallel()
		b, _, worker := raceSetup(t, h)
		for i := range raceRounds() {
			k := id("race", fmt.Sprintf("l%d", i))
			res, err := worker.Reserve(b.ctx, inbox.ReserveParams{ID: k, PayloadHash: hash("x"), Owner: "w1",
				Lease: time.Hour, Retention: time.Hour})
			require.NoError(t, err)
			var completeErr, resolveErr error
			race(func() {
				completeErr = res.Lease.Complete(b.ctx, inbox.Outcome{Result: []byte("done")})
			}, func() {
				_, _, resolveErr = b.store.Resolve(b.ctx, inbox.ResolveParams{ID: k, To: inbox.StatusFailed, Actor: operator})
			})
			require.NoError(t, completeErr, "the live worker always wins")
			require.True(t, errors.Is(resolveErr, inbox.ErrLeaseLive) || errors.Is(resolveErr, inbox.ErrNotResolvable),
				"%v", resolveErr)
			require.Equal(t, inbox.StatusCompleted, b.get(t, k).Status)
			require.Empty(t, b.audit(t, k))
		}
	})

	t.Run("ResolveRacesAnExpiredWorkersComplete", func(t *testing.T) {
		t.Parallel()
		b, clk, worker := raceSetup(t, h)
		wins := map[string]int{}
		for i := range raceRounds() {
			k := id("race", fmt.Sprintf("e%d", i))
			res, err := worker.Reserve(b.ctx, inbox.ReserveParams{ID: k, PayloadHash: hash("x"), Owner: "w1",
				Lease: time.Minute, Retention: time.Hour})
			require.NoError(t, err)
			clk.Advance(2 * time.Minute)
			var completeErr, resolveErr error
			race(func() {
				completeErr = res.Lease.Complete(b.ctx, inbox.Outcome{Result: []byte("late")})
			}, func() {
				_, _, resolveErr = b.store.Resolve(b.ctx, inbox.ResolveParams{ID: k, To: inbox.StatusFailed,
					Attempt: 1, Actor: operator})
			})
			require.True(t, (completeErr == nil) != (resolveErr == nil), "exactly one wins: complete %v, resolve %v",
				completeErr, resolveErr)
			now := b.get(t, k)
			if resolveErr == nil {
				wins["resolve"]++
				require.ErrorIs(t, completeErr, inbox.ErrLeaseLost)
				require.Equal(t, inbox.StatusFailed, now.Status)
				require.Nil(t, now.Result)
				require.Len(t, b.audit(t, k), 1)
			} else {
				wins["complete"]++
				require.ErrorIs(t, resolveErr, inbox.ErrNotResolvable)
				require.Equal(t, inbox.StatusCompleted, now.Status)
				require.Equal(t, []byte("late"), now.Result)
				require.Empty(t, b.audit(t, k))
			}
		}
		t.Logf("wins: %v", wins)
	})

	t.Run("PurgeWithAudit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		past := time.Now().Add(-time.Hour)
		b.seed(t, "old", 50, inbox.StatusCompleted, past)
		b.seed(t, "new", 5, inbox.StatusCompleted, time.Now().Add(time.Hour))

		_, err := b.store.Purge(b.ctx, inbox.PurgeParams{Audit: &inbox.Actor{Name: "cron"}})
		require.ErrorIs(t, err, inbox.ErrInvalidParams)
		require.Equal(t, 55, b.records(t), "an unusable actor deletes nothing")

		var progress []inbox.PurgeResult
		res, err := b.store.Purge(b.ctx, inbox.PurgeParams{BatchSize: 16, Pause: -1, Audit: &operator,
			Progress: func(r inbox.PurgeResult) { progress = append(progress, r) }})
		require.NoError(t, err)
		require.EqualValues(t, 50, res.Deleted)
		require.Equal(t, 4, res.Batches)
		require.NotEmpty(t, res.AuditID)
		require.Len(t, progress, 4)
		for i, want := range []int64{16, 32, 48, 50} {
			require.Equal(t, want, progress[i].Deleted)
			require.Equal(t, i+1, progress[i].Batches)
			require.Equal(t, res.AuditID, progress[i].AuditID)
		}
		require.Equal(t, 5, b.records(t))

		entries := b.allAudit(t, inbox.AuditFilter{Action: inbox.ActionPurge})
		require.Len(t, entries, 1)
		e := entries[0]
		require.Equal(t, res.AuditID, e.ID)
		require.EqualValues(t, 50, e.Count)
		require.Equal(t, inbox.ID{}, e.Record)
		require.Empty(t, e.StatusBefore)
		require.Empty(t, e.StatusAfter)
		require.Empty(t, e.Before)
		require.Equal(t, operator.Name, e.Actor)

		// A run that finds nothing changed nothing: it writes no entry,
		// with an actor or without.
		res, err = b.store.Purge(b.ctx, inbox.PurgeParams{Audit: &operator})
		require.NoError(t, err)
		require.Zero(t, res.Deleted)
		require.Equal(t, 1, res.Batches)
		require.Empty(t, res.AuditID)
		res, err = b.store.Purge(b.ctx, inbox.PurgeParams{})
		require.NoError(t, err)
		require.Empty(t, res.AuditID)
		entries = b.allAudit(t, inbox.AuditFilter{Action: inbox.ActionPurge})
		require.Len(t, entries, 1)
		require.EqualValues(t, 50, entries[0].Count)

		// A run whose last batch deletes nothing, after full ones, is
		// recorded once, with its count.
		b.seed(t, "even", 16, inbox.StatusCompleted, past)
		res, err = b.store.Purge(b.ctx, inbox.PurgeParams{BatchSize: 8, Pause: -1, Audit: &operator})
		require.NoError(t, err)
		require.EqualValues(t, 16, res.Deleted)
		require.Equal(t, 3, res.Batches)
		entries = b.allAudit(t, inbox.AuditFilter{Action: inbox.ActionPurge})
		require.Len(t, entries, 2)
		require.Equal(t, res.AuditID, entries[0].ID)
		require.EqualValues(t, 16, entries[0].Count)
	})

	t.Run("AnInterruptedPurgeCountsWhatItDeleted", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		past := time.Now().Add(-time.Hour)
		b.seed(t, "a", 100, inbox.StatusCompleted, past)

		// Cancelled between batches.
		ctx, cancel := context.WithCancel(b.ctx)
		res, err := b.store.Purge(ctx, inbox.PurgeParams{BatchSize: 10, Pause: -1, Audit: &operator,
			Progress: func(r inbox.PurgeResult) {
				if r.Batches == 3 {
					cancel()
				}
			}})
		require.ErrorIs(t, err, context.Canceled)
		require.EqualValues(t, 30, res.Deleted)
		require.Equal(t, 70, b.records(t))
		entries := b.allAudit(t, inbox.AuditFilter{Action: inbox.ActionPurge})
		require.Len(t, entries, 1)
		require.EqualValues(t, 30, entries[0].Count)

		// Cancelled at any moment, mid-batch included: the entries count
		// exactly the records gone.
		seeded := 100
		rounds := 6
		if raceEnabled {
			rounds = 3
		}
		for i := range rounds {
			b.seed(t, fmt.Sprintf("r%d", i), 200, inbox.StatusCompleted, past)
			seeded += 200
			ctx, cancel := context.WithCancel(b.ctx)
			timer := time.AfterFunc(time.Duration(rand.IntN(30_000))*time.Microsecond, cancel)
			res, err := b.store.Purge(ctx, inbox.PurgeParams{BatchSize: 7, Pause: -1, Audit: &operator})
			timer.Stop()
			cancel()
			if err != nil {
				require.ErrorIs(t, err, context.Canceled)
			}
			var counted int64
			var dbg []string
			for _, e := range b.allAudit(t, inbox.AuditFilter{Action: inbox.ActionPurge, Limit: 2}) {
				counted += e.Count
				dbg = append(dbg, fmt.Sprintf("%s=%d", e.ID, e.Count))
			}
			require.EqualValues(t, seeded-b.records(t), counted, "round %d: %+v %v %v", i, res, err, dbg)
		}
	})

	t.Run("ListPagesAndFilters", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		type made struct {
			id      inbox.ID
			status  inbox.Status
			attempt int64
			created time.Time
		}
		var all []made
		for _, scope := range []string{"", "t1"} {
			for _, op := range []string{"a", "b"} {
				for i := range 5 {
					k := inbox.ID{Scope: scope, Operation: op, Key: fmt.Sprintf("k%02d", i)}
					m := made{id: k, attempt: 1, created: usec(clk.Now())}
					switch i {
					case 0, 1:
						_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: k, PayloadHash: hash("x")})
						require.NoError(t, err)
						m.status = inbox.StatusCompleted
					case 2:
						b.pending(t, k, 0)
						m.status = inbox.StatusPending
					case 3:
						l := b.reserve(t, k, "w1", time.Second, 0)
						require.NoError(t, l.Release(b.ctx, "again"))
						_, err := b.store.TakeOver(b.ctx, b.get(t, k), inbox.TakeOverParams{Owner: "w2", Lease: time.Hour})
						require.NoError(t, err)
						m.status, m.attempt = inbox.StatusProcessing, 2
					case 4:
						_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: k, PayloadHash: hash("x"), Status: inbox.StatusFailed})
						require.NoError(t, err)
						m.status = inbox.StatusFailed
					}
					all = append(all, m)
					clk.Advance(time.Minute)
				}
			}
		}
		res, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: inbox.ID{Scope: "t1", Operation: "b", Key: "k99"},
			PayloadHash: hash("x")})
		require.NoError(t, err)
		require.NoError(t, b.store.SaveOutput(b.ctx, b.db, res.Record, []byte("output")))
		all = append(all, made{id: res.Record.ID, status: inbox.StatusCompleted, attempt: 1, created: usec(clk.Now())})
		now := usec(clk.Now())

		// list pages through f with the given page size.
		list := func(f inbox.Filter) []inbox.ID {
			t.Helper()
			var ids []inbox.ID
			for pages := 0; ; pages++ {
				require.Less(t, pages, 100)
				page, err := b.store.List(b.ctx, f)
				require.NoError(t, err)
				require.LessOrEqual(t, len(page.Records), max(f.Limit, 1))
				for _, r := range page.Records {
					ids = append(ids, r.ID)
				}
				if page.Next == "" {
					return ids
				}
				require.Len(t, page.Records, f.Limit, "only the last page is short")
				f.After = page.Next
			}
		}
		want := func(keep func(made) bool) []inbox.ID {
			ids := []inbox.ID{}
			for _, m := range all {
				if keep(m) {
					ids = append(ids, m.id)
				}
			}
			return ids // created in primary-key order
		}
		for name, c := range map[string]struct {
			f    inbox.Filter
			keep func(made) bool
		}{
			"all":           {inbox.Filter{}, func(made) bool { return true }},
			"pending":       {inbox.Filter{Status: inbox.StatusPending}, func(m made) bool { return m.status == inbox.StatusPending }},
			"operation b":   {inbox.Filter{Operation: "b"}, func(m made) bool { return m.id.Operation == "b" }},
			"global scope":  {inbox.Filter{ByScope: true}, func(m made) bool { return m.id.Scope == "" }},
			"scope t1":      {inbox.Filter{ByScope: true, Scope: "t1"}, func(m made) bool { return m.id.Scope == "t1" }},
			"scope ignored": {inbox.Filter{Scope: "t1"}, func(made) bool { return true }},
			"taken over":    {inbox.Filter{AttemptAbove: 1}, func(m made) bool { return m.attempt > 1 }},
			"older than":    {inbox.Filter{OlderThan: 10 * time.Minute}, func(m made) bool { return m.created.Before(now.Add(-10 * time.Minute)) }},
			"combined": {inbox.Filter{Status: inbox.StatusCompleted, Operation: "a", ByScope: true, Scope: "t1"},
				func(m made) bool {
					return m.status == inbox.StatusCompleted && m.id.Operation == "a" && m.id.Scope == "t1"
				}},
			"none": {inbox.Filter{Operation: "zzz"}, func(made) bool { return false }},
		} {
			expected := want(c.keep)
			for _, limit := range []int{1, 3, 1000} {
				f := c.f
				f.Limit = limit
				got := list(f)
				if got == nil {
					got = []inbox.ID{}
				}
				require.Equal(t, expected, got, "%s, pages of %d", name, limit)
			}
		}
		page, err := b.store.List(b.ctx, inbox.Filter{})
		require.NoError(t, err)
		require.Len(t, page.Records, len(all), "the default page holds them all")
		require.Empty(t, page.Next)
		last := page.Records[len(page.Records)-1]
		require.Equal(t, "k99", last.Key)
		require.Equal(t, []byte("output"), last.Result, "results are loaded")
		require.Equal(t, b.get(t, last.ID), last)
		page, err = b.store.List(b.ctx, inbox.Filter{Limit: inbox.MaxListLimit * 10})
		require.NoError(t, err, "a limit above the maximum reads the maximum")
		require.Len(t, page.Records, len(all))

		for name, f := range map[string]inbox.Filter{
			"negative limit":   {Limit: -1},
			"unknown status":   {Status: "done"},
			"garbage cursor":   {After: "!!"},
			"forged cursor":    {After: "YWJj"}, // "abc": no key parts
			"negative age":     {OlderThan: -time.Second},
			"negative attempt": {AttemptAbove: -1},
			"NUL in operation": {Operation: "a\x00"},
			"bad scope":        {ByScope: true, Scope: "\xff"},
		} {
			_, err := b.store.List(b.ctx, f)
			require.ErrorIs(t, err, inbox.ErrInvalidParams, name)
		}
	})

	t.Run("ListOrders", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		// Records created a minute apart, some at the same instant, some
		// changed later (updated_at moves) and some taken over (attempt
		// grows), across two scopes and two operations.
		var ids []inbox.ID
		for i := range 14 {
			id := inbox.ID{Scope: []string{"", "t1"}[i%2], Operation: []string{"a", "b"}[i/2%2], Key: fmt.Sprintf("k%02d", 13-i)}
			ids = append(ids, id)
			switch i % 3 {
			case 0:
				_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id, PayloadHash: hash("x")})
				require.NoError(t, err)
			case 1:
				b.pending(t, id, 0)
			case 2:
				l := b.reserve(t, id, "w1", time.Second, 0)
				for range i % 4 {
					require.NoError(t, l.Release(b.ctx, "again"))
					rec := b.get(t, id)
					lease, err := b.store.TakeOver(b.ctx, rec, inbox.TakeOverParams{Owner: "w2", Lease: time.Hour})
					require.NoError(t, err)
					l = lease
				}
			}
			if i%4 != 3 { // every fourth shares the instant of the one after it
				clk.Advance(time.Minute)
			}
		}
		// Later changes: updated_at no longer follows created_at.
		for _, id := range []inbox.ID{ids[1], ids[7], ids[4]} {
			clk.Advance(time.Minute)
			if rec := b.get(t, id); rec.Status == inbox.StatusPending {
				_, _, err := b.store.Resolve(b.ctx, inbox.ResolveParams{ID: id, To: inbox.StatusCompleted, Actor: operator})
				require.NoError(t, err)
			} else {
				_, err := b.store.Forget(b.ctx, inbox.ForgetParams{ID: id, Actor: operator})
				require.NoError(t, err)
				_, err = b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id, PayloadHash: hash("x")})
				require.NoError(t, err)
			}
		}
		var recs []*inbox.Record
		for _, id := range ids {
			recs = append(recs, b.get(t, id))
		}
		value := func(r *inbox.Record, c inbox.OrderColumn) int64 {
			switch c {
			case inbox.OrderByCreated:
				return r.CreatedAt.UnixMicro()
			case inbox.OrderByUpdated:
				return r.UpdatedAt.UnixMicro()
			}
			return r.Attempt
		}
		keyLess := func(a, b inbox.ID) bool {
			if a.Scope != b.Scope {
				return a.Scope < b.Scope
			}
			if a.Operation != b.Operation {
				return a.Operation < b.Operation
			}
			return a.Key < b.Key
		}
		for _, o := range inbox.ListOrders() {
			for name, keep := range map[string]func(*inbox.Record) bool{
				"all":     func(*inbox.Record) bool { return true },
				"pending": func(r *inbox.Record) bool { return r.Status == inbox.StatusPending },
				"scope":   func(r *inbox.Record) bool { return r.Scope == "t1" },
			} {
				var want []inbox.ID
				sorted := append([]*inbox.Record(nil), recs...)
				sort.SliceStable(sorted, func(i, j int) bool {
					a, c := sorted[i], sorted[j]
					if o.Desc {
						a, c = c, a
					}
					if va, vc := value(a, o.Column), value(c, o.Column); va != vc {
						return va < vc
					}
					return keyLess(a.ID, c.ID)
				})
				for _, r := range sorted {
					if keep(r) {
						want = append(want, r.ID)
					}
				}
				for _, limit := range []int{1, 2, 5, 1000} {
					f := inbox.Filter{Order: o, Limit: limit}
					switch name {
					case "pending":
						f.Status = inbox.StatusPending
					case "scope":
						f.ByScope, f.Scope = true, "t1"
					}
					var got []inbox.ID
					for pages := 0; ; pages++ {
						require.Less(t, pages, 100)
						page, err := b.store.List(b.ctx, f)
						require.NoError(t, err, "%s %s", o, name)
						for _, r := range page.Records {
							got = append(got, r.ID)
						}
						if page.Next == "" {
							break
						}
						require.Len(t, page.Records, limit, "only the last page is short")
						f.After = page.Next
					}
					require.Equal(t, want, got, "order %s, %s, pages of %d", o, name, limit)
				}
			}
		}

		// A cursor belongs to its order.
		byCreated, err := b.store.List(b.ctx, inbox.Filter{Order: inbox.ListOrder{Column: inbox.OrderByCreated}, Limit: 2})
		require.NoError(t, err)
		byKey, err := b.store.List(b.ctx, inbox.Filter{Limit: 2})
		require.NoError(t, err)
		for name, f := range map[string]inbox.Filter{
			"a created cursor, descending": {Order: inbox.ListOrder{Column: inbox.OrderByCreated, Desc: true}, After: byCreated.Next},
			"a created cursor, by key":     {After: byCreated.Next},
			"a key cursor, by attempt":     {Order: inbox.ListOrder{Column: inbox.OrderByAttempt}, After: byKey.Next},
			"an unknown column":            {Order: inbox.ListOrder{Column: "payload_hash"}},
			"the key, descending":          {Order: inbox.ListOrder{Desc: true}},
			"a garbage cursor":             {Order: inbox.ListOrder{Column: inbox.OrderByUpdated}, After: "!!"},
		} {
			_, err := b.store.List(b.ctx, f)
			require.ErrorIs(t, err, inbox.ErrInvalidParams, name)
		}
	})

	t.Run("Activity", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		t0 := usec(clk.Now())
		since := t0.Add(time.Minute)
		// Records changed at the edges of the buckets and inside them: at
		// t0 (before the window), at since (its first instant), a
		// microsecond before a bucket ends, at the start of the next, at the
		// window's end (after it), and past it.
		steps := []time.Duration{0, time.Minute, time.Hour + time.Minute - time.Microsecond, time.Microsecond,
			10 * time.Minute, 40 * time.Minute, 59 * time.Minute, time.Hour + time.Minute, time.Minute}
		var ids []inbox.ID
		for i, d := range steps {
			clk.Advance(d)
			id := inbox.ID{Operation: "op", Key: fmt.Sprintf("k%02d", i)}
			ids = append(ids, id)
			switch i % 4 {
			case 0:
				_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id, PayloadHash: hash("x")})
				require.NoError(t, err)
			case 1:
				_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id, PayloadHash: hash("x"), Status: inbox.StatusFailed})
				require.NoError(t, err)
			case 2:
				b.pending(t, id, 0)
			case 3:
				b.reserve(t, id, "w1", time.Hour, 0)
			}
		}
		var recs []*inbox.Record
		for _, id := range ids {
			recs = append(recs, b.get(t, id))
		}
		for _, p := range []inbox.ActivityParams{
			{Since: since, Width: time.Hour, Buckets: 3},
			{Since: since, Width: 7*time.Minute + 3*time.Second, Buckets: 30},
			{Since: since.Add(-time.Hour), Width: 24 * time.Hour, Buckets: 1},
			{Since: t0, Width: time.Microsecond, Buckets: 1000},
		} {
			got, err := b.store.Activity(b.ctx, p)
			require.NoError(t, err)
			require.Len(t, got, p.Buckets)
			want := make([]map[inbox.Status]int64, p.Buckets)
			for i := range want {
				want[i] = map[inbox.Status]int64{}
				require.Equal(t, p.Since.Add(time.Duration(i)*p.Width), got[i].Start, "bucket %d starts", i)
				require.Equal(t, got[i].Start.Add(p.Width), got[i].End, "bucket %d ends", i)
			}
			for _, r := range recs {
				off := r.UpdatedAt.Sub(p.Since)
				if off < 0 || off >= time.Duration(p.Buckets)*p.Width {
					continue
				}
				want[off/p.Width][r.Status]++
			}
			for i := range want {
				require.Equal(t, want[i], got[i].Counts, "%+v: bucket %d", p, i)
			}
		}
		for name, p := range map[string]inbox.ActivityParams{
			"no since":       {Width: time.Hour, Buckets: 1},
			"no width":       {Since: since, Buckets: 1},
			"no buckets":     {Since: since, Width: time.Hour},
			"too many":       {Since: since, Width: time.Hour, Buckets: inbox.MaxActivityBuckets + 1},
			"negative width": {Since: since, Width: -time.Hour, Buckets: 1},
		} {
			_, err := b.store.Activity(b.ctx, p)
			require.ErrorIs(t, err, inbox.ErrInvalidParams, name)
		}
	})

	t.Run("OldestCreated", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		oldest := func(op string) time.Time {
			t.Helper()
			at, err := b.store.OldestCreated(b.ctx, op)
			require.NoError(t, err)
			return at
		}
		require.True(t, oldest("").IsZero(), "an empty table has no oldest record")
		require.True(t, oldest("a").IsZero())

		claim := func(op, key string, status inbox.Status) time.Time {
			t.Helper()
			at := usec(clk.Now())
			_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id(op, key), PayloadHash: hash("x"),
				Status: status, Retention: time.Minute})
			require.NoError(t, err)
			clk.Advance(time.Second)
			return at
		}
		firstB := claim("b", "1", inbox.StatusCompleted)
		firstA := claim("a", "1", inbox.StatusCompleted)
		secondA := usec(clk.Now())
		b.reserve(t, id("a", "2"), "w1", time.Minute, time.Minute)
		clk.Advance(time.Second)
		secondB := usec(clk.Now())
		b.pending(t, id("b", "2"), time.Minute)
		clk.Advance(time.Second)

		require.WithinDuration(t, firstA, oldest("a"), 0)
		require.WithinDuration(t, firstB, oldest("b"), 0)
		require.WithinDuration(t, firstB, oldest(""), 0, "\"\" looks at every operation")
		require.True(t, oldest("c").IsZero(), "an operation without records")
		require.Equal(t, time.UTC, oldest("a").Location())

		// A later claim does not move the oldest.
		claim("a", "3", inbox.StatusCompleted)
		require.WithinDuration(t, firstA, oldest("a"), 0)

		// Once the oldest records are purged, the oldest is a later one.
		clk.Advance(time.Hour)
		_, err := b.store.Purge(b.ctx, inbox.PurgeParams{})
		require.NoError(t, err)
		require.WithinDuration(t, secondB, oldest("b"), 0, "the pending record is kept, the completed one purged")
		require.WithinDuration(t, secondA, oldest("a"), 0, "the processing record is kept, the completed ones purged")
		require.WithinDuration(t, secondA, oldest(""), 0)

		_, err = b.store.OldestCreated(b.ctx, "a\x00")
		require.ErrorIs(t, err, inbox.ErrInvalidKey)
	})

	t.Run("Overview", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		o, err := b.store.Overview(b.ctx)
		require.NoError(t, err)
		require.Empty(t, o.Counts)
		require.Zero(t, o.Total)
		require.Nil(t, o.OldestPending)
		require.Nil(t, o.OldestExpiredLease)
		require.Zero(t, o.AwaitingPurge)
		require.True(t, o.OldestExpired.IsZero())
		require.WithinDuration(t, usec(clk.Now()), o.Now, 0)

		claim := func(op, key string, status inbox.Status, retention time.Duration) {
			_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: id(op, key), PayloadHash: hash("x"),
				Status: status, Retention: retention})
			require.NoError(t, err)
		}
		claim("b", "short-1", inbox.StatusCompleted, time.Minute)
		firstExpiry := usec(clk.Now()).Add(time.Minute)
		claim("b", "short-2", inbox.StatusFailed, 2*time.Minute)
		clk.Advance(time.Second)
		b.pending(t, id("b", "pending-old"), time.Hour)
		oldPending := b.get(t, id("b", "pending-old"))
		clk.Advance(time.Second)
		b.reserve(t, id("a", "expired-old"), "w1", time.Minute, time.Hour)
		clk.Advance(time.Second)
		b.reserve(t, id("a", "expired-new"), "w1", time.Minute, time.Hour)
		clk.Advance(time.Second)
		b.pending(t, id("a", "pending-new"), time.Hour)
		claim("a", "long", inbox.StatusCompleted, 24*time.Hour)
		claim("a", "forever", inbox.StatusCompleted, 0)
		clk.Advance(10 * time.Minute)
		// Live: reserved after the clock moved.
		b.reserve(t, id("a", "live"), "w2", time.Hour, time.Hour)

		o, err = b.store.Overview(b.ctx)
		require.NoError(t, err)
		require.Equal(t, []inbox.Count{
			{Operation: "a", Status: inbox.StatusCompleted, N: 2},
			{Operation: "a", Status: inbox.StatusPending, N: 1},
			{Operation: "a", Status: inbox.StatusProcessing, N: 3},
			{Operation: "b", Status: inbox.StatusCompleted, N: 1},
			{Operation: "b", Status: inbox.StatusFailed, N: 1},
			{Operation: "b", Status: inbox.StatusPending, N: 1},
		}, o.Counts)
		require.EqualValues(t, 9, o.Total)
		require.Equal(t, oldPending, o.OldestPending)
		require.Equal(t, b.get(t, id("a", "expired-old")), o.OldestExpiredLease)
		require.EqualValues(t, 2, o.AwaitingPurge)
		require.WithinDuration(t, firstExpiry, o.OldestExpired, 0)
		require.WithinDuration(t, usec(clk.Now()), o.Now, 0)

		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.EqualValues(t, 3, st.Processing)
		require.EqualValues(t, 2, st.Pending)
		res, err := b.store.Purge(b.ctx, inbox.PurgeParams{})
		require.NoError(t, err)
		require.Equal(t, o.AwaitingPurge, res.Deleted, "AwaitingPurge is what a purge deletes")
	})

	t.Run("FindByDigest", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h)
		n := 2500 // more than one page of keys
		b.seed(t, "k", n, inbox.StatusCompleted, time.Now().Add(time.Hour))
		_, err := b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: inbox.ID{Scope: "zz", Operation: "other", Key: "x"},
			PayloadHash: hash("x")})
		require.NoError(t, err)
		other := inbox.ID{Scope: "zz", Operation: "other", Key: "x"}

		for _, k := range []inbox.ID{id("op", "k-0"), id("op", fmt.Sprintf("k-%d", n-1)), id("op", "k-1234")} {
			for _, op := range []string{"", "op"} {
				rec, err := b.store.FindByDigest(b.ctx, k.Digest(), op)
				require.NoError(t, err, "%v in %q", k, op)
				require.Equal(t, b.get(t, k), rec)
			}
			_, err := b.store.FindByDigest(b.ctx, k.Digest(), "other")
			require.ErrorIs(t, err, inbox.ErrNotFound)
		}
		rec, err := b.store.FindByDigest(b.ctx, other.Digest(), "")
		require.NoError(t, err)
		require.Equal(t, other, rec.ID)
		_, err = b.store.FindByDigest(b.ctx, other.Digest(), "op")
		require.ErrorIs(t, err, inbox.ErrNotFound)
		_, err = b.store.FindByDigest(b.ctx, id("op", "missing").Digest(), "")
		require.ErrorIs(t, err, inbox.ErrNotFound)

		for _, bad := range []string{"", "0123", strings.ToUpper(other.Digest()), other.Digest() + "0", "0123456789abcdeg"} {
			_, err := b.store.FindByDigest(b.ctx, bad, "")
			require.ErrorIs(t, err, inbox.ErrInvalidKey, "%q", bad)
		}
		_, err = b.store.FindByDigest(b.ctx, other.Digest(), "a\x00")
		require.ErrorIs(t, err, inbox.ErrInvalidKey)

		// Every page size finds the same records, whether the database
		// hashes the keys (a page at a time, the rest here) or this
		// process does; a key of more than ASCII hashes as ID.Digest does.
		uni := inbox.ID{Scope: "acmé", Operation: "op", Key: "ключ-✓ \u00e9"}
		_, err = b.store.Claim(b.ctx, b.db, inbox.ClaimParams{ID: uni, PayloadHash: hash("u")})
		require.NoError(t, err)
		for _, size := range []int{100, 999, 5000} {
			for _, k := range []inbox.ID{id("op", "k-0"), id("op", "k-2024"), uni, other} {
				var reads []int64
				rec, err := b.store.ScanDigest(b.ctx, inbox.DigestScan{Digest: k.Digest(), PageSize: size,
					Progress: func(n int64) { reads = append(reads, n) }})
				require.NoError(t, err, "%v, pages of %d", k, size)
				require.Equal(t, k, rec.ID)
				require.NotEmpty(t, reads)
				require.True(t, slices.IsSorted(reads), "progress %v", reads)
			}
			var reads []int64
			_, err := b.store.ScanDigest(b.ctx, inbox.DigestScan{Digest: id("op", "missing").Digest(), PageSize: size,
				Progress: func(n int64) { reads = append(reads, n) }})
			require.ErrorIs(t, err, inbox.ErrNotFound)
			require.Equal(t, int64(n+2), reads[len(reads)-1], "a scan that finds nothing reads every key once")
			_, err = b.store.ScanDigest(b.ctx, inbox.DigestScan{Digest: uni.Digest(), Operation: "other", PageSize: size})
			require.ErrorIs(t, err, inbox.ErrNotFound)
		}
		_, err = b.store.ScanDigest(b.ctx, inbox.DigestScan{Digest: uni.Digest(), PageSize: -1})
		require.ErrorIs(t, err, inbox.ErrInvalidParams)

		// A scope narrows the scan and shortens it: the primary key leads
		// with the scope, so the scan reads the scope's keys and at most
		// a page past them. The global scope ("") holds the n seeded
		// records; "acmé" one, "zz" one.
		for _, size := range []int{100, 999, 5000} {
			scan := func(k inbox.ID, scope string) (*inbox.Record, int64, error) {
				var read int64
				rec, err := b.store.ScanDigest(b.ctx, inbox.DigestScan{Digest: k.Digest(), Scope: scope, ByScope: true,
					PageSize: size, Progress: func(n int64) { read = n }})
				return rec, read, err
			}
			for _, k := range []inbox.ID{id("op", "k-0"), id("op", "k-2024"), uni, other} {
				rec, read, err := scan(k, k.Scope)
				require.NoError(t, err, "%v, pages of %d", k, size)
				require.Equal(t, k, rec.ID)
				if k.Scope != "" {
					require.LessOrEqual(t, read, int64(2), "%v, pages of %d: only the keys of its scope and after", k, size)
				}
			}
			_, read, err := scan(uni, "")
			require.ErrorIs(t, err, inbox.ErrNotFound, "in another scope")
			require.LessOrEqual(t, read, int64(n+size), "pages of %d: the global scope's keys and at most a page more", size)
			_, read, err = scan(id("op", "k-7"), "acmé")
			require.ErrorIs(t, err, inbox.ErrNotFound)
			require.LessOrEqual(t, read, int64(2), "pages of %d", size)
			_, _, err = scan(other, "z")
			require.ErrorIs(t, err, inbox.ErrNotFound, "a scope that sorts just before another's")
		}
		_, err = b.store.ScanDigest(b.ctx, inbox.DigestScan{Digest: uni.Digest(), Scope: "a\x00", ByScope: true})
		require.ErrorIs(t, err, inbox.ErrInvalidKey)
	})

	t.Run("ListAuditPagesAndFilters", func(t *testing.T) {
		t.Parallel()
		clk := newFixedClock()
		b := setupWith(t, h, onClock(clk))
		step := func() { clk.Advance(time.Millisecond) }
		var recs []inbox.ID
		for i := range 3 {
			rec := b.pending(t, id("op", fmt.Sprintf("p%d", i)), time.Hour)
			recs = append(recs, rec.ID)
			step()
			_, _, err := b.store.Resolve(b.ctx, inbox.ResolveParams{ID: rec.ID, To: inbox.StatusCompleted, Actor: operator})
			require.NoError(t, err)
		}
		for _, k := range recs[:2] {
			step()
			_, err := b.store.Forget(b.ctx, inbox.ForgetParams{ID: k, Actor: operator})
			require.NoError(t, err)
		}
		step()
		// A purge that deletes nothing is no audit event: give it a record.
		b.seed(t, "expired", 1, inbox.StatusCompleted, clk.Now().Add(-time.Hour))
		_, err := b.store.Purge(b.ctx, inbox.PurgeParams{Audit: &inbox.Actor{Name: "cron", Reason: "nightly"}})
		require.NoError(t, err)

		all := b.allAudit(t, inbox.AuditFilter{Limit: 2})
		require.Len(t, all, 6)
		require.Equal(t, b.allAudit(t, inbox.AuditFilter{}), all)
		for i := 1; i < len(all); i++ {
			require.Greater(t, all[i-1].ID, all[i].ID, "newest first")
			require.False(t, all[i-1].At.Before(all[i].At))
		}
		var actions []string
		for _, e := range all {
			actions = append(actions, e.Action)
		}
		require.Equal(t, []string{"purge", "forget", "forget", "resolve", "resolve", "resolve"}, actions)
		require.Equal(t, "cron", all[0].Actor)
		require.Equal(t, "nightly", all[0].Reason)

		mine := b.audit(t, recs[0])
		require.Len(t, mine, 2)
		require.Equal(t, inbox.ActionForget, mine[0].Action)
		require.Equal(t, inbox.StatusCompleted, mine[0].StatusBefore)
		require.Equal(t, inbox.ActionResolve, mine[1].Action)
		require.Equal(t, inbox.StatusPending, mine[1].StatusBefore)
		require.Len(t, b.audit(t, recs[2]), 1)
		require.Empty(t, b.audit(t, id("op", "nobody")))
		require.Len(t, b.allAudit(t, inbox.AuditFilter{Action: inbox.ActionForget, Limit: 1}), 2)
		require.Len(t, b.allAudit(t, inbox.AuditFilter{Action: inbox.ActionResolve, Record: &recs[1]}), 1)

		page, next, err := b.store.ListAudit(b.ctx, inbox.AuditFilter{Limit: 4})
		require.NoError(t, err)
		require.Len(t, page, 4)
		require.Equal(t, page[3].ID, next)
		page, next, err = b.store.ListAudit(b.ctx, inbox.AuditFilter{After: next})
		require.NoError(t, err)
		require.Equal(t, all[4:], page)
		require.Empty(t, next)

		for name, f := range map[string]inbox.AuditFilter{
			"unknown action": {Action: "delete"},
			"bad cursor":     {After: "zz"},
			"bad record":     {Record: &inbox.ID{Operation: "op"}},
			"negative limit": {Limit: -1},
		} {
			_, _, err := b.store.ListAudit(b.ctx, f)
			require.ErrorIs(t, err, inbox.ErrInvalidParams, name)
		}
	})
}

// raceRounds is how many times a race test runs its race.
func raceRounds() int {
	if raceEnabled {
		return 25
	}
	return 60
}

// raceSetup returns a bundle on a fixed clock and a second store over its
// table on the same clock: the worker's, racing the operator's.
func raceSetup(t *testing.T, h Harness) (*bundle, *fixedClock, *inbox.Store) {
	t.Helper()
	clk := newFixedClock()
	b := setupWith(t, h, onClock(clk))
	return b, clk, b.newStore(t, onClock(clk))
}

// race runs a and b at once, released together, and waits for both. One
// of them, at random, starts up to a millisecond late, so that over many
// rounds either may get to the database first.
func race(a, b func()) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	late := rand.IntN(2)
	delay := time.Duration(rand.IntN(1000)) * time.Microsecond
	for i, f := range []func(){a, b} {
		wg.Go(func() {
			<-start
			if i == late {
				time.Sleep(delay)
			}
			f()
		})
	}
	close(start)
	wg.Wait()
}
