package crashrelay_test

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inboxmill/inboxmill/internal/crashrelay"
	"github.com/inboxmill/inboxmill/internal/kafkatest"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// TestMain fails the package's tests when a process or the supervisor
// outlives Close. Sarama's metrics library starts one goroutine for the
// life of the program; the shared test database keeps its opener.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"))
}

// plan is what happens to message n, one crash per attempt; the attempts
// after the plan's end run normally.
func plan(n int) []crashrelay.Crash {
	switch n % 5 {
	case 1:
		return []crashrelay.Crash{crashrelay.BeforePublish}
	case 2:
		return []crashrelay.Crash{crashrelay.AfterPublish}
	case 3:
		return []crashrelay.Crash{crashrelay.AtAckCommit}
	case 4:
		return []crashrelay.Crash{crashrelay.AfterPublish, crashrelay.BeforePublish, crashrelay.AtAckCommit}
	}
	return nil
}

// TestRelay forwards an outbox to Kafka while the plan kills the relay's
// processes: every message reaches Kafka, once more for each crash after
// the Kafka write, and every crash restarts the process.
func TestRelay(t *testing.T) {
	const messages, topic = 20, "forwarded"
	db := testdb.Open(t, testdb.PostgresPGX)
	brokers := kafkatest.Start(t, 2, topic)
	schema := wsql.PostgreSQLQueueSchema{SubscribeBatchSize: 1}
	outboxTopic := testdb.UniqueName("crashrelay")
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + schema.MessagesTable(outboxTopic)) })
	queries, err := schema.SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{Topic: outboxTopic})
	require.NoError(t, err)
	for _, q := range queries {
		_, err := db.Exec(q.Query, q.Args...)
		require.NoError(t, err)
	}
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(db), wsql.PublisherConfig{SchemaAdapter: schema}, nil)
	require.NoError(t, err)
	outbox := forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: outboxTopic})
	wantCopies, wantCrashes := map[string]int{}, 0
	for n := range messages {
		msg := message.NewMessage(fmt.Sprint("msg-", n), nil)
		msg.Metadata.Set("n", strconv.Itoa(n))
		require.NoError(t, outbox.Publish(topic, msg))
		wantCopies[strconv.Itoa(n)] = 1
		for _, c := range plan(n) {
			wantCrashes++
			if c == crashrelay.AfterPublish || c == crashrelay.AtAckCommit {
				wantCopies[strconv.Itoa(n)]++
			}
		}
	}

	var mu sync.Mutex
	attempts, topics := map[string][]int{}, map[string]bool{}
	r, err := crashrelay.Start(db, crashrelay.Config{
		Topic: outboxTopic, Schema: schema, Offsets: wsql.PostgreSQLQueueOffsetsAdapter{},
		Brokers:      brokers,
		PartitionKey: "n",
		SaramaConfig: func() *sarama.Config {
			cfg := kafkatest.Config()
			cfg.Producer.Return.Successes = true
			return cfg
		},
		CrashAt: func(to string, msg *message.Message, attempt int) crashrelay.Crash {
			mu.Lock()
			defer mu.Unlock()
			topics[to] = true
			n := msg.Metadata.Get("n")
			attempts[n] = append(attempts[n], attempt)
			i, _ := strconv.Atoi(n)
			if p := plan(i); attempt < len(p) {
				return p[attempt]
			}
			return crashrelay.None
		},
	})
	require.NoError(t, err)
	t.Cleanup(r.Close)

	deadline := time.Now().Add(time.Minute)
	for {
		var pending int
		err := db.QueryRow("SELECT COUNT(*) FROM " + schema.MessagesTable(outboxTopic) + " WHERE NOT acked").Scan(&pending)
		require.NoError(t, err)
		if pending == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "%d envelopes still unacked", pending)
		time.Sleep(20 * time.Millisecond)
	}
	r.Close()
	r.Close() // a second Close returns at once

	copies := map[string]int{}
	records := kafkatest.ReadAll(t, brokers, topic)
	for _, rec := range records {
		copies[string(rec.Key)]++
	}
	require.Equal(t, wantCopies, copies)
	require.Equal(t, crashrelay.Stats{Writes: len(records), Crashes: wantCrashes, Restarts: wantCrashes}, r.Stats())
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]bool{topic: true}, topics)
	require.Len(t, attempts, messages)
	for n, got := range attempts {
		i, _ := strconv.Atoi(n)
		want := []int{0}
		for a := range plan(i) {
			want = append(want, a+1)
		}
		require.Equal(t, want, got, "attempts to forward message %s", n)
	}
}

func TestStartValidates(t *testing.T) {
	r, err := crashrelay.Start(nil, crashrelay.Config{RetryInterval: -time.Second})
	require.Nil(t, r)
	require.Error(t, err)
	for _, want := range []string{"Topic is required", "Schema is required", "Offsets is required",
		"Brokers is required", "RetryInterval must not be negative"} {
		require.ErrorContains(t, err, want)
	}

	_, err = crashrelay.Start(nil, crashrelay.Config{
		Topic: "outbox", Schema: wsql.DefaultPostgreSQLSchema{}, Offsets: wsql.DefaultPostgreSQLOffsetsAdapter{},
		Brokers: []string{"127.0.0.1:9"},
	})
	require.ErrorContains(t, err, "nil *sql.DB")
}

// TestStartFails returns the first process's error and leaves nothing
// running.
func TestStartFails(t *testing.T) {
	db := testdb.Open(t, testdb.PostgresPGX)
	_, err := crashrelay.Start(db, crashrelay.Config{
		Topic: "outbox", Schema: wsql.DefaultPostgreSQLSchema{}, Offsets: wsql.DefaultPostgreSQLOffsetsAdapter{},
		Brokers: []string{"127.0.0.1:1"}, // nothing listens there
		SaramaConfig: func() *sarama.Config {
			cfg := kafkatest.Config()
			cfg.Producer.Return.Successes = true
			return cfg
		},
	})
	require.ErrorContains(t, err, "cannot create Kafka producer")
}
