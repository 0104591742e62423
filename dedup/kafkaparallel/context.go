package kafkaparallel

import (
	"context"
	"time"

	"github.com/IBM/sarama"
)

type ctxKey struct{}

// withRecord returns ctx carrying rec, for the functions below.
func withRecord(ctx context.Context, rec *sarama.ConsumerMessage) context.Context {
	return context.WithValue(ctx, ctxKey{}, rec)
}

func record(ctx context.Context) *sarama.ConsumerMessage {
	rec, _ := ctx.Value(ctxKey{}).(*sarama.ConsumerMessage)
	return rec
}

// The functions below read the Kafka record a message came from out of
// the message's context, as watermill-kafka's functions of the same names
// do for its subscriber (whose context keys this package cannot set).

// MessagePartitionFromCtx returns the Kafka partition of the consumed
// message.
func MessagePartitionFromCtx(ctx context.Context) (int32, bool) {
	if rec := record(ctx); rec != nil {
		return rec.Partition, true
	}
	return 0, false
}

// MessagePartitionOffsetFromCtx returns the offset of the consumed
// message in its partition.
func MessagePartitionOffsetFromCtx(ctx context.Context) (int64, bool) {
	if rec := record(ctx); rec != nil {
		return rec.Offset, true
	}
	return 0, false
}

// MessageTimestampFromCtx returns the Kafka timestamp of the consumed
// message.
func MessageTimestampFromCtx(ctx context.Context) (time.Time, bool) {
	if rec := record(ctx); rec != nil {
		return rec.Timestamp, true
	}
	return time.Time{}, false
}

// MessageKeyFromCtx returns the Kafka record key of the consumed message.
func MessageKeyFromCtx(ctx context.Context) ([]byte, bool) {
	if rec := record(ctx); rec != nil {
		return rec.Key, true
	}
	return nil, false
}
