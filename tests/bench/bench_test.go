package main

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/tests/testdb"
)

// TestSmoke runs the benchmark program in its --smoke mode on each database
// — a few messages per scenario, growth up to a thousand rows with both key
// orders and (PostgreSQL) both layouts, a purge of a thousand rows by each
// method — so that CI proves every scenario
// still runs, checks its effects and prints its lines. It checks the
// output's shape, never the numbers.
func TestSmoke(t *testing.T) {
	for _, tc := range []struct {
		dialect string
		kind    testdb.Kind
	}{
		{"sqlite", testdb.SQLite},
		{"pg", testdb.PostgresPGX},
		{"mysql", testdb.MySQL},
	} {
		t.Run(tc.dialect, func(t *testing.T) {
			t.Parallel()
			if tc.kind != testdb.SQLite {
				testdb.Open(t, tc.kind) // skips, or fails with CI set, when the server is down
			}
			var stdout, stderr bytes.Buffer
			plots := t.TempDir()
			err := run(t.Context(), []string{"--smoke", "--dialects", tc.dialect, "--scenarios", strings.Join(allScenarios, ","),
				"--keys", "uuidv7,random", "--layouts", "plain,partitioned", "--plot", plots}, &stdout, &stderr)
			t.Log(stderr.String())
			require.NoError(t, err, stdout.String())
			for _, chart := range []string{"throughput", "p99", "ratio", "kafka-throughput", "kafka-ratio"} {
				svg, err := os.ReadFile(filepath.Join(plots, tc.dialect+"-"+chart+".svg"))
				require.NoError(t, err, "no %s chart", chart)
				require.Contains(t, string(svg), "<svg")
				require.Contains(t, string(svg), "inboxmill", "the %s chart has no line of the middleware", chart)
			}

			bench, ratios, purges := parseOutput(t, stdout.String())
			if tc.dialect == "pg" {
				// Three settings, each against the shallow and the deep topic.
				require.Equal(t, 6, strings.Count(stdout.String(), "\nBACKLOG backlog="), stdout.String())
				require.Regexp(t, `BACKLOG backlog=2000 in_flight=128/512 consumed=200 peak_rss_kb=[1-9]`, stdout.String())
			}
			want := []string{"plain", "plain_stmt", "inboxmill", "inboxmill_group", "inboxmill_dup", "inboxmill_dup_tx", "inboxmill_reserve", "inboxmill_reserve_batch", "watermill_dedup",
				"select_then_insert", "growth_empty", "growth_1k", "growth_uuidv7_empty", "growth_uuidv7_1k"}
			for _, s := range want {
				for _, w := range []string{"1", "2"} {
					require.Contains(t, bench, s+"/"+w, "no BENCH line for %s with %s workers", s, w)
				}
			}
			require.Contains(t, bench, "kafka_plain/4")
			require.Contains(t, bench, "kafka_inboxmill/4")
			require.Contains(t, bench, "kafka_group/4")
			require.Contains(t, ratios, "kafka_group_vs_plain/4")
			for _, v := range []string{"parallel_plain", "parallel", "parallel_group"} {
				require.Contains(t, bench, "kafka_"+v+"/4")
				require.Contains(t, ratios, "kafka_"+v+"_vs_plain/4")
			}
			for _, v := range []string{"group_pgx", "parallel_group_pgx"} {
				if tc.dialect == "pg" {
					require.Contains(t, bench, "kafka_"+v+"/4")
					require.Contains(t, ratios, "kafka_"+v+"_vs_plain/4")
				} else {
					require.NotContains(t, bench, "kafka_"+v+"/4")
				}
			}
			if tc.dialect == "pg" {
				for _, w := range []string{"1", "2"} {
					require.Contains(t, bench, "inboxmill_group_pgx/"+w)
					require.Contains(t, ratios, "group_pgx_vs_plain/"+w)
				}
				require.Contains(t, bench, "sqlqueue_plain/1")
				require.Contains(t, bench, "sqlqueue_inboxmill/1")
				require.Contains(t, bench, "sqlqueue_plain_batch/1")
				require.Contains(t, bench, "sqlqueue_inboxmill_batch/1")
				require.Contains(t, ratios, "sqlqueue_inboxmill_batch_vs_plain_batch/1")
				require.Contains(t, ratios, "sqlqueue_inboxmill_batch_vs_inboxmill/1")
				// The partitioned inbox: its growth, its ratios, its purge.
				for _, s := range []string{"growth_partitioned_empty/1", "growth_partitioned_1k/2"} {
					require.Contains(t, bench, s)
				}
				for _, r := range []string{"growth_p50_1k_partitioned_vs_plain/1", "growth_partitioned_p99_1k_vs_empty/2"} {
					require.Contains(t, ratios, r)
				}
				kv, ok := purges["partition_drop/random"]
				require.True(t, ok, "no PURGE line for partition_drop")
				require.Equal(t, "1000", kv["rows"])
			} else {
				require.NotContains(t, bench, "growth_partitioned_empty/1", "only PostgreSQL has the partitioned table")
				require.NotContains(t, bench, "inboxmill_group_pgx/1", "pipelines are PostgreSQL's")
			}
			for _, r := range []string{"inboxmill_vs_plain", "group_vs_plain", "one_statement_vs_plain", "dup_vs_fresh", "reserve_vs_plain", "reserve_batch_vs_plain", "growth_p50_1k_vs_empty",
				"growth_uuidv7_p99_1k_vs_empty", "growth_p50_1k_uuidv7_vs_random", "growth_p99_empty_uuidv7_vs_random"} {
				for _, w := range []string{"1", "2"} {
					require.Contains(t, ratios, r+"/"+w)
				}
			}
			for _, keys := range []string{"random", "uuidv7"} {
				kv, ok := purges["delete/"+keys]
				require.True(t, ok, "no PURGE line for delete with %s keys", keys)
				require.Equal(t, tc.dialect, kv["dialect"])
				require.Equal(t, "1000", kv["rows"])
				require.Equal(t, "1000", kv["batch"]) // inbox.DefaultPurgeBatchSize
				if tc.dialect != "sqlite" {
					wal, _ := strconv.ParseInt(kv["wal_bytes"], 10, 64)
					require.Positive(t, wal, "a DELETE writes to the log")
				}
			}
		})
	}
}

