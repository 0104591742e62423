package main

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/inboxmill/inboxmill/dedup"
)

const replayLong = `replay tells, before a Kafka topic is replayed through the dedup middleware
(a new consumer group from the oldest offset, an offset reset), what the
replay would do: how many messages of the range are new (the handler runs),
duplicates (acked without running), conflicts (key reused with another
payload: refused), invalid (no usable key: refused), or older than the
retention window (the record was purged or is about to be: the handler may
run again).

It executes nothing: it reads the topic with a plain consumer (no consumer
group, no committed offsets), derives every message's key exactly as the
middleware does — give it the same key, scope, operation and fingerprint
settings as the consumer's dedup.Config — and only reads the inbox table.

The range is every partition from its oldest offset to the high-water mark
when the command starts; narrow it with --partitions, --from and --to (an
offset for every partition, or partition:offset pairs) or --since (a time,
or a duration before now). Messages are read the way watermill-kafka's
DefaultMarshaler reads them: headers become metadata.

The last line on standard output is the summary:

  messages=20000 new=0 duplicate=19998 conflict=1 invalid=1 expired=0

Before reading, the topic's retention (retention.ms, through the admin
API) is compared with --retention: when the inbox forgets sooner than the
topic, messages older than --retention would run again, and a warning
says so on standard error; --strict-horizon refuses instead (exit 1).
The report also counts the messages of the range published before the
oldest record of the operation was created: no record is that old, so
nothing in the inbox remembers them (they were purged, forgotten, or
never processed).

Within the range, the first message of a key that would run claims it: its
later messages count as duplicates (or conflicts), as in the replay.
Progress goes to standard error every --progress-every messages and every
--progress-interval. Keys are shown as digests (inboxmill inspect --digest
finds the record). The single-dash flags of the former inboxmill-replay
command (-topic orders) are accepted too.`

// options are the parsed flags of replay.
type options struct {
	brokers    []string
	topic      string
	partitions []int32 // nil: all
	from, to   offsets
	since      time.Time

	keyMetadata, keyJSON string
	scopeMetadata, scope string
	eventTimeMetadata    string
	operation            string
	ignoreFields         []string
	rawFingerprint       bool
	retention            time.Duration
	strictHorizon        bool

	kafkaVersion     sarama.KafkaVersion
	concurrency      int
	idle             time.Duration
	progressEvery    int
	progressInterval time.Duration
	show             int
}

// replayFlags are replay's flags as given, before parsing.
type replayFlags struct {
	o                                    options
	brokers, partitions, from, to, since string
	ignore, retention, version           string
}

func (f *replayFlags) add(fs *pflag.FlagSet) {
	o := &f.o
	fs.StringVar(&f.brokers, "brokers", "localhost:9092", "Kafka brokers, comma-separated")
	fs.StringVar(&o.topic, "topic", "", "topic to read (required)")
	fs.StringVar(&f.partitions, "partitions", "", "partitions to read, comma-separated (default all)")
	fs.StringVar(&f.from, "from", "oldest", "first offset to read: oldest, an offset for every partition, or partition:offset pairs")
	fs.StringVar(&f.to, "to", "end", "offset to stop before: end (the high-water mark at start), an offset, or partition:offset pairs")
	fs.StringVar(&f.since, "since", "", "read from the first message at or after this time (RFC 3339) or this long ago (72h, 7d); instead of --from")
	fs.StringVar(&o.keyMetadata, "key-metadata", "", "the key is this metadata field (Kafka header), as dedup.KeyFromMetadata")
	fs.StringVar(&o.keyJSON, "key-json", "", "the key is this dotted JSON path of the payload, as dedup.KeyFromJSON")
	fs.StringVar(&o.scopeMetadata, "scope-metadata", "", "the scope is this metadata field, as dedup.ScopeFromMetadata")
	fs.StringVar(&o.scope, "scope", "", "the scope of every message, as dedup.ScopeConstant (default \"\")")
	fs.StringVar(&o.eventTimeMetadata, "event-time-metadata", "", "the event's time is this metadata field, as dedup.EventTimeFromMetadata "+
		"(for a partitioned table: events in closed buckets without a record are refused, and counted invalid)")
	fs.StringVar(&o.operation, "operation", "", "the operation: the router handler's name, or dedup.Config.Operation (required)")
	fs.StringVar(&f.ignore, "ignore-fields", "", "dotted JSON paths left out of the fingerprint, comma-separated, as dedup.Config.IgnoreFields")
	fs.BoolVar(&o.rawFingerprint, "raw-fingerprint", false, "fingerprint the raw payload, as dedup.RawFingerprint")
	fs.StringVar(&f.retention, "retention", "168h", "the retention window, as dedup.Config.Retention: a duration (7d works) or -1 for forever")
	fs.BoolVar(&o.strictHorizon, "strict-horizon", false, "refuse (exit 1) when --retention is shorter than the topic's retention, "+
		"or when the topic's retention cannot be read")
	fs.StringVar(&f.version, "kafka-version", sarama.V2_8_0_0.String(), "Kafka protocol version to speak")
	fs.IntVar(&o.concurrency, "concurrency", 4, "partitions read (and looked up) at once")
	fs.DurationVar(&o.idle, "idle", 30*time.Second, "stop reading a partition after this long without a message")
	fs.IntVar(&o.progressEvery, "progress-every", 10000, "print progress every this many messages (0: never)")
	fs.DurationVar(&o.progressInterval, "progress-interval", 10*time.Second, "print progress at least this often (0: never)")
	fs.IntVar(&o.show, "show", 20, "list this many messages that would not be acked as duplicates")
}

