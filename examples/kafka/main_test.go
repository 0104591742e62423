package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/internal/kafkatest"
	"github.com/inboxmill/inboxmill/internal/testdb"
)

var lastLine = regexp.MustCompile(`(?m)^delivered=(\d+) executed=(\d+) duplicates=(\d+) conflicts=(\d+)\n\z`)

// TestKafkaExample runs the program twice on one PostgreSQL inbox: first
// with its embedded broker, then against a separate broker whose topics it
// has to create, as with -brokers. The first run ships every event once
// despite retries, failures and lost acks; the second, with the same events
// published again, ships nothing new.
func TestKafkaExample(t *testing.T) {
	db := testdb.Open(t, testdb.PostgresPQ) // skips, or fails under CI, without PostgreSQL
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := config{
		dsn: testdb.PostgresDSN(), topic: "orders", group: "shipping", events: 100,
		inboxTable: testdb.UniqueName("kafka_example_inbox"), shipmentsTable: testdb.UniqueName("kafka_example_shipments"),
	}
	t.Cleanup(func() {
		for _, tbl := range []string{cfg.shipmentsTable, cfg.inboxTable, cfg.inboxTable + "_migrations"} {
			_, _ = db.Exec("DROP TABLE IF EXISTS " + tbl)
		}
	})

	var out bytes.Buffer
	sum, err := run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Regexp(t, lastLine, out.String())
	// 100 events + 20 producer retries + 1 reused key = 121 messages; 25
	// handler failures and 16 lost acks come back once each.
	require.Equal(t, summary{published: 121, delivered: 162, executed: 100, duplicates: 36, conflicts: 1, poisoned: 1,
		shipments: 100, distinctShipments: 100}, sum)
	require.Contains(t, out.String(), "kafka: embedded broker at 127.0.0.1:")
	require.Contains(t, out.String(), "poison queue: event evt-0007 refused: ")
	require.Contains(t, out.String(), "delivered=162 executed=100 duplicates=36 conflicts=1\n")

	out.Reset()
	cfg.brokers = strings.Join(kafkatest.Start(t, 1), ",")
	sum, err = run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Regexp(t, lastLine, out.String())
	require.Equal(t, summary{published: 121, delivered: 137, executed: 0, duplicates: 136, conflicts: 1, poisoned: 1,
		shipments: 100, distinctShipments: 100}, sum, "a second run executes nothing again")
}
