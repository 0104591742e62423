package kafkaparallel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inboxmill/inboxmill/dedup/kafkaparallel"
	"github.com/inboxmill/inboxmill/internal/kafkatest"
)

// picky refuses the records whose value is "garbage".
type picky struct{ kafka.DefaultMarshaler }

var errGarbage = errors.New("not an event")

func (p picky) Unmarshal(rec *sarama.ConsumerMessage) (*message.Message, error) {
	if string(rec.Value) == "garbage" {
		return nil, errGarbage
	}
	return p.DefaultMarshaler.Unmarshal(rec)
}

// TestUndecodable: a record the Unmarshaler refuses is never delivered.
// Without Config.Undecodable it holds its partition's committed offset
// while the other keys go on; with PublishUndecodable it reaches the
// dead-letter topic as it came, and the offset moves past it.
func TestUndecodable(t *testing.T) {
	t.Parallel()
	for _, hooked := range []bool{false, true} {
		name := "held"
		if hooked {
			name = "published"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			brokers := kafkatest.Start(t, 1, "u")
			records := seqStream(8, 3, 10, 1)
			bad := kafkatest.Record{Key: []byte("key-x"), Value: []byte("garbage"), Headers: map[string]string{"trace": "t1"}}
			records = append(records[:10], append([]kafkatest.Record{bad}, records[10:]...)...)
			kafkatest.Produce(t, brokers, "u", records)

			dead := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 10}, watermill.NopLogger{})
			t.Cleanup(func() { _ = dead.Close() })
			letters, err := dead.Subscribe(context.Background(), "dead")
			require.NoError(t, err)
			cfg := kafkaparallel.Config{}
			if hooked {
				cfg.Undecodable = kafkaparallel.PublishUndecodable(dead, "dead")
			}
			tr := newTracker()
			c := startConsumerWith(t, brokers, "u", "c", consumerOpts{group: "g", cfg: cfg}, picky{},
				func(msg *message.Message) ([]*message.Message, error) {
					tr.handled.Add(1)
					return nil, nil
				})
			waitFor(t, "every decodable message handled", func() (bool, error) { return tr.handled.Load() == 30, nil })
			if !hooked {
				waitFor(t, "the offset of the record before it committed", func() (bool, error) {
					committed, err := kafkatest.Committed(brokers, "g", "u")
					if err == nil && committed[0] > 10 {
						t.Fatalf("committed offset %d, past the record nobody took at 10", committed[0])
					}
					return err == nil && committed[0] == 10, err
				})
				time.Sleep(500 * time.Millisecond) // five commit intervals more
				committed, err := kafkatest.Committed(brokers, "g", "u")
				require.NoError(t, err)
				require.Equal(t, int64(10), committed[0], "the offset moved past a record nobody took")
				require.Equal(t, uint64(1), c.sub.Stats().Undecodable)
				return
			}
			select {
			case m := <-letters:
				require.Equal(t, "garbage", string(m.Payload))
				require.Equal(t, "10", m.Metadata.Get(kafkaparallel.MetaOffset))
				require.Equal(t, "t1", m.Metadata.Get("trace"))
				require.Equal(t, errGarbage.Error(), m.Metadata.Get(kafkaparallel.MetaUnmarshalError))
				m.Ack()
			case <-time.After(waitLimit):
				t.Fatal("the undecodable record never reached the dead-letter topic")
			}
			waitFor(t, "everything consumed", func() (bool, error) { return kafkatest.Consumed(brokers, "g", "u") })
		})
	}
}

// TestCloseLeavesNothingRunning: after Close, no goroutine of the
// subscriber is left, even with messages running when it closed.
func TestCloseLeavesNothingRunning(t *testing.T) {
	brokers := kafkatest.Start(t, 2, "leak")
	kafkatest.Produce(t, brokers, "leak", seqStream(9, 10, 10, 2))
	ignore := goleak.IgnoreCurrent()
	release := make(chan struct{})
	tr := newTracker()
	c := startConsumer(t, brokers, "leak", "c", consumerOpts{group: "g",
		cfg: kafkaparallel.Config{DrainTimeout: 50 * time.Millisecond}},
		func(msg *message.Message) ([]*message.Message, error) {
			tr.enter()
			defer tr.exit()
			select {
			case <-release:
			case <-msg.Context().Done():
				return nil, msg.Context().Err()
			}
			return nil, nil
		})
	waitFor(t, "messages running", func() (bool, error) { return tr.running.Load() > 2, nil })
	c.stop()
	close(release)
	st := c.sub.Stats()
	require.NotZero(t, st.Left)
	require.Zero(t, st.Running)
	require.Zero(t, st.InFlight)
	_, err := c.sub.Subscribe(context.Background(), "leak")
	require.ErrorIs(t, err, kafkaparallel.ErrClosed)
	goleak.VerifyNone(t, ignore, goleak.IgnoreAnyFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"))
}
