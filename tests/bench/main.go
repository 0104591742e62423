// Command bench measures what deduplication costs: the dedup middleware
// against the handler alone, against Watermill's in-memory Deduplicator and
// against a hand-written check-then-insert, on PostgreSQL (pgx), MariaDB and
// SQLite at several worker counts; claim latency as the inbox grows; and end
// to end through Kafka and the watermill-sql queue.
//
// Every scenario prints one line, the median of its rounds where it has
// several (each round is logged to stderr with the machine's load):
//
//	BENCH scenario=<name> dialect=<pg|mysql|sqlite> workers=<n> msgs=<n> msgs_per_s=<x> p50_us=<x> p99_us=<x> allocs_per_msg=<x>
//
// except purge (not run unless named in --scenarios), which prints per
// dialect, method, size and key order:
//
//	PURGE dialect=<d> method=<delete> rows=<n> seconds=<x> wal_bytes=<n> after_seconds=<x> after_wal_bytes=<n> keys=<k> batch=<n>
//
// and the run ends with ratios between measurements of the same run:
//
//	RATIO <name> dialect=<d> workers=<n> value=<x> [paired_median=<x> paired_min=<x> paired_max=<x> paired_above_1=<k>/<n>]
//
// value is the ratio of the two medians; with several rounds, the paired
// fields summarize the ratios of the two scenarios' measurements in the
// same round (every other round runs the scenarios in reverse order), and
// how many of those were above 1.
//
// Nothing is asserted: the numbers are for reading (docs/benchmarks.md).
// scripts/bench.sh builds and runs this program; --smoke is the tiny run
// that the package's test makes in CI.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
)

