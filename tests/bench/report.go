package main

import (
	"fmt"
	"slices"
	"strings"
)

// ratio is one RATIO line: a measurement over another of the same run.
type ratio struct {
	name, dialect string
	workers       int
	value         float64
	// extra are more key=value fields for the line (latencies beside the
	// ratio), "" for none.
	extra string
	// paired are the ratios of the two sides round by round, where both
	// had the same rounds (see pairedRatios).
	paired []float64
}

func (r ratio) String() string {
	s := fmt.Sprintf("RATIO %s dialect=%s workers=%d value=%.2f", r.name, r.dialect, r.workers, r.value)
	if p, ok := summarize(r.paired); ok {
		s += fmt.Sprintf(" paired_median=%.2f paired_min=%.2f paired_max=%.2f paired_above_1=%d/%d",
			p.median, p.min, p.max, p.above, len(r.paired))
	}
	if r.extra != "" {
		s += " " + r.extra
	}
	return s
}

// pairedRatios returns num's throughput over den's round by round, or nil
// unless both have the same number (at least two) of rounds. value, the
// ratio of the two medians, compares rounds that may have run minutes
// apart on a machine whose speed drifts; the two scenarios of a pair ran
// in the same round, one after the other (and in alternating order), so
// the spread of their ratios says whether a difference is more than the
// drift.
func pairedRatios(num, den []result) []float64 {
	if len(num) < 2 || len(num) != len(den) {
		return nil
	}
	out := make([]float64, len(num))
	for i := range num {
		if den[i].perSec <= 0 {
			return nil
		}
		out[i] = num[i].perSec / den[i].perSec
	}
	return out
}

type pairedSummary struct {
	median, min, max float64
	above            int // pairs whose ratio was above 1
}

