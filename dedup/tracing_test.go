package dedup_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

const tracedKey = "order-7781-secret" // never to appear in a span

// traced is a middleware whose spans a recorder keeps.
type traced struct {
	rec   *tracetest.SpanRecorder
	tp    *sdktrace.TracerProvider
	d     *dedup.Deduplicator
	store *inbox.Store
	clk   *testkit.Clock
}

func setupTraced(t *testing.T, cfg dedup.Config) *traced {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	store, clk := reserveStore(t)
	if cfg.Key == nil {
		cfg.Key = dedup.KeyFromMetadata("event_id")
	}
	if cfg.Operation == "" {
		cfg.Operation = "charge"
	}
	cfg.Logger = watermill.NopLogger{}
	cfg.TracerProvider = tp
	d, err := dedup.New(store, cfg)
	require.NoError(t, err)
	return &traced{rec: rec, tp: tp, d: d, store: store, clk: clk}
}

// deliver runs one delivery of payload under tracedKey and returns the
// spans it ended, oldest first.
func (tr *traced) deliver(t *testing.T, h message.HandlerFunc, payload string) ([]sdktrace.ReadOnlySpan, error) {
	t.Helper()
	return tr.deliverMsg(t, h, obsMsg(tracedKey, payload))
}

func (tr *traced) deliverMsg(t *testing.T, h message.HandlerFunc, msg *message.Message) ([]sdktrace.ReadOnlySpan, error) {
	t.Helper()
	before := len(tr.rec.Ended())
	orig := msg.Context()
	_, err := tr.d.Middleware(h)(msg)
	require.Equal(t, orig, msg.Context(), "the message leaves with the context it came with")
	spans := tr.rec.Ended()[before:]
	requireNoKey(t, spans)
	return spans, err
}

// requireNoKey checks that no span names the raw key, in attributes,
// events or status.
func requireNoKey(t *testing.T, spans []sdktrace.ReadOnlySpan) {
	t.Helper()
	for _, s := range spans {
		text := fmt.Sprint(s.Name(), s.Attributes(), s.Events(), s.Status())
		require.NotContains(t, text, tracedKey, "span %s", s.Name())
	}
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name()
	}
	return out
}

