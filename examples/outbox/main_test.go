package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/internal/kafkatest"
	"github.com/inboxmill/inboxmill/internal/testdb"
)

var lastLine = regexp.MustCompile(
	`(?m)^orders=(\d+) outbox_published=(\d+) forwarded=(\d+) downstream_executed=(\d+) downstream_duplicates=(\d+)\n\z`)

// TestOutboxExample runs the program twice on fresh PostgreSQL tables. The
// first run schedules one delivery per order although the forwarder dies
// after Kafka writes and at ack commits, and handlers fail after publishing
// to the outbox. The second, against a separate broker whose topics it has
// to create (as with -brokers), publishes the orders again and publishes,
// forwards and delivers nothing new.
func TestOutboxExample(t *testing.T) {
	db := testdb.Open(t, testdb.PostgresPGX) // skips, or fails under CI, without PostgreSQL
	cfg := config{
		dsn:         testdb.PostgresDSN(),
		ordersTopic: "orders", shipmentsTopic: "shipments",
		outboxTopic: testdb.UniqueName("outbox"),
		tables:      testdb.UniqueName("outbox_ex"),
		events:      60,
	}
	t.Cleanup(func() {
		for _, tbl := range []string{cfg.tables + "_requests", cfg.tables + "_deliveries", cfg.tables + "_inbox",
			cfg.tables + "_inbox_migrations", wsql.PostgreSQLQueueSchema{}.MessagesTable(cfg.outboxTopic)} {
			_, _ = db.Exec("DROP TABLE IF EXISTS " + tbl)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var out bytes.Buffer
	sum, err := run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Regexp(t, lastLine, out.String())
	// 60 orders, 10 of them published twice (i%6 == 0). Orders 4, 12, …, 60
	// (i%8 == 4) fail once after publishing to the outbox. The forwarder
	// dies after the Kafka write of orders 3, 13, …, 53 (i%10 == 3) and at
	// the ack commit of 7, 22, 37, 52 (i%15 == 7): ten copies in Kafka.
	require.Equal(t, summary{orders: 60, messages: 70, outboxPublished: 60, rolledBack: 8, forwarded: 70, crashes: 10,
		downstreamExecuted: 60, downstreamDuplicates: 10}, sum)
	require.Contains(t, out.String(), "kafka: embedded broker at 127.0.0.1:")
	require.Contains(t, out.String(), "shipment requests: every order has exactly one\ndeliveries: every order has exactly one\n")
	require.Contains(t, out.String(),
		"orders=60 outbox_published=60 forwarded=70 downstream_executed=60 downstream_duplicates=10\n")

	out.Reset()
	cfg.brokers = strings.Join(kafkatest.Start(t, 1), ",")
	sum, err = run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Regexp(t, lastLine, out.String())
	require.Equal(t, summary{orders: 60, messages: 70}, sum, "a second run publishes and forwards nothing")
	require.Contains(t, out.String(), "shipment requests: every order has exactly one\ndeliveries: every order has exactly one\n")
}
