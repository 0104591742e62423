package deduptest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
)

// Odd but legal values a handler may hand back: text with a NUL byte and
// with bytes that are not UTF-8 (PostgreSQL refuses both in text columns),
// a reference longer than the column, an output larger than MariaDB's
// default packet.
const (
	textWithNUL   = "provider said: timeout\x00after sending"
	textNotUTF8   = "provider said: \xff\xfe gateway"
	bigOutputSize = 20 << 20
)

var longRef = "ch_" + strings.Repeat("x", 300)

// runStorable checks that what a handler returns never makes the
// outcome's record fail: a record left processing would be taken over and
// its effect run again once the lease expires, every time, since the
// failure is deterministic.
func runStorable(t *testing.T, h Harness) {
	reserveCases := []struct {
		name   string
		result func(claim dedup.Claim) ([]*message.Message, error)
		want   inbox.Status
	}{
		{"UncertainWithNULInErrorAndRef", func(dedup.Claim) ([]*message.Message, error) {
			return nil, dedup.Uncertain(errors.New(textWithNUL), "ref\x00with-nul")
		}, inbox.StatusPending},
		{"UncertainWithInvalidUTF8", func(dedup.Claim) ([]*message.Message, error) {
			return nil, dedup.Uncertain(errors.New(textNotUTF8), "ref-\xff")
		}, inbox.StatusPending},
		{"UncertainWithARefLongerThanTheColumn", func(dedup.Claim) ([]*message.Message, error) {
			return nil, dedup.Uncertain(errors.New("timeout"), longRef)
		}, inbox.StatusPending},
		{"PermanentWithNULAndInvalidUTF8", func(dedup.Claim) ([]*message.Message, error) {
			return nil, dedup.Permanent(errors.New(textWithNUL + textNotUTF8))
		}, inbox.StatusFailed},
		{"SuccessWithAnOutputTooLargeToStore", func(dedup.Claim) ([]*message.Message, error) {
			return []*message.Message{message.NewMessage("out-1", make([]byte, bigOutputSize))}, nil
		}, inbox.StatusCompleted},
	}
	for _, tc := range reserveCases {
		t.Run("Reserve/"+tc.name, func(t *testing.T) {
			t.Parallel()
			r := setupReserve(t, h)
			const lease = time.Minute
			d := r.dedup(t, dedup.Config{}, dedup.Reserve{Lease: lease, HeartbeatInterval: -1, InFlightWait: -1, AckPending: true})
			h := func(msg *message.Message) ([]*message.Message, error) {
				r.calls.Add(1)
				claim, _ := dedup.ClaimFromContext(msg.Context())
				r.charge(claim)
				return tc.result(claim)
			}
			_, _ = d.Middleware(h)(event("pay-odd", `{"amount":1}`))
			rec := r.record(t, "pay-odd")
			require.Equal(t, tc.want, rec.Status, "the outcome is recorded, in a storable form if need be (error %q)", rec.Error)
			require.Empty(t, rec.LeaseOwner, "no lease is left for a takeover to find")

			// However often it is redelivered, and however late, the
			// effect is not run again.
			for range 3 {
				r.clock.Advance(2 * lease)
				_, _ = d.Middleware(h)(event("pay-odd", `{"amount":1}`))
			}
			require.EqualValues(t, 1, r.calls.Load(), "the handler ran once")
			require.Equal(t, 1, r.totalEffects())
		})
	}

	t.Run("Transactional/PermanentWithNULAndInvalidUTF8", func(t *testing.T) {
		t.Parallel()
		m := setupMiddleware(t, h, dedup.Config{Mode: dedup.Transactional{ReadFirst: dedup.ReadFirstNever}})
		m.fail = func(int64) error { return dedup.Permanent(errors.New(textWithNUL + textNotUTF8)) }
		_, err := m.deliver(event("evt-odd", `{}`))
		require.True(t, dedup.IsPoison(err), "the permanent failure goes to the poison queue: %v", err)
		for range 3 {
			_, err := m.deliver(event("evt-odd", `{}`))
			require.NoError(t, err, "later deliveries are duplicates of the recorded failure")
		}
		require.EqualValues(t, 1, m.calls.Load(), "a recorded permanent failure is not run again")
		require.Equal(t, 0, m.countEffects(t, "evt-odd"), "its writes rolled back")
		rec := m.get(t, "record_effect", "evt-odd")
		require.Equal(t, inbox.StatusFailed, rec.Status)
	})
}