func main() {
	if child, err := runChild(); child {
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// The scenarios, in the order they run. The first eleven run per dialect and
// worker count; growth per dialect, key order and inbox size; purge per
// dialect, size and key order; kafka per dialect with one worker per
// partition; sqlqueue on PostgreSQL with one subscriber.
var allScenarios = []string{
	"plain", "plain_stmt", "inboxmill", "inboxmill_group", "inboxmill_group_pgx", "inboxmill_dup", "inboxmill_dup_tx", "inboxmill_reserve", "inboxmill_reserve_batch", "watermill_dedup", "select_then_insert",
	"growth", "purge", "kafka", "sqlqueue", "kafka_backlog",
}

// defaultScenarios are those run when --scenarios is not given: all but
// purge, which seeds and deletes a million rows per dialect.
var defaultScenarios = slices.DeleteFunc(slices.Clone(allScenarios), func(s string) bool {
	return s == "purge" || s == "kafka_backlog"
})

// options are the parsed flags.
type options struct {
	quick, smoke bool
	dialects     []string
	workers      []int
	scenarios    []string
	msgs         int
	rounds       int
	warmup       time.Duration
	growth       []int64
	keys         []keyOrder
	layouts      []string
	purge        []int64
	purgeBatch   int
	cpuProfile   string
	markdown     string
	plotDir      string
	prepare      inbox.Prepare
	// group is the group commit settings of inboxmill_group.
	group dedup.Group
	// batch is the reserve batch settings of inboxmill_reserve_batch.
	batch dedup.Batch
	// partitions are the Kafka topics' partition counts.
	partitions []int
	// sqlQueueBatch is the SubscribeBatchSize of the sqlqueue scenario's
	// batched variants; 1 or less leaves them out.
	sqlQueueBatch int
	// kafkaVariants are the kafka scenario's variants to run (all when
	// empty); kafkaInFlight and kafkaPool the parallel consumer's
	// MaxInFlightPerPartition and its variants' pool size.
	kafkaVariants            []string
	kafkaInFlight, kafkaPool int
	// kafkaWarmup is how many messages each kafka measurement handles
	// before its clock starts.
	kafkaWarmup int
	// backlog is kafka_backlog's deep topic and backlogConsume how many
	// messages each of its consumers takes from it.
	backlog        int64
	backlogConsume int
}

// hasKafka reports whether the kafka scenario runs variant v.
func (o options) hasKafka(v string) bool {
	return len(o.kafkaVariants) == 0 || slices.Contains(o.kafkaVariants, v)
}

func (o options) has(scenario string) bool { return slices.Contains(o.scenarios, scenario) }

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		o                                   options
		dialects, workers, scenarios, sizes string
		prepare, keys, purgeSizes, layouts  string
		partitionList, kafkaVariantList     string
	)
	fs.BoolVar(&o.quick, "quick", false, "fewer messages per measurement and growth up to 1M rows (under 5 minutes on 2 cores)")
	fs.BoolVar(&o.smoke, "smoke", false, "a tiny run that only proves every scenario works (what the test runs)")
	fs.StringVar(&dialects, "dialects", "pg,mysql,sqlite", "databases to measure: pg, mysql, sqlite")
	fs.StringVar(&workers, "workers", "", "concurrent workers per measurement (default 1,8,32; 1,2 with --smoke)")
	fs.StringVar(&scenarios, "scenarios", strings.Join(defaultScenarios, ","), "scenarios to run (purge only when named)")
	fs.IntVar(&o.msgs, "msgs", 0, "messages per measurement (default 5000; 1000 with --quick; 24 with --smoke)")
	fs.DurationVar(&o.warmup, "warmup", 0, "per measurement, after the first deliveries, how long workers keep delivering before the clock starts, so that adaptive limits are measured settled (default 2s; 1s with --quick; 0 with --smoke)")
	fs.IntVar(&o.rounds, "rounds", 0, "measurements per scenario, dialect and worker count, interleaved; the median is reported (default 3)")
	fs.StringVar(&sizes, "growth", "", "inbox sizes for growth, e.g. 0,1m,10m (default 0,1m,10m; 0,1m with --quick; 0,1k with --smoke)")
	fs.StringVar(&layouts, "layouts", layoutPlain, "inbox tables for growth: plain, partitioned (PostgreSQL's, day partitions), or both")
	fs.StringVar(&keys, "keys", "random", "event ID orders for growth and purge: random (UUIDv4), uuidv7 (time-ordered), or both")
	fs.StringVar(&purgeSizes, "purge", "", "expired rows for purge, e.g. 1m,10m (default 1m; 100k with --quick; 1k with --smoke)")
	fs.IntVar(&o.purgeBatch, "purge-batch", 0, "purge's inbox.PurgeParams.BatchSize (default: the library's, inbox.DefaultPurgeBatchSize)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	fs.StringVar(&prepare, "prepare", "auto", "the stores' inbox.Config.Prepare: auto, always or never")
	fs.IntVar(&o.group.Coordinators, "group-coordinators", 0, "inboxmill_group's dedup.Group.Coordinators (default: the library's)")
	fs.IntVar(&o.group.MaxSize, "group-size", 0, "inboxmill_group's dedup.Group.MaxSize (default: the library's)")
	fs.DurationVar(&o.group.MaxLinger, "group-linger", 0, "inboxmill_group's dedup.Group.MaxLinger (default: the library's)")
	fs.IntVar(&o.batch.Statements, "batch-statements", 0, "inboxmill_reserve_batch's dedup.Batch.Statements (default: the library's)")
	fs.StringVar(&partitionList, "partitions", "4", "the kafka scenario's partition counts, each measured with its own topics (watermill-kafka handles one message per partition at a time)")
	fs.StringVar(&kafkaVariantList, "kafka-variants", "", "the kafka scenario's variants (default all: "+strings.Join(kafkaVariants, ",")+")")
	fs.IntVar(&o.kafkaInFlight, "kafka-in-flight", 0, "the parallel consumer's MaxInFlightPerPartition (default: the library's)")
	fs.IntVar(&o.kafkaWarmup, "kafka-warmup", -1, "the kafka scenario's messages handled before the clock starts, published with the measured ones (default 30000; 10000 with --quick; 0 with --smoke)")
	fs.IntVar(&o.kafkaPool, "kafka-pool", 16, "the database pool of the kafka scenario's parallel variants (the others get partitions+2)")
	var backlog string
	fs.StringVar(&backlog, "backlog", "1m", "kafka_backlog: the deep topic's messages (a topic of a hundredth as many is the baseline)")
	fs.IntVar(&o.backlogConsume, "backlog-consume", 20000, "kafka_backlog: messages each consumer process takes")
	fs.IntVar(&o.sqlQueueBatch, "sqlqueue-batch", 32, "the sqlqueue scenario's batched variants' SubscribeBatchSize (watermillsql.NewSubscriber); 1 leaves them out")
	fs.StringVar(&o.markdown, "markdown", "", "also write the results and ratios as Markdown tables to this file")
	fs.StringVar(&o.plotDir, "plot", "", "also write SVG charts of the results into this directory (throughput and p99 against workers per scenario, ratios to the bare handler)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var errs []error
	for _, d := range splitList(dialects) {
		if _, ok := dialectByName(d); !ok {
			errs = append(errs, fmt.Errorf("unknown dialect %q (pg, mysql, sqlite)", d))
		}
		o.dialects = append(o.dialects, d)
	}
	switch prepare {
	case "auto":
		o.prepare = inbox.PrepareAuto
	case "always":
		o.prepare = inbox.PrepareAlways
	case "never":
		o.prepare = inbox.PrepareNever
	default:
		errs = append(errs, fmt.Errorf("--prepare %q: want auto, always or never", prepare))
	}
	for _, s := range splitList(scenarios) {
		if !slices.Contains(allScenarios, s) {
			errs = append(errs, fmt.Errorf("unknown scenario %q (%s)", s, strings.Join(allScenarios, ", ")))
		}
		o.scenarios = append(o.scenarios, s)
	}
	switch {
	case workers != "":
		for _, w := range splitList(workers) {
			n, err := strconv.Atoi(w)
			if err != nil || n < 1 {
				errs = append(errs, fmt.Errorf("--workers: %q is not a positive number", w))
			}
			o.workers = append(o.workers, n)
		}
	case o.smoke:
		o.workers = []int{1, 2}
	default:
		o.workers = []int{1, 8, 32}
	}
	for _, v := range splitList(kafkaVariantList) {
		if !slices.Contains(kafkaVariants, v) {
			errs = append(errs, fmt.Errorf("--kafka-variants: unknown variant %q (%s)", v, strings.Join(kafkaVariants, ", ")))
		}
		o.kafkaVariants = append(o.kafkaVariants, v)
	}
	if o.smoke && !flagSet(fs, "backlog") {
		backlog = "2k"
	}
	if o.smoke && !flagSet(fs, "backlog-consume") {
		o.backlogConsume = 200
	}
	if n, err := parseSize(backlog); err != nil || n < 1 {
		errs = append(errs, fmt.Errorf("--backlog %q: want a positive size such as 1m", backlog))
	} else {
		o.backlog = n
	}
	switch {
	case flagSet(fs, "kafka-warmup") && o.kafkaWarmup < 0:
		errs = append(errs, fmt.Errorf("--kafka-warmup %d is negative", o.kafkaWarmup))
	case flagSet(fs, "kafka-warmup"):
	case o.smoke:
		o.kafkaWarmup = 0
	case o.quick:
		o.kafkaWarmup = 10000
	default:
		o.kafkaWarmup = 30000
	}
	if o.kafkaPool < 1 {
		errs = append(errs, fmt.Errorf("--kafka-pool %d is not positive", o.kafkaPool))
	}
	for _, p := range splitList(partitionList) {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("--partitions: %q is not a positive number", p))
		}
		o.partitions = append(o.partitions, n)
	}
	switch {
	case o.msgs < 0:
		errs = append(errs, fmt.Errorf("--msgs %d is negative", o.msgs))
	case o.msgs > 0:
	case o.smoke:
		o.msgs = 24
	case o.quick:
		o.msgs = 1000
	default:
		o.msgs = 5000
	}
	switch {
	case o.rounds < 0:
		errs = append(errs, fmt.Errorf("--rounds %d is negative", o.rounds))
	case o.rounds > 0:
	case o.smoke:
		o.rounds = 1
	default:
		o.rounds = 3
	}
	switch {
	case flagSet(fs, "warmup") && o.warmup < 0:
		errs = append(errs, fmt.Errorf("--warmup %v is negative", o.warmup))
	case flagSet(fs, "warmup"):
	case o.smoke:
		o.warmup = 0
	case o.quick:
		o.warmup = time.Second
	default:
		o.warmup = 2 * time.Second
	}
	switch {
	case sizes != "":
		for _, s := range splitList(sizes) {
			n, err := parseSize(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("--growth: %w", err))
			}
			o.growth = append(o.growth, n)
		}
	case o.smoke:
		o.growth = []int64{0, 1000}
	case o.quick:
		o.growth = []int64{0, 1_000_000}
	default:
		o.growth = []int64{0, 1_000_000, 10_000_000}
	}
	slices.Sort(o.growth)
	o.growth = slices.Compact(o.growth)
	if len(o.growth) > 0 && o.growth[0] != 0 {
		o.growth = append([]int64{0}, o.growth...) // ratios are against the empty inbox
	}
	for _, l := range splitList(layouts) {
		if l != layoutPlain && l != layoutPartitioned {
			errs = append(errs, fmt.Errorf("--layouts: unknown layout %q (plain, partitioned)", l))
		} else if !slices.Contains(o.layouts, l) {
			o.layouts = append(o.layouts, l)
		}
	}
	if k, err := parseKeys(keys); err != nil {
		errs = append(errs, err)
	} else {
		o.keys = k
	}
	switch {
	case purgeSizes != "":
		for _, s := range splitList(purgeSizes) {
			n, err := parseSize(s)
			if err == nil && n == 0 {
				err = fmt.Errorf("%q: a purge needs rows", s)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("--purge: %w", err))
			}
			o.purge = append(o.purge, n)
		}
	case o.smoke:
		o.purge = []int64{1000}
	case o.quick:
		o.purge = []int64{100_000}
	default:
		o.purge = []int64{1_000_000}
	}
	if o.purgeBatch < 0 {
		errs = append(errs, fmt.Errorf("--purge-batch %d is negative", o.purgeBatch))
	}
	return o, errors.Join(errs...)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// parseSize reads 0, 5000, 1k, 1m, 10m.
