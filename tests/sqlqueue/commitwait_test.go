package sqlqueue_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
)

// slowPastDeadline publishes one event whose first attempt outlives the
// subscriber's ack deadline: it waits until its context is done, lets the
// subscriber go on for a while, then writes its effect with a context of
// its own, as a handler that finishes what it started does.
func slowPastDeadline(t *testing.T, e *env) (h message.NoPublishHandlerFunc, first *atomic.Bool) {
	t.Helper()
	e.publishAll(t, "evt-slow")
	first = &atomic.Bool{}
	return func(msg *message.Message) error {
		if first.CompareAndSwap(false, true) {
			<-msg.Context().Done()
			time.Sleep(300 * time.Millisecond) // the subscriber moves on meanwhile
			msg.SetContext(context.WithoutCancel(msg.Context()))
		}
		return e.effect(msg)
	}, first
}

// TestJoinedCommitWaitsForTheHandler: the subscriber of
// watermillsql.NewSubscriber does not commit the consuming transaction
// under a handler that is still running, even at batch size one, so the
// inbox record never commits without the effect.
func TestJoinedCommitWaitsForTheHandler(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			h, first := slowPastDeadline(t, e)
			e.router(t, newDedup(t, e), e.batchSubscriber(t, 1, 200*time.Millisecond), h)
			require.Eventually(t, func() bool { return first.Load() && len(e.unacked(t)) == 0 }, time.Minute, 10*time.Millisecond)
			require.Equal(t, map[string]int{"evt-slow": 1}, e.effectsPerEvent(t), "the effect happened, once")
		})
	}
}
