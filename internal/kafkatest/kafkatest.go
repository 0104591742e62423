// Package kafkatest runs the tests' Kafka: an in-process Kafka-protocol broker
// (github.com/twmb/franz-go/pkg/kfake) listening on 127.0.0.1, reached over
// TCP by the same Sarama client watermill-kafka uses in production.
package kafkatest

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Version is the Kafka protocol version the tests speak; kfake and every
// broker since Kafka 2.8, 4.x included, accept it.
var Version = sarama.V2_8_0_0

// Start starts a one-broker kfake cluster on 127.0.0.1 with each topic
// created with the given number of partitions, and closes it when the test
// ends. It returns the broker addresses.
func Start(t testing.TB, partitions int32, topics ...string) []string {
	t.Helper()
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(partitions, topics...),
		// Lets Config's short sessions through: a member that died is then
		// evicted, and its partitions reassigned, within seconds.
		kfake.GroupMinSessionTimeout(500*time.Millisecond),
	)
	if err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// Config returns the Sarama configuration the tests consume and produce
// with: Version, a new consumer group starting at the oldest offset (the
// default, the newest, would skip what was published before the group
// joined), offsets auto-committed every second (a commit per message would
// cap throughput at a few hundred messages a second), and a three-second
// session so that a consumer that dies is replaced quickly.
func Config() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.Version = Version
	cfg.ClientID = "inboxmill-test"
	cfg.Consumer.Return.Errors = true
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.AutoCommit.Enable = true
	cfg.Consumer.Offsets.AutoCommit.Interval = time.Second
	cfg.Consumer.Group.Session.Timeout = 3 * time.Second
	cfg.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
	cfg.Metadata.Retry.Backoff = 100 * time.Millisecond
	cfg.Net.DialTimeout = 5 * time.Second
	return cfg
}

// Record is a message as a producer outside Watermill writes it: headers,
// payload, no Watermill UUID.
type Record struct {
	// Partition is where the record goes.
	Partition int32
	// Key is the record key; nil sends none.
	Key []byte
	// Headers become the Watermill message's metadata.
	Headers map[string]string
	// Value is the payload.
	Value []byte
	// Timestamp is the record's create time; zero means now.
	Timestamp time.Time
}

// Produce writes records to topic in order, in batches, and fails the test
// if any is not acknowledged.
func Produce(t testing.TB, brokers []string, topic string, records []Record) {
	t.Helper()
	cfg := Config()
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	p, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		t.Fatalf("kafka producer: %v", err)
	}
	defer p.Close()
	const batch = 500
	for start := 0; start < len(records); start += batch {
		msgs := make([]*sarama.ProducerMessage, 0, batch)
		for _, r := range records[start:min(start+batch, len(records))] {
			m := &sarama.ProducerMessage{Topic: topic, Partition: r.Partition, Value: sarama.ByteEncoder(r.Value),
				Timestamp: r.Timestamp}
			if r.Key != nil {
				m.Key = sarama.ByteEncoder(r.Key)
			}
			keys := make([]string, 0, len(r.Headers))
			for k := range r.Headers {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(k), Value: []byte(r.Headers[k])})
			}
			msgs = append(msgs, m)
		}
		if err := p.SendMessages(msgs); err != nil {
			t.Fatalf("produce to %s: %v", topic, err)
		}
	}
}

// ReadAll returns every record of topic, partition by partition, from the
// oldest offset up to the high-water mark at the time of the call.
func ReadAll(t testing.TB, brokers []string, topic string) []*sarama.ConsumerMessage {
	t.Helper()
	client, err := sarama.NewClient(brokers, Config())
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatalf("kafka consumer: %v", err)
	}
	defer consumer.Close()
	partitions, err := client.Partitions(topic)
	if err != nil {
		t.Fatalf("partitions of %s: %v", topic, err)
	}
	var out []*sarama.ConsumerMessage
	for _, p := range partitions {
		oldest, err1 := client.GetOffset(topic, p, sarama.OffsetOldest)
		end, err2 := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err := errors.Join(err1, err2); err != nil {
			t.Fatalf("offsets of %s/%d: %v", topic, p, err)
		}
		if oldest >= end {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p, oldest)
		if err != nil {
			t.Fatalf("consume %s/%d: %v", topic, p, err)
		}
		timeout := time.NewTimer(time.Minute)
		for done := false; !done; {
			select {
			case m := <-pc.Messages():
				out = append(out, m)
				done = m.Offset+1 >= end
			case err := <-pc.Errors():
				t.Fatalf("read %s/%d: %v", topic, p, err)
			case <-timeout.C:
				t.Fatalf("read %s/%d: no record up to offset %d after a minute", topic, p, end)
			}
		}
		timeout.Stop()
		_ = pc.Close()
	}
	return out
}

// Consumed reports whether group has committed the high-water mark of
// every partition of topic: everything published has been consumed, and
// acked, by the group.
func Consumed(brokers []string, group, topic string) (bool, error) {
	client, err := sarama.NewClient(brokers, Config())
	if err != nil {
		return false, err
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return false, err
	}
	partitions, err := client.Partitions(topic)
	if err != nil {
		return false, err
	}
	committed, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: partitions})
	if err != nil {
		return false, err
	}
	for _, p := range partitions {
		end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return false, err
		}
		b := committed.GetBlock(topic, p)
		if b == nil {
			return false, fmt.Errorf("no committed offset block for %s/%d", topic, p)
		}
		if b.Err != sarama.ErrNoError {
			return false, b.Err
		}
		if b.Offset < end {
			return false, nil
		}
	}
	return true, nil
}

// Committed returns the offsets group has committed for the partitions of
// topic (-1 where it has committed none).
func Committed(brokers []string, group, topic string) (map[int32]int64, error) {
	client, err := sarama.NewClient(brokers, Config())
	if err != nil {
		return nil, err
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return nil, err
	}
	partitions, err := client.Partitions(topic)
	if err != nil {
		return nil, err
	}
	res, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: partitions})
	if err != nil {
		return nil, err
	}
	out := make(map[int32]int64, len(partitions))
	for _, p := range partitions {
		b := res.GetBlock(topic, p)
		if b == nil {
			return nil, fmt.Errorf("no committed offset block for %s/%d", topic, p)
		}
		if b.Err != sarama.ErrNoError {
			return nil, b.Err
		}
		out[p] = b.Offset
	}
	return out, nil
}

// KillableDialer dials the broker for a Sarama client (Net.Proxy.Dialer)
// and can cut every connection it made at once, as the death of the
// consumer's process would: nothing the client had not sent yet — an
// offset commit, a leave — reaches the broker.
type KillableDialer struct {
	mu    sync.Mutex
	dead  bool
	conns []net.Conn
}

// Dial dials addr, or fails once the dialer is killed.
func (k *KillableDialer) Dial(network, addr string) (net.Conn, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.dead {
		return nil, errors.New("the consumer is dead")
	}
	conn, err := (&net.Dialer{Timeout: 5 * time.Second}).Dial(network, addr)
	if err == nil {
		k.conns = append(k.conns, conn)
	}
	return conn, err
}

// Kill closes every connection and refuses new ones.
func (k *KillableDialer) Kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dead = true
	for _, c := range k.conns {
		_ = c.Close()
	}
}

// ConfigWith returns Config dialing through d.
func ConfigWith(d *KillableDialer) *sarama.Config {
	cfg := Config()
	cfg.Net.Proxy.Enable = true
	cfg.Net.Proxy.Dialer = d
	return cfg
}
