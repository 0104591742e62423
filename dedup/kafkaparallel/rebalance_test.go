package kafkaparallel_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/kafkaparallel"
	"github.com/inboxmill/inboxmill/internal/kafkatest"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// withRetries adds a producer retry (same event, same payload, a new
// record) after one record in seven, on the same partition and key, a few
// records later.
func withRetries(seed uint64, records []kafkatest.Record) []kafkatest.Record {
	rng := rand.New(rand.NewPCG(seed, 11))
	out := make([]kafkatest.Record, 0, len(records)*8/7)
	var pending []kafkatest.Record
	for _, r := range records {
		out = append(out, r)
		if rng.IntN(7) == 0 {
			pending = append(pending, r)
		}
		if len(pending) > 0 && rng.IntN(3) == 0 {
			out = append(out, pending[0])
			pending = pending[1:]
		}
	}
	return append(out, pending...)
}

// TestRebalanceMidStream: a stream with producer retries on six
// partitions. A consumer starts; a second joins a fifth of the way in, (a
// third at half way,) and the first leaves at 70%. Each change comes
// while every consumer's messages in flight are held at a gate before the
// middleware, longer than the drain timeout, so the rebalance leaves them
// running while the partitions' next owners receive them again; and a
// message in forty takes longer than the drain timeout inside its
// transaction. Every event must have one effect, each key's effects in
// order, whatever the mode.
func TestRebalanceMidStream(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		v           variant
		cooperative bool
	}{
		{variant{testdb.PostgresPQ, "tx"}, false},
		{variant{testdb.PostgresPQ, "tx"}, true},
		{variant{testdb.MySQL, "tx"}, false},
		{variant{testdb.PostgresPGX, "pipeline"}, false},
		{variant{testdb.PostgresPGX, "group"}, true},
		{variant{testdb.PostgresPQ, "reserve"}, false},
	} {
		for _, n := range []int{2, 3} {
			name := fmt.Sprintf("%s/consumers=%d", tc.v, n)
			if tc.cooperative {
				name += "/cooperative"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				rebalanceMidStream(t, tc.v, n, tc.cooperative)
			})
		}
	}
}

// gate lets a number of messages pass, then holds the others until the
// number is raised (or their context ends).
type gate struct {
	mu            sync.Mutex
	limit, passed int
	raised        chan struct{}
}

func newGate(limit int) *gate { return &gate{limit: limit, raised: make(chan struct{})} }

func (g *gate) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		for {
			g.mu.Lock()
			if g.passed < g.limit {
				g.passed++
				g.mu.Unlock()
				return h(msg)
			}
			raised := g.raised
			g.mu.Unlock()
			select {
			case <-raised:
			case <-msg.Context().Done():
				return nil, msg.Context().Err()
			}
		}
	}
}

func (g *gate) raise(limit int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.limit = limit
	close(g.raised)
	g.raised = make(chan struct{})
}

// reached reports whether every pass allowed is used: the consumers wait
// at the gate.
func (g *gate) reached() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.passed >= g.limit
}

