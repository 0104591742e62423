// Package amqptests runs the dedup middleware end to end behind
// watermill-amqp's durable queue subscriber, against the RabbitMQ at
// INBOXMILL_AMQP_URI (default amqp://guest:guest@127.0.0.1:5672/) and real
// PostgreSQL and SQLite.
package amqptests

import (
	"context"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	tt "github.com/inboxmill/inboxmill/tests/internal/transporttest"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

func TestMain(m *testing.M) { tt.Main(m, transport{}) }

func amqpURI() string {
	if u := os.Getenv("INBOXMILL_AMQP_URI"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// transport is watermill-amqp's durable queue: one queue per topic, its
// consumers competing for its messages. The queue is the group.
type transport struct{}

func (transport) Name() string { return "amqp" }

// config is what producer and consumers share: a durable queue named after
// the topic, publisher confirms (a producer that retries needs to know
// what the broker took), and a prefetch of a few messages per consumer.
func config() amqp.Config {
	c := amqp.NewDurableQueueConfig(amqpURI())
	c.Publish.ConfirmDelivery = true
	c.Consume.Qos.PrefetchCount = 4
	return c
}

func (transport) Provision(t testing.TB, s tt.Spec) {
	t.Helper()
	u, err := url.Parse(amqpURI())
	require.NoError(t, err)
	tt.Reach(t, "RabbitMQ", u.Host)
	conn, err := amqp091.Dial(amqpURI())
	require.NoError(t, err)
	ch, err := conn.Channel()
	require.NoError(t, err)
	// Declared as the subscriber declares it, before anything is published.
	_, err = ch.QueueDeclare(s.Topic, true, false, false, false, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(s.Topic, false, false, false)
		_ = conn.Close()
	})
}

func (transport) NewPublisher(t testing.TB) message.Publisher {
	t.Helper()
	pub, err := amqp.NewPublisher(config(), watermill.NopLogger{})
	require.NoError(t, err)
	return pub
}

func (transport) NewSubscriber(tt.Spec) (message.Subscriber, error) {
	return amqp.NewSubscriber(config(), watermill.NopLogger{})
}

// Backlog counts the queue's ready messages: AMQP does not tell how many a
// live consumer holds unacked, which the broker requeues when its channel
// closes.
func (transport) Backlog(_ context.Context, s tt.Spec) (int, error) {
	conn, err := amqp091.DialConfig(amqpURI(), amqp091.Config{Dial: amqp091.DefaultDial(5 * time.Second)})
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	q, err := ch.QueueDeclarePassive(s.Topic, true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return q.Messages, nil
}

// TestCrash runs the crash scenario (see transporttest.Crash) on
// PostgreSQL and SQLite, in both modes. RabbitMQ requeues what a consumer
// held unacked as soon as its connection closes, so the redelivery of the
// message a reserve-mode consumer died on meets its live lease first: it is
// nacked until the lease runs out, then taken over.
func TestCrash(t *testing.T) {
	for _, kind := range []testdb.Kind{testdb.PostgresPGX, testdb.SQLite} {
		for _, mode := range []tt.Mode{tt.Transactional, tt.Reserve} {
			t.Run(string(kind)+"/"+string(mode), func(t *testing.T) {
				t.Parallel()
				tt.Crash(t, transport{}, tt.Options{DB: kind, Mode: mode})
			})
		}
	}
}