func attrs(s sdktrace.ReadOnlySpan) map[string]any {
	m := map[string]any{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

// requireDelivery checks the shape every delivery's spans have: the
// delivery's span ends last, and every other span is its child; it returns
// the spans by name.
func requireDelivery(t *testing.T, spans []sdktrace.ReadOnlySpan, mode string, outcome dedup.Outcome, attempt int64) map[string]sdktrace.ReadOnlySpan {
	t.Helper()
	require.NotEmpty(t, spans)
	delivery := spans[len(spans)-1]
	require.Equal(t, "inboxmill.delivery", delivery.Name())
	a := attrs(delivery)
	require.Equal(t, mode, a["inboxmill.mode"])
	require.Equal(t, string(outcome), a["inboxmill.outcome"])
	require.Equal(t, "charge", a["inboxmill.operation"])
	require.Equal(t, inbox.ID{Operation: "charge", Key: tracedKey}.Digest(), a["inboxmill.key_digest"])
	require.NotEmpty(t, a["messaging.message.id"])
	if attempt > 0 {
		require.Equal(t, attempt, a["inboxmill.attempt"])
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans[:len(spans)-1] {
		require.Equal(t, delivery.SpanContext().SpanID(), s.Parent().SpanID(), "%s is a phase of the delivery", s.Name())
		require.Equal(t, delivery.SpanContext().TraceID(), s.SpanContext().TraceID())
		pa := attrs(s)
		require.Equal(t, "charge", pa["inboxmill.operation"], s.Name())
		require.Equal(t, a["inboxmill.key_digest"], pa["inboxmill.key_digest"], s.Name())
		byName[s.Name()] = s
	}
	return byName
}

func requirePhase(t *testing.T, s sdktrace.ReadOnlySpan, outcome string, attempt int64, failed bool) {
	t.Helper()
	require.NotNil(t, s)
	a := attrs(s)
	require.Equal(t, outcome, a["inboxmill.outcome"], s.Name())
	if attempt > 0 {
		require.Equal(t, attempt, a["inboxmill.attempt"], s.Name())
	}
	if failed {
		require.Equal(t, codes.Error, s.Status().Code, s.Name())
		require.NotEmpty(t, s.Events(), "%s records its error", s.Name())
	} else {
		require.NotEqual(t, codes.Error, s.Status().Code, "%s: %v", s.Name(), s.Status())
	}
}

func TestTracingTransactional(t *testing.T) {
	t.Parallel()
	tr := setupTraced(t, dedup.Config{Mode: dedup.Transactional{ReadFirst: dedup.ReadFirstNever}})
	var inHandler trace.SpanContext
	h := func(msg *message.Message) ([]*message.Message, error) {
		// The handler's own spans (and an instrumented driver's) nest
		// under inboxmill.handler.
		_, s := tr.tp.Tracer("shop").Start(msg.Context(), "charge card")
		inHandler = s.SpanContext()
		s.End()
		return []*message.Message{message.NewMessage("out-1", []byte(`{}`))}, nil
	}

	spans, err := tr.deliver(t, h, `{"amount":1}`)
	require.NoError(t, err)
	require.Equal(t, []string{"inboxmill.claim", "charge card", "inboxmill.handler", "inboxmill.commit", "inboxmill.delivery"}, names(spans))
	require.Equal(t, spans[2].SpanContext().SpanID(), spans[1].Parent().SpanID(), "the handler's span is its context's")
	require.Equal(t, inHandler, spans[1].SpanContext())
	phases := requireDelivery(t, append(spans[:1:1], spans[2:]...), "transactional", dedup.OutcomeExecuted, 1)
	requirePhase(t, phases["inboxmill.claim"], "claimed", 1, false)
	requirePhase(t, phases["inboxmill.handler"], "executed", 1, false)
	requirePhase(t, phases["inboxmill.commit"], "executed", 0, false)
	require.NotContains(t, attrs(phases["inboxmill.claim"]), "inboxmill.read_first")

	t.Run("duplicate", func(t *testing.T) {
		spans, err := tr.deliver(t, h, `{ "amount": 1 }`)
		require.NoError(t, err)
		require.Equal(t, []string{"inboxmill.claim", "inboxmill.delivery"}, names(spans), "no handler span")
		phases := requireDelivery(t, spans, "transactional", dedup.OutcomeDuplicate, 1)
		requirePhase(t, phases["inboxmill.claim"], "duplicate", 1, false)
	})

	t.Run("conflict", func(t *testing.T) {
		spans, err := tr.deliver(t, h, `{"amount":2}`)
		require.ErrorIs(t, err, dedup.ErrPayloadConflict)
		require.Equal(t, []string{"inboxmill.claim", "inboxmill.delivery"}, names(spans))
		phases := requireDelivery(t, spans, "transactional", dedup.OutcomeConflict, 0)
		requirePhase(t, phases["inboxmill.claim"], "conflict", 0, true)
		require.Equal(t, codes.Error, spans[1].Status().Code, "the delivery failed")
	})
}

func TestTracingTransactionalReadFirstDuplicate(t *testing.T) {
	t.Parallel()
	tr := setupTraced(t, dedup.Config{Mode: dedup.Transactional{ReadFirst: dedup.ReadFirstAlways}})
	spans, err := tr.deliver(t, noopHandler, `{"amount":1}`)
	require.NoError(t, err)
	require.Equal(t, []string{"inboxmill.claim", "inboxmill.claim", "inboxmill.handler", "inboxmill.commit", "inboxmill.delivery"}, names(spans))
	requirePhase(t, spans[0], "undecided", 0, false)
	require.Equal(t, true, attrs(spans[0])["inboxmill.read_first"], "the read first is a claim span of its own")

	spans, err = tr.deliver(t, noopHandler, `{"amount":1}`)
	require.NoError(t, err)
	require.Equal(t, []string{"inboxmill.claim", "inboxmill.delivery"}, names(spans), "a duplicate found by reading: no handler span")
	phases := requireDelivery(t, spans, "transactional", dedup.OutcomeDuplicate, 1)
	requirePhase(t, phases["inboxmill.claim"], "duplicate", 1, false)
	require.Equal(t, true, attrs(phases["inboxmill.claim"])["inboxmill.read_first"])
}

func TestTracingTransactionalFailures(t *testing.T) {
	t.Parallel()
	tr := setupTraced(t, dedup.Config{})
	spans, err := tr.deliver(t, func(*message.Message) ([]*message.Message, error) {
		return nil, errors.New("downstream unavailable")
	}, `{"amount":1}`)
	require.Error(t, err)
	require.Equal(t, []string{"inboxmill.claim", "inboxmill.handler", "inboxmill.delivery"}, names(spans), "nothing to commit")
	phases := requireDelivery(t, spans, "transactional", dedup.OutcomeRetry, 1)
	requirePhase(t, phases["inboxmill.handler"], "retry", 1, true)
	require.Equal(t, "downstream unavailable", phases["inboxmill.handler"].Status().Description)

	spans, err = tr.deliver(t, func(*message.Message) ([]*message.Message, error) {
		return nil, dedup.Permanent(errors.New("card declined"))
	}, `{"amount":1}`)
	require.True(t, dedup.IsPoison(err))
	require.Equal(t, []string{"inboxmill.claim", "inboxmill.handler", "inboxmill.fail", "inboxmill.delivery"}, names(spans))
	phases = requireDelivery(t, spans, "transactional", dedup.OutcomeFailed, 1)
	requirePhase(t, phases["inboxmill.handler"], "failed", 1, true)
	requirePhase(t, phases["inboxmill.fail"], "failed", 1, false)
}

// TestTracingJoined: in a joined consuming transaction the transport
// commits; the commit span covers storing the output and releasing the
// savepoint.
func TestTracingJoined(t *testing.T) {
	t.Parallel()
	var tx *sql.Tx
	tr := setupTraced(t, dedup.Config{Mode: dedup.Transactional{
		JoinTx: func(context.Context) (*sql.Tx, bool) { return tx, tx != nil },
	}})
	var err error
	tx, err = tr.store.DB().BeginTx(context.Background(), nil)
	require.NoError(t, err)
	dedup.RegisterConsumingTx(tx) // as the transport that began it does
	defer func() { _ = tx.Rollback() }()
	spans, err := tr.deliver(t, noopHandler, `{"amount":1}`)
	require.NoError(t, err)
	require.Equal(t, []string{"inboxmill.claim", "inboxmill.handler", "inboxmill.commit", "inboxmill.delivery"}, names(spans))
	requireDelivery(t, spans, "transactional", dedup.OutcomeExecuted, 1)
	require.Equal(t, true, attrs(spans[3])["inboxmill.joined"])
}

func TestTracingReserve(t *testing.T) {
	t.Parallel()
	tr := setupTraced(t, dedup.Config{Mode: dedup.Reserve{InFlightWait: -1}})
	spans, err := tr.deliver(t, noopHandler, `{"amount":1}`)
	require.NoError(t, err)
	require.Equal(t, []string{"inboxmill.reserve", "inboxmill.handler", "inboxmill.complete", "inboxmill.delivery"}, names(spans))
	phases := requireDelivery(t, spans, "reserve", dedup.OutcomeExecuted, 1)
	requirePhase(t, phases["inboxmill.reserve"], "claimed", 1, false)
	require.Equal(t, false, attrs(phases["inboxmill.reserve"])["inboxmill.takeover"])
	requirePhase(t, phases["inboxmill.handler"], "executed", 1, false)
	requirePhase(t, phases["inboxmill.complete"], "executed", 1, false)

	spans, err = tr.deliver(t, noopHandler, `{"amount":1}`)
	require.NoError(t, err)
	require.Equal(t, []string{"inboxmill.reserve", "inboxmill.delivery"}, names(spans), "a duplicate: no handler span")
	phases = requireDelivery(t, spans, "reserve", dedup.OutcomeDuplicate, 1)
	requirePhase(t, phases["inboxmill.reserve"], "duplicate", 1, false)
}

func TestTracingReserveOutcomes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		err     error
		phase   string
		outcome dedup.Outcome
	}{
		{name: "uncertain", err: dedup.Uncertain(errors.New("timeout"), "ref-1"), phase: "inboxmill.pend", outcome: dedup.OutcomePending},
		{name: "permanent", err: dedup.Permanent(errors.New("declined")), phase: "inboxmill.fail", outcome: dedup.OutcomeFailed},
		{name: "transient", err: errors.New("503"), phase: "inboxmill.release", outcome: dedup.OutcomeRetry},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tr := setupTraced(t, dedup.Config{Mode: dedup.Reserve{InFlightWait: -1}})
			spans, err := tr.deliver(t, func(*message.Message) ([]*message.Message, error) { return nil, tt.err }, `{}`)
			require.Error(t, err)
			require.Equal(t, []string{"inboxmill.reserve", "inboxmill.handler", tt.phase, "inboxmill.delivery"}, names(spans))
			phases := requireDelivery(t, spans, "reserve", tt.outcome, 1)
			requirePhase(t, phases["inboxmill.handler"], string(tt.outcome), 1, true)
			requirePhase(t, phases[tt.phase], string(tt.outcome), 1, false)
		})
	}
}

