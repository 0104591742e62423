package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
)

// seeded is the inbox the read tests look at.
type seeded struct {
	shipped, refunded, pend, held, gone, declined, old1, old2 inbox.ID
}

// seed fills e with one record of every kind:
//
//	ship/evt-1      completed now, with two output messages
//	refund/evt-2    completed now, in scope "tenant-b"
//	charge/pi-1     pending, created a month ago
//	charge/pi-2     processing under a live lease
//	charge/pi-3     processing, its lease expired a month ago
//	charge/pi-4     failed now
//	ship/old-1,2    completed and failed a month ago, expired: purgeable
func seed(t *testing.T, e *env) seeded {
	t.Helper()
	s := seeded{
		shipped: id("ship", "evt-1"), refunded: inbox.ID{Scope: "tenant-b", Operation: "refund", Key: "evt-2"},
		pend: id("charge", "pi-1"), held: id("charge", "pi-2"), gone: id("charge", "pi-3"), declined: id("charge", "pi-4"),
		old1: id("ship", "old-1"), old2: id("ship", "old-2"),
	}
	m1 := message.NewMessage("0b9d6e2c-0000-4000-8000-000000000001", []byte(`{"parcel":"p-1"}`))
	m1.Metadata.Set("tenant", "shop-1")
	m1.Metadata.Set("type", "shipped")
	m2 := message.NewMessage("0b9d6e2c-0000-4000-8000-000000000002", make([]byte, 300))
	e.completed(t, s.shipped, m1, m2)
	e.completed(t, s.refunded)
	e.pending(t, s.pend, true)
	e.live(t, s.held)
	e.abandoned(t, s.gone)
	lease := e.live(t, s.declined)
	require.NoError(t, lease.Fail(t.Context(), "card declined"))
	e.expired(t, s.old1, inbox.StatusCompleted)
	e.expired(t, s.old2, inbox.StatusFailed)
	return s
}

func TestStats(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		s := seed(t, e)
		out := e.ok(t, "stats")
		require.Contains(t, out, fmt.Sprintf("table %s (%s): 8 records\n", e.table, dialectFlag(e.kind)))
		require.Regexp(t, `(?m)^OPERATION\s+PROCESSING\s+PENDING\s+COMPLETED\s+FAILED\s+TOTAL$`, out)
		require.Regexp(t, `(?m)^charge\s+2\s+1\s+0\s+1\s+4$`, out)
		require.Regexp(t, `(?m)^refund\s+0\s+0\s+1\s+0\s+1$`, out)
		require.Regexp(t, `(?m)^ship\s+0\s+0\s+2\s+1\s+3$`, out)
		require.Regexp(t, `(?m)^\(all\)\s+2\s+1\s+3\s+2\s+8$`, out)
		require.Regexp(t, `oldest pending: charge/`+s.pend.Digest()+`, created 720h0m\d+s ago \(inboxmill inspect --table \w+ --digest `+
			s.pend.Digest()+`\)`, out)
		require.Contains(t, out, "oldest expired lease: charge/"+s.gone.Digest()+", held by worker-gone, lease expired ")
		require.Contains(t, out, "awaiting purge: 2 records past expires_at, the oldest 696h")

		v := decode[statsView](t, e.ok(t, "stats", "-o", "json"))
		require.EqualValues(t, 8, v.Total)
		require.Equal(t, e.table, v.Table)
		require.Equal(t, dialectFlag(e.kind), v.Dialect)
		require.Contains(t, v.Counts, countJSON{"charge", "pending", 1})
		require.Contains(t, v.Counts, countJSON{"ship", "failed", 1})
		require.Len(t, v.Counts, 6)
		require.Equal(t, s.pend.Digest(), v.OldestPending.Digest)
		require.InDelta(t, monthAgo.Seconds(), *v.OldestPendingAge, 120)
		require.Equal(t, "pi-3", v.OldestExpiredLease.Key)
		require.False(t, v.OldestExpiredLease.LeaseLive)
		require.EqualValues(t, 2, v.AwaitingPurge)
		require.InDelta(t, (monthAgo - 24*time.Hour).Seconds(), *v.PurgeLag, 120)

		// An empty inbox.
		empty := setup(t, e.kind)
		out = empty.ok(t, "stats")
		require.Contains(t, out, "0 records\noldest pending: none\noldest expired lease: none\nawaiting purge: none\n")
		v = decode[statsView](t, empty.ok(t, "stats", "--output", "json"))
		require.Zero(t, v.Total)
		require.Empty(t, v.Counts)
		require.Nil(t, v.OldestPending)
		require.Nil(t, v.OldestPendingAge)
	})
}

