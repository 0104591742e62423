package main

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
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
			{"forget", "--reason", "r", "--yes"}, {"forget", "--reason", "r", "--dry-run"},
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

// quoted is a double-quoted value in a message.
var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)+"`)

// repeats reports how a message repeats itself, "" when it does not: the
// package prefix "inbox: " twice ("inbox: resolve: inbox: record not
// found"), a clause twice in a row ("x: x"), or one quoted value twice
// (`invalid argument "x" for "--pause" flag: time: invalid duration "x"`).
func repeats(msg string) string {
	if strings.Count(msg, "inbox: ") > 1 {
		return `"inbox: " more than once`
	}
	parts := strings.Split(msg, ": ")
	for i := 1; i < len(parts); i++ {
		if parts[i] == parts[i-1] {
			return fmt.Sprintf("%q twice in a row", parts[i])
		}
	}
	seen := map[string]bool{}
	for _, q := range quoted.FindAllString(msg, -1) {
		if seen[q] {
			return q + " twice"
		}
		seen[q] = true
	}
	return ""
}

// TestMessagesDoNotRepeatThemselves runs what an operator gets wrong and
// what the store refuses, and requires each message to say it once: the
// command names the flag at fault or the record's state, without the
// store's error chain after it saying the same again.
func TestMessagesDoNotRepeatThemselves(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		done := e.completed(t, id("ship", "evt-1"))
		held := e.live(t, id("charge", "pi-1"))
		gone := e.abandoned(t, id("charge", "pi-2"))
		_, err := e.store.TakeOver(t.Context(), gone, inbox.TakeOverParams{Owner: "worker-2", Lease: time.Hour})
		require.NoError(t, err)
		long := strings.Repeat("k", inbox.MaxKeyLen+1)
		for _, c := range []struct {
			args []string
			code int
			want string
		}{
			{[]string{"resolve", "--operation", "ship", "--key", "a\xffb", "--to", "failed", "--reason", "r"}, exitUsage, "--key is not valid UTF-8"},
			{[]string{"forget", "--yes", "--operation", "ship", "--key", long, "--reason", "r"}, exitUsage, "--key is 256 bytes, more than 255"},
			{[]string{"inspect", "--operation", "ship", "--key", "a\x00b"}, exitUsage, "--key contains a NUL byte"},
			{[]string{"inspect", "--scope", "\xff", "--operation", "ship", "--key", "k"}, exitUsage, "--scope is not valid UTF-8"},
			{[]string{"audit", "--operation", "\xff", "--key", "k"}, exitUsage, "--operation is not valid UTF-8"},
			{[]string{"inspect", "--digest", "0123456789abcdef", "--operation", "\xff"}, exitUsage, "--operation is not valid UTF-8"},
			{[]string{"resolve", "--digest", done.Digest(), "--to", "failed", "--reason", "r"}, exitRefused, "it is completed"},
			{[]string{"resolve", "--digest", held.ID().Digest(), "--to", "failed", "--reason", "r"}, exitRefused, "a worker holds it under a live lease"},
			{[]string{"forget", "--digest", gone.Digest(), "--attempt", "1", "--reason", "r", "--dry-run"}, exitRefused, "a worker took it over"},
			{[]string{"resolve", "--digest", done.Digest(), "--to", "failed", "--external-ref", "ch_1", "--reason", "r"}, exitUsage,
				"--external-ref is stored only with --to completed"},
			{[]string{"resolve", "--digest", done.Digest(), "--to", "completed", "--error", "e", "--reason", "r"}, exitUsage,
				"--error is stored only with --to failed"},
			{[]string{"resolve", "--digest", done.Digest(), "--to", "completed", "--reason", strings.Repeat("r", inbox.MaxReasonLen+1)},
				exitUsage, "--reason is 2049 bytes, more than 2048"},
			{[]string{"forget", "--yes", "--digest", done.Digest(), "--actor", "\xff", "--reason", "r"}, exitUsage, "--actor is not valid UTF-8"},
			{[]string{"list", "--operation", "\xff"}, exitUsage, "--operation is not valid UTF-8"},
			{[]string{"list", "--after", "garbage"}, exitUsage, "--after: the cursor is not one a listing returned"},
			{[]string{"audit", "--after", "garbage"}, exitUsage, "--after: the cursor is not one a listing returned"},
			{[]string{"purge", "--pause", "soon", "--reason", "r"}, exitUsage, `--pause`},
			{[]string{"resolve", "--digest", done.Digest(), "--attempt", "99999999999999999999", "--to", "failed", "--reason", "r"},
				exitUsage, "--attempt"},
			{[]string{"stats", "--table", "bad name"}, exitUsage, "plain identifier"},
			{[]string{"stats", "--table", ""}, exitUsage, "--table is empty"},
		} {
			r := e.run(t, c.args...)
			if c.args[1] == "--table" { // e.run's --table would win
				r = runCmd(t, append(c.args, "--dsn", e.dsn)...)
			}
			require.Equal(t, c.code, r.code, "%q\n%s", c.args, r)
			require.Contains(t, r.stderr, c.want, "%q", c.args)
			for _, line := range strings.Split(strings.TrimSpace(r.stderr), "\n") {
				require.Empty(t, repeats(line), "%q: %s", c.args, line)
			}
		}
		require.Empty(t, e.audit(t))
	})
}

func TestRepeats(t *testing.T) {
	for msg, want := range map[string]bool{
		"inboxmill resolve: inbox: resolve: inbox: record not found":                    true,
		"inboxmill list: x: x: y":                                                       true,
		`inboxmill purge: invalid argument "x" for "--pause" flag: time: invalid "x"`:   true,
		`inboxmill stats: --table "bad name": not a plain identifier`:                   false,
		"inboxmill resolve: inbox: resolve: ERROR: connection refused (SQLSTATE 08006)": false,
	} {
		require.Equal(t, want, repeats(msg) != "", msg)
	}
}

// TestSharedFlagsRefuseWhatTheyWouldMisread: a connect timeout or a
// partition layout that cannot mean what it says is a usage error, not
// the default taken in silence.
func TestSharedFlagsRefuseWhatTheyWouldMisread(t *testing.T) {
	dsn := filepath.Join(t.TempDir(), "inbox.db")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--connect-timeout", "-5s"}, "--connect-timeout -5s: want a positive duration"},
		{[]string{"--connect-timeout", "0s"}, "--connect-timeout 0s: want a positive duration"},
		{[]string{"--partition-width", "-1h"}, "--partition-width -1h0m0s: want a positive whole number of minutes"},
		{[]string{"--partition-width", "90s"}, "--partition-width 1m30s: want a positive whole number of minutes"},
		{[]string{"--partition-retention", "-24h"}, "--partition-retention -24h0m0s: want a positive duration"},
	} {
		r := runCmd(t, append([]string{"stats", "--dsn", dsn}, c.args...)...)
		require.Equal(t, exitUsage, r.code, "%q\n%s", c.args, r)
		require.Contains(t, r.stderr, c.want, "%q", c.args)
	}
}
