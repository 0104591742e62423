package horizon

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
)

// ConfigDescriber is the part of sarama.ClusterAdmin that [KafkaAdmin]
// uses.
type ConfigDescriber interface {
	DescribeConfig(resource sarama.ConfigResource) ([]sarama.ConfigEntry, error)
}

// The topic configs a Kafka source reads.
var kafkaConfigs = []string{"retention.ms", "retention.bytes", "cleanup.policy", "segment.ms"}

// Kafka returns the Source of a topic, read through the admin API of
// client (DescribeConfigs, which needs the DescribeConfigs ACL on the
// topic). The client is borrowed, not closed.
//
// The horizon is the topic's retention.ms (-1: forever), with segment.ms as
// its Grace. A compacted topic (cleanup.policy compact without delete)
// keeps the latest message of every key forever. retention.bytes only
// shortens a time bound, so it matters only with retention.ms -1: the
// horizon is then unknown (bounded by size).
func Kafka(client sarama.Client, topic string) Source {
	return SourceFunc(func(ctx context.Context) (Horizon, error) {
		// The admin needs the controller, which a client that fetches
		// metadata only for the topics it uses (Metadata.Full false) may
		// not know yet: ask for this topic's metadata then.
		if _, err := client.Controller(); err != nil {
			if err := client.RefreshMetadata(topic); err != nil {
				return Horizon{}, fmt.Errorf("horizon: topic %s: %w", topic, err)
			}
		}
		// An admin made from a client only borrows it; closing the admin
		// would close the caller's client, so it is left to the collector.
		admin, err := sarama.NewClusterAdminFromClient(client)
		if err != nil {
			return Horizon{}, fmt.Errorf("horizon: topic %s: %w", topic, err)
		}
		return KafkaAdmin(admin, topic).Horizon(ctx)
	})
}

// KafkaAdmin is [Kafka] over an admin the caller already has (a
// sarama.ClusterAdmin, or anything with its DescribeConfig).
func KafkaAdmin(admin ConfigDescriber, topic string) Source {
	return SourceFunc(func(ctx context.Context) (Horizon, error) {
		if err := ctx.Err(); err != nil {
			return Horizon{}, err
		}
		entries, err := describe(ctx, admin, sarama.ConfigResource{Type: sarama.TopicResource, Name: topic,
			ConfigNames: kafkaConfigs})
		if err != nil {
			return Horizon{}, fmt.Errorf("horizon: read the configs of topic %s: %w", topic, err)
		}
		return kafkaHorizon(topic, entries)
	})
}

// describe runs DescribeConfig, which takes no context, so that a
// cancelled ctx returns at once (the call itself ends with sarama's
// timeouts).
func describe(ctx context.Context, admin ConfigDescriber, r sarama.ConfigResource) ([]sarama.ConfigEntry, error) {
	type result struct {
		entries []sarama.ConfigEntry
		err     error
	}
	done := make(chan result, 1)
	go func() {
		e, err := admin.DescribeConfig(r)
		done <- result{e, err}
	}()
	select {
	case res := <-done:
		return res.entries, res.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// kafkaHorizon reads the horizon from a topic's configs.
func kafkaHorizon(topic string, entries []sarama.ConfigEntry) (Horizon, error) {
	cfg := map[string]string{}
	for _, e := range entries {
		cfg[e.Name] = e.Value
	}
	h := Horizon{Name: "topic " + topic, Oldest: -1}
	millis := func(name string) (int64, bool, error) {
		v, ok := cfg[name]
		if !ok || v == "" {
			return 0, false, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("horizon: topic %s: %s is %q, not a number", topic, name, v)
		}
		return n, true, nil
	}
	policy := map[string]bool{}
	for _, p := range strings.Split(cfg["cleanup.policy"], ",") {
		policy[strings.TrimSpace(p)] = true
	}
	if policy["compact"] && !policy["delete"] {
		h.Age = Forever
		h.Note = "cleanup.policy=compact: the latest message of every key is kept"
		return h, nil
	}
	ms, ok, err := millis("retention.ms")
	if err != nil {
		return Horizon{}, err
	}
	if !ok {
		return Horizon{}, fmt.Errorf("horizon: topic %s: the broker did not report retention.ms", topic)
	}
	bytes, _, err := millis("retention.bytes")
	if err != nil {
		return Horizon{}, err
	}
	segment, _, err := millis("segment.ms")
	if err != nil {
		return Horizon{}, err
	}
	switch {
	case ms < 0:
		h.Age = Forever
		if bytes > 0 {
			h.BySize = true
			h.Note = fmt.Sprintf("retention.ms=-1, retention.bytes=%d per partition", bytes)
		}
	case ms == 0:
		return Horizon{}, fmt.Errorf("horizon: topic %s: retention.ms is 0", topic)
	default:
		h.Age = time.Duration(ms) * time.Millisecond
	}
	if segment > 0 && h.Age != Forever {
		h.Grace = time.Duration(segment) * time.Millisecond
	}
	return h, nil
}