type listView struct {
	Records []recordJSON `json:"records"`
	Next    string       `json:"next"`
}

func keys(v listView) []string {
	var out []string
	for _, r := range v.Records {
		out = append(out, r.Operation+"/"+r.Key)
	}
	return out
}

func TestList(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		seed(t, e)
		list := func(args ...string) listView {
			return decode[listView](t, e.ok(t, append([]string{"list", "-o", "json"}, args...)...))
		}
		all := []string{"charge/pi-1", "charge/pi-2", "charge/pi-3", "charge/pi-4", "ship/evt-1", "ship/old-1", "ship/old-2", "refund/evt-2"}
		require.Equal(t, all, keys(list()), "primary-key order: scope, operation, key")
		require.Equal(t, []string{"charge/pi-1"}, keys(list("--status", "pending")))
		require.Equal(t, []string{"charge/pi-2", "charge/pi-3"}, keys(list("--status", "processing")))
		require.Equal(t, []string{"ship/evt-1", "ship/old-1", "ship/old-2"}, keys(list("--operation", "ship")))
		require.Equal(t, []string{"refund/evt-2"}, keys(list("--scope", "tenant-b")))
		require.Len(t, keys(list("--scope", "")), 7, "--scope '' is the global scope")
		require.Equal(t, []string{"charge/pi-1", "charge/pi-3", "ship/old-1", "ship/old-2"}, keys(list("--older-than", "7d")))
		require.Equal(t, []string{"charge/pi-3"}, keys(list("--older-than", "24h", "--status", "processing")), "filters combine")
		require.Empty(t, keys(list("--attempt-above", "1")))
		// A cursor that is not one of ours is a usage error, not a failure.
		require.Equal(t, exitUsage, e.run(t, "list", "--after", "!!!").code)
		require.Equal(t, exitUsage, e.run(t, "audit", "--after", "zz").code)

		// Pages.
		p1 := list("--limit", "3")
		require.Equal(t, all[:3], keys(p1))
		require.NotEmpty(t, p1.Next)
		p2 := list("--limit", "3", "--after", p1.Next)
		require.Equal(t, all[3:6], keys(p2))
		p3 := list("--limit", "3", "--after", p2.Next)
		require.Equal(t, all[6:], keys(p3))
		require.Empty(t, p3.Next)
		require.Equal(t, all, keys(list("--limit", "2", "--all")))

		// What a record shows.
		v := list("--status", "processing")
		held := v.Records[0]
		require.Equal(t, "worker-live", held.LeaseOwner)
		require.True(t, held.LeaseLive)
		require.NotNil(t, held.LeaseUntil)
		require.Equal(t, inbox.ID{Operation: "charge", Key: "pi-2"}.Digest(), held.Digest)
		require.False(t, v.Records[1].LeaseLive)

		// The table, for people, with the next page's cursor on stderr.
		r := e.run(t, "list", "--limit", "3")
		require.Equal(t, exitOK, r.code, r.String())
		require.Regexp(t, `(?m)^SCOPE\s+OPERATION\s+KEY\s+DIGEST\s+STATUS\s+ATTEMPT\s+AGE\s+UPDATED\s+LEASE$`, r.stdout)
		require.Regexp(t, `(?m)^""\s+charge\s+pi-1\s+[0-9a-f]{16}\s+pending\s+1\s+720h`, r.stdout)
		require.Regexp(t, `(?m)^""\s+charge\s+pi-2\s+[0-9a-f]{16}\s+processing\s+1\s+\S+\s+\S+ ago\s+live, (59m\d+s|1h0m0s) left$`, r.stdout)
		require.Regexp(t, `(?m)^""\s+charge\s+pi-3\s+.*expired 719h59m\d+s ago$`, r.stdout)
		require.Contains(t, r.stdout, "3 record(s)\n")
		require.Contains(t, r.stderr, "more records: add --after "+p1.Next)
		out := e.ok(t, "list", "--status", "pending", "--operation", "ship")
		require.Equal(t, "no records\n", out)
	})
}

