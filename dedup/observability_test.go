package dedup_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

const (
	messagesMetric = "inboxmill_dedup_messages_total"
	claimMetric    = "inboxmill_dedup_claim_duration_seconds"
)

// metricValue returns the value of the counter (or the sample count of the
// histogram) name whose labels are exactly labels, and whether it exists.
func metricValue(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; !ok || v != lp.GetValue() {
					continue metrics
				}
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount()), true
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// counterSum adds up the counter name over every series whose label
// label is value.
func counterSum(t *testing.T, g prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

func outcomeCount(t *testing.T, g prometheus.Gatherer, op string, o dedup.Outcome) float64 {
	t.Helper()
	v, _ := metricValue(t, g, messagesMetric, map[string]string{"operation": op, "outcome": string(o)})
	return v
}

// obsMsg builds a delivery of event key with payload.
func obsMsg(key, payload string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
	if key != "" {
		msg.Metadata.Set("event_id", key)
	}
	return msg
}

func noopHandler(*message.Message) ([]*message.Message, error) { return nil, nil }

func TestMetricsCountOutcomes(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op", Registerer: reg})
	require.NoError(t, err)
	h := d.Middleware(noopHandler)

	_, err = h(obsMsg("k1", `{"a":1}`))
	require.NoError(t, err, "fresh")
	_, err = h(obsMsg("k1", `{ "a" : 1 }`))
	require.NoError(t, err, "duplicate")
	_, err = h(obsMsg("k1", `{"a":2}`))
	require.ErrorIs(t, err, dedup.ErrPayloadConflict, "conflict")
	_, err = h(obsMsg("", `{"a":1}`))
	require.ErrorIs(t, err, dedup.ErrMissingKey, "missing key")

	require.Equal(t, 1.0, outcomeCount(t, reg, "op", dedup.OutcomeExecuted))
	require.Equal(t, 1.0, outcomeCount(t, reg, "op", dedup.OutcomeDuplicate))
	require.Equal(t, 1.0, outcomeCount(t, reg, "op", dedup.OutcomeConflict))
	require.Equal(t, 1.0, counterSum(t, reg, messagesMetric, "outcome", string(dedup.OutcomeInvalid)))
	for _, o := range []dedup.Outcome{dedup.OutcomeInFlight, dedup.OutcomeRetry} {
		require.Zero(t, counterSum(t, reg, messagesMetric, "outcome", string(o)), o)
	}

	// The claim is timed for every delivery that reached the database: not
	// for the message without a key.
	n, ok := metricValue(t, reg, claimMetric, map[string]string{"operation": "op"})
	require.True(t, ok, "the claim histogram has a series for the operation")
	require.Equal(t, 3.0, n)

	require.Equal(t, dedup.Stats{Executed: 1, Duplicates: 1, Conflicts: 1, Invalid: 1}, d.Stats())
}

func TestMetricsSharedRegistry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	cfg := dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op", Registerer: reg}
	d1, err := dedup.New(store, cfg)
	require.NoError(t, err)
	d2, err := dedup.New(store, cfg)
	require.NoError(t, err, "a second middleware on the same registry is not AlreadyRegistered")
	d3, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "other", Registerer: reg})
	require.NoError(t, err)

	_, err = d1.Middleware(noopHandler)(obsMsg("k1", `{}`))
	require.NoError(t, err)
	_, err = d2.Middleware(noopHandler)(obsMsg("k2", `{}`))
	require.NoError(t, err)
	_, err = d2.Middleware(noopHandler)(obsMsg("k1", `{}`))
	require.NoError(t, err, "d2 sees d1's record: a duplicate")
	_, err = d3.Middleware(noopHandler)(obsMsg("k1", `{}`))
	require.NoError(t, err, "another operation: executed")

	require.Equal(t, 2.0, outcomeCount(t, reg, "op", dedup.OutcomeExecuted), "both middlewares count into one series")
	require.Equal(t, 1.0, outcomeCount(t, reg, "op", dedup.OutcomeDuplicate))
	require.Equal(t, 1.0, outcomeCount(t, reg, "other", dedup.OutcomeExecuted))
	n, _ := metricValue(t, reg, claimMetric, map[string]string{"operation": "op"})
	require.Equal(t, 3.0, n)
	n, _ = metricValue(t, reg, claimMetric, map[string]string{"operation": "other"})
	require.Equal(t, 1.0, n)

	require.Equal(t, dedup.Stats{Executed: 1}, d1.Stats(), "Stats are per middleware")
	require.Equal(t, dedup.Stats{Executed: 1, Duplicates: 1}, d2.Stats())
	require.Equal(t, dedup.Stats{Executed: 1}, d3.Stats())
}