func parseSize(s string) (int64, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "k"):
		mult, s = 1_000, strings.TrimSuffix(s, "k")
	case strings.HasSuffix(s, "m"):
		mult, s = 1_000_000, strings.TrimSuffix(s, "m")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size such as 0, 1k or 10m", s)
	}
	return n * mult, nil
}

// sizeLabel names an inbox size in scenario and ratio names: empty, 1k, 1m, 10m.
func sizeLabel(n int64) string {
	switch {
	case n == 0:
		return "empty"
	case n%1_000_000 == 0:
		return strconv.FormatInt(n/1_000_000, 10) + "m"
	case n%1_000 == 0:
		return strconv.FormatInt(n/1_000, 10) + "k"
	}
	return strconv.FormatInt(n, 10)
}

// run is the whole program; the smoke test calls it directly.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	b, err := newBench(o, stdout, stderr)
	if err != nil {
		return err
	}
	defer b.close()
	start := time.Now()
	b.logf("dialects=%s workers=%v msgs=%d rounds=%d scenarios=%s keys=%v (%s)", strings.Join(o.dialects, ","), o.workers, o.msgs,
		o.rounds, strings.Join(o.scenarios, ","), o.keys, machineLoad())
	if err := b.runAll(ctx); err != nil {
		return err
	}
	b.printRatios()
	if o.markdown != "" {
		if err := os.WriteFile(o.markdown, []byte(b.markdownTables()), 0o644); err != nil {
			return err
		}
	}
	if o.plotDir != "" {
		files, err := b.writePlots(o.plotDir)
		if err != nil {
			return err
		}
		for _, f := range files {
			b.logf("plot: %s", f)
		}
	}
	b.logf("done in %v (%s)", time.Since(start).Round(time.Second), machineLoad())
	return nil
}