func (a *app) replayCmd() *cobra.Command {
	var f replayFlags
	cmd := &cobra.Command{
		Use:   "replay --brokers HOST:PORT --topic TOPIC --operation NAME (--key-metadata FIELD | --key-json PATH)",
		Short: "Tell what replaying a Kafka topic range through the dedup middleware would do, executing nothing",
		Long:  replayLong,
		Example: `  inboxmill replay --brokers localhost:9092 --topic orders \
    --dsn 'postgres://postgres@localhost:5432/test?sslmode=disable' \
    --operation ship_order --key-metadata event_id --scope-metadata tenant_id`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := f.parse(cmd.Flags(), a.db, time.Now())
			if err != nil {
				return usageErr(err)
			}
			return a.dryRun(cmd.Context(), o)
		},
	}
	f.add(cmd.Flags())
	return cmd
}

// parse checks the flags and reports every problem at once.
func (f *replayFlags) parse(fs *pflag.FlagSet, db dbFlags, now time.Time) (options, error) {
	o := f.o
	var errs []error
	o.brokers = splitList(f.brokers)
	if len(o.brokers) == 0 {
		errs = append(errs, errors.New("--brokers is empty"))
	}
	if o.topic == "" {
		errs = append(errs, errors.New("--topic is required"))
	}
	if db.dsn == "" {
		errs = append(errs, errors.New("--dsn (or INBOXMILL_DSN) is required"))
	} else if _, err := resolveDialect(db.dialect, db.dsn); err != nil {
		errs = append(errs, err)
	}
	if o.operation == "" {
		errs = append(errs, errors.New("--operation is required: the router handler's name (or dedup.Config.Operation)"))
	}
	if (o.keyMetadata == "") == (o.keyJSON == "") {
		errs = append(errs, errors.New("give exactly one of --key-metadata and --key-json"))
	}
	if o.scopeMetadata != "" && fs.Changed("scope") {
		errs = append(errs, errors.New("give at most one of --scope-metadata and --scope"))
	}
	o.ignoreFields = splitList(f.ignore)
	if o.rawFingerprint && len(o.ignoreFields) > 0 {
		errs = append(errs, errors.New("--ignore-fields only applies to the JSON fingerprint, not --raw-fingerprint"))
	}
	seen := map[int32]bool{}
	for _, p := range splitList(f.partitions) {
		n, err := strconv.ParseInt(p, 10, 32)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Errorf("--partitions: %q is not a partition number", p))
			continue
		}
		if seen[int32(n)] {
			// Read twice, every message of it would count twice.
			errs = append(errs, fmt.Errorf("--partitions: partition %d is given twice", n))
			continue
		}
		seen[int32(n)] = true
		o.partitions = append(o.partitions, int32(n))
	}
	var err error
	if o.from, err = parseOffsets(f.from, "oldest"); err != nil {
		errs = append(errs, fmt.Errorf("--from: %w", err))
	}
	if o.to, err = parseOffsets(f.to, "end"); err != nil {
		errs = append(errs, fmt.Errorf("--to: %w", err))
	} else if err := checkRange(o.from, o.to); err != nil {
		errs = append(errs, err)
	}
	if f.since != "" {
		if fs.Changed("from") {
			errs = append(errs, errors.New("give at most one of --from and --since"))
		}
		if o.since, err = parseSince(f.since, now); err != nil {
			errs = append(errs, fmt.Errorf("--since: %w", err))
		}
	}
	if o.retention, err = parseRetention(f.retention); err != nil {
		errs = append(errs, fmt.Errorf("--retention: %w", err))
	}
	if o.kafkaVersion, err = sarama.ParseKafkaVersion(f.version); err != nil {
		errs = append(errs, fmt.Errorf("--kafka-version: %w", err))
	}
	if o.concurrency < 1 {
		errs = append(errs, errors.New("--concurrency must be at least 1"))
	}
	if o.idle <= 0 {
		errs = append(errs, errors.New("--idle must be positive"))
	}
	if o.progressEvery < 0 || o.progressInterval < 0 || o.show < 0 {
		errs = append(errs, errors.New("--progress-every, --progress-interval and --show cannot be negative"))
	}
	return o, errors.Join(errs...)
}