func TestMetricsSharedWrappedRegisterer(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"service": "billing"}, reg)
	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	cfg := dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op", Registerer: wrapped}
	d1, err := dedup.New(store, cfg)
	require.NoError(t, err)
	d2, err := dedup.New(store, cfg)
	require.NoError(t, err)
	_, err = d1.Middleware(noopHandler)(obsMsg("k1", `{}`))
	require.NoError(t, err)
	_, err = d2.Middleware(noopHandler)(obsMsg("k2", `{}`))
	require.NoError(t, err)
	v, ok := metricValue(t, reg, messagesMetric, map[string]string{"service": "billing", "operation": "op", "outcome": "executed"})
	require.True(t, ok)
	require.Equal(t, 2.0, v)
}

func TestMetricsRegistrationConflictIsReported(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	// Someone else owns the name with other labels.
	require.NoError(t, reg.Register(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: messagesMetric, Help: "not ours",
	}, []string{"queue"})))
	d, err := dedup.New(unmigratedStore(t), dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Registerer: reg})
	require.Error(t, err)
	require.Nil(t, d)
	require.Contains(t, err.Error(), "register metrics")
	require.NotErrorIs(t, err, dedup.ErrInvalidConfig)
}

func TestMetricsRecordInFlightFailedAndTerminalRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op", Registerer: reg})
	require.NoError(t, err)
	fingerprint, err := dedup.JSONFingerprint()
	require.NoError(t, err)
	calls := 0
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		calls++
		return nil, errors.New("handler failed")
	})

	// A record another worker holds (processing, as a reserve-mode
	// middleware on the same operation would leave it) and one that failed
	// for good.
	hash, err := fingerprint(obsMsg("held", `{"n":1}`))
	require.NoError(t, err)
	_, err = store.Reserve(ctx, inbox.ReserveParams{ID: inbox.ID{Operation: "op", Key: "held"}, PayloadHash: hash,
		Owner: "other", Lease: time.Hour})
	require.NoError(t, err)
	hash, err = fingerprint(obsMsg("dead", `{"n":1}`))
	require.NoError(t, err)
	_, err = store.Claim(ctx, store.DB(), inbox.ClaimParams{ID: inbox.ID{Operation: "op", Key: "dead"}, PayloadHash: hash,
		Status: inbox.StatusFailed})
	require.NoError(t, err)

	out, err := h(obsMsg("held", `{"n":1}`))
	require.ErrorIs(t, err, dedup.ErrInFlight)
	require.True(t, dedup.IsRetryable(err))
	require.False(t, dedup.IsPoison(err))
	require.Nil(t, out)

	out, err = h(obsMsg("dead", `{"n":1}`))
	require.NoError(t, err, "a terminally failed record acks its duplicates")
	require.Empty(t, out)

	_, err = h(obsMsg("new", `{"n":1}`))
	require.EqualError(t, err, "handler failed")
	require.False(t, dedup.IsRetryable(err))
	require.False(t, dedup.IsPoison(err))

	require.Equal(t, 1, calls, "only the new key ran the handler")
	require.Equal(t, dedup.Stats{InFlight: 1, Duplicates: 1, Retries: 1}, d.Stats())
	require.Equal(t, 1.0, outcomeCount(t, reg, "op", dedup.OutcomeInFlight))
	require.Equal(t, 1.0, outcomeCount(t, reg, "op", dedup.OutcomeDuplicate))
	require.Equal(t, 1.0, outcomeCount(t, reg, "op", dedup.OutcomeRetry))
	_, err = store.Get(ctx, store.DB(), inbox.ID{Operation: "op", Key: "new"})
	require.ErrorIs(t, err, inbox.ErrNotFound, "the failed delivery left no record")
}

