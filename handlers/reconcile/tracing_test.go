package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmill/inboxmill/handlers/reconcile"
	"github.com/inboxmill/inboxmill/inbox"
)

func spanAttrs(s sdktrace.ReadOnlySpan) map[string]any {
	m := map[string]any{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

// TestReconcilerTracing: a pass is a span, each record a child span whose
// context Resolve gets, with the verdict; keys appear as digests only.
func TestReconcilerTracing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "inbox")
	e.pending("pay-ok-secret", "ch_1")
	e.pending("pay-down-secret", "")
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	var inResolve []trace.SpanContext
	r := e.reconciler(reconcile.Config{Logger: watermill.NopLogger{}, TracerProvider: tp,
		Resolve: func(ctx context.Context, rec *inbox.Record) (reconcile.Resolution, error) {
			inResolve = append(inResolve, trace.SpanContextFromContext(ctx))
			if rec.ExternalRef == "" {
				return reconcile.Resolution{}, errors.New("provider unreachable")
			}
			return reconcile.Resolution{Verdict: reconcile.Succeeded}, nil
		}})
	rep, err := r.RunOnce(e.ctx)
	require.NoError(t, err)
	require.Equal(t, 2, rep.Examined)

	spans := rec.Ended()
	require.Len(t, spans, 3)
	pass := spans[2]
	require.Equal(t, "inboxmill.reconcile", pass.Name())
	pa := spanAttrs(pass)
	require.Equal(t, "inbox", pa["inboxmill.table"])
	require.Equal(t, int64(2), pa["inboxmill.examined"])
	require.Equal(t, int64(1), pa["inboxmill.resolved"])
	require.Equal(t, int64(1), pa["inboxmill.unresolved"])

	verdicts := map[string]sdktrace.ReadOnlySpan{}
	for i, s := range spans[:2] {
		require.Equal(t, "inboxmill.resolve", s.Name())
		require.Equal(t, pass.SpanContext().SpanID(), s.Parent().SpanID())
		require.Equal(t, s.SpanContext(), inResolve[i], "Resolve runs in the record's span")
		a := spanAttrs(s)
		require.Equal(t, "charge", a["inboxmill.operation"])
		require.Equal(t, int64(1), a["inboxmill.attempt"])
		require.Equal(t, "pending", a["inboxmill.status"])
		require.NotContains(t, fmt.Sprint(s.Attributes(), s.Events(), s.Status()), "secret", "keys only as digests")
		verdicts[a["inboxmill.verdict"].(string)] = s
	}
	ok := verdicts["succeeded"]
	require.NotNil(t, ok)
	require.Equal(t, inbox.ID{Operation: "charge", Key: "pay-ok-secret"}.Digest(), spanAttrs(ok)["inboxmill.key_digest"])
	require.NotEqual(t, codes.Error, ok.Status().Code)
	down := verdicts["unresolved"]
	require.NotNil(t, down)
	require.Equal(t, codes.Error, down.Status().Code, "the failed lookup marks the record's span")
	require.Equal(t, "provider unreachable", down.Status().Description)
}
