package kafkaparallel

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// ErrClosed: Subscribe was called on a closed Subscriber.
var ErrClosed = errors.New("kafkaparallel: subscriber closed")

// Subscriber is a Watermill subscriber for Kafka that runs many messages
// of a partition at the same time (see the package documentation). It is
// safe for concurrent use.
type Subscriber struct {
	kafka  kafka.SubscriberConfig // defaults applied; its Sarama settings are sarama
	sarama *sarama.Config         // a copy, committing every CommitInterval
	cfg    Config
	logger watermill.LoggerAdapter

	tokens chan struct{} // one per message in flight, MaxInFlight in all

	closing   chan struct{}
	closeOnce sync.Once
	mu        sync.Mutex
	closed    bool
	subs      sync.WaitGroup

	n counters
}

// counters are the Stats counts, kept atomically.
type counters struct {
	partitions, inFlight, running                        atomic.Int64
	delivered, acked, nacked, left, undecodable, revoked atomic.Uint64
	committed                                            atomic.Uint64
}

// NewSubscriber returns a subscriber consuming with watermill-kafka's
// settings k (ConsumerGroup is required: the group's committed offsets
// are the watermarks) and the parallel consumer's cfg. Defaults are those
// of watermill-kafka's NewSubscriber: DefaultSaramaSubscriberConfig, a
// DefaultMarshaler, 100 ms before a nacked message is sent again and 1 s
// between reconnections. A nil logger logs nothing.
func NewSubscriber(k kafka.SubscriberConfig, cfg Config, logger watermill.LoggerAdapter) (*Subscriber, error) {
	if k.OverwriteSaramaConfig == nil {
		k.OverwriteSaramaConfig = kafka.DefaultSaramaSubscriberConfig()
	}
	if k.NackResendSleep == 0 {
		k.NackResendSleep = 100 * time.Millisecond
	}
	if k.ReconnectRetrySleep == 0 {
		k.ReconnectRetrySleep = time.Second
	}
	if k.Unmarshaler == nil {
		k.Unmarshaler = kafka.DefaultMarshaler{}
	}
	if k.OTELEnabled && k.Tracer == nil {
		k.Tracer = kafka.NewOTELSaramaTracer()
	}
	cfg = cfg.withDefaults()
	var errs []error
	if len(k.Brokers) == 0 {
		errs = append(errs, fmt.Errorf("%w: no Kafka brokers", ErrInvalidConfig))
	}
	if k.ConsumerGroup == "" {
		errs = append(errs, fmt.Errorf("%w: ConsumerGroup is empty: the group's committed offsets are the watermarks", ErrInvalidConfig))
	}
	if err := cfg.validate(k.OverwriteSaramaConfig); err != nil {
		errs = append(errs, err)
	}
	sc := *k.OverwriteSaramaConfig
	sc.Consumer.Offsets.AutoCommit.Enable = true
	sc.Consumer.Offsets.AutoCommit.Interval = cfg.CommitInterval
	if err := sc.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: Sarama settings: %w", ErrInvalidConfig, err))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Subscriber{
		kafka: k, sarama: &sc, cfg: cfg,
		logger:  logger.With(watermill.LogFields{"subscriber_uuid": watermill.NewShortUUID()}),
		tokens:  make(chan struct{}, cfg.MaxInFlight),
		closing: make(chan struct{}),
	}, nil
}

// Subscribe joins the consumer group for topic and returns the channel
// its messages come on, closed after Close (or once ctx ends) when every
// partition has drained. Messages of a partition come concurrently, up to
// the in-flight limits, in the order Config.Ordering keeps; each must be
// acked or nacked. A nacked message is sent again, in its place in its
// lane, after the Kafka settings' NackResendSleep.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	sub := &subscription{s: s, topic: topic, ctx: ctx, output: make(chan *message.Message),
		log: s.logger.With(watermill.LogFields{"provider": "kafka", "topic": topic, "consumer_group": s.kafka.ConsumerGroup})}
	s.subs.Add(1)
	go sub.run()
	return sub.output, nil
}

// Close stops consuming: every partition stops taking messages, waits up
// to DrainTimeout for those running, commits its watermark and leaves the
// group. It returns once every subscription's channel is closed.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.closeOnce.Do(func() { close(s.closing) })
	s.subs.Wait()
	return nil
}

// SubscribeInitialize creates topic with the Kafka settings'
// InitializeTopicDetails, as watermill-kafka's subscriber does.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	ws, err := kafka.NewSubscriber(s.kafka, s.logger)
	if err != nil {
		return err
	}
	defer ws.Close()
	return ws.SubscribeInitialize(topic)
}