func TestStatsWithoutRegisterer(t *testing.T) {
	t.Parallel()
	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op"})
	require.NoError(t, err)
	h := d.Middleware(noopHandler)
	for range 3 {
		_, err = h(obsMsg("k", `{}`))
		require.NoError(t, err)
	}
	_, err = h(obsMsg("k", `{"x":1}`))
	require.ErrorIs(t, err, dedup.ErrPayloadConflict)
	require.Equal(t, dedup.Stats{Executed: 1, Duplicates: 2, Conflicts: 1}, d.Stats())
}

func TestLoggingLevelsAndRedaction(t *testing.T) {
	t.Parallel()
	const (
		secretKey = "secret-key-123"
		secretPay = "card-4242"
	)
	ctx := context.Background()
	logger := testkit.NewLogger()
	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op", Logger: logger})
	require.NoError(t, err)
	fingerprint, err := dedup.JSONFingerprint()
	require.NoError(t, err)

	payload := `{"card":"` + secretPay + `","amount":1}`
	var mode string
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		switch mode {
		case "fail":
			return nil, errors.New("downstream unavailable")
		case "panic":
			panic("handler bug")
		}
		out := message.NewMessage("out-1", []byte(`{"echo":"`+secretPay+`"}`))
		out.Metadata.Set("event_id", secretKey)
		return []*message.Message{out}, nil
	})
	type delivery struct {
		name    string
		key     string
		payload string
		mode    string
		outcome dedup.Outcome
		level   string
	}
	heldKey := secretKey + "-held"
	hash, err := fingerprint(obsMsg(heldKey, payload))
	require.NoError(t, err)
	_, err = store.Reserve(ctx, inbox.ReserveParams{ID: inbox.ID{Operation: "op", Key: heldKey}, PayloadHash: hash,
		Owner: "other", Lease: time.Hour})
	require.NoError(t, err)

	deliveries := []delivery{
		{name: "executed", key: secretKey, payload: payload, outcome: dedup.OutcomeExecuted, level: "debug"},
		{name: "duplicate", key: secretKey, payload: payload, outcome: dedup.OutcomeDuplicate, level: "debug"},
		{name: "conflict", key: secretKey, payload: `{"card":"` + secretPay + `","amount":2}`, outcome: dedup.OutcomeConflict, level: "info"},
		{name: "in flight", key: heldKey, payload: payload, outcome: dedup.OutcomeInFlight, level: "info"},
		{name: "failed", key: secretKey + "-fail", payload: payload, mode: "fail", outcome: dedup.OutcomeRetry, level: "info"},
		{name: "panic", key: secretKey + "-panic", payload: payload, mode: "panic", outcome: dedup.OutcomeRetry, level: "info"},
		{name: "missing key", key: "", payload: payload, outcome: dedup.OutcomeInvalid, level: "info"},
		{name: "oversized key", key: strings.Repeat(secretKey, 20), payload: payload, outcome: dedup.OutcomeInvalid, level: "info"},
		{name: "key with NUL", key: secretKey + "\x00", payload: payload, outcome: dedup.OutcomeInvalid, level: "info"},
	}
	uuids := make([]string, len(deliveries))
	for i, dl := range deliveries {
		mode = dl.mode
		msg := obsMsg(dl.key, dl.payload)
		uuids[i] = msg.UUID
		_, _ = h(msg)
	}

	entries := logger.Entries()
	require.Len(t, entries, len(deliveries), "one line per delivery")
	for i, dl := range deliveries {
		e := entries[i]
		t.Run(dl.name, func(t *testing.T) {
			require.NotEqual(t, "error", e.Level, "nothing is logged at Error: %s", e)
			require.Nil(t, e.Err)
			require.Equal(t, dl.level, e.Level, "%s", e)
			require.Equal(t, string(dl.outcome), e.Fields["outcome"])
			require.Equal(t, uuids[i], e.Fields["message_uuid"])
			require.Contains(t, e.Fields, "key_digest")
			if dl.outcome != dedup.OutcomeInvalid {
				require.Equal(t, inbox.ID{Operation: "op", Key: dl.key}.Digest(), e.Fields["key_digest"])
				require.Equal(t, "op", e.Fields["operation"])
				require.Equal(t, "", e.Fields["scope"])
			}
			if dl.outcome == dedup.OutcomeExecuted || dl.outcome == dedup.OutcomeDuplicate {
				require.NotContains(t, e.Fields, "error")
			} else {
				require.Contains(t, e.Fields, "error")
			}
			line := e.String()
			require.NotContains(t, line, secretKey, "the raw key is never logged")
			require.NotContains(t, line, secretPay, "the payload is never logged")
			require.NotContains(t, line, "amount")
		})
	}
}

