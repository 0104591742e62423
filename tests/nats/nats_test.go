// Package natstests runs the dedup middleware end to end behind
// watermill-nats' JetStream subscriber (pkg/jetstream), against the NATS
// server at INBOXMILL_NATS_URL (default nats://127.0.0.1:4222, started with
// -js) and real PostgreSQL and SQLite.
package natstests

import (
	"context"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	tt "github.com/inboxmill/inboxmill/tests/internal/transporttest"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

func TestMain(m *testing.M) { tt.Main(m, transport{}) }

func natsURL() string {
	if u := os.Getenv("INBOXMILL_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// transport is watermill-nats' pkg/jetstream: a stream per topic and one
// durable pull consumer per group, which every member binds to.
type transport struct{}

func (transport) Name() string { return "nats-jetstream" }

// consumerConfig is the group's durable consumer. AckWait is what makes
// JetStream redeliver what a dead member held; watermill's own
// AckWaitTimeout only bounds how long its subscriber waits for the router.
func consumerConfig(s tt.Spec) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       s.Group,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.RedeliverAfter,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxDeliver:    -1,
	}
}

func connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(natsURL())
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return nc, js
}

func (transport) Provision(t testing.TB, s tt.Spec) {
	t.Helper()
	u, err := url.Parse(natsURL())
	require.NoError(t, err)
	tt.Reach(t, "NATS", u.Host)
	nc, js := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: s.Topic, Subjects: []string{s.Topic}})
	require.NoError(t, err, "JetStream must be enabled (nats-server -js)")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, s.Topic)
		nc.Close()
	})
	_, err = js.CreateOrUpdateConsumer(ctx, s.Topic, consumerConfig(s))
	require.NoError(t, err)
}

func (transport) NewPublisher(t testing.TB) message.Publisher {
	t.Helper()
	pub, err := wmjs.NewPublisher(wmjs.PublisherConfig{URL: natsURL(), Logger: watermill.NopLogger{}})
	require.NoError(t, err)
	return pub
}

func (transport) NewSubscriber(s tt.Spec) (message.Subscriber, error) {
	return newDrainFirst(natsURL(), wmjs.SubscriberConfig{
		Logger: watermill.NopLogger{},
		// Longer than any handler, as JetStream's AckWait is.
		AckWaitTimeout: s.RedeliverAfter,
		// Bind to the group's durable consumer; the default makes an
		// ephemeral consumer per subscriber, which is no group at all.
		ResourceInitializer: func(ctx context.Context, js jetstream.JetStream, topic string) (
			jetstream.Consumer, func(context.Context, watermill.LoggerAdapter), error,
		) {
			c, err := js.Consumer(ctx, topic, s.Group)
			return c, nil, err
		},
		// AckWait runs from delivery to the client's buffer: keep the
		// buffer small enough to be handled within it. A closed member's
		// pull requests stay on the server until they expire, and what
		// was in flight at a close came back only after about that long
		// (30 s by default; see TestCloseMidStream and docs/transports.md).
		ConsumeOptions: []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(8), jetstream.PullExpiry(5 * time.Second)},
	})
}

func (transport) Backlog(ctx context.Context, s tt.Spec) (int, error) {
	nc, err := nats.Connect(natsURL())
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	c, err := js.Consumer(ctx, s.Topic, s.Group)
	if err != nil {
		return 0, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int(info.NumPending) + info.NumAckPending, nil
}

// TestCrash runs the crash scenario (see transporttest.Crash) on
// PostgreSQL and SQLite, in both modes. JetStream redelivers what a dead
// member held once AckWait (2 s) has passed since the delivery.
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

// TestMsgIDIsNotTheInbox shows what JetStream's publish deduplication
// (Nats-Msg-Id, set to the Watermill UUID by TrackMessageID) catches and
// what it leaves to the inbox: a message resent with its UUID inside the
// stream's duplicate window is dropped by the server; the same event
// rebuilt with a new UUID, or resent after the window, is stored again,
// and only the inbox keeps its effect single. (A redelivery after a
// consumer died is no publish at all; TestCrash covers it.)
func TestMsgIDIsNotTheInbox(t *testing.T) {
	t.Parallel()
	e := tt.Setup(t, transport{}, tt.Options{DB: testdb.SQLite, Mode: tt.Transactional})
	s := e.Spec("c")
	nc, js := connect(t)
	defer nc.Close()
	const window = time.Second
	ctx := t.Context()
	_, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: s.Topic, Subjects: []string{s.Topic}, Duplicates: window})
	require.NoError(t, err)

	pub, err := wmjs.NewPublisher(wmjs.PublisherConfig{URL: natsURL(), Logger: watermill.NopLogger{}, TrackMessageID: true})
	require.NoError(t, err)
	defer pub.Close()
	msgs, events := tt.Stream(2, 0, 1)
	publish := func(m *message.Message) {
		t.Helper()
		require.NoError(t, pub.Publish(s.Topic, m))
	}
	resend := func(m *message.Message, seq string) *message.Message {
		c := message.NewMessage(m.UUID, m.Payload)
		for k, v := range m.Metadata {
			c.Metadata.Set(k, v)
		}
		c.Metadata.Set(tt.MetaSeq, seq)
		return c
	}
	first, second := msgs[0], msgs[1]
	publish(first)
	publish(resend(first, "3")) // same UUID, inside the window: dropped
	publish(second)
	rebuilt := resend(second, "4")
	rebuilt.UUID = watermill.NewUUID() // a new UUID: stored
	publish(rebuilt)
	time.Sleep(window + 200*time.Millisecond)
	publish(resend(first, "5")) // same UUID after the window: stored

	info, err := js.Stream(ctx, s.Topic)
	require.NoError(t, err)
	state, err := info.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 4, state.State.Msgs, "the server dropped only the resend inside its window")

	c := e.StartInProcess(s)
	e.WaitFor("every message handled", func() (bool, error) {
		n, err := e.Backlog()
		st := c.Stats()
		return n == 0 && st.Executed+st.Duplicates == 4, err
	})
	require.NoError(t, c.Close())
	e.RequireOnce(events)
	st := c.Stats()
	require.EqualValues(t, 2, st.Executed)
	require.EqualValues(t, 2, st.Duplicates, "the rebuilt event and the late resend reached the consumer; the inbox caught them")
	lines := e.Lines()
	for seq, want := range map[int]string{1: tt.WordExec, 2: tt.WordExec, 4: tt.WordDup, 5: tt.WordDup} {
		got := tt.Of(lines, seq)
		require.Len(t, got, 1, "seq %d", seq)
		require.Equal(t, want, got[0].Word, "seq %d", seq)
	}
	require.Empty(t, tt.Of(lines, 3), "the server dropped the resend inside its window")
}