func TestInspect(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		s := seed(t, e)
		// By key and by digest, the same record.
		byKey := e.ok(t, "inspect", "--operation", "ship", "--key", "evt-1")
		byDigest := e.ok(t, "inspect", "--digest", s.shipped.Digest())
		strip := func(out string) string { // the ages move between two runs
			var keep []string
			for _, l := range strings.Split(out, "\n") {
				if !strings.Contains(l, " ago)") && !strings.Contains(l, "(in ") {
					keep = append(keep, l)
				}
			}
			return strings.Join(keep, "\n")
		}
		require.Equal(t, strip(byKey), strip(byDigest))
		require.Equal(t, strip(byKey), strip(e.ok(t, "inspect", "--digest", s.shipped.Digest(), "--operation", "ship")))
		require.Contains(t, byKey, "record ship/"+s.shipped.Digest()+" in table "+e.table+"\n")
		for _, re := range []string{
			`(?m)^  scope\s+""$`, `(?m)^  key\s+evt-1$`, `(?m)^  status\s+completed$`, `(?m)^  attempt\s+1$`,
			`(?m)^  payload hash\s+[0-9a-f]{64} \(32 bytes\)$`, `(?m)^  lease\s+none$`,
			`(?m)^  expires\s+\S+ \(in 16[78]h\d+m\d+s\)$`, `(?m)^  correlation id\s+corr-evt-1$`,
			`(?m)^  idempotency key\s+` + s.shipped.IdempotencyKey() + `$`,
			`(?m)^  output\s+\d+ bytes: 2 message\(s\) replayed to duplicates$`,
			`(?m)^    message 1\s+uuid 0b9d6e2c-0000-4000-8000-000000000001, payload 16 bytes, metadata tenant=shop-1 type=shipped$`,
			`(?m)^    message 2\s+uuid 0b9d6e2c-0000-4000-8000-000000000002, payload 300 bytes, no metadata$`,
			`(?m)^  inboxmill forget --table \w+ --operation ship --key evt-1 --attempt 1 --reason '...' --dry-run$`,
		} {
			require.Regexp(t, re, byKey)
		}
		require.NotContains(t, byKey, `{"parcel"`, "payloads are shown by size only")

		// A live lease: who holds it, for how long, and no action.
		out := e.ok(t, "inspect", "--operation", "charge", "--key", "pi-2")
		require.Regexp(t, `(?m)^  lease\s+owner worker-live, until \S+: live, (59m\d+s|1h0m0s) left$`, out)
		require.Contains(t, out, "# held by worker-live for ")
		require.NotContains(t, out, "inboxmill resolve")
		require.NotContains(t, out, "inboxmill forget")

		// A pending record: the resolve commands, with the attempt.
		out = e.ok(t, "inspect", "--digest", s.pend.Digest())
		require.Regexp(t, `(?m)^  error\s+provider timed out$`, out)
		require.Regexp(t, `(?m)^  external ref\s+psp-pi-1$`, out)
		require.Contains(t, out, "inboxmill resolve --table "+e.table+" --operation charge --key pi-1 --attempt 1 --to completed --external-ref REF --reason '...'")
		require.Contains(t, out, "inboxmill resolve --table "+e.table+" --operation charge --key pi-1 --attempt 1 --to failed --reason '...'")

		// An abandoned one.
		out = e.ok(t, "inspect", "--digest", s.gone.Digest())
		require.Regexp(t, `(?m)^  lease\s+owner worker-gone, until \S+: expired 719h59m\d+s ago$`, out)
		require.Contains(t, out, "--to completed")

		// A scoped one.
		out = e.ok(t, "inspect", "--scope", "tenant-b", "--operation", "refund", "--key", "evt-2")
		require.Regexp(t, `(?m)^  scope\s+tenant-b$`, out)
		require.Contains(t, out, "inboxmill forget --table "+e.table+" --scope tenant-b --operation refund --key evt-2 --attempt 1")
		require.Regexp(t, `(?m)^  output\s+none$`, out)

		// JSON.
		v := decode[inspectView](t, e.ok(t, "inspect", "--digest", s.shipped.Digest(), "-o", "json"))
		require.Equal(t, "evt-1", v.Key)
		require.Equal(t, s.shipped.IdempotencyKey(), v.IdempotencyKey)
		require.Nil(t, v.LeaseRemainingSeconds)
		require.NotNil(t, v.Output)
		require.Equal(t, []storedMessage{
			{UUID: "0b9d6e2c-0000-4000-8000-000000000001", Metadata: map[string]string{"tenant": "shop-1", "type": "shipped"}, PayloadBytes: 16},
			{UUID: "0b9d6e2c-0000-4000-8000-000000000002", Metadata: map[string]string{}, PayloadBytes: 300},
		}, v.Output.Messages)
		require.Equal(t, v.ResultBytes, v.Output.Bytes)
		require.Empty(t, v.History)
		v = decode[inspectView](t, e.ok(t, "inspect", "--operation", "charge", "--key", "pi-2", "-o", "json"))
		require.InDelta(t, time.Hour.Seconds(), *v.LeaseRemainingSeconds, 120)
		require.True(t, v.LeaseLive)
		require.Nil(t, v.Output)

		// What is not there.
		r := e.run(t, "inspect", "--operation", "ship", "--key", "nope")
		require.Equal(t, exitNotFound, r.code)
		require.Contains(t, r.stderr, "no record in table "+e.table+" has scope \"\", operation ship and key nope (digest "+id("ship", "nope").Digest()+")")
		r = e.run(t, "inspect", "--digest", id("ship", "nope").Digest())
		require.Equal(t, exitNotFound, r.code)
		require.Contains(t, r.stderr, "no record of any operation in table "+e.table+" has key digest ")
		r = e.run(t, "inspect", "--digest", s.shipped.Digest(), "--operation", "charge")
		require.Equal(t, exitNotFound, r.code)
		require.Contains(t, r.stderr, `no record of operation "charge"`)
		// --scope narrows a search by digest: s.shipped is in the global
		// scope.
		require.Equal(t, strip(byKey), strip(e.ok(t, "inspect", "--digest", s.shipped.Digest(), "--scope", "")))
		r = e.run(t, "inspect", "--digest", s.shipped.Digest(), "--scope", "acme")
		require.Equal(t, exitNotFound, r.code)
		require.Contains(t, r.stderr, "no record of any operation in scope acme in table "+e.table+" has key digest ")
		r = e.run(t, "inspect", "--digest", s.shipped.Digest(), "--key", "x")
		require.Equal(t, exitUsage, r.code, r.String())
		r = e.run(t, "inspect", "--digest", "not-hex")
		require.Equal(t, exitUsage, r.code, r.String())
		require.Contains(t, r.stderr, `--digest "not-hex": want the 16 hex characters`)
	})
}

