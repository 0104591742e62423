package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/internal/kafkatest"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

var lastLine = regexp.MustCompile(`(?m)^delivered=(\d+) executed=(\d+) duplicates=(\d+) conflicts=(\d+)\n\z`)

// TestKafkaExample runs the program three times on one PostgreSQL inbox:
// first with its embedded broker, then against a separate broker whose
// topics it has to create, as with -brokers, then with -reset. The first
// run ships every event once despite retries, failures and lost acks; the
// second, with the same events published again, ships nothing new and
// says why; the third starts over and ships every event once again.
func TestKafkaExample(t *testing.T) {
	db := testdb.Open(t, testdb.PostgresPQ) // skips, or fails under CI, without PostgreSQL
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := config{
		dsn: testdb.PostgresDSN(), topic: "orders", group: "shipping", events: 100,
		inboxTable: testdb.UniqueName("kafka_example_inbox"), shipmentsTable: testdb.UniqueName("kafka_example_shipments"),
	}
	t.Cleanup(func() {
		if store, err := inbox.NewStore(db, postgres.Dialect(), inbox.Config{Table: cfg.inboxTable}); err == nil {
			_ = store.MigrateDown(context.Background(), 0) // the inbox and every table its migrations made
		}
		_, _ = db.Exec("DROP TABLE IF EXISTS " + cfg.shipmentsTable)
	})

	var out bytes.Buffer
	sum, err := run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Regexp(t, lastLine, out.String())
	// 100 events + 20 producer retries + 1 reused key = 121 messages; 25
	// handler failures and 16 lost acks come back once each.
	first := summary{published: 121, delivered: 162, executed: 100, duplicates: 36, conflicts: 1, poisoned: 1,
		shipments: 100, distinctShipments: 100, retried: 25}
	requireSummary(t, first, sum)
	require.Contains(t, out.String(), "inbox: table "+cfg.inboxTable+" holds no records from earlier runs\n")
	require.Contains(t, out.String(), "kafka: embedded broker at 127.0.0.1:")
	require.Contains(t, out.String(), "poison queue: event evt-0007 refused: ")
	require.Contains(t, out.String(), fmt.Sprintf("delivered=%d executed=100 duplicates=36 conflicts=1\n", sum.delivered))

	out.Reset()
	cfg.brokers = strings.Join(kafkatest.Start(t, 1), ",")
	sum, err = run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Regexp(t, lastLine, out.String())
	requireSummary(t, summary{published: 121, delivered: 137, executed: 0, duplicates: 136, conflicts: 1, poisoned: 1,
		shipments: 100, distinctShipments: 100}, sum, "a second run executes nothing again")
	require.Contains(t, out.String(), "note: 100 events were already recorded by an earlier run in table "+cfg.inboxTable+
		"; they are acknowledged as duplicates (executed=0 is expected). Run with -reset to start over.\n")

	out.Reset()
	cfg.brokers, cfg.reset = "", true
	sum, err = run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	requireSummary(t, first, sum, "after -reset every event ships again, once")
	require.Contains(t, out.String(), "reset: dropped the inbox "+cfg.inboxTable+" and "+cfg.shipmentsTable+"\n")
	require.Contains(t, out.String(), "holds no records from earlier runs\n")

	// The parallel consumer: the same faults, the same outcome.
	out.Reset()
	cfg.parallel = 32
	sum, err = run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	requireSummary(t, first, sum, "with -parallel every event ships once, as without")
	require.Contains(t, out.String(), "kafka: parallel consumer, up to 32 messages per partition at once")
}

// requireSummary checks a run's summary against want: the outcome
// exactly, and the deliveries up to the handler runs that a transient
// database error rolled back beside the simulated failures (a server out
// of connections under the load of other tests): each comes back once
// more, and changes nothing else.
func requireSummary(t *testing.T, want, got summary, msgAndArgs ...any) {
	t.Helper()
	extra := got.retried - want.retried
	require.GreaterOrEqual(t, extra, 0, msgAndArgs...)
	want.delivered += extra
	want.retried = got.retried
	require.Equal(t, want, got, msgAndArgs...)
}

// An error names the database it could not reach without its password.
func TestKafkaExampleRedactsPassword(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := cli([]string{"-dsn", "postgres://app:s3cret@127.0.0.1:1/x?sslmode=disable", "-reset"}, &stdout, &stderr)
	require.Equal(t, 1, code, stderr.String())
	require.Contains(t, stderr.String(), "kafka example: PostgreSQL at postgres://app:xxxxx@127.0.0.1:1/x?sslmode=disable: ")
	require.NotContains(t, stdout.String()+stderr.String(), "s3cret")
}

// The deadline grows with -events, and -h says so.
func TestKafkaExampleDeadline(t *testing.T) {
	t.Parallel()
	require.Equal(t, 2*time.Minute, runDeadline.For(100))
	require.Equal(t, 20*time.Minute, runDeadline.For(60_000))
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, cli([]string{"-h"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "the run gives up after 2m0s or 20ms per event, whichever is longer")
	require.Contains(t, stderr.String(), "-reset")
}
