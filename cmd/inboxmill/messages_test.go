package main

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// negativeAge is a duration printed with a minus sign: an age or a lag
// that reads "-167h59m43s ago".
var negativeAge = regexp.MustCompile(`-\d+(\.\d+)?(h|m|s|ms)`)

// TestNothingExpiredReadsAsNothing: with finished records none of which
// is past its expires_at, stats and purge --dry-run say that nothing
// awaits a purge, and no age or lag is negative: the earliest expires_at,
// a week ahead, is not how long anything has waited.
func TestNothingExpiredReadsAsNothing(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		e.completed(t, id("ship", "evt-1")) // expires in a week
		e.completed(t, id("ship", "evt-2"))

		out := e.ok(t, "stats")
		require.Contains(t, out, "awaiting purge: none\n")
		require.NotRegexp(t, negativeAge, out)

		v := decode[statsView](t, e.ok(t, "stats", "-o", "json"))
		require.Zero(t, v.AwaitingPurge)
		require.Nil(t, v.OldestExpired, "no record has expired")
		require.NotNil(t, v.PurgeLag)
		require.Zero(t, *v.PurgeLag, "nothing waits for a purge")

		out = e.ok(t, "purge", "--dry-run", "--reason", "check")
		require.Equal(t, "dry run: a purge would delete 0 records from table "+e.table+" (completed and failed, past expires_at)\n"+
			"nothing changed; no audit entry written\n", out)

		// An empty table: the lag is 0 as well, not missing.
		empty := setup(t, e.kind)
		v = decode[statsView](t, empty.ok(t, "stats", "-o", "json"))
		require.Nil(t, v.OldestExpired)
		require.NotNil(t, v.PurgeLag)
		require.Zero(t, *v.PurgeLag)
	})
}

// TestMissingRecordIsNotFound: every subcommand that names a record
// answers a record that does not exist with exit status 4 and says which
// record it looked for, by key or by digest, dry run or not.
func TestMissingRecordIsNotFound(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		e.completed(t, id("ship", "evt-1")) // the table is not empty
		missing := id("ship", "nope")
		byKey := []string{"--operation", "ship", "--key", "nope"}
		byDigest := []string{"--digest", missing.Digest()}
		for _, args := range [][]string{
			{"inspect"}, {"inspect", "-o", "json"},
			{"resolve", "--to", "completed", "--reason", "r"}, {"resolve", "--to", "failed", "--reason", "r", "--dry-run"},
			{"forget", "--reason", "r"}, {"forget", "--reason", "r", "--dry-run"},
			{"audit"}, {"audit", "-o", "json"},
		} {
			for _, name := range [][]string{byKey, byDigest} {
				cmd := append(append([]string{}, args...), name...)
				r := e.run(t, cmd...)
				require.Equal(t, exitNotFound, r.code, "%v\n%s", cmd, r)
				require.Empty(t, r.stdout, "%v", cmd)
				require.Contains(t, r.stderr, "no record", "%v", cmd)
				require.Contains(t, r.stderr, missing.Digest(), "%v", cmd)
			}
		}
		require.Empty(t, e.audit(t))
	})
}