// TestInspectOddKeys: keys and output that are not plain text are shown
// escaped, never raw to the terminal.
func TestInspectOddKeys(t *testing.T) {
	e := setup(t, "sqlite")
	odd := id("ship", "evt\x1b[2J\n1")
	e.completed(t, odd, message.NewMessage("uuid-\x07", nil))
	out := e.ok(t, "inspect", "--digest", odd.Digest())
	require.NotContains(t, out, "\x1b")
	require.NotContains(t, out, "\x07")
	require.Contains(t, out, `"evt\x1b[2J\n1"`)
	require.Contains(t, out, `uuid "uuid-\a"`)
	// The suggested commands name such a record by digest.
	require.Contains(t, out, "inboxmill forget --table "+e.table+" --operation ship --digest "+odd.Digest()+" --attempt 1")
	out = e.ok(t, "list")
	require.NotContains(t, out, "\x1b")
	require.Contains(t, out, `"evt\x1b[2J\n1"`)
	// A key with a quote is quoted for the shell.
	q := id("ship", "it's")
	e.completed(t, q)
	require.Contains(t, e.ok(t, "inspect", "--digest", q.Digest()), `--key 'it'\''s' --attempt 1`)
}

func TestDecodeOutput(t *testing.T) {
	m := message.NewMessage("u-1", []byte("payload"))
	m.Metadata.Set("b", "2")
	m.Metadata.Set("a", "\xff")
	for _, msgs := range [][]*message.Message{nil, {m}, {m, message.NewMessage("", nil)}} {
		b, err := dedup.EncodeOutput(msgs)
		require.NoError(t, err)
		got, err := decodeOutput(b)
		require.NoError(t, err)
		require.Len(t, got, len(msgs))
		for i, want := range msgs {
			require.Equal(t, want.UUID, got[i].UUID)
			require.Equal(t, len(want.Payload), got[i].PayloadBytes)
			require.Equal(t, len(want.Metadata), len(got[i].Metadata))
			for k, v := range want.Metadata {
				require.Equal(t, v, got[i].Metadata[k])
			}
		}
	}
	b, err := dedup.EncodeOutput([]*message.Message{m})
	require.NoError(t, err)
	for _, bad := range [][]byte{[]byte("{}"), b[:len(b)-1], append(append([]byte{}, b...), 0), append([]byte("IMR\x02"), b[4:]...)} {
		_, err := decodeOutput(bad)
		require.Error(t, err)
	}
}

