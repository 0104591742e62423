package deduptest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/deduptest"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// TestMain fails the package's tests when any goroutine outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

// newDedup returns a transactional middleware over a migrated SQLite
// inbox of its own, keyed on deduptest.EventIDKey.
func newDedup(t *testing.T, mode dedup.Mode) (*dedup.Deduplicator, *inbox.Store) {
	t.Helper()
	store, err := inbox.NewStore(testdb.Open(t, testdb.SQLite), sqlite.Dialect(), inbox.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	require.NoError(t, store.Migrate(context.Background()))
	d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata(deduptest.EventIDKey), Operation: "op", Mode: mode})
	require.NoError(t, err)
	return d, store
}

func TestNewMessage(t *testing.T) {
	t.Parallel()
	a := deduptest.NewMessage("evt-1", `{"n":1}`, "tenant_id", "acme", "correlation_id", "c-1")
	b := deduptest.NewMessage("evt-1", `{"n":1}`)
	require.Equal(t, "evt-1", a.Metadata.Get("event_id"))
	require.Equal(t, "acme", a.Metadata.Get("tenant_id"))
	require.Equal(t, "c-1", a.Metadata.Get("correlation_id"))
	require.Len(t, a.Metadata, 3)
	require.Equal(t, `{"n":1}`, string(a.Payload))
	require.NotEmpty(t, a.UUID)
	require.NotEqual(t, a.UUID, b.UUID, "every message is a delivery of its own")
	require.PanicsWithValue(t, "deduptest: NewMessage: metadata must be key, value pairs, got 1 strings", func() {
		//lint:ignore SA5012 an odd count is what this checks
		deduptest.NewMessage("evt-1", `{}`, "tenant_id")
	})
}

func TestNoPublish(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	var got *message.Message
	h := deduptest.NoPublish(func(msg *message.Message) error {
		got = msg
		return boom
	})
	msg := deduptest.NewMessage("evt-1", `{}`)
	out, err := h(msg)
	require.ErrorIs(t, err, boom)
	require.Nil(t, out)
	require.Same(t, msg, got)
}

// Every delivery is a copy of the message with its UUID, payload, metadata
// and context; the message itself is left as it was.
func TestRedeliverDeliversCopiesOfTheMessage(t *testing.T) {
	t.Parallel()
	d, _ := newDedup(t, nil)
	type marker struct{}
	msg := deduptest.NewMessage("evt-1", `{"n":1}`, "tenant_id", "acme")
	msg.SetContext(context.WithValue(context.Background(), marker{}, "mine"))
	boom := errors.New("downstream unavailable")
	var (
		mu   sync.Mutex
		seen []*message.Message
	)
	rep := deduptest.Redeliver(t, d, func(m *message.Message) ([]*message.Message, error) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, m)
		require.Equal(t, "mine", m.Context().Value(marker{}), "the delivery carries the message's context")
		return nil, boom // rolled back: every delivery runs the handler
	}, msg, deduptest.Times(3))
	require.Len(t, seen, 3)
	for _, m := range seen {
		require.NotSame(t, msg, m)
		require.Equal(t, msg.UUID, m.UUID)
		require.Equal(t, msg.Payload, m.Payload)
		require.Equal(t, msg.Metadata, m.Metadata)
	}
	require.Equal(t, 3, rep.Runs)
	require.Equal(t, 3, rep.Nacked)
	require.Zero(t, rep.Acked)
	require.Len(t, rep.Errors(), 3)
	for i, dl := range rep.Deliveries {
		require.Equal(t, i+1, dl.N)
		require.Equal(t, 1, dl.Attempt)
		require.False(t, dl.Acked())
		require.ErrorIs(t, dl.Err, boom)
	}
	require.Empty(t, rep.Outputs())
	_, hasTx := dedup.TxFromContext(msg.Context())
	require.False(t, hasTx)
	require.Equal(t, "3 deliveries: 0 acked, 3 nacked; the handler ran 3 times; errors: "+
		"[downstream unavailable downstream unavailable downstream unavailable]", rep.String())
}

func TestRedeliverUntilAcked(t *testing.T) {
	t.Parallel()
	boom := errors.New("downstream unavailable")
	failing := func(n int64) message.HandlerFunc {
		var calls atomic.Int64
		return func(*message.Message) ([]*message.Message, error) {
			if calls.Add(1) <= n {
				return nil, boom
			}
			return nil, nil
		}
	}
	t.Run("a nack is redelivered until acked", func(t *testing.T) {
		t.Parallel()
		d, _ := newDedup(t, nil)
		rep := deduptest.Redeliver(t, d, failing(2), deduptest.NewMessage("evt-1", `{}`), deduptest.Times(2), deduptest.UntilAcked(5))
		type na struct{ n, attempt int }
		var got []na
		for _, dl := range rep.Deliveries {
			got = append(got, na{dl.N, dl.Attempt})
		}
		require.Equal(t, []na{{1, 1}, {1, 2}, {1, 3}, {2, 1}}, got)
		require.ErrorIs(t, rep.Deliveries[0].Err, boom)
		require.ErrorIs(t, rep.Deliveries[1].Err, boom)
		require.NoError(t, rep.Deliveries[2].Err)
		require.NoError(t, rep.Deliveries[3].Err)
		require.Equal(t, 2, rep.Acked)
		require.Equal(t, 2, rep.Nacked)
		require.Equal(t, 3, rep.Runs, "the duplicate does not run the handler")
	})
	t.Run("up to the bound", func(t *testing.T) {
		t.Parallel()
		d, _ := newDedup(t, nil)
		rep := deduptest.Redeliver(t, d, failing(10), deduptest.NewMessage("evt-1", `{}`), deduptest.Times(1), deduptest.UntilAcked(2))
		require.Len(t, rep.Deliveries, 3)
		require.Zero(t, rep.Acked)
		require.Equal(t, 3, rep.Nacked)
	})
	t.Run("poison is not redelivered", func(t *testing.T) {
		t.Parallel()
		d, store := newDedup(t, nil)
		rep := deduptest.Redeliver(t, d, func(*message.Message) ([]*message.Message, error) {
			return nil, dedup.Permanent(errors.New("invalid order"))
		}, deduptest.NewMessage("evt-1", `{}`), deduptest.Times(3), deduptest.UntilAcked(5))
		require.Len(t, rep.Deliveries, 3)
		require.True(t, dedup.IsPoison(rep.Deliveries[0].Err))
		require.Equal(t, 1, rep.Deliveries[0].Attempt, "a poison queue takes it")
		require.Equal(t, 2, rep.Acked, "a failed intent's redeliveries are acked")
		require.Equal(t, 1, rep.Runs)
		rec, err := store.Get(context.Background(), store.DB(), inbox.ID{Operation: "op", Key: "evt-1"})
		require.NoError(t, err)
		require.Equal(t, inbox.StatusFailed, rec.Status)
	})
}

