package natstests

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	tt "github.com/inboxmill/inboxmill/tests/internal/transporttest"
	"github.com/inboxmill/inboxmill/tests/testdb"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

// TestCloseMidStream closes routers on the tests' subscriber while
// JetStream is still delivering to them, round after round, and then
// requires every message to have been handled and acked by someone.
//
// A router's Close cancels the context it subscribed with and closes the
// subscriber at about the same moment. watermill-nats v2.2.0's subscriber
// closes its output channel as soon as either happens, while its NATS
// callbacks may be sending on that channel: under -race that is a
// reported race, and at worst a panic (send on closed channel) in a NATS
// callback goroutine, which takes the process down. drainFirst must make
// neither possible, and must lose nothing: what arrives after Close began
// is nacked and redelivered to the next round.
func TestCloseMidStream(t *testing.T) {
	t.Parallel()
	const (
		messages = 3000
		rounds   = 6
	)
	s := tt.Spec{
		Consumer: "closer", Topic: testdb.UniqueName("close"), Group: testdb.UniqueName("closers"),
		RedeliverAfter: 2 * time.Second,
	}
	transport{}.Provision(t, s)
	publishSeqs(t, s.Topic, messages)

	var (
		mu      sync.Mutex
		handled = make(map[int]int, messages) // seq -> deliveries handled
	)
	handledCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(handled)
	}
	// start runs a router on a new subscriber of the group; it counts what
	// its handler acks in seen.
	start := func(seen *atomic.Int64) (stop func() error) {
		t.Helper()
		sub, err := transport{}.NewSubscriber(s)
		require.NoError(t, err)
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, watermill.NopLogger{})
		require.NoError(t, err)
		router.AddConsumerHandler("close_mid_stream", s.Topic, sub, func(m *message.Message) error {
			seq, err := strconv.Atoi(m.Metadata.Get(tt.MetaSeq))
			if err != nil {
				return fmt.Errorf("message without a seq: %w", err)
			}
			mu.Lock()
			handled[seq]++
			mu.Unlock()
			seen.Add(1)
			return nil
		})
		done := make(chan error, 1)
		go func() { done <- router.Run(context.Background()) }()
		<-router.Running()
		// The router closes the subscriber without waiting for it; Close
		// again to wait for the drain (and see its error).
		return func() error { return errors.Join(router.Close(), <-done, sub.Close()) }
	}

	for r := range rounds {
		// Close while messages are in flight: once this round has handled
		// some of them, or when none is left to hand out.
		var seen atomic.Int64
		stop := start(&seen)
		closeAfter := int64(150 + r*100)
		testkit.WaitFor(t, 45*time.Second, fmt.Sprintf("round %d to handle %d messages", r, closeAfter), func() (bool, error) {
			if seen.Load() >= closeAfter || handledCount() == messages {
				return true, nil
			}
			return false, fmt.Errorf("seen %d, handled %d, %s", seen.Load(), handledCount(), consumerState(t, s))
		})
		require.NoError(t, stop(), "round %d", r)
	}
	// The last router runs until the group has nothing left: whatever the
	// closes nacked, or left unacked for AckWait, comes back to it.
	var seen atomic.Int64
	stop := start(&seen)
	testkit.WaitFor(t, 60*time.Second, "every message handled and acked", func() (bool, error) {
		n, err := transport{}.Backlog(t.Context(), s)
		if err != nil || n > 0 || handledCount() < messages {
			return false, fmt.Errorf("handled %d: %s (%v)", handledCount(), consumerState(t, s), err)
		}
		return true, nil
	})
	require.NoError(t, stop())

	mu.Lock()
	defer mu.Unlock()
	for seq := 1; seq <= messages; seq++ {
		require.NotZero(t, handled[seq], "message %d was never handled", seq)
	}
	require.Len(t, handled, messages, "handled messages nobody published")
}

// publishSeqs publishes n messages to subject, numbered 1 to n in their
// seq metadata, and waits until the stream holds them all.
func publishSeqs(t *testing.T, subject string, n int) {
	t.Helper()
	nc, js := connect(t)
	defer nc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	for seq := 1; seq <= n; seq++ {
		m := nats.NewMsg(subject)
		m.Data = []byte(`{"n":` + strconv.Itoa(seq) + `}`)
		m.Header.Set("_watermill_message_uuid", watermill.NewUUID())
		m.Header.Set(tt.MetaSeq, strconv.Itoa(seq))
		_, err := js.PublishMsgAsync(m)
		require.NoError(t, err)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatalf("the stream did not confirm %d publishes within 60s", n)
	}
}

// consumerState describes the group's durable consumer, for a failure
// message.
func consumerState(t *testing.T, s tt.Spec) string {
	nc, js := connect(t)
	defer nc.Close()
	c, err := js.Consumer(t.Context(), s.Topic, s.Group)
	if err != nil {
		return err.Error()
	}
	info, err := c.Info(t.Context())
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("pending %d, ack pending %d, redelivered %d, waiting %d", info.NumPending, info.NumAckPending, info.NumRedelivered, info.NumWaiting)
}
