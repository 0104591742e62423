package kafkaparallel_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/kafkaparallel"
	"github.com/inboxmill/inboxmill/internal/kafkatest"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

// waitLimit bounds every wait for consumers: generous for -race on two
// loaded cores, never reached when things work.
const waitLimit = 3 * time.Minute

// consumer is one member of a consumer group with its own Sarama client,
// as a process of its own would have, consuming through a router.
type consumer struct {
	t      *testing.T
	name   string
	sub    *kafkaparallel.Subscriber
	router *message.Router
	dialer *kafkatest.KillableDialer
	done   chan error
}

// consumerOpts configure startConsumer.
type consumerOpts struct {
	group string
	cfg   kafkaparallel.Config
	// middlewares are added to the router in order (the first outermost).
	middlewares []message.HandlerMiddleware
	publisher   message.Publisher
	// cooperative rebalances with the cooperative-sticky strategy
	// instead of Sarama's default (range, eager).
	cooperative bool
}

// startConsumer starts a router consuming topic with a parallel
// subscriber and h, and waits until it runs.
func startConsumer(t *testing.T, brokers []string, topic, name string, o consumerOpts, h message.HandlerFunc) *consumer {
	t.Helper()
	return startConsumerWith(t, brokers, topic, name, o, nil, h)
}

// startConsumerWith is startConsumer with an Unmarshaler (nil: the
// default).
func startConsumerWith(t *testing.T, brokers []string, topic, name string, o consumerOpts, u kafka.Unmarshaler,
	h message.HandlerFunc) *consumer {
	t.Helper()
	c := &consumer{t: t, name: name, dialer: &kafkatest.KillableDialer{}, done: make(chan error, 1)}
	sc := kafkatest.ConfigWith(c.dialer)
	sc.ClientID = name
	if o.cooperative {
		sc.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyCooperativeSticky()}
	}
	if o.cfg.CommitInterval == 0 {
		o.cfg.CommitInterval = 100 * time.Millisecond
	}
	sub, err := kafkaparallel.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               brokers,
		ConsumerGroup:         o.group,
		Unmarshaler:           u,
		OverwriteSaramaConfig: sc,
		NackResendSleep:       10 * time.Millisecond,
		ReconnectRetrySleep:   100 * time.Millisecond,
	}, o.cfg, testLogger(t))
	require.NoError(t, err)
	c.sub = sub
	c.router, err = message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	c.router.AddMiddleware(o.middlewares...)
	if o.publisher != nil {
		c.router.AddHandler(handlerName, topic, sub, topic+".out", o.publisher, h)
	} else {
		c.router.AddConsumerHandler(handlerName, topic, sub, func(msg *message.Message) error {
			_, err := h(msg)
			return err
		})
	}
	go func() { c.done <- c.router.Run(context.Background()) }()
	select {
	case <-c.router.Running():
	case err := <-c.done:
		t.Fatalf("%s: router: %v", name, err)
	}
	t.Cleanup(c.stop)
	return c
}

// stop closes the consumer cleanly (it drains and commits); a second call
// does nothing.
func (c *consumer) stop() {
	if c.router.IsClosed() {
		return
	}
	require.NoError(c.t, c.router.Close())
	select {
	case err := <-c.done:
		require.NoError(c.t, err)
	case <-time.After(waitLimit):
		c.t.Fatalf("%s: router did not stop", c.name)
	}
}

// crash cuts the consumer's Kafka connections, so nothing it has not
// committed yet reaches the broker, then stops it.
func (c *consumer) crash() {
	c.dialer.Kill()
	c.stop()
}

const handlerName = "apply"

// tracker records, per ordering key, the sequence numbers handled and
// complains about any that comes out of order; and the peak of messages
// running at once.
type tracker struct {
	mu       sync.Mutex
	last     map[string]int
	bad      []string
	running  atomic.Int64
	peak     atomic.Int64
	handled  atomic.Int64
	attempts atomic.Int64
}

func newTracker() *tracker { return &tracker{last: map[string]int{}} }

// enter and exit bracket a handler's run.
func (tr *tracker) enter() {
	n := tr.running.Add(1)
	for {
		p := tr.peak.Load()
		if n <= p || tr.peak.CompareAndSwap(p, n) {
			break
		}
	}
	tr.attempts.Add(1)
}

func (tr *tracker) exit() { tr.running.Add(-1) }

// done records that key's message seq took effect; it must follow seq-1.
func (tr *tracker) done(key string, seq int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if prev, ok := tr.last[key]; (ok && seq != prev+1 || !ok && seq != 0) && len(tr.bad) < 20 {
		tr.bad = append(tr.bad, fmt.Sprintf("key %s: %d after %d", key, seq, tr.last[key]))
	}
	tr.last[key] = seq
	tr.handled.Add(1)
}

func (tr *tracker) violations() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.bad...)
}

func waitFor(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	testkit.WaitFor(t, waitLimit, what, cond)
}

// poisonQueue returns the router middleware that publishes what the
// dedup middleware refuses for good (dedup.IsPoison) to topic and acks it.
func poisonQueue(t *testing.T, brokers []string, topic string) message.HandlerMiddleware {
	t.Helper()
	pc := kafka.DefaultSaramaSyncPublisherConfig()
	pc.Version = kafkatest.Version
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Marshaler: kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: pc}, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	mw, err := middleware.PoisonQueueWithFilter(pub, topic, dedup.IsPoison)
	require.NoError(t, err)
	return mw
}

// watermillMessage is rec as watermill-kafka's DefaultMarshaler reads it.
func watermillMessage(t *testing.T, rec *sarama.ConsumerMessage) *message.Message {
	t.Helper()
	msg, err := kafka.DefaultMarshaler{}.Unmarshal(rec)
	require.NoError(t, err)
	return msg
}

func testLogger(t *testing.T) watermill.LoggerAdapter {
	if testing.Verbose() {
		return watermill.NewStdLogger(true, false)
	}
	return watermill.NopLogger{}
}