// TestContextAfterHandler checks that the message leaves the middleware with
// the context it came with: no finished transaction, no claim.
func TestContextAfterHandler(t *testing.T) {
	t.Parallel()
	type ctxMarker struct{}
	boom := errors.New("boom")
	tests := []struct {
		name    string
		handler func(*message.Message) ([]*message.Message, error)
		check   func(t *testing.T, out []*message.Message, err error)
	}{
		{
			name:    "success",
			handler: func(*message.Message) ([]*message.Message, error) { return nil, nil },
			check:   func(t *testing.T, _ []*message.Message, err error) { require.NoError(t, err) },
		},
		{
			name: "success with output",
			handler: func(*message.Message) ([]*message.Message, error) {
				return []*message.Message{message.NewMessage("o", []byte("x"))}, nil
			},
			check: func(t *testing.T, out []*message.Message, err error) {
				require.NoError(t, err)
				require.Len(t, out, 1)
				_, ok := dedup.TxFromContext(out[0].Context())
				require.False(t, ok, "output messages carry no transaction")
			},
		},
		{
			name:    "failure",
			handler: func(*message.Message) ([]*message.Message, error) { return nil, boom },
			check: func(t *testing.T, _ []*message.Message, err error) {
				require.ErrorIs(t, err, boom)
			},
		},
		{
			name: "nil message in the output",
			handler: func(*message.Message) ([]*message.Message, error) {
				return []*message.Message{nil}, nil
			},
			check: func(t *testing.T, out []*message.Message, err error) {
				require.ErrorContains(t, err, "nil message")
				require.Nil(t, out)
			},
		},
		{
			name:    "panic",
			handler: func(*message.Message) ([]*message.Message, error) { panic("bug") },
			check: func(t *testing.T, _ []*message.Message, err error) {
				var pe *dedup.PanicError
				require.ErrorAs(t, err, &pe)
				require.Equal(t, "bug", pe.Value)
				require.NotEmpty(t, pe.Stack)
				require.Equal(t, "dedup: handler panicked: bug", pe.Error())
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store, _ := testkit.SQLiteStore(t, inbox.Config{})
			d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Scope: dedup.ScopeConstant("acme"), Operation: "op"})
			require.NoError(t, err)

			orig := context.WithValue(context.Background(), ctxMarker{}, "mine")
			msg := obsMsg("k", `{}`)
			msg.SetContext(orig)

			var (
				seenTx    *sql.Tx
				seenClaim dedup.Claim
			)
			out, err := d.Middleware(func(m *message.Message) ([]*message.Message, error) {
				require.Same(t, msg, m)
				tx, ok := dedup.TxFromContext(m.Context())
				require.True(t, ok, "the handler sees the transaction")
				require.NotNil(t, tx)
				seenTx = tx
				seenClaim, ok = dedup.ClaimFromContext(m.Context())
				require.True(t, ok, "the handler sees the claim")
				require.Equal(t, "mine", m.Context().Value(ctxMarker{}), "the handler's context derives from the message's")
				return tt.handler(m)
			})(msg)
			tt.check(t, out, err)

			_, ok := dedup.TxFromContext(msg.Context())
			require.False(t, ok, "the message no longer carries the transaction")
			_, ok = dedup.ClaimFromContext(msg.Context())
			require.False(t, ok, "the message no longer carries the claim")
			require.True(t, msg.Context() == orig, "the message's original context is put back")

			require.NotNil(t, seenTx)
			_, err = seenTx.Exec("SELECT 1")
			require.ErrorIs(t, err, sql.ErrTxDone, "the transaction is finished when the middleware returns")

			sum := sha256.Sum256([]byte("acme\x00op\x00k\x00"))
			require.Equal(t, dedup.Claim{ID: inbox.ID{Scope: "acme", Operation: "op", Key: "k"}, Attempt: 1,
				IdempotencyKey: hex.EncodeToString(sum[:])}, seenClaim)
			require.Equal(t, seenClaim.ID.IdempotencyKey(), seenClaim.IdempotencyKey)
		})
	}
}

