package main

import (
	"bytes"
	"context"
	"database/sql"
	"regexp"
	"strings"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/internal/kafkatest"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

var lastLine = regexp.MustCompile(
	`(?m)^orders=(\d+) outbox_published=(\d+) forwarded=(\d+) downstream_executed=(\d+) downstream_duplicates=(\d+)\n\z`)

// TestOutboxExample runs the program three times on fresh PostgreSQL
// tables. The first run schedules one delivery per order although the
// forwarder dies after Kafka writes and at ack commits, and handlers fail
// after publishing to the outbox. The second, against a separate broker
// whose topics it has to create (as with -brokers), publishes the orders
// again, publishes, forwards and delivers nothing new, and says why. The
// third, with -reset, starts over and does all of the first run's work
// again.
func TestOutboxExample(t *testing.T) {
	db := testdb.Open(t, testdb.PostgresPGX) // skips, or fails under CI, without PostgreSQL
	cfg := config{
		dsn:         testdb.PostgresDSN(),
		ordersTopic: "orders", shipmentsTopic: "shipments",
		outboxTopic: testdb.UniqueName("outbox"),
		tables:      testdb.UniqueName("outbox_ex"),
		events:      60,
	}
	t.Cleanup(func() { dropAll(db, cfg) })
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
	first := summary{orders: 60, messages: 70, outboxPublished: 60, rolledBack: 8, forwarded: 70, crashes: 10,
		downstreamExecuted: 60, downstreamDuplicates: 10}
	require.Equal(t, first, sum)
	require.Contains(t, out.String(), "inbox: table "+cfg.tables+"_inbox holds no records from earlier runs\n")
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
	require.Contains(t, out.String(), "note: 120 events (request_shipment: 60, schedule_delivery: 60) were already recorded "+
		"by an earlier run in table "+cfg.tables+"_inbox; they are acknowledged as duplicates (executed=0 is expected). "+
		"Run with -reset to start over.\n")
	require.NotContains(t, out.String(), "left unconsumed", "the first run forwarded its whole outbox")

	out.Reset()
	cfg.brokers, cfg.reset = "", true
	sum, err = run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Equal(t, first, sum, "after -reset every order is requested, forwarded and delivered again, once")
	require.Contains(t, out.String(), "reset: dropped the inbox "+cfg.tables+"_inbox and "+cfg.tables+"_requests, "+
		cfg.tables+"_deliveries, \"watermill_"+cfg.outboxTopic+"\"\n")
	require.Contains(t, out.String(), "holds no records from earlier runs\n")
}

// TestOutboxExampleLeftovers: outbox rows a stopped run never forwarded
// are announced, and the next run's forwarder sends them, its delivery
// consumer recognising them as duplicates.
func TestOutboxExampleLeftovers(t *testing.T) {
	db := testdb.Open(t, testdb.PostgresPGX)
	cfg := config{
		dsn:         testdb.PostgresDSN(),
		ordersTopic: "orders", shipmentsTopic: "shipments",
		outboxTopic: testdb.UniqueName("outbox"),
		tables:      testdb.UniqueName("outbox_ex"),
		events:      10,
	}
	t.Cleanup(func() { dropAll(db, cfg) })
	outbox := wsql.PostgreSQLQueueSchema{}.MessagesTable(cfg.outboxTopic)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	_, err := run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	_, err = db.ExecContext(ctx, `UPDATE `+outbox+` SET acked = false
		WHERE "offset" IN (SELECT "offset" FROM `+outbox+` ORDER BY "offset" LIMIT 2)`)
	require.NoError(t, err)

	out.Reset()
	sum, err := run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Contains(t, out.String(), "note: 2 messages an earlier run left unconsumed in table "+outbox+
		" are delivered in this run too.")
	require.GreaterOrEqual(t, sum.forwarded, 2, "the leftovers are forwarded: %+v", sum)
	require.Zero(t, sum.outboxPublished)
	require.Zero(t, sum.downstreamExecuted, "they were delivered before: %+v", sum)
	require.Equal(t, sum.forwarded, sum.downstreamDuplicates)
	require.Contains(t, out.String(), "deliveries: every order has exactly one\n")
}

// An error names the database it could not reach without its password.
func TestOutboxExampleRedactsPassword(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := cli([]string{"-dsn", "postgres://app:s3cret@127.0.0.1:1/x?sslmode=disable", "-reset"}, &stdout, &stderr)
	require.Equal(t, 1, code, stderr.String())
	require.Contains(t, stderr.String(), "outbox example: PostgreSQL at postgres://app:xxxxx@127.0.0.1:1/x?sslmode=disable: ")
	require.NotContains(t, stdout.String()+stderr.String(), "s3cret")
}

// The deadline grows with -events, and -h says so.
func TestOutboxExampleDeadline(t *testing.T) {
	t.Parallel()
	require.Equal(t, 2*time.Minute, runDeadline.For(60))
	require.Equal(t, 20*time.Minute, runDeadline.For(60_000))
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, cli([]string{"-h"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "the run gives up after 2m0s or 20ms per event, whichever is longer")
	require.Contains(t, stderr.String(), "-reset")
}

// dropAll drops what the runs created: the inbox with every table its
// migrations made, the business tables and the outbox.
func dropAll(db *sql.DB, cfg config) {
	if store, err := inbox.NewStore(db, postgres.Dialect(), inbox.Config{Table: cfg.tables + "_inbox"}); err == nil {
		_ = store.MigrateDown(context.Background(), 0)
	}
	for _, t := range []string{cfg.tables + "_requests", cfg.tables + "_deliveries",
		wsql.PostgreSQLQueueSchema{}.MessagesTable(cfg.outboxTopic)} {
		_, _ = db.Exec("DROP TABLE IF EXISTS " + t)
	}
}
