package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/horizon"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/internal/kafkatest"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

const topic = "orders"

type replayBundle struct {
	brokers []string
	db      *sql.DB
	store   *inbox.Store
	base    []string
	// perPartition counts the topic's messages by partition.
	perPartition map[int32]int
}

// setup publishes 53 messages on three partitions — 40 events, events 0-19
// ten days ago and 20-39 now, retries of events 0-9, event 30's ID reused
// for another order, two messages without an event ID — and processes them
// all through the middleware, so that the inbox holds what a consumer
// would have left.
func replaySetup(t *testing.T, kind testdb.Kind) *replayBundle {
	t.Helper()
	ctx := context.Background()
	b := &replayBundle{perPartition: map[int32]int{}}
	var dsn string
	switch kind {
	case testdb.SQLite:
		dsn = filepath.Join(t.TempDir(), "inbox.db")
		b.db = testdb.OpenSQLite(t, dsn)
	case testdb.MySQL:
		b.db, dsn = testdb.Open(t, kind), testdb.MySQLDSN()
	default:
		b.db, dsn = testdb.Open(t, kind), testdb.PostgresDSN()
	}
	table := testdb.UniqueName("replay_inbox")
	var err error
	b.store, err = inbox.NewStore(b.db, testdb.Dialect(kind), inbox.Config{Table: table})
	require.NoError(t, err)
	require.NoError(t, b.store.Migrate(ctx))
	t.Cleanup(func() {
		for _, tbl := range inbox.TableNames(table) {
			_, _ = b.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tbl)
		}
	})
	b.brokers = kafkatest.Start(t, 3, topic)

	now := time.Now()
	old := now.Add(-240 * time.Hour)
	var records []kafkatest.Record
	add := func(p int32, eventID, payload string, at time.Time) {
		h := map[string]string{"tenant_id": "shop-1"}
		if eventID != "" {
			h["event_id"] = eventID
		}
		records = append(records, kafkatest.Record{Partition: p, Headers: h, Value: []byte(payload), Timestamp: at})
		b.perPartition[p]++
	}
	for i := range 40 {
		at := now
		if i < 20 {
			at = old
		}
		add(int32(i%3), eventID(i), fmt.Sprintf(`{"order":"o-%d","sent_at":"first"}`, i), at)
		if i < 10 {
			add(int32(i%3), eventID(i), fmt.Sprintf(`{"order":"o-%d","sent_at":"retry"}`, i), at.Add(time.Second))
		}
	}
	add(0, eventID(30), `{"order":"o-999"}`, now)
	add(0, "", `{"order":"o-1000"}`, now)
	add(1, "", `{"order":"o-1001"}`, now)
	kafkatest.Produce(t, b.brokers, topic, records)

	d, err := dedup.New(b.store, dedup.Config{
		Key:          dedup.KeyFromMetadata("event_id"),
		Scope:        dedup.ScopeFromMetadata("tenant_id"),
		Operation:    "ship_order",
		IgnoreFields: []string{"sent_at"},
	})
	require.NoError(t, err)
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for _, km := range kafkatest.ReadAll(t, b.brokers, topic) {
		msg, err := kafka.DefaultMarshaler{}.Unmarshal(km)
		require.NoError(t, err)
		_, _ = h(msg)
	}
	require.Equal(t, dedup.Stats{Executed: 40, Duplicates: 10, Conflicts: 1, Invalid: 2}, d.Stats())

	b.base = []string{
		"--brokers", strings.Join(b.brokers, ","), "--topic", topic,
		"--dialect", dialectFlag(kind), "--dsn", dsn, "--table", table,
		"--operation", "ship_order", "--key-metadata", "event_id", "--scope-metadata", "tenant_id",
		"--ignore-fields", "sent_at", "--progress-interval", "0",
	}
	return b
}

func eventID(i int) string { return fmt.Sprintf("evt-%02d", i) }

func dialectFlag(kind testdb.Kind) string {
	switch kind {
	case testdb.SQLite:
		return "sqlite"
	case testdb.MySQL:
		return "mysql"
	}
	return "postgres"
}

// replay runs the command and returns its exit status, standard output
// and standard error.
func replay(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := runCtx(ctx, append([]string{"replay"}, args...)...)
	return r.code, r.stdout, r.stderr
}

// summary runs the command, requires success and returns the last line.
func (b *replayBundle) summary(t *testing.T, args ...string) string {
	t.Helper()
	code, stdout, stderr := replay(t, append(append([]string{}, b.base...), args...)...)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	return lines[len(lines)-1]
}