func summarize(vs []float64) (pairedSummary, bool) {
	if len(vs) == 0 {
		return pairedSummary{}, false
	}
	s := slices.Sorted(slices.Values(vs))
	p := pairedSummary{min: s[0], max: s[len(s)-1], median: s[len(s)/2]}
	if len(s)%2 == 0 {
		p.median = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	for _, v := range s {
		if v > 1 {
			p.above++
		}
	}
	return p, true
}

// target is what a ratio is reported against; never asserted.
type target struct {
	atLeast bool
	value   float64
	// only, when set, limits the target to one dialect and worker count.
	dialect string
	workers int
}

func (t target) String() string {
	op := "≤"
	if t.atLeast {
		op = "≥"
	}
	s := fmt.Sprintf("%s %.2f", op, t.value)
	if t.dialect != "" {
		s += fmt.Sprintf(" (%s, %d workers)", t.dialect, t.workers)
	}
	return s
}

func (t target) applies(r ratio) bool {
	return t.dialect == "" || (t.dialect == r.dialect && t.workers == r.workers)
}

func (t target) met(v float64) bool {
	if t.atLeast {
		return v >= t.value
	}
	return v <= t.value
}

// targetFor returns the target of a ratio, if it has one.
func targetFor(r ratio) (target, bool) {
	switch name := r.name; {
	case name == "kafka_parallel_vs_plain" && r.workers <= 4:
		return target{atLeast: true, value: 3.0, dialect: "pg", workers: r.workers}, true
	case name == "kafka_parallel_vs_plain":
		return target{atLeast: true, value: 2.0, dialect: "pg", workers: r.workers}, true
	case name == "kafka_parallel_group_pgx_vs_plain" && r.workers <= 4:
		return target{atLeast: true, value: 4.0, dialect: "pg", workers: r.workers}, true
	case name == "kafka_group_vs_plain" && r.workers >= 16:
		return target{atLeast: true, value: 1.0, dialect: "pg", workers: r.workers}, true
	case name == "group_pgx_vs_plain" && r.workers >= 32:
		return target{atLeast: true, value: 2.0, dialect: "pg", workers: r.workers}, true
	case name == "group_vs_plain" && r.workers >= 32:
		return target{atLeast: true, value: 1.3, dialect: "pg", workers: r.workers}, true
	case name == "group_vs_plain":
		return target{atLeast: true, value: 1.0, dialect: "pg", workers: 8}, true
	case name == "group_vs_inboxmill":
		return target{atLeast: true, value: 1.0}, true
	case name == "reserve_batch_vs_reserve" && r.dialect == "pg" && r.workers >= 64:
		return target{atLeast: true, value: 1.5}, true
	case name == "reserve_batch_vs_reserve":
		return target{atLeast: true, value: 0.97}, true
	case name == "inboxmill_vs_plain":
		return target{atLeast: true, value: 0.85, dialect: "pg", workers: 8}, true
	case name == "dup_vs_fresh":
		return target{atLeast: true, value: 2.5}, true
	case strings.HasSuffix(name, "_uuidv7_vs_random"), strings.HasSuffix(name, "_partitioned_vs_plain"),
		strings.HasPrefix(name, "growth_partitioned_"):
		return target{}, false
	case strings.HasPrefix(name, "growth_p50_"), strings.HasPrefix(name, "growth_uuidv7_p50_"):
		return target{value: 1.5}, true
	}
	return target{}, false
}

// ratios derives every ratio the run's results allow, by dialect and
// worker count.
func (b *bench) ratios() []ratio {
	var out []ratio
	throughput := func(name, num, den string, dialect string, workers int) {
		n, ok1 := b.find(num, dialect, workers)
		d, ok2 := b.find(den, dialect, workers)
		if ok1 && ok2 && d.perSec > 0 {
			out = append(out, ratio{name: name, dialect: dialect, workers: workers, value: n.perSec / d.perSec,
				paired: pairedRatios(b.rounds[roundKey(num, dialect, workers)], b.rounds[roundKey(den, dialect, workers)])})
		}
	}
	// withLatency is throughput with the p50 and p99 of both sides beside
	// the ratio: the group commit targets bound latency as well.
	withLatency := func(name, num, den string, dialect string, workers int) {
		throughput(name, num, den, dialect, workers)
		if n := len(out); n > 0 && out[n-1].name == name && out[n-1].dialect == dialect && out[n-1].workers == workers {
			g, _ := b.find(num, dialect, workers)
			p, _ := b.find(den, dialect, workers)
			out[n-1].extra = fmt.Sprintf("p50_us=%.0f p99_us=%.0f plain_p50_us=%.0f plain_p99_us=%.0f",
				micros(g.p50), micros(g.p99), micros(p.p50), micros(p.p99))
		}
	}
	for _, dialect := range b.opts.dialects {
		for _, w := range b.opts.workers {
			throughput("inboxmill_vs_plain", "inboxmill", "plain", dialect, w)
			withLatency("group_vs_plain", "inboxmill_group", "plain", dialect, w)
			// Turning group commit on, against leaving it off.
			throughput("group_vs_inboxmill", "inboxmill_group", "inboxmill", dialect, w)
			withLatency("group_pgx_vs_plain", "inboxmill_group_pgx", "plain", dialect, w)
			throughput("one_statement_vs_plain", "plain_stmt", "plain", dialect, w)
			throughput("inboxmill_vs_plain_stmt", "inboxmill", "plain_stmt", dialect, w)
			throughput("dup_vs_fresh", "inboxmill_dup", "inboxmill", dialect, w)
			throughput("dup_tx_vs_fresh", "inboxmill_dup_tx", "inboxmill", dialect, w)
			throughput("reserve_vs_plain", "inboxmill_reserve", "plain", dialect, w)
			withLatency("reserve_batch_vs_plain", "inboxmill_reserve_batch", "plain", dialect, w)
			throughput("reserve_batch_vs_reserve", "inboxmill_reserve_batch", "inboxmill_reserve", dialect, w)
			throughput("watermill_dedup_vs_plain", "watermill_dedup", "plain", dialect, w)
			throughput("select_then_insert_vs_plain", "select_then_insert", "plain", dialect, w)
			throughput("inboxmill_vs_select_then_insert", "inboxmill", "select_then_insert", dialect, w)
			out = append(out, b.growthRatios(dialect, w)...)
		}
		for _, parts := range b.opts.partitions {
			throughput("kafka_inboxmill_vs_plain", "kafka_inboxmill", "kafka_plain", dialect, parts)
			withLatency("kafka_group_vs_plain", "kafka_group", "kafka_plain", dialect, parts)
			withLatency("kafka_group_pgx_vs_plain", "kafka_group_pgx", "kafka_plain", dialect, parts)
			withLatency("kafka_parallel_plain_vs_plain", "kafka_parallel_plain", "kafka_plain", dialect, parts)
			withLatency("kafka_parallel_vs_plain", "kafka_parallel", "kafka_plain", dialect, parts)
			withLatency("kafka_parallel_group_vs_plain", "kafka_parallel_group", "kafka_plain", dialect, parts)
			withLatency("kafka_parallel_group_pgx_vs_plain", "kafka_parallel_group_pgx", "kafka_plain", dialect, parts)
		}
		throughput("sqlqueue_inboxmill_vs_plain", "sqlqueue_inboxmill", "sqlqueue_plain", dialect, 1)
		throughput("sqlqueue_inboxmill_batch_vs_plain_batch", "sqlqueue_inboxmill_batch", "sqlqueue_plain_batch", dialect, 1)
		throughput("sqlqueue_inboxmill_batch_vs_inboxmill", "sqlqueue_inboxmill_batch", "sqlqueue_inboxmill", dialect, 1)
	}
	return out
}

// growthRatios are the growth scenario's latency ratios (lower is better)
// at one worker count: each size against the empty inbox, per key order
// (growth_p50_10m_vs_empty, growth_uuidv7_p50_10m_vs_empty), and uuidv7
// keys against random ones at each size (growth_p50_10m_uuidv7_vs_random).
func (b *bench) growthRatios(dialect string, w int) []ratio {
	var out []ratio
	latency := func(name string, num, den result) {
		if den.p50 > 0 && den.p99 > 0 {
			out = append(out,
				ratio{name: fmt.Sprintf(name, "p50"), dialect: dialect, workers: w, value: float64(num.p50) / float64(den.p50)},
				ratio{name: fmt.Sprintf(name, "p99"), dialect: dialect, workers: w, value: float64(num.p99) / float64(den.p99)})
		}
	}
	for _, keys := range b.opts.keys {
		prefix := "growth_"
		if keys != keysRandom {
			prefix += string(keys) + "_"
		}
		empty, ok := b.find(keys.scenario("growth", 0), dialect, w)
		if !ok || len(b.opts.growth) == 0 {
			continue
		}
		for _, size := range b.opts.growth[1:] {
			if g, ok := b.find(keys.scenario("growth", size), dialect, w); ok {
				latency(prefix+"%s_"+sizeLabel(size)+"_vs_empty", g, empty)
			}
		}
	}
	for _, size := range b.opts.growth {
		r, ok1 := b.find(keysRandom.scenario("growth", size), dialect, w)
		v, ok2 := b.find(keysUUIDv7.scenario("growth", size), dialect, w)
		if ok1 && ok2 {
			latency("growth_%s_"+sizeLabel(size)+"_uuidv7_vs_random", v, r)
		}
		// The partitioned table against the plain one, random keys.
		pt, ok3 := b.find(keysRandom.scenario("growth_"+layoutPartitioned, size), dialect, w)
		if ok1 && ok3 {
			latency("growth_%s_"+sizeLabel(size)+"_partitioned_vs_plain", pt, r)
		}
	}
	// The partitioned table at each size against its empty self.
	if empty, ok := b.find(keysRandom.scenario("growth_"+layoutPartitioned, 0), dialect, w); ok && len(b.opts.growth) > 0 {
		for _, size := range b.opts.growth[1:] {
			if g, ok := b.find(keysRandom.scenario("growth_"+layoutPartitioned, size), dialect, w); ok {
				latency("growth_partitioned_%s_"+sizeLabel(size)+"_vs_empty", g, empty)
			}
		}
	}
	return out
}

func (b *bench) printRatios() {
	for _, r := range b.ratios() {
		fmt.Fprintln(b.out, r)
	}
}

// markdownTables renders the results, the ratios and the purges for
// docs/benchmarks.md.
func (b *bench) markdownTables() string {
	var s strings.Builder
	if len(b.results) > 0 {
		b.benchTables(&s)
	}
	if len(b.purges) > 0 {
		if len(b.results) > 0 {
			s.WriteString("\n")
		}
		s.WriteString("| dialect | method | keys | batch | rows | seconds | WAL / redo bytes | after: seconds | after: WAL / redo bytes |\n")
		s.WriteString("|---|---|---|--:|--:|--:|--:|--:|--:|\n")
		for _, r := range b.purges {
			fmt.Fprintf(&s, "| %s | %s | %s | %d | %d | %.1f | %d | %.1f | %d |\n",
				r.dialect, r.method, r.keys, r.batch, r.rows, r.seconds, r.walBytes, r.afterSeconds, r.afterWALBytes)
		}
	}
	return s.String()
}

func (b *bench) benchTables(s *strings.Builder) {
	s.WriteString("| scenario | dialect | workers | msgs | msgs/s | p50 µs | p99 µs | allocs/msg |\n")
	s.WriteString("|---|---|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range b.results {
		fmt.Fprintf(s, "| %s | %s | %d | %d | %.0f | %.0f | %.0f | %.0f |\n",
			r.scenario, r.dialect, r.workers, r.msgs, r.perSec, micros(r.p50), micros(r.p99), r.allocs)
	}
	s.WriteString("\n| ratio | dialect | workers | value | paired: median (min–max), above 1 | target |\n|---|---|--:|--:|---|---|\n")
	for _, r := range b.ratios() {
		status := ""
		if t, ok := targetFor(r); ok && t.applies(r) {
			status = t.String() + ": missed"
			if t.met(r.value) {
				status = t.String() + ": met"
			}
		}
		paired := ""
		if p, ok := summarize(r.paired); ok {
			paired = fmt.Sprintf("%.2f (%.2f–%.2f), %d/%d", p.median, p.min, p.max, p.above, len(r.paired))
		}
		fmt.Fprintf(s, "| %s | %s | %d | %.2f | %s | %s |\n", r.name, r.dialect, r.workers, r.value, paired, status)
	}
}
