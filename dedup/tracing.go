package dedup

import (
	"context"
	"reflect"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// tracerName is the instrumentation scope of the middleware's spans.
const tracerName = "github.com/inboxmill/inboxmill/dedup"

// The spans of a delivery: one for the delivery, and one per phase below it.
const (
	spanDelivery = "inboxmill.delivery"
	spanClaim    = "inboxmill.claim"
	spanHandler  = "inboxmill.handler"
	spanCommit   = "inboxmill.commit"
	spanReserve  = "inboxmill.reserve"
	spanComplete = "inboxmill.complete"
	spanPend     = "inboxmill.pend"
	spanFail     = "inboxmill.fail"
	spanRelease  = "inboxmill.release"
)

// The attributes of the spans. The key is only ever a digest.
const (
	attrOperation = attribute.Key("inboxmill.operation")
	attrKeyDigest = attribute.Key("inboxmill.key_digest")
	attrOutcome   = attribute.Key("inboxmill.outcome")
	attrAttempt   = attribute.Key("inboxmill.attempt")
	attrMode      = attribute.Key("inboxmill.mode")
	attrReadFirst = attribute.Key("inboxmill.read_first")
	attrJoined    = attribute.Key("inboxmill.joined")
	attrTakeover  = attribute.Key("inboxmill.takeover")
	// attrGroupMembers is how many deliveries shared a grouped claim or
	// commit.
	attrGroupMembers = attribute.Key("inboxmill.group_members")
	attrMessageID    = attribute.Key("messaging.message.id")
)

// phaseClaimed is the outcome of a claim or reservation that made the
// intent this delivery's: the delivery goes on to the handler.
const phaseClaimed = "claimed"

// phaseFollows is the outcome of a grouped claim whose key an earlier
// member of the same group claimed: the delivery waits for that member's
// commit and replays its output.
const phaseFollows = "follows"

// tracing makes a delivery's spans, or nothing at all when no provider is
// installed.
type tracing struct {
	tracer trace.Tracer // nil: never any spans
	// idle is the global provider as found by New while it still only
	// delegates (no otel.SetTracerProvider yet). As long as it is what
	// otel.GetTracerProvider returns, spans would be dropped: the
	// middleware skips them, and the context values and allocations they
	// cost. Once a provider is installed, the tracer delegates to it.
	idle trace.TracerProvider
}

func newTracing(tp trace.TracerProvider) tracing {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if _, ok := tp.(noop.TracerProvider); ok {
		return tracing{}
	}
	t := tracing{tracer: tp.Tracer(tracerName)}
	if isGlobalDelegate(tp) {
		t.idle = tp
	}
	return t
}

// isGlobalDelegate reports whether tp is the provider otel.GetTracerProvider
// returns before one is installed. Should the check ever miss (otel moved
// it), spans are made regardless: correct, only not free.
func isGlobalDelegate(tp trace.TracerProvider) bool {
	t := reflect.TypeOf(tp)
	return t.Kind() == reflect.Pointer && t.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global"
}

func (t *tracing) on() bool {
	// Interfaces of different dynamic types compare unequal without
	// panicking; idle's is a pointer.
	return t.tracer != nil && (t.idle == nil || otel.GetTracerProvider() != t.idle)
}

// span is one span of a delivery; the zero value (tracing off) does nothing.
type span struct {
	s trace.Span
	// delivery is the delivery's span, which a phase's attempt is copied to.
	delivery trace.Span
}

// startDelivery begins the delivery's span, parented on the span in the
// message's context or else on the trace context the global propagator
// finds in its metadata (a W3C traceparent, with
// propagation.TraceContext installed), and puts it in the message's
// context, where the phases find it. The caller puts the context back.
func (d *Deduplicator) startDelivery(msg *message.Message) span {
	if !d.trace.on() {
		return span{}
	}
	ctx := msg.Context()
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = otel.GetTextMapPropagator().Extract(ctx, propagation.MapCarrier(msg.Metadata))
	}
	mode := Transactional{}.modeName()
	if d.rs != nil {
		mode = d.rs.modeName()
	}
	ctx, s := d.trace.tracer.Start(ctx, spanDelivery, trace.WithAttributes(
		attrMode.String(mode), attrMessageID.String(msg.UUID)))
	msg.SetContext(context.WithValue(ctx, deliverySpanKey, s))
	return span{s: s}
}

// endDelivery ends the delivery's span with its outcome and identity.
func (s span) endDelivery(id identity, o Outcome, err error) {
	if s.s == nil {
		return
	}
	if s.s.IsRecording() {
		s.s.SetAttributes(attrOperation.String(id.Operation), attrKeyDigest.String(id.digest), attrOutcome.String(string(o)))
	}
	s.end("", 0, err)
}

// startPhase begins the phase name of a delivery below ctx, which carries
// the delivery's span.
func (d *Deduplicator) startPhase(ctx context.Context, name string, id identity) (context.Context, span) {
	if !d.trace.on() {
		return ctx, span{}
	}
	delivery, _ := ctx.Value(deliverySpanKey).(trace.Span)
	ctx, s := d.trace.tracer.Start(ctx, name, trace.WithAttributes(
		attrOperation.String(id.Operation), attrKeyDigest.String(id.digest)))
	return ctx, span{s: s, delivery: delivery}
}

// setBool adds an attribute to a span still open. The attribute is built
// only for a span that records: a variadic argument would cost an
// allocation on every delivery, traced or not.
func (s span) setBool(k attribute.Key, v bool) {
	if s.s != nil && s.s.IsRecording() {
		s.s.SetAttributes(k.Bool(v))
	}
}

// setInt is setBool for an integer attribute.
func (s span) setInt(k attribute.Key, v int64) {
	if s.s != nil && s.s.IsRecording() {
		s.s.SetAttributes(k.Int64(v))
	}
}

// endHandler ends a handler phase with the outcome its error leads to.
func (s span) endHandler(attempt int64, err error) {
	if err != nil {
		s.end(string(handlerOutcome(err)), attempt, err)
		return
	}
	s.end(string(OutcomeExecuted), attempt, nil)
}

// setDeliveryBool adds an attribute to the delivery's span in ctx, if any.
func setDeliveryBool(ctx context.Context, k attribute.Key, v bool) {
	if s, ok := ctx.Value(deliverySpanKey).(trace.Span); ok && s.IsRecording() {
		s.SetAttributes(k.Bool(v))
	}
}

// end ends the span with the phase's outcome, the record's attempt (when
// known, > 0) and the phase's error, which marks the span as failed. The
// error text is the middleware's (which names keys by digest only) or the
// handler's own.
func (s span) end(outcome string, attempt int64, err error) {
	if s.s == nil {
		return
	}
	if s.s.IsRecording() {
		if outcome != "" {
			s.s.SetAttributes(attrOutcome.String(outcome))
		}
		if attempt > 0 {
			s.s.SetAttributes(attrAttempt.Int64(attempt))
			if s.delivery != nil {
				s.delivery.SetAttributes(attrAttempt.Int64(attempt))
			}
		}
		if err != nil {
			s.s.RecordError(err)
			s.s.SetStatus(codes.Error, err.Error())
		}
	}
	s.s.End()
}