// TestReplayDryRun runs the command against kfake and each database.
func TestReplayDryRun(t *testing.T) {
	for _, kind := range []testdb.Kind{testdb.SQLite, testdb.PostgresPQ, testdb.MySQL} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			b := replaySetup(t, kind)

			// Everything was processed: a replay runs nothing.
			require.Equal(t, "messages=53 new=0 duplicate=50 conflict=1 invalid=2 expired=0", b.summary(t))

			// Forget two old events and two recent ones.
			for _, i := range []int{1, 2, 25, 26} {
				require.NoError(t, b.store.Delete(context.Background(), b.db, inbox.ID{Scope: "shop-1", Operation: "ship_order", Key: eventID(i)}))
			}
			// The recent ones are new; the old ones were published before
			// the 7-day window, so their records would have been purged by
			// now: older than the retention window. Either runs again.
			require.Equal(t, "messages=53 new=2 duplicate=46 conflict=1 invalid=2 expired=2", b.summary(t))
			require.Equal(t, "messages=53 new=2 duplicate=46 conflict=1 invalid=2 expired=2", b.summary(t, "--retention", "7d"))
			require.Equal(t, "messages=53 new=4 duplicate=46 conflict=1 invalid=2 expired=0", b.summary(t, "--retention", "-1"))
			require.Equal(t, "messages=53 new=0 duplicate=46 conflict=1 invalid=2 expired=4", b.summary(t, "--retention", "1ms"))

			// Only the last hour: events 20-39, the reused ID, the keyless two.
			require.Equal(t, "messages=23 new=2 duplicate=18 conflict=1 invalid=2 expired=0", b.summary(t, "--since", "1h"))
			require.Equal(t, "messages=23 new=2 duplicate=18 conflict=1 invalid=2 expired=0",
				b.summary(t, "--since", time.Now().Add(-time.Hour).Format(time.RFC3339)))
			require.Equal(t, "messages=0 new=0 duplicate=0 conflict=0 invalid=0 expired=0",
				b.summary(t, "--since", time.Now().Add(time.Hour).Format(time.RFC3339)))

			// Offset ranges.
			require.Equal(t, "messages=2 new=0 duplicate=2 conflict=0 invalid=0 expired=0",
				b.summary(t, "--partitions", "0", "--from", "1", "--to", "3"))
			want := 2 + (b.perPartition[1] - 1) + (b.perPartition[2] - 1)
			require.Contains(t, b.summary(t, "--from", "0:1,1:1,2:0", "--to", "0:3,2:"+fmt.Sprint(b.perPartition[2]-1)),
				fmt.Sprintf("messages=%d ", want))
			require.Contains(t, b.summary(t, "--from", "1000"), "messages=0 ")
		})
	}
}

// TestReplayOutput checks what the command shows besides the summary.
func TestReplayOutput(t *testing.T) {
	t.Parallel()
	b := replaySetup(t, testdb.SQLite)
	require.NoError(t, b.store.Delete(context.Background(), b.db, inbox.ID{Scope: "shop-1", Operation: "ship_order", Key: eventID(25)}))

	code, stdout, stderr := replay(t, append(b.base, "--progress-every", "10", "--show", "3")...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "partition 0: offsets 0 to 20 (20 messages)")
	require.Regexp(t, `(?m)^  partition=\d offset=\d+ class=(new|conflict|invalid) `, stdout)
	require.Contains(t, stdout, "... and 1 more that are not duplicates")
	require.Contains(t, stdout, "a replay would run the handler for 1 messages (1 new, 0 older than the retention window), "+
		"ack 49 duplicates without running it, and refuse 3 (1 conflicting, 2 invalid)\n")
	require.NotContains(t, stdout, "evt-", "keys are shown as digests")
	require.Regexp(t, `(?m)^progress: 10/53 messages \(19%\), \d+ msg/s, messages=10 `, stderr)
	require.Regexp(t, `(?m)^progress: 50/53 messages`, stderr)

	// A conflict says why; an invalid message too.
	code, stdout, _ = replay(t, append(b.base, "--show", "100")...)
	require.Equal(t, 0, code)
	require.Regexp(t, `class=conflict key_digest=[0-9a-f]{16} published=\S+ reason="inbox: key [0-9a-f]{16} of operation \\"ship_order\\"`, stdout)
	require.Regexp(t, `class=invalid published=\S+ reason="dedup: key from metadata \\"event_id\\"`, stdout)
	require.Regexp(t, `class=new key_digest=`+inbox.ID{Scope: "shop-1", Operation: "ship_order", Key: eventID(25)}.Digest(), stdout)

	// Progress by time alone.
	code, _, stderr = replay(t, append(b.base, "--progress-every", "0", "--progress-interval", "1ns")...)
	require.Equal(t, 0, code)
	require.Contains(t, stderr, "progress: ")
}