// firstWrite is a writer that runs hook once, before the first write
// reaches the buffer.
type firstWrite struct {
	bytes.Buffer
	hook func()
	done bool
}

func (w *firstWrite) Write(p []byte) (int, error) {
	if !w.done {
		w.done = true
		w.hook()
	}
	return w.Buffer.Write(p)
}

// TestListAllStreams: `list --all` writes each page as it reads it, so
// that its memory holds one page, not the table: a record added after its
// first write, past the pages it had read, is in its output. (Reading
// every page before writing, as it did, it was not.)
func TestListAllStreams(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		const n = 250
		for i := range n {
			e.completed(t, id("bulk", fmt.Sprintf("k-%04d", i)))
		}
		for i, output := range []string{"table", "json"} {
			late := id("bulk", "zz-late-"+output) // sorts after every other key
			stdout := &firstWrite{hook: func() { e.completed(t, late) }}
			var stderr bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			code := run(ctx, []string{"list", "--all", "--limit", "100", "-o", output, "--dsn", e.dsn, "--table", e.table},
				strings.NewReader(""), stdout, &stderr)
			cancel()
			require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
			require.True(t, stdout.done)
			require.True(t, strings.Contains(stdout.String(), late.Key), "%s: the record added after the first write is missing", output)
			if output == "json" {
				v := decode[listView](t, stdout.String())
				require.Len(t, v.Records, n+1+i) // and the late records of the runs before
				require.Empty(t, v.Next)
			} else {
				require.Equal(t, 1, strings.Count(stdout.String(), "SCOPE"), "one header")
				require.True(t, strings.HasSuffix(stdout.String(), fmt.Sprintf("\n%d record(s)\n", n+1+i)), "the count")
			}
		}
	})
}

// TestJSONList: the streamed listing is byte for byte the document
// writeJSON writes of the whole listing, for any number of records and
// pages.
func TestJSONList(t *testing.T) {
	now := time.Now()
	var recs []*inbox.Record
	for i := range 5 {
		recs = append(recs, &inbox.Record{ID: inbox.ID{Scope: "s", Operation: "op", Key: fmt.Sprintf("<k&%d>", i)},
			Status: inbox.StatusCompleted, Attempt: 1, CreatedAt: now, UpdatedAt: now})
	}
	for _, pages := range [][]int{{}, {0}, {1}, {5}, {2, 3}, {1, 0, 4}} {
		var got bytes.Buffer
		l := &jsonList{w: &got}
		want := struct {
			Records []recordJSON `json:"records"`
			Next    string       `json:"next"`
		}{Records: []recordJSON{}, Next: "cur"}
		off := 0
		for _, n := range pages {
			require.NoError(t, l.page(recs[off:off+n], now))
			for _, r := range recs[off : off+n] {
				want.Records = append(want.Records, toJSON(r, now))
			}
			off += n
		}
		require.NoError(t, l.end("cur"))
		var wantBuf bytes.Buffer
		require.NoError(t, writeJSON(&wantBuf, want))
		require.Equal(t, wantBuf.String(), got.String(), "pages %v", pages)
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 100_000_000: "100,000,000", -1234567: "-1,234,567"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}