// dedupConfig is the middleware configuration the flags describe.
func (o options) dedupConfig() dedup.Config {
	cfg := dedup.Config{Operation: o.operation, IgnoreFields: o.ignoreFields, Retention: o.retention}
	if o.keyMetadata != "" {
		cfg.Key = dedup.KeyFromMetadata(o.keyMetadata)
	} else {
		cfg.Key = dedup.KeyFromJSON(o.keyJSON)
	}
	if o.scopeMetadata != "" {
		cfg.Scope = dedup.ScopeFromMetadata(o.scopeMetadata)
	} else {
		cfg.Scope = dedup.ScopeConstant(o.scope)
	}
	if o.rawFingerprint {
		cfg.Fingerprint = dedup.RawFingerprint
	}
	if o.eventTimeMetadata != "" {
		cfg.EventTime = dedup.EventTimeFromMetadata(o.eventTimeMetadata)
	}
	return cfg
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// offsets is a --from or --to value: one offset for every partition, or
// some partitions' offsets (the others keep the default), or the default
// (oldest, end) when neither is set.
type offsets struct {
	all          int64 // -1: the default
	perPartition map[int32]int64
}

func (o offsets) get(p int32) (int64, bool) {
	if v, ok := o.perPartition[p]; ok {
		return v, true
	}
	return o.all, o.all >= 0
}

func parseOffsets(s, def string) (offsets, error) {
	o := offsets{all: -1}
	s = strings.TrimSpace(s)
	if s == "" || s == def {
		return o, nil
	}
	if !strings.Contains(s, ":") {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return o, fmt.Errorf("%q is neither %s, an offset, nor partition:offset pairs", s, def)
		}
		o.all = n
		return o, nil
	}
	o.perPartition = map[int32]int64{}
	for _, pair := range splitList(s) {
		ps, ns, ok := strings.Cut(pair, ":")
		p, err1 := strconv.ParseInt(ps, 10, 32)
		n, err2 := strconv.ParseInt(ns, 10, 64)
		if !ok || err1 != nil || err2 != nil || p < 0 || n < 0 {
			return o, fmt.Errorf("%q is not partition:offset", pair)
		}
		if _, dup := o.perPartition[int32(p)]; dup {
			return o, fmt.Errorf("partition %d is given twice", p)
		}
		o.perPartition[int32(p)] = n
	}
	return o, nil
}

// checkRange refuses a --from after --to for a partition both name (or
// both give for every partition): the range would read nothing, which a
// dry run would report as a topic with no messages to replay.
func checkRange(from, to offsets) error {
	var errs []error
	if from.all >= 0 && to.all >= 0 && from.all > to.all {
		errs = append(errs, fmt.Errorf("--from %d is after --to %d", from.all, to.all))
	}
	parts := map[int32]bool{}
	for p := range from.perPartition {
		parts[p] = true
	}
	for p := range to.perPartition {
		parts[p] = true
	}
	sorted := make([]int32, 0, len(parts))
	for p := range parts {
		sorted = append(sorted, p)
	}
	slices.Sort(sorted)
	for _, p := range sorted {
		a, aok := from.get(p)
		b, bok := to.get(p)
		_, own := from.perPartition[p]
		_, own2 := to.perPartition[p]
		if aok && bok && a > b && (own || own2) {
			errs = append(errs, fmt.Errorf("--from %d is after --to %d for partition %d", a, b, p))
		}
	}
	return errors.Join(errs...)
}

// parseSince reads an RFC 3339 time, or a duration before now.
func parseSince(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := parseDuration(s)
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a positive duration", s)
	}
	return now.Add(-d), nil
}

// parseRetention reads a duration, or -1 (or "forever") for records kept
// forever, as dedup.Config.Retention.
func parseRetention(s string) (time.Duration, error) {
	if s == "-1" || s == "forever" {
		return -1, nil
	}
	d, err := parseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q is neither a positive duration nor -1 (forever)", s)
	}
	return d, nil
}

// maxDays is the most whole days a time.Duration holds (about 292 years).
const maxDays = int64(math.MaxInt64 / int64(24*time.Hour))

// parseDuration is time.ParseDuration that also takes whole days ("7d"),
// the unit retention is usually thought of in. Days beyond what a
// time.Duration holds are refused, not wrapped around.
func parseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err != nil {
			return 0, err
		}
		if n > maxDays || n < -maxDays {
			return 0, fmt.Errorf("%d days is more than a duration holds (%d days)", n, maxDays)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(s)
}

// durationFlag is a pflag value that takes parseDuration's forms (7d).
type durationFlag struct{ d *time.Duration }

func (f durationFlag) String() string {
	if f.d == nil || *f.d == 0 {
		return ""
	}
	return f.d.String()
}
func (f durationFlag) Type() string { return "duration" }
func (f durationFlag) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration (90m, 36h, 7d)", s)
	}
	*f.d = d
	return nil
}