// TestReplayHints: a report that points at a wrong setting says which.
func TestReplayHints(t *testing.T) {
	t.Parallel()
	b := replaySetup(t, testdb.SQLite)
	withArg := func(flag, value string) []string {
		args := append([]string{}, b.base...)
		for i := range args {
			if args[i] == flag {
				args[i+1] = value
				return args
			}
		}
		return append(args, flag, value)
	}
	// Right settings: no hint.
	code, _, stderr := replay(t, b.base...)
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, stderr, "hint:")

	code, stdout, stderr := replay(t, withArg("--operation", "ship_orders")...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, " new=20 ")
	require.Contains(t, stderr, `hint: no records exist for operation "ship_orders"`)

	// The middleware ignored sent_at; a replay that ignores another field
	// computes other fingerprints, and its messages conflict.
	code, stdout, stderr = replay(t, withArg("--ignore-fields", "order")...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, " duplicate=0 conflict=51 ")
	require.Contains(t, stderr, "hint: 51 of 51 keyed messages conflict with their records")
	require.Contains(t, stderr, "check --ignore-fields")

	code, _, stderr = replay(t, withArg("--key-metadata", "event-id")...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "hint: no message has a usable key")
}

// TestReplayFailures: what cannot be read is an error, never a report.
func TestReplayFailures(t *testing.T) {
	t.Parallel()
	b := replaySetup(t, testdb.SQLite)
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown topic", []string{"--topic", "nope"}, "topic nope"},
		{"unknown partition", []string{"--partitions", "7"}, "has no partition 7"},
		{"unknown partition in --from", []string{"--from", "7:0"}, "has no partition 7"},
		{"no inbox table", []string{"--table", "missing"}, "there is no inbox table missing"},
		{"no broker", []string{"--brokers", "127.0.0.1:1"}, "run out of available brokers"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr := replay(t, append(append([]string{}, b.base...), c.args...)...)
			require.Equal(t, 1, code, stderr)
			require.Contains(t, stderr, c.want)
		})
	}
}

// TestReplayLegacyFlags: the single-dash flags of the former
// inboxmill-replay command still work, mixed with the new ones.
func TestReplayLegacyFlags(t *testing.T) {
	t.Parallel()
	b := replaySetup(t, testdb.SQLite)
	var legacy []string
	for _, a := range b.base {
		if strings.HasPrefix(a, "--") {
			a = a[1:]
		}
		legacy = append(legacy, a)
	}
	code, stdout, stderr := replay(t, append(legacy, "-show=0", "-retention", "-1")...)
	require.Equal(t, 0, code, stderr)
	require.True(t, strings.HasSuffix(stdout, "messages=53 new=0 duplicate=50 conflict=1 invalid=2 expired=0\n"), stdout)
}

// TestReplayUsage: bad flags are reported together, with exit status 2,
// before anything is opened.
func TestReplayUsage(t *testing.T) {
	base := []string{"--topic", "t", "--dsn", "inbox.db", "--operation", "op", "--key-metadata", "event_id"}
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"nothing", nil, []string{"--topic is required", "--dsn (or INBOXMILL_DSN) is required", "--operation is required",
			"exactly one of --key-metadata and --key-json"}},
		{"two keys", append(base, "--key-json", "id"), []string{"exactly one of --key-metadata and --key-json"}},
		{"two scopes", append(base, "--scope-metadata", "tenant", "--scope", "a"), []string{"at most one of --scope-metadata and --scope"}},
		{"since and from", append(base, "--since", "1h", "--from", "3"), []string{"at most one of --from and --since"}},
		{"bad since", append(base, "--since", "yesterday"), []string{"--since: \"yesterday\""}},
		{"bad from", append(base, "--from", "first"), []string{"--from: \"first\""}},
		{"bad to pair", append(base, "--to", "0:x"), []string{"--to: \"0:x\" is not partition:offset"}},
		{"partition twice", append(base, "--to", "0:1,0:2"), []string{"partition 0 is given twice"}},
		{"bad retention", append(base, "--retention", "0"), []string{"--retention: \"0\""}},
		{"bad dialect", append(base, "--dialect", "oracle"), []string{"unknown dialect \"oracle\""}},
		{"dsn of no known form", []string{"--topic", "t", "--dsn", "x", "--operation", "op", "--key-metadata", "e"},
			[]string{"cannot tell the database from the DSN x"}},
		{"raw with ignore", append(base, "--raw-fingerprint", "--ignore-fields", "a"), []string{"--ignore-fields only applies"}},
		{"bad partitions", append(base, "--partitions", "a"), []string{"--partitions: \"a\""}},
		{"bad version", append(base, "--kafka-version", "x"), []string{"--kafka-version"}},
		{"stray argument", append(base, "extra"), []string{"unexpected arguments"}},
		{"unknown flag", append(base, "--nope"), []string{"unknown flag: --nope"}},
		{"unknown legacy flag", append(base, "-nope"), []string{"unknown shorthand flag"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, stdout, stderr := replay(t, c.args...)
			require.Equal(t, 2, code, stderr)
			require.Empty(t, stdout)
			for _, w := range c.want {
				require.Contains(t, stderr, w)
			}
		})
	}
	for _, h := range []string{"-h", "--help"} {
		code, stdout, _ := replay(t, h)
		require.Equal(t, 0, code)
		require.Contains(t, stdout, "inboxmill replay --brokers HOST:PORT --topic TOPIC")
		require.Contains(t, stdout, "--progress-interval")
	}
}