func (b *bench) runAll(ctx context.Context) error {
	for _, name := range b.opts.dialects {
		d, _ := dialectByName(name)
		if err := b.ping(ctx, d); err != nil {
			return err
		}
		for _, w := range b.opts.workers {
			// Rounds interleave the scenarios, so that a burst of load from
			// elsewhere on the machine hits one round of each rather than
			// every round of one; the median round is reported. Every
			// other round runs them in reverse order, so that a drift
			// of the machine over a round does not favour whichever of
			// two scenarios runs first (the paired ratios compare the
			// two round by round).
			rounds := map[string][]result{}
			for round := 1; round <= b.opts.rounds; round++ {
				for _, s := range inRoundOrder(round, perDialect) {
					if !b.opts.has(s.name) || (s.only != "" && s.only != d.name) {
						continue
					}
					r, err := b.measureScenario(ctx, d, s, w)
					if err != nil {
						return fmt.Errorf("%s on %s with %d workers: %w", s.name, d.name, w, err)
					}
					if b.opts.rounds > 1 {
						b.logf("round %d/%d: %s (%s)", round, b.opts.rounds, r, machineLoad())
					}
					rounds[s.name] = append(rounds[s.name], r)
				}
			}
			for _, s := range perDialect {
				if rs := rounds[s.name]; len(rs) > 0 {
					b.reportRounds(rs)
				}
			}
		}
		if b.opts.has("growth") {
			if err := b.growth(ctx, d); err != nil {
				return fmt.Errorf("growth on %s: %w", d.name, err)
			}
		}
		if b.opts.has("purge") {
			if err := b.purge(ctx, d); err != nil {
				return fmt.Errorf("purge on %s: %w", d.name, err)
			}
		}
	}
	if b.opts.has("kafka") {
		if err := b.kafka(ctx); err != nil {
			return fmt.Errorf("kafka: %w", err)
		}
	}
	if b.opts.has("kafka_backlog") && slices.Contains(b.opts.dialects, "pg") {
		if err := b.backlog(ctx); err != nil {
			return fmt.Errorf("kafka_backlog: %w", err)
		}
	}
	if b.opts.has("sqlqueue") && slices.Contains(b.opts.dialects, "pg") {
		if err := b.sqlQueue(ctx); err != nil {
			return fmt.Errorf("sqlqueue: %w", err)
		}
	}
	return nil
}

// inRoundOrder returns s as round runs it: in order in odd rounds,
// reversed in even ones, so that a drift of the machine over a round
// does not favour whichever of two scenarios runs first.
func inRoundOrder[T any](round int, s []T) []T {
	if round%2 == 1 {
		return s
	}
	r := slices.Clone(s)
	slices.Reverse(r)
	return r
}

// machineLoad describes what else the machine is doing, for judging how
// noisy a measurement is: the load average and, where the kernel reports
// it, the share of the last 10 s in which runnable tasks waited for a CPU.
func machineLoad() string {
	var parts []string
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			parts = append(parts, "loadavg "+strings.Join(f[:3], " "))
		}
	}
	if b, err := os.ReadFile("/proc/pressure/cpu"); err == nil {
		for _, f := range strings.Fields(string(b)) {
			if v, ok := strings.CutPrefix(f, "avg10="); ok {
				parts = append(parts, "cpu pressure "+v+"%")
				break
			}
		}
	}
	if len(parts) == 0 {
		return "load unknown"
	}
	return strings.Join(parts, ", ")
}

// flagSet reports whether the command line set the flag.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
