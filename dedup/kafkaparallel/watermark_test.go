package kafkaparallel_test

import (
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup/kafkaparallel"
	"github.com/inboxmill/inboxmill/internal/kafkatest"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

var errCrashed = errors.New("the consumer crashed")

// TestWatermarkAfterACrash: one partition; the message at offset 20 hangs
// while the later messages of other keys complete, so the committed offset
// (the watermark) stays at 20. The consumer then dies — its Kafka
// connections cut, nothing more committed, the hanging message's
// transaction never committed. Its successor must receive nothing below
// offset 20 and everything from it on; of those, what the first consumer
// completed is a duplicate the inbox acknowledges without running the
// handler, and the rest runs, each key's effects in order.
func TestWatermarkAfterACrash(t *testing.T) {
	t.Parallel()
	for _, v := range []variant{{testdb.SQLite, "tx"}, {testdb.PostgresPQ, "tx"}, {testdb.MySQL, "tx"},
		{testdb.PostgresPGX, "group"}, {testdb.PostgresPGX, "pipeline"}, {testdb.PostgresPQ, "reserve"}} {
		t.Run(v.String(), func(t *testing.T) {
			t.Parallel()
			watermarkAfterACrash(t, v)
		})
	}
}

func watermarkAfterACrash(t *testing.T, v variant) {
	const keys, perKey, hang = 20, 10, int64(20)
	e := newDBEnv(t, v)
	brokers := kafkatest.Start(t, 1, "wm")
	records := seqStream(5, keys, perKey, 1)
	kafkatest.Produce(t, brokers, "wm", records)
	var hung seqEvent
	require.NoError(t, json.Unmarshal(records[hang].Value, &hung))
	// The hanging message's later messages wait behind it in its lane.
	behind := 0
	for _, r := range records[hang:] {
		if string(r.Key) == hung.Key {
			behind++
		}
	}
	events := map[string]bool{}
	for _, r := range records {
		events[r.Headers["event_id"]] = true
	}

	var dead atomic.Bool
	release := make(chan struct{})
	// The hang comes before the middleware claims: a handler that hangs
	// inside the claim's transaction would hold SQLite's one writer, and
	// its group commit's transaction.
	hangs := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if decodeSeq(t, msg) == hung {
				select {
				case <-release:
				case <-msg.Context().Done():
				}
			}
			if dead.Load() {
				return nil, errCrashed // a dead process makes no effect
			}
			return h(msg)
		}
	}
	a := startConsumer(t, brokers, "wm", "a", consumerOpts{group: "g",
		cfg:         kafkaparallel.Config{MaxInFlightPerPartition: 32, DrainTimeout: 100 * time.Millisecond},
		middlewares: []message.HandlerMiddleware{hangs, e.dedup().Middleware}},
		e.handler("a", nil))
	done := len(records) - behind
	waitFor(t, "every message not behind the hanging one done", func() (bool, error) { return e.countEffects() == done, nil })
	waitFor(t, "the watermark committed", func() (bool, error) {
		c, err := kafkatest.Committed(brokers, "g", "wm")
		if err == nil && c[0] > hang {
			t.Fatalf("committed offset %d, past the message at %d that is not done", c[0], hang)
		}
		return err == nil && c[0] == hang, err
	})
	dead.Store(true)
	a.dialer.Kill()
	close(release)
	a.stop()
	c, err := kafkatest.Committed(brokers, "g", "wm")
	require.NoError(t, err)
	require.Equal(t, hang, c[0], "the dead consumer committed past the message that never finished")

	seen := newOffsets()
	d := e.dedup()
	b := startConsumer(t, brokers, "wm", "b", consumerOpts{group: "g",
		middlewares: []message.HandlerMiddleware{seen.middleware, d.Middleware}}, e.handler("b", nil))
	waitFor(t, "everything consumed", func() (bool, error) { return kafkatest.Consumed(brokers, "g", "wm") })
	b.stop()
	got := seen.snapshot()
	for off := range int64(len(records)) {
		if off < hang {
			require.Zero(t, got[off], "offset %d, below the watermark, was delivered again", off)
		} else {
			require.NotZero(t, got[off], "offset %d, at or above the watermark, was not delivered again", off)
		}
	}
	st := d.Stats()
	require.Equal(t, uint64(behind), st.Executed, "the successor ran other messages than those never done")
	require.Equal(t, uint64(len(records)-int(hang)-behind), st.Duplicates,
		"what the dead consumer completed above the watermark must be acknowledged as duplicates")
	e.checkEffects(events)
}