func TestParseFlagValues(t *testing.T) {
	o, err := parseOffsets("oldest", "oldest")
	require.NoError(t, err)
	_, ok := o.get(3)
	require.False(t, ok)

	o, err = parseOffsets("0:5, 2:7", "end")
	require.NoError(t, err)
	v, ok := o.get(2)
	require.True(t, ok)
	require.EqualValues(t, 7, v)
	_, ok = o.get(1)
	require.False(t, ok)

	o, err = parseOffsets("12", "oldest")
	require.NoError(t, err)
	v, ok = o.get(9)
	require.True(t, ok)
	require.EqualValues(t, 12, v)

	for in, want := range map[string]time.Duration{"7d": 7 * 24 * time.Hour, "90m": 90 * time.Minute, "-1": -1, "forever": -1} {
		got, err := parseRetention(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"0", "-5m", "xd", ""} {
		_, err := parseRetention(in)
		require.Error(t, err, in)
	}

	now := time.Date(2030, 5, 1, 12, 0, 0, 0, time.UTC)
	got, err := parseSince("2d", now)
	require.NoError(t, err)
	require.Equal(t, now.Add(-48*time.Hour), got)
	got, err = parseSince("2030-04-01T00:00:00Z", now)
	require.NoError(t, err)
	require.Equal(t, time.Date(2030, 4, 1, 0, 0, 0, 0, time.UTC), got)
}

// setTopicConfig sets configs of the test topic, as an operator would
// with kafka-configs --alter.
func (b *replayBundle) setTopicConfig(t *testing.T, configs map[string]string) {
	t.Helper()
	client, err := sarama.NewClient(b.brokers, kafkatest.Config())
	require.NoError(t, err)
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	require.NoError(t, err)
	entries := map[string]*string{}
	for k, v := range configs {
		entries[k] = &v
	}
	require.NoError(t, admin.AlterConfig(sarama.TopicResource, topic, entries, false))
}

// TestReplayHorizon: the topic's retention is compared with --retention
// before anything is read.
func TestReplayHorizon(t *testing.T) {
	t.Parallel()
	b := replaySetup(t, testdb.SQLite)
	const want = "messages=53 new=0 duplicate=50 conflict=1 invalid=2 expired=0"

	// The broker's default, 7 days, and --retention's, 7 days: no warning.
	code, stdout, stderr := replay(t, b.base...)
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, stderr, "warning:")
	require.True(t, strings.HasSuffix(stdout, want+"\n"), stdout)

	b.setTopicConfig(t, map[string]string{"retention.ms": fmt.Sprint((30 * 24 * time.Hour).Milliseconds())})
	const loud = "the inbox keeps records for 7d but topic orders keeps messages for 30d: messages older than 7d would run again"
	code, stdout, stderr = replay(t, b.base...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "warning: "+loud+"\n")
	require.True(t, strings.HasSuffix(stdout, want+"\n"), "the warning changes nothing of the report: %s", stdout)

	// Strict: refused before anything is read.
	code, stdout, stderr = replay(t, append(b.base, "--strict-horizon")...)
	require.Equal(t, 1, code, stderr)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "inboxmill replay: "+loud+"\n")

	// A retention as long as the topic's, or forever, is safe.
	for _, r := range []string{"30d", "31d", "-1"} {
		code, stdout, stderr = replay(t, append(b.base, "--strict-horizon", "--retention", r)...)
		require.Equal(t, 0, code, "--retention %s: %s", r, stderr)
		require.NotContains(t, stderr, "warning:")
		require.Contains(t, stdout, "messages=53 ")
	}
	code, _, stderr = replay(t, append(b.base, "--strict-horizon", "--retention", "29d")...)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "the inbox keeps records for 29d but topic orders keeps messages for 30d")

	b.setTopicConfig(t, map[string]string{"retention.ms": "-1"})
	code, _, stderr = replay(t, b.base...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "warning: the inbox keeps records for 7d but topic orders keeps messages forever: "+
		"messages older than 7d would run again\n")
	code, _, stderr = replay(t, append(b.base, "--strict-horizon", "--retention", "forever")...)
	require.Equal(t, 0, code, stderr)
}

