package kafkaparallel

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Ordering says which messages of a partition the subscriber keeps in
// offset order: the others run at the same time.
type Ordering int

const (
	// OrderByKey runs the messages of one ordering key (Config.OrderingKey,
	// the Kafka record key by default) one after the other, in offset
	// order, and messages of different keys at the same time. The default.
	OrderByKey Ordering = iota
	// OrderByPartition runs a partition's messages one after the other, as
	// watermill-kafka's subscriber does; partitions run at the same time.
	// The subscriber still reads ahead and commits in the background.
	OrderByPartition
	// OrderNone runs any messages of a partition at the same time, up to
	// the in-flight limits: for handlers whose effects commute.
	OrderNone
)

// String returns the ordering's name, as ParseOrdering takes it: key,
// partition or none.
func (o Ordering) String() string {
	switch o {
	case OrderByKey:
		return "key"
	case OrderByPartition:
		return "partition"
	case OrderNone:
		return "none"
	}
	return fmt.Sprintf("Ordering(%d)", int(o))
}

// ParseOrdering returns the Ordering named key, partition or none.
func ParseOrdering(s string) (Ordering, error) {
	for _, o := range []Ordering{OrderByKey, OrderByPartition, OrderNone} {
		if o.String() == s {
			return o, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown ordering %q (key, partition or none)", ErrInvalidConfig, s)
}

// Defaults of Config.
const (
	DefaultMaxInFlightPerPartition = 32
	DefaultMaxInFlight             = 256
	DefaultCommitInterval          = time.Second
	DefaultDrainTimeout            = 10 * time.Second
	// DefaultWindowFactor times MaxInFlightPerPartition is MaxWindow's
	// default.
	DefaultWindowFactor = 16
)

// ErrInvalidConfig: the subscriber's configuration is unusable.
var ErrInvalidConfig = errors.New("kafkaparallel: invalid config")

// UndecodableFunc is told of a record the Unmarshaler refused, with its
// error. Returning nil takes the record as handled: the partition's
// watermark moves past it. Returning an error keeps it: the call is made
// again after a pause (Config.NackResendSleep of the Kafka settings,
// doubling up to a minute) until it returns nil or the partition is
// revoked. PublishUndecodable publishes such records to a dead-letter
// topic.
type UndecodableFunc func(ctx context.Context, record *sarama.ConsumerMessage, err error) error

// Config is the parallel consumer's own settings; the Kafka side
// (brokers, consumer group, Sarama settings, unmarshaler, nack resend
// sleep, tracer) is watermill-kafka's kafka.SubscriberConfig, passed to
// NewSubscriber beside it.
type Config struct {
	// MaxInFlightPerPartition is the most messages of one partition the
	// subscriber has read and not yet seen acked: running, or waiting in
	// their key's lane behind an earlier message of the same key. Defaults
	// to DefaultMaxInFlightPerPartition (32).
	MaxInFlightPerPartition int

	// MaxInFlight is the most messages in flight over every partition the
	// subscriber consumes. Defaults to DefaultMaxInFlight (256). Memory is
	// bounded by these limits (and Sarama's own read-ahead,
	// Consumer.ChannelBufferSize records a partition), whatever the
	// partitions' backlog.
	MaxInFlight int

	// Ordering says which messages keep their offset order. Defaults to
	// OrderByKey.
	Ordering Ordering

	// OrderingKey returns the key a message is ordered by under
	// OrderByKey: an aggregate's ID, an account, a customer. Messages
	// with the same key run one at a time, in offset order; messages
	// with an empty key share one lane. Order is kept within a partition
	// only: choose a key the producer partitions by (or one that
	// determines the partition key), else two messages of one key on two
	// partitions run in any order. Defaults to nil: the Kafka record key.
	OrderingKey func(msg *message.Message) string

	// CommitInterval is how often the partitions' watermarks (the first
	// offset of each that is not done) are committed to the consumer
	// group; a revoked partition's is committed at once. It replaces the
	// Sarama settings' Consumer.Offsets.AutoCommit. Defaults to
	// DefaultCommitInterval (1 s).
	CommitInterval time.Duration

	// DrainTimeout bounds how long a revoked partition (a rebalance, or
	// Close) waits for its running messages before it commits its
	// watermark and hands the partition over. A message still running
	// then has its context cancelled and is left to the partition's next
	// owner, which receives it again: the inbox's unique constraint (or
	// the lease, in reserve mode) makes sure it has one effect. Must be
	// shorter than the Sarama settings' Consumer.Group.Rebalance.Timeout
	// (60 s by default). Defaults to DefaultDrainTimeout (10 s).
	DrainTimeout time.Duration

	// MaxWindow is the most offsets of a partition read past its
	// watermark, done or not: a message that keeps failing holds the
	// watermark while later messages of other keys complete, and the
	// partition stops reading once this many wait above it. It bounds the
	// memory of the offsets' bookkeeping and how many done messages a crash
	// sends again (each of them a duplicate the inbox acknowledges).
	// Defaults to DefaultWindowFactor (16) × MaxInFlightPerPartition.
	MaxWindow int

	// Undecodable is told of records the Unmarshaler refuses. Defaults to
	// nil: such a record is never delivered and never passed, its error
	// is logged, and its partition's watermark stays below it (the
	// partition goes on with other keys until MaxWindow fills).
	Undecodable UndecodableFunc
}

func (c Config) withDefaults() Config {
	if c.MaxInFlightPerPartition == 0 {
		c.MaxInFlightPerPartition = DefaultMaxInFlightPerPartition
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = DefaultCommitInterval
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.MaxWindow == 0 {
		c.MaxWindow = DefaultWindowFactor * c.MaxInFlightPerPartition
	}
	return c
}

// validate reports every problem of a configuration with defaults
// applied, against the Sarama settings it runs with.
func (c Config) validate(sc *sarama.Config) error {
	var errs []error
	if c.MaxInFlightPerPartition < 1 {
		errs = append(errs, fmt.Errorf("%w: MaxInFlightPerPartition %d is not positive", ErrInvalidConfig, c.MaxInFlightPerPartition))
	}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("%w: MaxInFlight %d is not positive", ErrInvalidConfig, c.MaxInFlight))
	}
	if c.Ordering < OrderByKey || c.Ordering > OrderNone {
		errs = append(errs, fmt.Errorf("%w: unknown Ordering %d", ErrInvalidConfig, int(c.Ordering)))
	}
	if c.OrderingKey != nil && c.Ordering != OrderByKey {
		errs = append(errs, fmt.Errorf("%w: OrderingKey is set but Ordering is %s (it orders by key only)", ErrInvalidConfig, c.Ordering))
	}
	if c.CommitInterval < 0 {
		errs = append(errs, fmt.Errorf("%w: CommitInterval %v is negative", ErrInvalidConfig, c.CommitInterval))
	}
	if c.DrainTimeout < 0 {
		errs = append(errs, fmt.Errorf("%w: DrainTimeout %v is negative", ErrInvalidConfig, c.DrainTimeout))
	}
	if rt := sc.Consumer.Group.Rebalance.Timeout; c.DrainTimeout >= rt {
		errs = append(errs, fmt.Errorf("%w: DrainTimeout %v is not shorter than the Sarama Consumer.Group.Rebalance.Timeout %v: "+
			"the group would remove this member while it drains", ErrInvalidConfig, c.DrainTimeout, rt))
	}
	if c.MaxWindow < c.MaxInFlightPerPartition {
		errs = append(errs, fmt.Errorf("%w: MaxWindow %d is smaller than MaxInFlightPerPartition %d", ErrInvalidConfig, c.MaxWindow, c.MaxInFlightPerPartition))
	}
	return errors.Join(errs...)
}
