package main

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

// parseReplay parses replay's flags from args, as the command does.
func parseReplay(t testing.TB, args ...string) (options, error) {
	var f replayFlags
	fs := pflag.NewFlagSet("replay", pflag.ContinueOnError)
	f.add(fs)
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	return f.parse(fs, dbFlags{dsn: "inbox.db"}, time.Date(2030, 5, 1, 12, 0, 0, 0, time.UTC))
}

// TestReplayFlagsHostile: odd and wrong values of replay's range and
// retention flags get a clear usage error, never a range that silently
// reads nothing, reads a partition twice, or a retention that wrapped
// around.
func TestReplayFlagsHostile(t *testing.T) {
	base := []string{"--topic", "t", "--operation", "op", "--key-metadata", "event_id"}
	for _, c := range []struct {
		args []string
		want string // "" for accepted
	}{
		{[]string{"--partitions", "0,1,0"}, "--partitions: partition 0 is given twice"},
		{[]string{"--partitions", "0, 1"}, ""},
		{[]string{"--partitions", "-1"}, `--partitions: "-1" is not a partition number`},
		{[]string{"--partitions", "2147483648"}, `--partitions: "2147483648" is not a partition number`},
		{[]string{"--from", "5", "--to", "3"}, "--from 5 is after --to 3"},
		{[]string{"--from", "0:5", "--to", "0:3"}, "--from 5 is after --to 3 for partition 0"},
		{[]string{"--from", "0:5", "--to", "3"}, "--from 5 is after --to 3 for partition 0"},
		{[]string{"--from", "5", "--to", "1:3"}, "--from 5 is after --to 3 for partition 1"},
		{[]string{"--from", "0:5", "--to", "1:3"}, ""}, // different partitions
		{[]string{"--from", "3", "--to", "3"}, ""},     // an empty range, as asked
		{[]string{"--from", "9223372036854775808"}, `--from: "9223372036854775808" is neither oldest`},
		{[]string{"--from", "-1"}, `--from: "-1" is neither oldest`},
		{[]string{"--from", "0:"}, `--from: "0:" is not partition:offset`},
		{[]string{"--from", ":5"}, `--from: ":5" is not partition:offset`},
		{[]string{"--from", "0:1:2"}, `--from: "0:1:2" is not partition:offset`},
		{[]string{"--to", " end "}, ""},
		{[]string{"--retention", "300000d"}, `--retention: "300000d" is neither a positive duration`},
		{[]string{"--retention", "106751d"}, ""}, // the longest whole days a time.Duration holds
		{[]string{"--retention", "106752d"}, `--retention: "106752d" is neither a positive duration`},
		{[]string{"--retention", "-7d"}, `--retention: "-7d" is neither a positive duration`},
		{[]string{"--retention", "d"}, `--retention: "d" is neither a positive duration`},
		{[]string{"--retention", "7D"}, `--retention: "7D" is neither a positive duration`},
		{[]string{"--since", "300000d"}, `--since: "300000d" is neither an RFC 3339 time nor a positive duration`},
		{[]string{"--since", "2030-01-01T00:00:00+14:00"}, ""},
		{[]string{"--since", "2030-01-01T00:00:00+25:00"}, `--since: "2030-01-01T00:00:00+25:00"`},
		{[]string{"--since", "2030-02-30T00:00:00Z"}, `--since: "2030-02-30T00:00:00Z"`},
		{[]string{"--since", "0d"}, `--since: "0d" is neither`},
	} {
		_, err := parseReplay(t, append(append([]string{}, base...), c.args...)...)
		if c.want == "" {
			require.NoError(t, err, "%q", c.args)
			continue
		}
		require.Error(t, err, "%q", c.args)
		require.Contains(t, err.Error(), c.want, "%q", c.args)
	}

	o, err := parseReplay(t, append(base, "--retention", "106751d")...)
	require.NoError(t, err)
	require.Equal(t, 106751*24*time.Hour, o.retention)
}

