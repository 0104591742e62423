package dedup

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/inboxmill/inboxmill/inbox"
)

// TestTracingOffCostsNoAllocation: until the application installs a
// provider (this test binary never installs one; the test that does runs
// in a process of its own), and with a no-op provider, a delivery's spans
// cost no allocation at all. Not parallel: AllocsPerRun counts the whole
// process's allocations.
func TestTracingOffCostsNoAllocation(t *testing.T) {
	require.True(t, isGlobalDelegate(otel.GetTracerProvider()), "the global provider is recognised while it delegates")
	require.False(t, isGlobalDelegate(noop.NewTracerProvider()))

	full := inbox.ID{Operation: "op", Key: "k"}
	id := identity{ID: full, digest: full.Digest()}
	boom := errors.New("boom")
	for name, tp := range map[string]*tracing{"default": ptr(newTracing(nil)), "noop": ptr(newTracing(noop.NewTracerProvider()))} {
		t.Run(name, func(t *testing.T) {
			require.False(t, tp.on())
			d := &Deduplicator{trace: *tp}
			msg := message.NewMessage("uuid-1", nil)
			allocs := testing.AllocsPerRun(200, func() {
				ds := d.startDelivery(msg)
				ctx, sp := d.startPhase(msg.Context(), spanClaim, id)
				sp.setBool(attrReadFirst, true)
				setDeliveryBool(ctx, attrJoined, true)
				sp.end(phaseClaimed, 1, nil)
				_, sp = d.startPhase(ctx, spanHandler, id)
				sp.end(string(OutcomeRetry), 1, boom)
				ds.endDelivery(id, OutcomeRetry, boom)
			})
			require.Zero(t, allocs)
		})
	}
}

func ptr[T any](v T) *T { return &v }
