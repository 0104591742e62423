// Package kafkaex connects the Kafka examples to a broker: an in-process
// Kafka-protocol broker (franz-go's kfake) on 127.0.0.1 by default, or a
// real cluster, with the Sarama settings watermill-kafka needs for it.
package kafkaex

import (
	"errors"
	"fmt"
	"strings"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Connect returns the brokers to use and a function that stops what it
// started. With brokers empty it starts an embedded broker on loopback with
// the topics; otherwise it uses the comma-separated cluster and creates the
// topics there if they are missing.
func Connect(brokers string, partitions int32, topics ...string) ([]string, func(), error) {
	if brokers == "" {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics...))
		if err != nil {
			return nil, nil, err
		}
		return cluster.ListenAddrs(), cluster.Close, nil
	}
	var addrs []string
	for _, b := range strings.Split(brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			addrs = append(addrs, b)
		}
	}
	admin, err := sarama.NewClusterAdmin(addrs, SubscriberConfig())
	if err != nil {
		return nil, nil, fmt.Errorf("kafka at %v: %w", addrs, err)
	}
	defer admin.Close()
	for _, topic := range topics {
		err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false)
		if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return nil, nil, fmt.Errorf("create topic %s: %w", topic, err)
		}
	}
	return addrs, func() {}, nil
}

// Version is the Kafka protocol version the examples speak: Kafka 2.8,
// which every broker since accepts, 4.x included. watermill-kafka's default
// configs set none since v3.1 (they forced 1.0 before) and so speak
// Sarama's DefaultVersion, which moves with Sarama releases; pinned here,
// an upgrade of Sarama does not change what the examples send. The dedup
// key travels in a record header, which needs 0.11 or later.
var Version = sarama.V2_8_0_0

// SubscriberConfig is watermill-kafka's default with two changes: Version,
// and a new consumer group starting from the oldest offset — from the
// newest, Sarama's default, it would miss what was published before it
// joined. Offsets stay auto-committed (every second): a duplicate after a
// crash is the inbox's job, and committing every message would cost a
// round trip each.
func SubscriberConfig() *sarama.Config {
	c := kafka.DefaultSaramaSubscriberConfig()
	c.Version = Version
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	return c
}

// PublisherConfig is watermill-kafka's default with Version.
func PublisherConfig() *sarama.Config {
	c := kafka.DefaultSaramaSyncPublisherConfig()
	c.Version = Version
	return c
}
