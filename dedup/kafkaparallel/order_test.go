package kafkaparallel_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup/kafkaparallel"
	"github.com/inboxmill/inboxmill/internal/kafkatest"
)

// seqEvent is the payload of the ordering tests: the n-th message of key.
type seqEvent struct {
	Key string `json:"key"`
	Seq int    `json:"seq"`
}

// seqStream returns keys×perKey records, each key's in sequence order and
// on the partition its key hashes to, the keys interleaved at random.
func seqStream(seed uint64, keys, perKey int, partitions int32) []kafkatest.Record {
	rng := rand.New(rand.NewPCG(seed, 7))
	next := make([]int, keys)
	var out []kafkatest.Record
	for left := keys * perKey; left > 0; left-- {
		k := rng.IntN(keys)
		for next[k] == perKey {
			k = (k + 1) % keys
		}
		key := fmt.Sprintf("key-%03d", k)
		v, _ := json.Marshal(seqEvent{Key: key, Seq: next[k]})
		out = append(out, kafkatest.Record{Partition: partitionOf(key, partitions), Key: []byte(key), Value: v,
			Headers: map[string]string{"event_id": fmt.Sprintf("%s/%d", key, next[k])}})
		next[k]++
	}
	return out
}

func partitionOf(key string, partitions int32) int32 {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int32(h.Sum32() % uint32(partitions))
}

func decodeSeq(t *testing.T, msg *message.Message) seqEvent {
	var ev seqEvent
	require.NoError(t, json.Unmarshal(msg.Payload, &ev))
	return ev
}

var errFlaky = errors.New("first attempt fails")

// TestKeyOrderUnderConcurrency: 40 keys of 50 messages each on four
// partitions, handlers that take a random while and fail one first
// attempt in ten. Each key's messages must take effect in sequence order
// while many run at once — more than one per partition, never more than
// the limits.
func TestKeyOrderUnderConcurrency(t *testing.T) {
	t.Parallel()
	const keys, perKey, parts = 40, 50, 4
	brokers := kafkatest.Start(t, parts, "seq")
	kafkatest.Produce(t, brokers, "seq", seqStream(1, keys, perKey, parts))
	tr := newTracker()
	var (
		mu     sync.Mutex
		failed = map[string]bool{}
	)
	rng := rand.New(rand.NewPCG(2, 2))
	c := startConsumer(t, brokers, "seq", "c1", consumerOpts{group: "order",
		cfg: kafkaparallel.Config{MaxInFlightPerPartition: 8, MaxInFlight: 24}},
		func(msg *message.Message) ([]*message.Message, error) {
			tr.enter()
			defer tr.exit()
			ev := decodeSeq(t, msg)
			id := msg.Metadata.Get("event_id")
			mu.Lock()
			d := time.Duration(rng.IntN(3000)) * time.Microsecond
			fail := !failed[id] && rng.IntN(10) == 0
			failed[id] = true
			mu.Unlock()
			time.Sleep(d)
			if fail {
				return nil, errFlaky
			}
			tr.done(ev.Key, ev.Seq)
			return nil, nil
		})
	waitFor(t, "every message handled", func() (bool, error) { return tr.handled.Load() == keys*perKey, nil })
	waitFor(t, "every offset committed", func() (bool, error) { return kafkatest.Consumed(brokers, "order", "seq") })
	require.Empty(t, tr.violations(), "a key's messages took effect out of order")
	peak := tr.peak.Load()
	t.Logf("peak %d handlers at once; %d attempts for %d messages; stats %+v", peak, tr.attempts.Load(), keys*perKey, c.sub.Stats())
	require.Greater(t, peak, int64(parts), "no more than one message per partition ran at once")
	require.LessOrEqual(t, peak, int64(24), "more messages ran at once than MaxInFlight")
	st := c.sub.Stats()
	require.Greater(t, st.Nacked, uint64(0))
	require.Equal(t, st.Acked, uint64(keys*perKey))
}

// TestOrderings: OrderByPartition runs one message of a partition at a
// time, in offset order; OrderNone runs as many of one partition as
// MaxInFlightPerPartition allows.
func TestOrderings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ordering kafkaparallel.Ordering
		peak     int64
	}{{kafkaparallel.OrderByPartition, 1}, {kafkaparallel.OrderNone, 6}} {
		t.Run(tc.ordering.String(), func(t *testing.T) {
			t.Parallel()
			brokers := kafkatest.Start(t, 1, "one")
			kafkatest.Produce(t, brokers, "one", seqStream(3, 10, 20, 1))
			tr := newTracker()
			var (
				mu   sync.Mutex
				last int64 = -1
				bad  []string
			)
			startConsumer(t, brokers, "one", "c1", consumerOpts{group: "o", cfg: kafkaparallel.Config{
				MaxInFlightPerPartition: 6, Ordering: tc.ordering}},
				func(msg *message.Message) ([]*message.Message, error) {
					tr.enter()
					defer tr.exit()
					off, ok := kafkaparallel.MessagePartitionOffsetFromCtx(msg.Context())
					require.True(t, ok)
					time.Sleep(time.Millisecond)
					mu.Lock()
					if tc.ordering == kafkaparallel.OrderByPartition && off != last+1 {
						bad = append(bad, fmt.Sprintf("offset %d after %d", off, last))
					}
					last = off
					mu.Unlock()
					tr.handled.Add(1)
					return nil, nil
				})
			waitFor(t, "every message handled", func() (bool, error) { return tr.handled.Load() == 200, nil })
			require.Empty(t, bad)
			require.Equal(t, tc.peak, tr.peak.Load())
		})
	}
}

// TestInFlightLimits: handlers that block hold the limits: per partition
// with one partition, over all of them with three.
func TestInFlightLimits(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Start(t, 3, "lim")
	kafkatest.Produce(t, brokers, "lim", seqStream(4, 30, 10, 3))
	release := make(chan struct{})
	tr := newTracker()
	c := startConsumer(t, brokers, "lim", "c1", consumerOpts{group: "l", cfg: kafkaparallel.Config{
		MaxInFlightPerPartition: 4, MaxInFlight: 7, Ordering: kafkaparallel.OrderNone}},
		func(msg *message.Message) ([]*message.Message, error) {
			tr.enter()
			defer tr.exit()
			<-release
			tr.handled.Add(1)
			return nil, nil
		})
	waitFor(t, "the limit reached", func() (bool, error) { return tr.running.Load() == 7, nil })
	time.Sleep(200 * time.Millisecond) // nothing more may start
	st := c.sub.Stats()
	require.Equal(t, int64(7), tr.running.Load())
	require.Equal(t, 7, st.Running)
	require.LessOrEqual(t, st.InFlight, 7)
	close(release)
	waitFor(t, "every message handled", func() (bool, error) { return tr.handled.Load() == 300, nil })
	require.Equal(t, int64(7), tr.peak.Load())
}