// Stats are a Subscriber's counts.
type Stats struct {
	// Partitions is how many partitions the subscriber consumes now.
	Partitions int
	// InFlight is how many messages it has read and not yet seen acked:
	// running, or waiting in their lane.
	InFlight int
	// Running is how many of them were handed to the router and are not
	// acked or nacked yet.
	Running int
	// Delivered counts the messages handed to the router, a resend after
	// a nack counting again; Acked and Nacked count their outcomes.
	Delivered, Acked, Nacked uint64
	// Left counts the messages a revoked partition left to its next owner
	// without their outcome: still running after DrainTimeout, or not
	// started yet.
	Left uint64
	// Undecodable counts records the Unmarshaler refused.
	Undecodable uint64
	// Revoked counts the partitions this subscriber stopped consuming (a
	// rebalance took them, or Close).
	Revoked uint64
	// Commits counts the watermarks committed when a partition was
	// revoked (the periodic commits are Sarama's).
	Commits uint64
}

// Stats returns the subscriber's counts so far.
func (s *Subscriber) Stats() Stats {
	n := &s.n
	return Stats{
		Partitions: int(n.partitions.Load()), InFlight: int(n.inFlight.Load()), Running: int(n.running.Load()),
		Delivered: n.delivered.Load(), Acked: n.acked.Load(), Nacked: n.nacked.Load(), Left: n.left.Load(),
		Undecodable: n.undecodable.Load(), Revoked: n.revoked.Load(), Commits: n.committed.Load(),
	}
}

// subscription is one Subscribe call: a consumer group member of its own,
// rejoining after errors until the subscriber closes.
type subscription struct {
	s      *Subscriber
	topic  string
	ctx    context.Context
	output chan *message.Message
	log    watermill.LoggerAdapter
	// deliverers counts the goroutines that may still send on output.
	deliverers sync.WaitGroup
}

func (sub *subscription) stopped() bool {
	select {
	case <-sub.s.closing:
		return true
	case <-sub.ctx.Done():
		return true
	default:
		return false
	}
}

func (sub *subscription) run() {
	defer sub.s.subs.Done()
	defer close(sub.output)
	defer sub.deliverers.Wait() // nobody sends on output after it is closed
	for !sub.stopped() {
		if err := sub.consume(); err != nil {
			sub.log.Error("Kafka consumer group failed, reconnecting", err, nil)
		}
		if sub.stopped() {
			return
		}
		if d := sub.s.kafka.ReconnectRetrySleep; d > 0 {
			select {
			case <-time.After(d):
			case <-sub.s.closing:
			case <-sub.ctx.Done():
			}
		}
	}
}

// consume runs one client and consumer group until it fails or the
// subscriber stops.
func (sub *subscription) consume() error {
	s := sub.s
	client, err := sarama.NewClient(s.kafka.Brokers, s.sarama)
	if err != nil {
		return fmt.Errorf("kafkaparallel: connect: %w", err)
	}
	defer client.Close()
	group, err := sarama.NewConsumerGroupFromClient(s.kafka.ConsumerGroup, client)
	if err != nil {
		return fmt.Errorf("kafkaparallel: join consumer group %s: %w", s.kafka.ConsumerGroup, err)
	}
	defer group.Close()

	ctx, cancel := context.WithCancel(sub.ctx)
	defer cancel()
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	errorsDone := make(chan struct{})
	go func() {
		defer close(errorsDone)
		for {
			select {
			case err, ok := <-group.Errors():
				if !ok {
					return
				}
				if err != nil {
					sub.log.Error("Sarama consumer group error", err, nil)
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	defer func() { cancel(); <-errorsDone }()

	var h sarama.ConsumerGroupHandler = groupHandler{sub, group}
	if s.kafka.Tracer != nil {
		h = s.kafka.Tracer.WrapConsumerGroupHandler(h)
	}
	for ctx.Err() == nil {
		if err := group.Consume(ctx, []string{sub.topic}, h); err != nil {
			if errors.Is(err, sarama.ErrClosedConsumerGroup) || ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("kafkaparallel: consume %s: %w", sub.topic, err)
		}
	}
	return nil
}

// groupHandler runs each claimed partition (see partition.go).
type groupHandler struct {
	sub   *subscription
	group sarama.ConsumerGroup
}

func (groupHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (groupHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h groupHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	newPartition(h.sub, h.group, sess, claim).run()
	return nil
}