func TestTracingReserveTakeover(t *testing.T) {
	t.Parallel()
	tr := setupTraced(t, dedup.Config{Mode: dedup.Reserve{InFlightWait: -1}})
	holdLease(t, tr.store, tracedKey, `{}`, "crashed-worker", time.Second)
	tr.clk.Advance(2 * time.Second)
	spans, err := tr.deliver(t, noopHandler, `{}`)
	require.NoError(t, err)
	phases := requireDelivery(t, spans, "reserve", dedup.OutcomeExecuted, 2)
	requirePhase(t, phases["inboxmill.reserve"], "claimed", 2, false)
	require.Equal(t, true, attrs(phases["inboxmill.reserve"])["inboxmill.takeover"])
}

// TestTracingInvalidMessage: no key, no phases; the delivery's span says
// why.
func TestTracingInvalidMessage(t *testing.T) {
	t.Parallel()
	tr := setupTraced(t, dedup.Config{})
	spans, err := tr.deliverMsg(t, noopHandler, obsMsg("", `{}`))
	require.ErrorIs(t, err, dedup.ErrMissingKey)
	require.Equal(t, []string{"inboxmill.delivery"}, names(spans))
	a := attrs(spans[0])
	require.Equal(t, "invalid", a["inboxmill.outcome"])
	require.Equal(t, "", a["inboxmill.key_digest"])
	require.Equal(t, codes.Error, spans[0].Status().Code)
}