func TestContextUntouchedWhenHandlerDoesNotRun(t *testing.T) {
	t.Parallel()
	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op"})
	require.NoError(t, err)
	h := d.Middleware(noopHandler)
	_, err = h(obsMsg("k", `{}`))
	require.NoError(t, err)

	type marker struct{}
	for _, tc := range []struct {
		name string
		msg  *message.Message
	}{
		{name: "duplicate", msg: obsMsg("k", `{}`)},
		{name: "conflict", msg: obsMsg("k", `{"x":1}`)},
		{name: "invalid", msg: obsMsg("", `{}`)},
	} {
		orig := context.WithValue(context.Background(), marker{}, tc.name)
		tc.msg.SetContext(orig)
		_, _ = d.Middleware(func(*message.Message) ([]*message.Message, error) {
			t.Fatalf("%s: the handler must not run", tc.name)
			return nil, nil
		})(tc.msg)
		require.True(t, tc.msg.Context() == orig, tc.name)
		_, ok := dedup.TxFromContext(tc.msg.Context())
		require.False(t, ok, tc.name)
	}
}

func TestIdempotencyKeyIsStableAcrossAttempts(t *testing.T) {
	t.Parallel()
	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Scope: dedup.ScopeFromMetadata("tenant"), Operation: "op"})
	require.NoError(t, err)
	var keys []string
	fail := true
	h := d.Middleware(func(m *message.Message) ([]*message.Message, error) {
		c, ok := dedup.ClaimFromContext(m.Context())
		require.True(t, ok)
		keys = append(keys, c.IdempotencyKey)
		if fail {
			return nil, errors.New("transient provider error")
		}
		return nil, nil
	})
	deliver := func(tenant string) error {
		msg := obsMsg("k", `{}`)
		msg.Metadata.Set("tenant", tenant)
		_, err := h(msg)
		return err
	}
	require.Error(t, deliver("acme"))
	fail = false
	require.NoError(t, deliver("acme"))
	require.NoError(t, deliver("globex"))
	require.Len(t, keys, 3)
	require.Equal(t, keys[0], keys[1], "a retry of the same intent keeps its idempotency key")
	require.NotEqual(t, keys[1], keys[2], "another tenant's intent has another key")
	for _, k := range keys {
		require.Len(t, k, 64)
		require.NotContains(t, k, "k\x00")
	}
}

// A refused message is still counted under the operation it reached, so
// per-handler alerts on invalid messages fire.
func TestInvalidMessagesAreCountedUnderTheirOperation(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op", Registerer: reg})
	require.NoError(t, err)
	_, err = d.Middleware(noopHandler)(message.NewMessage("u", []byte(`{}`)))
	require.ErrorIs(t, err, dedup.ErrMissingKey)
	require.Equal(t, 1.0, outcomeCount(t, reg, "op", dedup.OutcomeInvalid))
}

// A fingerprint function that returns an unusable hash refuses the message
// as poison instead of failing it (and nacking it) forever.
func TestBadFingerprintIsPoison(t *testing.T) {
	t.Parallel()
	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	for _, n := range []int{0, 65} {
		d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op",
			Fingerprint: func(*message.Message) ([]byte, error) { return make([]byte, n), nil }})
		require.NoError(t, err)
		_, err = d.Middleware(noopHandler)(obsMsg("k", `{}`))
		require.ErrorIs(t, err, dedup.ErrFingerprint, n)
		require.True(t, dedup.IsPoison(err))
		require.Equal(t, dedup.Stats{Invalid: 1}, d.Stats())
	}
}
