package kafkaparallel

import (
	"context"
	"fmt"
	"strconv"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Metadata of the messages PublishUndecodable publishes, besides the
// record's headers.
const (
	MetaUnmarshalError = "kafkaparallel_unmarshal_error"
	MetaTopic          = "kafkaparallel_topic"
	MetaPartition      = "kafkaparallel_partition"
	MetaOffset         = "kafkaparallel_offset"
)

// PublishUndecodable returns an UndecodableFunc that publishes each
// record the Unmarshaler refuses to topic through pub, as it came: its
// value as the payload, its headers as metadata, and where it came from
// and why it was refused under the Meta* names. The record counts as
// handled once the publish succeeded; a failed publish is tried again.
func PublishUndecodable(pub message.Publisher, topic string) UndecodableFunc {
	return func(_ context.Context, rec *sarama.ConsumerMessage, uerr error) error {
		msg := message.NewMessage(watermill.NewUUID(), rec.Value)
		for _, h := range rec.Headers {
			if h != nil {
				msg.Metadata.Set(string(h.Key), string(h.Value))
			}
		}
		msg.Metadata.Set(MetaUnmarshalError, uerr.Error())
		msg.Metadata.Set(MetaTopic, rec.Topic)
		msg.Metadata.Set(MetaPartition, strconv.FormatInt(int64(rec.Partition), 10))
		msg.Metadata.Set(MetaOffset, strconv.FormatInt(rec.Offset, 10))
		if err := pub.Publish(topic, msg); err != nil {
			return fmt.Errorf("kafkaparallel: publish undecodable record %s/%d@%d to %s: %w",
				rec.Topic, rec.Partition, rec.Offset, topic, err)
		}
		return nil
	}
}