// FuzzDurationFlags feeds any text to parseDuration, the parser of
// --retention, --since and list's --older-than. Invariants:
//
//   - it never panics;
//   - "Nd" is exactly N whole days, or an error: never a product that
//     overflowed time.Duration into another value;
//   - any other text parses exactly as time.ParseDuration does;
//   - --retention accepts only a positive duration or -1, and --since only
//     an RFC 3339 time or an instant before now.
//
// The seed corpus is testdata/fuzz/FuzzDurationFlags.
func FuzzDurationFlags(f *testing.F) {
	now := time.Date(2030, 5, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseDuration(s)
		if days, ok := strings.CutSuffix(s, "d"); ok {
			n, perr := strconv.ParseInt(days, 10, 64)
			exact := new(big.Int).Mul(big.NewInt(n), big.NewInt(int64(24*time.Hour)))
			fits := perr == nil && exact.IsInt64()
			if err == nil && (!fits || exact.Int64() != int64(d)) {
				t.Fatalf("parseDuration(%q) = %v, which is not %s whole days", s, d, days)
			}
			if err != nil && fits && (days == "" || days[0] != '+') && !strings.HasPrefix(days, "-0") {
				// Every whole number of days that fits is taken (a
				// sign "+" or a redundant "-0…" may be refused).
				if _, aerr := strconv.Atoi(days); aerr == nil {
					t.Fatalf("parseDuration(%q) refused %s whole days, which fit: %v", s, days, err)
				}
			}
		} else {
			want, werr := time.ParseDuration(s)
			if (err == nil) != (werr == nil) || d != want {
				t.Fatalf("parseDuration(%q) = %v, %v; time.ParseDuration: %v, %v", s, d, err, want, werr)
			}
		}
		if r, err := parseRetention(s); err == nil && r != -1 && r <= 0 {
			t.Fatalf("parseRetention(%q) = %v", s, r)
		}
		if since, err := parseSince(s, now); err == nil {
			if _, perr := time.Parse(time.RFC3339, s); perr != nil && !since.Before(now) {
				t.Fatalf("parseSince(%q) = %v, not before now", s, since)
			}
		}
	})
}

// FuzzOffsetFlags feeds any text to --from, --to and --partitions.
// Invariants:
//
//   - the parse never panics, and refuses with an error, never with a
//     range that is not what was asked;
//   - an accepted --from or --to names offsets and partitions that are
//     not negative, each partition once, and formatting them back parses
//     to the same offsets;
//   - an accepted set of flags names no partition twice, and no
//     partition whose --from is after its --to.
//
// The seed corpus is testdata/fuzz/FuzzOffsetFlags.
func FuzzOffsetFlags(f *testing.F) {
	f.Fuzz(func(t *testing.T, from, to, partitions string) {
		for _, in := range []struct{ s, def string }{{from, "oldest"}, {to, "end"}} {
			o, err := parseOffsets(in.s, in.def)
			if err != nil {
				continue
			}
			if o.all < -1 {
				t.Fatalf("parseOffsets(%q): offset %d", in.s, o.all)
			}
			var pairs []string
			for p, n := range o.perPartition {
				if p < 0 || n < 0 {
					t.Fatalf("parseOffsets(%q): partition %d offset %d", in.s, p, n)
				}
				pairs = append(pairs, fmt.Sprintf("%d:%d", p, n))
			}
			if len(pairs) > 0 {
				back, err := parseOffsets(strings.Join(pairs, ","), in.def)
				if err != nil || fmt.Sprint(back.perPartition) != fmt.Sprint(o.perPartition) {
					t.Fatalf("parseOffsets(%q) = %v; its pairs parse to %v, %v", in.s, o.perPartition, back.perPartition, err)
				}
			}
		}
		o, err := parseReplay(t, "--topic", "t", "--operation", "op", "--key-metadata", "e",
			"--from", from, "--to", to, "--partitions", partitions)
		if err != nil {
			return
		}
		seen := map[int32]bool{}
		for _, p := range o.partitions {
			if seen[p] {
				t.Fatalf("--partitions %q: partition %d twice in %v", partitions, p, o.partitions)
			}
			seen[p] = true
		}
		check := func(p int32) {
			a, aok := o.from.get(p)
			b, bok := o.to.get(p)
			if aok && bok && a > b {
				t.Fatalf("--from %q --to %q: partition %d reads from %d to %d", from, to, p, a, b)
			}
		}
		for p := range o.from.perPartition {
			check(p)
		}
		for p := range o.to.perPartition {
			check(p)
		}
		check(math.MaxInt32) // a partition neither names: the offsets for every partition
	})
}