var installPropagator sync.Once

// usePropagator installs the W3C trace-context propagator globally, as an
// application does. Nothing else in these tests depends on the global
// propagator.
func usePropagator() {
	installPropagator.Do(func() { otel.SetTextMapPropagator(propagation.TraceContext{}) })
}

func TestTracingParentFromMetadata(t *testing.T) {
	t.Parallel()
	usePropagator()
	tr := setupTraced(t, dedup.Config{})
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		spanID  = "00f067aa0ba902b7"
	)
	msg := obsMsg(tracedKey, `{}`)
	msg.Metadata.Set("traceparent", "00-"+traceID+"-"+spanID+"-01")
	spans, err := tr.deliverMsg(t, noopHandler, msg)
	require.NoError(t, err)
	delivery := spans[len(spans)-1]
	require.Equal(t, traceID, delivery.SpanContext().TraceID().String())
	require.Equal(t, spanID, delivery.Parent().SpanID().String())
	require.True(t, delivery.Parent().IsRemote(), "parented on the producer's span")
	for _, s := range spans {
		require.Equal(t, traceID, s.SpanContext().TraceID().String(), s.Name())
	}
}

func TestTracingParentFromMessageContext(t *testing.T) {
	t.Parallel()
	usePropagator()
	tr := setupTraced(t, dedup.Config{})
	ctx, receive := tr.tp.Tracer("transport").Start(context.Background(), "orders receive")
	defer receive.End()
	msg := obsMsg(tracedKey, `{}`)
	msg.SetContext(ctx)
	// A traceparent in the metadata too: the context's span wins.
	msg.Metadata.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	spans, err := tr.deliverMsg(t, noopHandler, msg)
	require.NoError(t, err)
	delivery := spans[len(spans)-1]
	require.Equal(t, receive.SpanContext().SpanID(), delivery.Parent().SpanID())
	require.Equal(t, receive.SpanContext().TraceID(), delivery.SpanContext().TraceID())
}

// TestTracingNewTraceWithoutParent: a message carrying no trace starts
// one, with the phases still below the delivery.
func TestTracingNewTraceWithoutParent(t *testing.T) {
	t.Parallel()
	tr := setupTraced(t, dedup.Config{})
	spans, err := tr.deliver(t, noopHandler, `{}`)
	require.NoError(t, err)
	delivery := spans[len(spans)-1]
	require.False(t, delivery.Parent().IsValid(), "a root span")
	requireDelivery(t, spans, "transactional", dedup.OutcomeExecuted, 1)
}

