package reconcile

import (
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the reconciler's spans.
const tracerName = "github.com/inboxmill/inboxmill/handlers/reconcile"

const (
	spanPass    = "inboxmill.reconcile"
	spanResolve = "inboxmill.resolve"
)

// The attributes of the spans; keys are named by their digest only, as in
// package dedup's spans.
const (
	attrTable      = attribute.Key("inboxmill.table")
	attrOperation  = attribute.Key("inboxmill.operation")
	attrKeyDigest  = attribute.Key("inboxmill.key_digest")
	attrAttempt    = attribute.Key("inboxmill.attempt")
	attrStatus     = attribute.Key("inboxmill.status")
	attrVerdict    = attribute.Key("inboxmill.verdict")
	attrExamined   = attribute.Key("inboxmill.examined")
	attrResolved   = attribute.Key("inboxmill.resolved")
	attrUnresolved = attribute.Key("inboxmill.unresolved")
	attrGaveUp     = attribute.Key("inboxmill.gave_up")
)

// endPass ends a pass's span with what the pass did.
func endPass(span trace.Span, rep Report, err error) {
	if span.IsRecording() {
		resolved := 0
		for _, n := range rep.Resolved {
			resolved += n
		}
		span.SetAttributes(attrExamined.Int(rep.Examined), attrResolved.Int(resolved),
			attrUnresolved.Int(rep.Unresolved), attrGaveUp.Int(rep.GaveUp))
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}

// endResolve ends a record's span with its verdict; a record someone else
// moved first is "moved", not a failure.
func endResolve(span trace.Span, v Verdict, err error) {
	if span.IsRecording() {
		switch {
		case errors.Is(err, errMoved):
			span.SetAttributes(attrVerdict.String("moved"))
		case err != nil:
			span.SetAttributes(attrVerdict.String(v.String()))
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		default:
			span.SetAttributes(attrVerdict.String(v.String()))
		}
	}
	span.End()
}
