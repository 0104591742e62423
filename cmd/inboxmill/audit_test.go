package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

type auditView struct {
	Entries []auditJSON `json:"entries"`
	Next    string      `json:"next"`
}

func TestAudit(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		require.Equal(t, "no audit entries\n", e.ok(t, "audit"))

		pend := e.pending(t, id("charge", "pi-1"), false)
		done := e.completed(t, id("ship", "evt-1"))
		e.expired(t, id("ship", "old-1"), "completed")
		e.ok(t, "resolve", "--digest", pend.Digest(), "--to", "completed", "--reason", "seen at the provider", "--actor", "alice")
		e.ok(t, "forget", "--digest", done.Digest(), "--reason", "carrier lost the parcel", "--actor", "bob", "--yes")
		e.ok(t, "purge", "--reason", "nightly", "--actor", "cron", "--progress=false", "--yes")

		out := e.ok(t, "audit")
		require.Regexp(t, `(?m)^AT\s+ACTOR\s+ACTION\s+RECORD\s+KEY\s+BEFORE\s+AFTER\s+COUNT\s+REASON$`, out)
		require.Regexp(t, `(?m)^\S+Z\s+cron\s+purge\s+-\s+-\s+-\s+-\s+1\s+nightly$`, out)
		require.Regexp(t, `(?m)^\S+Z\s+bob\s+forget\s+ship/`+done.Digest()+`\s+evt-1\s+completed@1\s+-\s+1\s+carrier lost the parcel$`, out)
		require.Regexp(t, `(?m)^\S+Z\s+alice\s+resolve\s+charge/`+pend.Digest()+`\s+pi-1\s+pending@1\s+completed\s+1\s+seen at the provider$`, out)
		require.Regexp(t, `(?s)cron.*bob.*alice`, out, "newest first")

		v := decode[auditView](t, e.ok(t, "audit", "-o", "json"))
		require.Len(t, v.Entries, 3)
		require.Empty(t, v.Next)
		require.Equal(t, []string{"purge", "forget", "resolve"}, []string{v.Entries[0].Action, v.Entries[1].Action, v.Entries[2].Action})
		require.Nil(t, v.Entries[0].Record)
		require.Equal(t, &auditRecord{"", "ship", "evt-1", done.Digest()}, v.Entries[1].Record)
		require.Equal(t, "completed", decode[map[string]any](t, string(v.Entries[1].Before))["status"])
		require.Equal(t, "pending", v.Entries[2].StatusBefore)
		require.Equal(t, "completed", v.Entries[2].StatusAfter)

		// Filters: an action; a record, by key or by digest, also once the
		// record is forgotten.
		v = decode[auditView](t, e.ok(t, "audit", "--action", "forget", "-o", "json"))
		require.Len(t, v.Entries, 1)
		require.Equal(t, "bob", v.Entries[0].Actor)
		for _, args := range [][]string{
			{"--operation", "ship", "--key", "evt-1"},
			{"--digest", done.Digest()},
			{"--digest", done.Digest(), "--operation", "ship"},
		} {
			v = decode[auditView](t, e.ok(t, append([]string{"audit", "-o", "json"}, args...)...))
			require.Len(t, v.Entries, 1, args)
			require.Equal(t, "forget", v.Entries[0].Action)
		}
		// Under another operation there is neither the record nor history.
		r := e.run(t, "audit", "-o", "json", "--digest", done.Digest(), "--operation", "charge")
		require.Equal(t, exitNotFound, r.code, r.String())
		require.Contains(t, r.stderr, "no audit entry names one")
		v = decode[auditView](t, e.ok(t, "audit", "-o", "json", "--digest", pend.Digest()))
		require.Len(t, v.Entries, 1)
		require.Equal(t, "alice", v.Entries[0].Actor)
		r = e.run(t, "audit", "--operation", "ship")
		require.Equal(t, exitUsage, r.code)

		// Pages.
		p1 := decode[auditView](t, e.ok(t, "audit", "-o", "json", "--limit", "2"))
		require.Len(t, p1.Entries, 2)
		require.NotEmpty(t, p1.Next)
		p2 := decode[auditView](t, e.ok(t, "audit", "-o", "json", "--limit", "2", "--after", p1.Next))
		require.Len(t, p2.Entries, 1)
		require.Equal(t, "resolve", p2.Entries[0].Action)
		require.Len(t, decode[auditView](t, e.ok(t, "audit", "-o", "json", "--limit", "1", "--all")).Entries, 3)
		r = e.run(t, "audit", "--limit", "1")
		require.Equal(t, exitOK, r.code)
		require.Contains(t, r.stderr, "more entries: add --after ")

		// inspect shows a record's history.
		out = e.ok(t, "inspect", "--digest", pend.Digest())
		require.Regexp(t, `(?m)^history \(newest first\):\n  \S+Z  resolve by alice: pending -> completed at attempt 1, reason seen at the provider$`, out)
		iv := decode[inspectView](t, e.ok(t, "inspect", "--digest", pend.Digest(), "-o", "json"))
		require.Len(t, iv.History, 1)
		require.Equal(t, "seen at the provider", iv.History[0].Reason)
	})
}
