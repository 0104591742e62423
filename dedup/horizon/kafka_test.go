package horizon_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup/horizon"
	"github.com/inboxmill/inboxmill/internal/kafkatest"
)

// fakeAdmin answers DescribeConfig with fixed entries and records what
// was asked.
type fakeAdmin struct {
	entries map[string]string
	err     error
	asked   []sarama.ConfigResource
	block   chan struct{}
}

func (f *fakeAdmin) DescribeConfig(r sarama.ConfigResource) ([]sarama.ConfigEntry, error) {
	f.asked = append(f.asked, r)
	if f.block != nil {
		<-f.block
	}
	var out []sarama.ConfigEntry
	for k, v := range f.entries {
		out = append(out, sarama.ConfigEntry{Name: k, Value: v})
	}
	return out, f.err
}

// TestKafkaConfigs reads each combination of the topic configs that
// decides the horizon.
func TestKafkaConfigs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries map[string]string
		want    horizon.Horizon
		err     string
	}{
		{"time bound", map[string]string{"retention.ms": "2592000000", "retention.bytes": "-1", "cleanup.policy": "delete",
			"segment.ms": "604800000"},
			horizon.Horizon{Name: "topic orders", Age: 30 * day, Grace: 7 * day, Oldest: -1}, ""},
		{"size does not shorten the promise of time", map[string]string{"retention.ms": "86400000", "retention.bytes": "1073741824"},
			horizon.Horizon{Name: "topic orders", Age: day, Oldest: -1}, ""},
		{"forever", map[string]string{"retention.ms": "-1", "retention.bytes": "-1", "segment.ms": "604800000"},
			horizon.Horizon{Name: "topic orders", Age: horizon.Forever, Oldest: -1}, ""},
		{"size only", map[string]string{"retention.ms": "-1", "retention.bytes": "1000"},
			horizon.Horizon{Name: "topic orders", Age: horizon.Forever, BySize: true, Oldest: -1,
				Note: "retention.ms=-1, retention.bytes=1000 per partition"}, ""},
		{"compacted", map[string]string{"retention.ms": "1000", "cleanup.policy": "compact"},
			horizon.Horizon{Name: "topic orders", Age: horizon.Forever, Oldest: -1,
				Note: "cleanup.policy=compact: the latest message of every key is kept"}, ""},
		{"compacted and deleted", map[string]string{"retention.ms": "3600000", "cleanup.policy": "compact, delete"},
			horizon.Horizon{Name: "topic orders", Age: time.Hour, Oldest: -1}, ""},
		{"not reported", map[string]string{"retention.bytes": "-1"}, horizon.Horizon{}, "did not report retention.ms"},
		{"garbage", map[string]string{"retention.ms": "a week"}, horizon.Horizon{}, `retention.ms is "a week", not a number`},
		{"zero", map[string]string{"retention.ms": "0"}, horizon.Horizon{}, "retention.ms is 0"},
		{"garbage size", map[string]string{"retention.ms": "-1", "retention.bytes": "x"}, horizon.Horizon{}, "retention.bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			admin := &fakeAdmin{entries: tc.entries}
			h, err := horizon.KafkaAdmin(admin, "orders").Horizon(context.Background())
			require.Len(t, admin.asked, 1)
			require.Equal(t, sarama.TopicResource, admin.asked[0].Type)
			require.Equal(t, "orders", admin.asked[0].Name)
			require.ElementsMatch(t, []string{"retention.ms", "retention.bytes", "cleanup.policy", "segment.ms"},
				admin.asked[0].ConfigNames)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, h)
		})
	}
}

func TestKafkaAdminErrors(t *testing.T) {
	denied := errors.New("cluster authorization failed")
	_, err := horizon.KafkaAdmin(&fakeAdmin{err: denied}, "orders").Horizon(context.Background())
	require.ErrorIs(t, err, denied)
	require.ErrorContains(t, err, "topic orders")

	// A cancelled context returns at once, even while the admin call hangs.
	admin := &fakeAdmin{block: make(chan struct{})}
	defer close(admin.block)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = horizon.KafkaAdmin(admin, "orders").Horizon(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	_, err = horizon.KafkaAdmin(&fakeAdmin{}, "orders").Horizon(ctx)
	require.ErrorIs(t, err, context.Canceled)
}

// TestKafkaBroker reads the configs from the in-process broker over the
// Kafka protocol: a topic left at the defaults, topics created with
// configs of their own, and one that does not exist.
func TestKafkaBroker(t *testing.T) {
	brokers := kafkatest.Start(t, 1, "seeded")
	// A client that fetches metadata only for the topics it uses, as
	// consumers are often configured, knows no controller at first.
	cfg := kafkatest.Config()
	cfg.Metadata.Full = false
	client, err := sarama.NewClient(brokers, cfg)
	require.NoError(t, err)
	defer client.Close()
	full, err := sarama.NewClient(brokers, kafkatest.Config())
	require.NoError(t, err)
	admin, err := sarama.NewClusterAdminFromClient(full)
	require.NoError(t, err)
	defer admin.Close()
	create := func(name string, configs map[string]string) {
		t.Helper()
		entries := map[string]*string{}
		for k, v := range configs {
			entries[k] = &v
		}
		require.NoError(t, admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1,
			ConfigEntries: entries}, false))
	}
	create("orders", map[string]string{"retention.ms": "2592000000"})
	create("forever", map[string]string{"retention.ms": "-1"})
	create("sized", map[string]string{"retention.ms": "-1", "retention.bytes": "1048576"})
	create("compacted", map[string]string{"cleanup.policy": "compact"})
	ctx := context.Background()

	// The broker's defaults: 7 days, segments rolled every 7 days.
	h, err := horizon.Kafka(client, "seeded").Horizon(ctx)
	require.NoError(t, err)
	require.Equal(t, horizon.Horizon{Name: "topic seeded", Age: 7 * day, Grace: 7 * day, Oldest: -1}, h)

	rep, err := horizon.Check(ctx, horizon.Kafka(client, "orders"), 7*day)
	require.NoError(t, err)
	require.False(t, rep.Safe)
	require.Equal(t, "the inbox keeps records for 7d but topic orders keeps messages for 30d: messages older than 7d would run again",
		rep.Message)
	_, err = horizon.Require(ctx, horizon.Kafka(client, "orders"), 30*day)
	require.NoError(t, err)

	h, err = horizon.Kafka(client, "forever").Horizon(ctx)
	require.NoError(t, err)
	require.Equal(t, horizon.Forever, h.Age)
	require.False(t, h.Unknown())

	_, err = horizon.Require(ctx, horizon.Kafka(client, "sized"), 30*day)
	require.ErrorIs(t, err, horizon.ErrHorizonUnknown)

	h, err = horizon.Kafka(client, "compacted").Horizon(ctx)
	require.NoError(t, err)
	require.Equal(t, horizon.Forever, h.Age)
	require.Contains(t, h.Note, "compact")

	_, err = horizon.Kafka(client, "missing").Horizon(ctx)
	require.ErrorContains(t, err, "topic missing")

	// The source borrows the client: it still works.
	_, err = client.Partitions("seeded")
	require.NoError(t, err)
}