func rebalanceMidStream(t *testing.T, v variant, n int, cooperative bool) {
	const keys, perKey, parts = 60, 12, 6
	e := newDBEnv(t, v)
	brokers := kafkatest.Start(t, parts, "rb")
	records := withRetries(6, seqStream(6, keys, perKey, parts))
	kafkatest.Produce(t, brokers, "rb", records)
	events := map[string]bool{}
	for _, r := range records {
		events[r.Headers["event_id"]] = true
	}
	slow := func(ctx context.Context, ev seqEvent) error {
		if (ev.Seq*keys+len(ev.Key))%40 == 0 {
			select {
			case <-time.After(400 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	g := newGate(len(records) / 5)
	var (
		cs []*consumer
		ds []*dedup.Deduplicator
	)
	start := func(name string) *consumer {
		d := e.dedup()
		c := startConsumer(t, brokers, "rb", name, consumerOpts{group: "g",
			cfg:         kafkaparallel.Config{MaxInFlightPerPartition: 8, DrainTimeout: 100 * time.Millisecond},
			middlewares: []message.HandlerMiddleware{g.middleware, d.Middleware}, cooperative: cooperative},
			e.handler(name, slow))
		cs, ds = append(cs, c), append(ds, d)
		return c
	}
	// change holds the stream at the gate, makes a change of membership,
	// waits until the group has settled on it, and lets limit through.
	change := func(what string, do func(), settled func() bool, limit int) {
		waitFor(t, "the consumers held at the gate before "+what, func() (bool, error) { return g.reached(), nil })
		do()
		waitFor(t, "the group settled after "+what, func() (bool, error) { return settled(), nil })
		g.raise(limit)
	}
	owns := func(c *consumer) func() bool { return func() bool { return c.sub.Stats().Partitions > 0 } }
	a := start("a")
	var b, c *consumer
	change("b joins", func() { b = start("b") }, func() bool { return owns(b)() && a.sub.Stats().Partitions < parts },
		len(records)/2)
	if n == 3 {
		change("c joins", func() { c = start("c") }, func() bool { return owns(c)() }, len(records)*7/10)
	}
	change("a leaves", a.stop, func() bool { return b.sub.Stats().Partitions+partitionsOf(c) == parts }, 1<<30)
	waitFor(t, "every effect", func() (bool, error) { return e.countEffects() >= len(events), nil })
	waitFor(t, "everything consumed", func() (bool, error) { return kafkatest.Consumed(brokers, "g", "rb") })
	for _, c := range cs {
		c.stop()
	}
	e.checkEffects(events)
	var executed, left uint64
	for i, c := range cs {
		st, dst := c.sub.Stats(), ds[i].Stats()
		executed += dst.Executed
		left += st.Left
		t.Logf("%s: %+v; dedup %+v", c.name, st, dst)
		require.NotZero(t, dst.Executed, "%s executed nothing: no rebalance happened mid-stream", c.name)
	}
	// One effect per event is the guarantee (checkEffects). A straggler
	// whose context was cancelled while it committed may have committed
	// without knowing: it counts as a retry, and its next delivery as a
	// duplicate. So the middlewares ran at most one handler per event.
	require.LessOrEqual(t, executed, uint64(len(events)))
	require.NotZero(t, left, "no rebalance left a message running to the next owner")
}

func partitionsOf(c *consumer) int {
	if c == nil {
		return 0
	}
	return c.sub.Stats().Partitions
}

// TestPoisonAndReplay: a conflicting payload (an event ID reused) in the
// middle of a partition goes to the poison topic and the watermark moves
// past it. Then the whole topic is replayed through a new consumer group:
// a dry run predicts every message a duplicate but the conflict, and the
// replay runs no handler.
func TestPoisonAndReplay(t *testing.T) {
	t.Parallel()
	for _, kind := range []testdb.Kind{testdb.PostgresPQ, testdb.MySQL, testdb.SQLite} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			poisonAndReplay(t, variant{kind, "tx"})
		})
	}
}

func poisonAndReplay(t *testing.T, v variant) {
	e := newDBEnv(t, v)
	brokers := kafkatest.Start(t, 2, "pz", "pz.poison")
	records := seqStream(7, 10, 10, 2)
	// The 50th record reuses the event ID of the 10th with another payload.
	bad := records[50]
	bad.Headers = map[string]string{"event_id": records[10].Headers["event_id"]}
	var ev seqEvent
	require.NoError(t, json.Unmarshal(records[10].Value, &ev))
	ev.Seq += 1000
	bad.Value, _ = json.Marshal(ev)
	bad.Key = records[10].Key
	bad.Partition = records[10].Partition
	records = append(records[:50], append([]kafkatest.Record{bad}, records[50:]...)...)
	kafkatest.Produce(t, brokers, "pz", records)
	events := map[string]bool{}
	for _, r := range records {
		events[r.Headers["event_id"]] = true
	}
	poison := poisonQueue(t, brokers, "pz.poison")

	d := e.dedup()
	c := startConsumer(t, brokers, "pz", "a", consumerOpts{group: "g",
		middlewares: []message.HandlerMiddleware{poison, d.Middleware}}, e.handler("a", nil))
	waitFor(t, "everything consumed, the poison included", func() (bool, error) { return kafkatest.Consumed(brokers, "g", "pz") })
	c.stop()
	e.checkEffects(events)
	require.Equal(t, uint64(1), d.Stats().Conflicts)
	require.Len(t, kafkatest.ReadAll(t, brokers, "pz.poison"), 1)

	// The dry run reads the topic as it is, with the consumer's settings.
	dry := e.dedup()
	var report dedup.DryRunReport
	for _, rec := range kafkatest.ReadAll(t, brokers, "pz") {
		msg := watermillMessage(t, rec)
		res, err := dry.DryRun(e.ctx, msg, rec.Timestamp)
		require.NoError(t, err)
		report.Add(res)
	}
	require.Equal(t, int64(len(records)-1), report.Duplicate, "dry run: %s", report.String())
	require.Equal(t, int64(1), report.Conflict)
	require.Zero(t, report.WouldExecute())

	d2 := e.dedup()
	r := startConsumer(t, brokers, "pz", "replay", consumerOpts{group: "replay",
		middlewares: []message.HandlerMiddleware{poison, d2.Middleware}}, e.handler("replay", nil))
	waitFor(t, "the replay consumed everything", func() (bool, error) { return kafkatest.Consumed(brokers, "replay", "pz") })
	r.stop()
	st := d2.Stats()
	require.Zero(t, st.Executed, "the replay ran handlers")
	require.Equal(t, uint64(report.Duplicate), st.Duplicates)
	require.Equal(t, uint64(1), st.Conflicts)
	e.checkEffects(events)
}