func TestRedeliverConcurrently(t *testing.T) {
	t.Parallel()
	for name, mode := range map[string]dedup.Mode{
		"transactional": nil,
		"reserve":       dedup.Reserve{InFlightPoll: dedup.DefaultInFlightPoll / 10},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d, _ := newDedup(t, mode)
			var running, overlapped atomic.Int64
			rep := deduptest.Redeliver(t, d, func(msg *message.Message) ([]*message.Message, error) {
				if running.Add(1) > 1 {
					overlapped.Add(1)
				}
				defer running.Add(-1)
				return []*message.Message{message.NewMessage("out-"+msg.Metadata.Get("event_id"), []byte("x"))}, nil
			}, deduptest.NewMessage("evt-1", `{}`), deduptest.Times(8), deduptest.Concurrently(), deduptest.UntilAcked(100))
			require.Equal(t, 8, rep.Acked, "%v", rep)
			require.Equal(t, 1, rep.Runs, "%v", rep)
			require.Zero(t, overlapped.Load())
			seen := map[int]bool{}
			for _, dl := range rep.Deliveries {
				seen[dl.N] = true
			}
			require.Len(t, seen, 8, "every one of the deliveries was made")
			outs := rep.Outputs()
			require.Len(t, outs, 8)
			for _, out := range outs {
				require.Len(t, out, 1)
				require.Equal(t, "out-evt-1", out[0].UUID, "the duplicates hand back the stored output")
			}
		})
	}
}

// fakeTB records what Redeliver fails a test with.
type fakeTB struct{ fatal []string }

func (*fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatal = append(f.fatal, fmt.Sprintf(format, args...))
}

func TestRedeliverRefusesWrongUse(t *testing.T) {
	t.Parallel()
	d, _ := newDedup(t, nil)
	var ran atomic.Int64
	h := func(*message.Message) ([]*message.Message, error) {
		ran.Add(1)
		return nil, nil
	}
	msg := deduptest.NewMessage("evt-1", `{}`)
	for _, tc := range []struct {
		name string
		call func(deduptest.TB) deduptest.Report
		want string
	}{
		{"nil Deduplicator", func(tb deduptest.TB) deduptest.Report { return deduptest.Redeliver(tb, nil, h, msg) }, "the Deduplicator is nil"},
		{"nil handler", func(tb deduptest.TB) deduptest.Report { return deduptest.Redeliver(tb, d, nil, msg) }, "the handler is nil"},
		{"nil message", func(tb deduptest.TB) deduptest.Report { return deduptest.Redeliver(tb, d, h, nil) }, "the message is nil"},
		{"Times(0)", func(tb deduptest.TB) deduptest.Report {
			return deduptest.Redeliver(tb, d, h, msg, deduptest.Times(0))
		}, "Times(0): deliver at least once"},
		{"UntilAcked(-1)", func(tb deduptest.TB) deduptest.Report {
			return deduptest.Redeliver(tb, d, h, msg, deduptest.UntilAcked(-1))
		}, "UntilAcked(-1) is negative"},
	} {
		tb := &fakeTB{}
		rep := tc.call(tb)
		require.Len(t, tb.fatal, 1, tc.name)
		require.True(t, strings.HasPrefix(tb.fatal[0], "deduptest: Redeliver: "), tb.fatal[0])
		require.Contains(t, tb.fatal[0], tc.want, tc.name)
		require.Empty(t, rep.Deliveries, tc.name)
	}
	require.Zero(t, ran.Load(), "nothing was delivered")

	// Used rightly, with the defaults: DefaultTimes deliveries, one after
	// the other.
	tb := &fakeTB{}
	rep := deduptest.Redeliver(tb, d, h, msg)
	require.Empty(t, tb.fatal)
	require.Len(t, rep.Deliveries, deduptest.DefaultTimes)
	for i, dl := range rep.Deliveries {
		require.Equal(t, i+1, dl.N)
	}
	require.Equal(t, deduptest.DefaultTimes, rep.Acked)
	require.Equal(t, 1, rep.Runs)
	require.Equal(t, "5 deliveries: 5 acked, 0 nacked; the handler ran 1 time", rep.String())
}