// TestCheckHorizonUnreadable: a retention that cannot be read is a
// warning, and a refusal under --strict-horizon.
func TestCheckHorizonUnreadable(t *testing.T) {
	denied := horizon.SourceFunc(func(context.Context) (horizon.Horizon, error) {
		return horizon.Horizon{}, errors.New("topic authorization failed")
	})
	o := options{topic: "orders", retention: 7 * 24 * time.Hour}
	var stderr strings.Builder
	require.NoError(t, checkHorizon(context.Background(), denied, o, &stderr))
	require.Equal(t, "warning: cannot compare --retention with the retention of topic orders, so a replay may run "+
		"messages whose records were purged: topic authorization failed\n", stderr.String())

	o.strictHorizon = true
	stderr.Reset()
	err := checkHorizon(context.Background(), denied, o, &stderr)
	require.ErrorContains(t, err, "--strict-horizon: cannot compare --retention with the retention of topic orders: "+
		"topic authorization failed")
	require.Empty(t, stderr.String())

	bySize := horizon.Fixed(horizon.Horizon{Name: "topic orders", Age: horizon.Forever, BySize: true})
	require.ErrorIs(t, checkHorizon(context.Background(), bySize, o, &stderr), horizon.ErrHorizonUnknown)
}

// TestReplayOlderThanEveryRecord: the report counts the messages published
// before the operation's oldest record was created.
func TestReplayOlderThanEveryRecord(t *testing.T) {
	t.Parallel()
	b := replaySetup(t, testdb.SQLite)
	line := func(stdout string) string {
		t.Helper()
		for _, l := range strings.Split(stdout, "\n") {
			if strings.HasPrefix(l, "  older than every record: ") {
				return l
			}
		}
		t.Fatalf("no line about records in:\n%s", stdout)
		return ""
	}
	// Records are written when messages are consumed, after they were
	// published: every message of the range is older than the records a
	// consumer that just caught up wrote.
	code, stdout, stderr := replay(t, b.base...)
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^  older than every record: 53 messages, published before the oldest record of operation "ship_order" `+
		`was created \(\S+Z\)$`, line(stdout))

	// As after a purge: the oldest record left was created half an hour
	// after events 0-19 (and the retries of 0-9) were published ten days
	// ago.
	oldest := time.Now().Add(-240*time.Hour + 30*time.Minute).Truncate(time.Second)
	_, err := b.db.Exec(fmt.Sprintf(`UPDATE %s SET created_at = ? WHERE "key" = ?`, b.store.Table()),
		testdb.Dialect(testdb.SQLite).TimeArg(oldest), eventID(15))
	require.NoError(t, err)
	code, stdout, stderr = replay(t, b.base...)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, `  older than every record: 30 messages, published before the oldest record of operation "ship_order" `+
		`was created (`+oldest.UTC().Format(time.RFC3339)+`)`, line(stdout))
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Equal(t, "messages=53 new=0 duplicate=50 conflict=1 invalid=2 expired=0", lines[len(lines)-1])
	require.Equal(t, line(stdout), lines[len(lines)-3], "the line comes before the sentence and the summary")

	code, stdout, _ = replay(t, append(b.base, "--since", "1h")...)
	require.Equal(t, 0, code)
	require.Contains(t, line(stdout), "older than every record: 0 messages,")

	// Another operation has no records at all.
	args := append([]string{}, b.base...)
	for i := range args {
		if args[i] == "--operation" {
			args[i+1] = "refund_order"
		}
	}
	code, stdout, _ = replay(t, args...)
	require.Equal(t, 0, code)
	require.Equal(t, `  older than every record: 53 messages (operation "refund_order" has no records)`, line(stdout))
}