// parseOutput checks every BENCH, RATIO and PURGE line's fields and returns
// them keyed by "<scenario or ratio>/<workers>", and "<method>/<keys>" for
// PURGE lines.
func parseOutput(t *testing.T, out string) (bench, ratios, purges map[string]map[string]string) {
	t.Helper()
	bench, ratios, purges = map[string]map[string]string{}, map[string]map[string]string{}, map[string]map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		switch fields[0] {
		case "BENCH":
			kv := keyValues(t, fields[1:])
			for _, k := range []string{"scenario", "dialect", "workers", "msgs", "msgs_per_s", "p50_us", "p99_us", "allocs_per_msg"} {
				require.Contains(t, kv, k, sc.Text())
			}
			for _, k := range []string{"msgs_per_s", "p50_us", "p99_us", "allocs_per_msg"} {
				v, err := strconv.ParseFloat(kv[k], 64)
				require.NoError(t, err, sc.Text())
				require.Greater(t, v, 0.0, sc.Text())
			}
			bench[kv["scenario"]+"/"+kv["workers"]] = kv
		case "RATIO":
			require.Greater(t, len(fields), 2, sc.Text())
			kv := keyValues(t, fields[2:])
			v, err := strconv.ParseFloat(kv["value"], 64)
			require.NoError(t, err, sc.Text())
			require.Greater(t, v, 0.0, sc.Text())
			ratios[fields[1]+"/"+kv["workers"]] = kv
		case "PURGE":
			kv := keyValues(t, fields[1:])
			for _, k := range []string{"dialect", "method", "rows", "seconds", "wal_bytes", "after_seconds", "after_wal_bytes", "keys", "batch"} {
				require.Contains(t, kv, k, sc.Text())
			}
			for _, k := range []string{"rows", "wal_bytes", "after_wal_bytes", "batch"} {
				v, err := strconv.ParseInt(kv[k], 10, 64)
				require.NoError(t, err, sc.Text())
				require.GreaterOrEqual(t, v, int64(0), sc.Text())
			}
			for _, k := range []string{"seconds", "after_seconds"} {
				v, err := strconv.ParseFloat(kv[k], 64)
				require.NoError(t, err, sc.Text())
				require.GreaterOrEqual(t, v, 0.0, sc.Text())
			}
			purges[kv["method"]+"/"+kv["keys"]] = kv
		case "BACKLOG":
			kv := keyValues(t, fields[1:])
			for _, k := range []string{"backlog", "in_flight", "consumed", "peak_rss_kb", "rss_now_kb", "seconds"} {
				require.Contains(t, kv, k, sc.Text())
			}
		case "SEED":
		default:
			t.Fatalf("unexpected output line %q", sc.Text())
		}
	}
	return bench, ratios, purges
}

