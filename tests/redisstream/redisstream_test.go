// Package redisstreamtests runs the dedup middleware end to end behind
// watermill-redisstream's consumer groups, against the Redis at
// INBOXMILL_REDIS_ADDR (default 127.0.0.1:6379) and real PostgreSQL and
// SQLite.
package redisstreamtests

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	tt "github.com/inboxmill/inboxmill/tests/internal/transporttest"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

func TestMain(m *testing.M) { tt.Main(m, transport{}) }

func redisAddr() string {
	if a := os.Getenv("INBOXMILL_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

func client() *redis.Client { return redis.NewClient(&redis.Options{Addr: redisAddr()}) }

// transport is watermill-redisstream: a stream per topic and a consumer
// group per group, whose members claim what another member has held
// pending for longer than MaxIdleTime.
type transport struct{}

func (transport) Name() string { return "redisstream" }

func (transport) Provision(t testing.TB, s tt.Spec) {
	t.Helper()
	tt.Reach(t, "Redis", redisAddr())
	rc := client()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// From the stream's start, before anything is published.
	require.NoError(t, rc.XGroupCreateMkStream(ctx, s.Topic, s.Group, "0").Err())
	t.Cleanup(func() {
		_ = rc.Del(context.Background(), s.Topic).Err()
		_ = rc.Close()
	})
}

func (transport) NewPublisher(t testing.TB) message.Publisher {
	t.Helper()
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client()}, watermill.NopLogger{})
	require.NoError(t, err)
	return pub
}

func (transport) NewSubscriber(s tt.Spec) (message.Subscriber, error) {
	return redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:        client(),
		Consumer:      s.Consumer,
		ConsumerGroup: s.Group,
		// A member claims what another has held pending this long, dead
		// or still working on it.
		MaxIdleTime:   s.RedeliverAfter,
		ClaimInterval: max(s.RedeliverAfter/5, 50*time.Millisecond),
		// A nack resends the message in the same consumer; do not spin.
		NackResendSleep: 50 * time.Millisecond,
		// Without it, Close can wait on an XREADGROUP that blocks forever.
		DisableIndefiniteInitialBlock: true,
		// Claiming back a message this consumer is still handling would
		// only queue it behind itself; let another member take it, which
		// is the case these tests are about.
		ShouldClaimPendingMessage: func(xp redis.XPendingExt) bool { return xp.Consumer != s.Consumer },
	}, watermill.NopLogger{})
}

func (transport) Backlog(ctx context.Context, s tt.Spec) (int, error) {
	rc := client()
	defer rc.Close()
	groups, err := rc.XInfoGroups(ctx, s.Topic).Result()
	if err != nil {
		return 0, err
	}
	for _, g := range groups {
		if g.Name == s.Group {
			if g.Lag < 0 {
				return 0, fmt.Errorf("redis cannot tell the lag of group %s", s.Group)
			}
			return int(g.Pending + g.Lag), nil
		}
	}
	return 0, fmt.Errorf("no consumer group %s on %s", s.Group, s.Topic)
}

// TestCrash runs the crash scenario (see transporttest.Crash) on
// PostgreSQL and SQLite, in both modes. What a dead member held stays
// pending until another member claims it, MaxIdleTime (2 s) after it was
// delivered.
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

const (
	maxIdle = 300 * time.Millisecond
	handler = 2 * time.Second // the slow event's handler: more than six times maxIdle
)

// TestHandlerOutlastsMaxIdleTime makes one event's handler run far longer
// than MaxIdleTime, with two live consumers in the group. Redis then hands
// the message to the second consumer while the first is still working on
// it — nobody died — and what keeps the effect single is the middleware:
//
//   - transactional: the second delivery's claim waits on the first's
//     uncommitted record, then finds it done;
//   - reserve, a lease longer than the handler (heartbeat off): the second
//     delivery finds the lease live and nacks until the first completes;
//   - reserve, a lease shorter than the handler but kept alive by the
//     heartbeat: the same;
//   - reserve, a lease longer than MaxIdleTime but shorter than the
//     handler, heartbeat off — the sizing to avoid: the second delivery
//     takes the expired lease over and makes the effect again. The first
//     consumer's late completion is fenced (refused: another attempt holds
//     the record), so the record stays consistent, but the effect is made
//     twice. The test requires exactly that, so that it shows what the
//     other sizings prevent.
//
// In the single-effect cases the first consumer's completion, though the
// message is pending under the second consumer by then, is the one
// recorded, and its ack (XACK is by group, not by member) is harmless: the
// second consumer's own delivery ends as a duplicate.
func TestHandlerOutlastsMaxIdleTime(t *testing.T) {
	cases := []struct {
		name             string
		mode             tt.Mode
		lease, heartbeat time.Duration
		effects          int
	}{
		{"transactional", tt.Transactional, 0, 0, 1},
		{"reserve/lease-outlasts-handler", tt.Reserve, 2 * handler, -1, 1},
		{"reserve/heartbeat", tt.Reserve, 800 * time.Millisecond, 250 * time.Millisecond, 1},
		{"reserve/lease-runs-out", tt.Reserve, 800 * time.Millisecond, -1, 2},
	}
	for _, kind := range []testdb.Kind{testdb.PostgresPGX, testdb.SQLite} {
		for _, c := range cases {
			t.Run(string(kind)+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				slowHandler(t, kind, c.mode, c.lease, c.heartbeat, c.effects)
			})
		}
	}
}

