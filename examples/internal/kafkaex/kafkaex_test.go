package kafkaex

import (
	"testing"

	"github.com/IBM/sarama"
)

// The examples' guarantees rest on these settings, which come partly from
// watermill-kafka's defaults: a change there (v3.1 stopped setting the
// version) must not change them unnoticed.
func TestConfigs(t *testing.T) {
	sub := SubscriberConfig()
	if sub.Version != Version {
		t.Errorf("subscriber speaks Kafka %v, want %v", sub.Version, Version)
	}
	if sub.Consumer.Offsets.Initial != sarama.OffsetOldest {
		t.Errorf("a new consumer group starts at offset %d, want the oldest (%d): it would skip what came before it",
			sub.Consumer.Offsets.Initial, sarama.OffsetOldest)
	}
	if !sub.Consumer.Offsets.AutoCommit.Enable {
		t.Error("offsets are not auto-committed: watermill-kafka would commit every message, a round trip each")
	}
	if !sub.Consumer.Return.Errors {
		t.Error("consumer errors are not returned: watermill-kafka would not see them")
	}
	if err := sub.Validate(); err != nil {
		t.Errorf("subscriber config: %v", err)
	}

	pub := PublisherConfig()
	if pub.Version != Version {
		t.Errorf("publisher speaks Kafka %v, want %v", pub.Version, Version)
	}
	if !pub.Producer.Return.Successes {
		t.Error("successes are not returned: a sync producer cannot work")
	}
	if err := pub.Validate(); err != nil {
		t.Errorf("publisher config: %v", err)
	}
	if !Version.IsAtLeast(sarama.V0_11_0_0) {
		t.Errorf("Kafka %v has no record headers, which carry the dedup key", Version)
	}
}
