package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// kafkaConn is the driver's own Kafka client: it produces the stream,
// watches the groups' committed offsets and reads the poison topic.
type kafkaConn struct {
	client   sarama.Client
	admin    sarama.ClusterAdmin
	producer sarama.SyncProducer
}

func dialKafka(brokers []string, clientID string) (*kafkaConn, error) {
	cfg := wire.SaramaConfig(clientID)
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	// One request in flight: a retried batch can then never overtake the
	// next, and a conflicting payload never lands before its original.
	cfg.Net.MaxOpenRequests = 1
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	k := &kafkaConn{client: client}
	if k.producer, err = sarama.NewSyncProducerFromClient(client); err != nil {
		client.Close()
		return nil, fmt.Errorf("kafka producer: %w", err)
	}
	if k.admin, err = sarama.NewClusterAdminFromClient(client); err != nil {
		k.producer.Close()
		client.Close()
		return nil, fmt.Errorf("kafka admin: %w", err)
	}
	return k, nil
}

// dialKafkaRetrying is dialKafka, tried again for up to patience while
// no broker answers: another mode may have restarted the broker (a
// planned fault) while this one was still setting up, and under load
// setups and restarts overlap.
func dialKafkaRetrying(ctx context.Context, brokers []string, clientID string, patience time.Duration) (*kafkaConn, error) {
	deadline := time.Now().Add(patience)
	for {
		k, err := dialKafka(brokers, clientID)
		if err == nil || !errors.Is(err, sarama.ErrOutOfBrokers) || time.Now().After(deadline) {
			return k, err
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(err, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (k *kafkaConn) close() {
	_ = k.producer.Close()
	_ = k.admin.Close() // closes the client too
}

// produce writes msgs to topic in order, as a producer outside Watermill
// does: headers, a JSON payload, no Watermill UUID. It returns how many
// messages were written (whole batches) before an error.
func (k *kafkaConn) produce(topic string, msgs []streamMsg) (int, error) {
	const batch = 500
	for start := 0; start < len(msgs); start += batch {
		out := make([]*sarama.ProducerMessage, 0, batch)
		for _, m := range msgs[start:min(start+batch, len(msgs))] {
			pm := &sarama.ProducerMessage{
				Topic: topic, Partition: m.partition, Value: sarama.ByteEncoder(m.payload()),
				Headers: []sarama.RecordHeader{
					{Key: []byte(wire.MetaEventID), Value: []byte(m.ev.id)},
					{Key: []byte(wire.MetaTenant), Value: []byte(m.ev.tenant)},
				},
			}
			if k := m.key(); k != nil {
				pm.Key = sarama.ByteEncoder(k)
			}
			out = append(out, pm)
		}
		if err := k.producer.SendMessages(out); err != nil {
			return start, fmt.Errorf("produce to %s: %w", topic, err)
		}
	}
	return len(msgs), nil
}

// consumed reports whether group has committed the high-water mark of
// every partition of topic, and how many messages it has yet to commit.
func (k *kafkaConn) consumed(group, topic string) (bool, int64, error) {
	partitions, err := k.client.Partitions(topic)
	if err != nil {
		return false, 0, err
	}
	committed, err := k.admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: partitions})
	if errors.Is(err, sarama.ErrGroupIDNotFound) {
		committed, err = nil, nil // kfake's answer for a group that has not joined yet
	}
	if err != nil {
		return false, 0, err
	}
	var behind int64
	for _, p := range partitions {
		end, err := k.client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return false, 0, err
		}
		var b *sarama.OffsetFetchResponseBlock
		if committed != nil {
			b = committed.GetBlock(topic, p)
		}
		switch {
		case committed == nil:
			behind += end
		case b == nil:
			return false, 0, fmt.Errorf("no committed offset block for %s/%d", topic, p)
		case b.Err != sarama.ErrNoError:
			return false, 0, b.Err
		case b.Offset < 0:
			behind += end // nothing committed yet
		case b.Offset < end:
			behind += end - b.Offset
		}
	}
	return behind == 0, behind, nil
}

// readAll returns every record of topic from the oldest offset to the
// high-water mark at the time of the call.
func (k *kafkaConn) readAll(ctx context.Context, topic string) ([]*sarama.ConsumerMessage, error) {
	var out []*sarama.ConsumerMessage
	err := k.scan(ctx, topic, func(m *sarama.ConsumerMessage) { out = append(out, m) })
	return out, err
}

// scan calls fn with every record of topic from the oldest offset to the
// high-water mark at the time of the call: one partition after the other,
// each in offset order, so a long topic is not held in memory.
func (k *kafkaConn) scan(ctx context.Context, topic string, fn func(*sarama.ConsumerMessage)) error {
	consumer, err := sarama.NewConsumerFromClient(k.client)
	if err != nil {
		return err
	}
	defer consumer.Close()
	partitions, err := k.client.Partitions(topic)
	if err != nil {
		return err
	}
	for _, p := range partitions {
		oldest, err1 := k.client.GetOffset(topic, p, sarama.OffsetOldest)
		end, err2 := k.client.GetOffset(topic, p, sarama.OffsetNewest)
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		if oldest >= end {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p, oldest)
		if err != nil {
			return err
		}
		timeout := time.NewTimer(time.Minute)
		for done := false; !done; {
			select {
			case m := <-pc.Messages():
				fn(m)
				done = m.Offset+1 >= end
			case err := <-pc.Errors():
				_ = pc.Close()
				return fmt.Errorf("read %s/%d: %w", topic, p, err)
			case <-timeout.C:
				_ = pc.Close()
				return fmt.Errorf("read %s/%d: offset %d not reached after a minute", topic, p, end)
			case <-ctx.Done():
				_ = pc.Close()
				return ctx.Err()
			}
		}
		timeout.Stop()
		_ = pc.Close()
	}
	return nil
}

func header(m *sarama.ConsumerMessage, key string) string {
	for _, h := range m.Headers {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}

// lag describes, for a failure message, where group stands on topic: each
// partition with messages not committed (committed offset and high-water
// mark), and each member with the partitions the group assigned it.
func (k *kafkaConn) lag(group, topic string) string {
	var b strings.Builder
	partitions, err := k.client.Partitions(topic)
	if err != nil {
		return fmt.Sprintf("partitions of %s: %v", topic, err)
	}
	committed, err := k.admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: partitions})
	if err != nil {
		fmt.Fprintf(&b, "offsets of %s: %v; ", group, err)
	}
	var behind []string
	for _, p := range partitions {
		end, err := k.client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			behind = append(behind, fmt.Sprintf("%d: %v", p, err))
			continue
		}
		off := int64(-1)
		if committed != nil {
			if blk := committed.GetBlock(topic, p); blk != nil {
				off = blk.Offset
			}
		}
		if off < end {
			behind = append(behind, fmt.Sprintf("%d: %d/%d", p, off, end))
		}
	}
	fmt.Fprintf(&b, "group %s behind on partitions [%s]", group, strings.Join(behind, " "))
	desc, err := k.admin.DescribeConsumerGroups([]string{group})
	if err != nil || len(desc) == 0 {
		fmt.Fprintf(&b, "; describe: %v", err)
		return b.String()
	}
	d := desc[0]
	fmt.Fprintf(&b, "; state %s, %d members", d.State, len(d.Members))
	ids := make([]string, 0, len(d.Members))
	for id := range d.Members {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		m := d.Members[id]
		var parts []int32
		if a, err := m.GetMemberAssignment(); err == nil && a != nil {
			parts = a.Topics[topic]
		}
		slices.Sort(parts)
		fmt.Fprintf(&b, "; %s (%s) %v", id, m.ClientId, parts)
	}
	return b.String()
}