func slowHandler(t *testing.T, kind testdb.Kind, mode tt.Mode, lease, heartbeat time.Duration, effects int) {
	e := tt.Setup(t, transport{}, tt.Options{DB: kind, Mode: mode, RedeliverAfter: maxIdle, Lease: lease,
		Heartbeat: heartbeat})
	// One event: on SQLite a second one would wait for the slow handler's
	// write transaction and keep its consumer from taking the slow message.
	msgs, events := tt.Stream(1, 0, 1)
	const slow, slowSeq = "evt-00000", 1
	e.Publish(msgs...)
	s1, s2 := e.Spec("c1"), e.Spec("c2")
	s1.Slow = map[string]time.Duration{slow: handler}
	s2.Slow = s1.Slow
	c1, c2 := e.StartInProcess(s1), e.StartInProcess(s2)
	e.WaitFor("every event completed and nothing pending", func() (bool, error) {
		n, err := e.Completed()
		if err != nil || n < len(events) || c1.InFlight()+c2.InFlight() > 0 {
			return false, err
		}
		left, err := e.Backlog()
		return left == 0, err
	})
	require.NoError(t, c1.Close())
	require.NoError(t, c2.Close())
	require.Zero(t, e.Drain().Executed)

	lines := tt.Of(e.Lines(), slowSeq)
	var timeline []string
	for _, l := range lines {
		timeline = append(timeline, fmt.Sprintf("%s %s attempt=%d found=%v %v..%v %s", l.Consumer, l.Word, l.Attempt,
			l.Found, l.Start.Format("05.000"), l.At.Format("05.000"), l.Err))
	}
	t.Logf("deliveries of the slow message:\n%s", strings.Join(timeline, "\n"))

	// The first delivery is the one whose handler ran as attempt 1.
	var first *tt.Line
	for i, l := range lines {
		if (l.Word == tt.WordExec || l.Word == tt.WordFenced) && l.Attempt == 1 {
			first = &lines[i]
		}
	}
	require.NotNil(t, first, "no delivery ran the slow handler as attempt 1")
	require.GreaterOrEqual(t, first.At.Sub(first.Start), handler)
	var concurrent bool
	for _, l := range lines {
		if l.Consumer != first.Consumer && l.Start.After(first.Start) && l.Start.Before(first.At) {
			concurrent = true
		}
	}
	require.True(t, concurrent, "Redis handed the message to the other consumer while the first still ran it")

	by := e.EffectsByEvent()
	rec := e.Record(slow, events[slow])
	require.Equal(t, inbox.StatusCompleted, rec.Status)
	var fenced []tt.Line
	for _, l := range lines {
		if l.Word == tt.WordFenced {
			fenced = append(fenced, l)
		}
	}
	if effects == 1 {
		require.Len(t, by[slow], 1, "the slow event's effect")
		require.Equal(t, first.Consumer, by[slow][0].Consumer)
		require.Equal(t, tt.WordExec, first.Word, "the first consumer's late completion is the one recorded")
		require.EqualValues(t, 1, rec.Attempt, "nobody took the lease over")
		require.Empty(t, fenced)
		require.Zero(t, c1.Stats().Takeovers+c2.Stats().Takeovers)
		return
	}
	require.Len(t, by[slow], 2, "with the lease run out, the takeover made the effect again")
	require.Equal(t, tt.WordFenced, first.Word, "the first consumer's late completion was fenced")
	require.GreaterOrEqual(t, rec.Attempt, int64(2))
	require.NotZero(t, c1.Stats().Takeovers+c2.Stats().Takeovers)
}