// TestTracingGlobalProviderInstalledLater runs in a process of its own,
// since it installs the global provider: a middleware created with the
// default TracerProvider makes no spans before the application installs
// one, and makes them after, without being created again.
func TestTracingGlobalProviderInstalledLater(t *testing.T) {
	t.Parallel()
	if os.Getenv("INBOXMILL_TRACING_CHILD") != "1" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestTracingGlobalProviderInstalledLater$", "-test.count=1")
		cmd.Env = append(os.Environ(), "INBOXMILL_TRACING_CHILD=1")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "PASS")
		return
	}
	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "charge",
		Logger: watermill.NopLogger{}})
	require.NoError(t, err)
	h := d.Middleware(noopHandler)

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	_, err = h(obsMsg("before", `{}`))
	require.NoError(t, err)
	require.Empty(t, rec.Ended())

	otel.SetTracerProvider(tp)
	_, err = h(obsMsg("after", `{}`))
	require.NoError(t, err)
	require.Equal(t, []string{"inboxmill.claim", "inboxmill.handler", "inboxmill.commit", "inboxmill.delivery"}, names(rec.Ended()))
	require.True(t, strings.HasPrefix(rec.Ended()[0].InstrumentationScope().Name, "github.com/inboxmill/inboxmill/dedup"))
}

// A grouped delivery's trace has the phases of an ungrouped one: the
// claim and the commit it shared, with the number of members that shared
// them, and its own handler.
func TestTracingGroup(t *testing.T) {
	t.Parallel()
	tr := setupTraced(t, dedup.Config{Mode: dedup.Transactional{Group: &dedup.Group{MaxLinger: time.Second, Coordinators: 1}}})
	// The first delivery takes the one coordinator alone and holds it
	// until the others have formed a group behind it.
	release := make(chan struct{})
	h := tr.d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		if msg.Metadata.Get("event_id") == "k-0" {
			<-release
		}
		return nil, nil
	})
	keys := []string{"k-1", "k-2", "k-3", "k-4"}
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := h(obsMsg("k-0", `{"amount":1}`))
		require.NoError(t, err)
	})
	require.Eventually(t, func() bool { return tr.d.GroupStats().Solo == 1 }, 10*time.Second, time.Millisecond)
	for _, k := range keys {
		wg.Go(func() {
			_, err := h(obsMsg(k, `{"amount":1}`))
			require.NoError(t, err)
		})
	}
	require.Eventually(t, func() bool { return tr.d.GroupStats().Waiting == len(keys) }, 10*time.Second, time.Millisecond)
	close(release)
	wg.Wait()
	byTrace := map[trace.TraceID][]sdktrace.ReadOnlySpan{}
	for _, s := range tr.rec.Ended() {
		byTrace[s.SpanContext().TraceID()] = append(byTrace[s.SpanContext().TraceID()], s)
	}
	require.Len(t, byTrace, len(keys)+1, "one trace per delivery")
	for id, spans := range byTrace {
		if _, grouped := attrs(spans[0])["inboxmill.group_members"]; !grouped {
			// The delivery that ran alone: an ungrouped trace.
			require.Equal(t, []string{"inboxmill.claim", "inboxmill.handler", "inboxmill.commit", "inboxmill.delivery"}, names(spans))
			delete(byTrace, id)
		}
	}
	require.Len(t, byTrace, len(keys), "the others shared one group")
	for _, spans := range byTrace {
		require.Equal(t, []string{"inboxmill.claim", "inboxmill.handler", "inboxmill.commit", "inboxmill.delivery"}, names(spans))
		delivery := spans[3]
		require.Equal(t, string(dedup.OutcomeExecuted), attrs(delivery)["inboxmill.outcome"])
		for _, s := range spans[:3] {
			require.Equal(t, delivery.SpanContext().SpanID(), s.Parent().SpanID(), "%s is a phase of the delivery", s.Name())
			require.Equal(t, attrs(delivery)["inboxmill.key_digest"], attrs(s)["inboxmill.key_digest"])
		}
		requirePhase(t, spans[0], "claimed", 1, false)
		requirePhase(t, spans[1], "executed", 1, false)
		requirePhase(t, spans[2], "executed", 0, false)
		members := attrs(spans[0])["inboxmill.group_members"]
		require.NotNil(t, members, "the claim says how many shared it")
		require.Equal(t, members, attrs(spans[2])["inboxmill.group_members"], "so does the commit")
	}

	t.Run("a later duplicate is answered by the claim alone", func(t *testing.T) {
		spans, err := tr.deliverMsg(t, h, obsMsg("k-1", `{"amount":1}`))
		require.NoError(t, err)
		require.Equal(t, []string{"inboxmill.claim", "inboxmill.delivery"}, names(spans))
		requirePhase(t, spans[0], "duplicate", 1, false)
	})
}