func keyValues(t *testing.T, fields []string) map[string]string {
	t.Helper()
	kv := map[string]string{}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		require.True(t, ok, "field %q is not key=value", f)
		kv[k] = v
	}
	return kv
}

// TestMain lets the test binary be the bench's child processes (the
// kafka_backlog scenario's broker and consumers run the binary itself).
func TestMain(m *testing.M) {
	if child, err := runChild(); child {
		if err != nil {
			os.Stderr.WriteString("bench: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestPairedRatios checks that a ratio line carries the ratio of each
// round's pair beside the ratio of the medians, and only where both sides
// had the same rounds.
func TestPairedRatios(t *testing.T) {
	rs := func(scenario string, perSec ...float64) []result {
		out := make([]result, len(perSec))
		for i, v := range perSec {
			out[i] = result{scenario: scenario, dialect: "pg", workers: 8, msgs: 100, perSec: v}
		}
		return out
	}
	b := &bench{opts: options{dialects: []string{"pg"}, workers: []int{8}}, out: io.Discard}
	b.reportRounds(rs("plain", 100, 250, 100))
	b.reportRounds(rs("inboxmill", 100, 200, 150))
	b.reportRounds(rs("inboxmill_reserve", 100, 100))
	b.reportRounds(rs("inboxmill_reserve_batch", 90, 110, 100))
	got := map[string]string{}
	for _, r := range b.ratios() {
		got[r.name] = r.String()
	}
	// The medians are 150 and 100; the rounds' pairs 1.0, 0.8 and 1.5.
	require.Equal(t, "RATIO inboxmill_vs_plain dialect=pg workers=8 value=1.50 paired_median=1.00 paired_min=0.80 paired_max=1.50 paired_above_1=1/3",
		got["inboxmill_vs_plain"])
	require.Equal(t, "RATIO reserve_batch_vs_reserve dialect=pg workers=8 value=1.00", got["reserve_batch_vs_reserve"],
		"two rounds against three are no pairs")

	require.Equal(t, []string{"a", "b", "c"}, inRoundOrder(1, []string{"a", "b", "c"}))
	require.Equal(t, []string{"c", "b", "a"}, inRoundOrder(2, []string{"a", "b", "c"}))

	p, ok := summarize([]float64{1.2, 0.9, 1.1, 0.7})
	require.True(t, ok)
	require.Equal(t, pairedSummary{median: 1.0, min: 0.7, max: 1.2, above: 2}, p)
	require.Contains(t, b.markdownTables(), "| inboxmill_vs_plain | pg | 8 | 1.50 | 1.00 (0.80–1.50), 1/3 |")
}
