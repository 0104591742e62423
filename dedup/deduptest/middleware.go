package deduptest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
)

// mw is a middleware-level test bundle: a Deduplicator over the bundle's
// store and a handler that writes one business row per call.
type mw struct {
	*bundle
	d     *dedup.Deduplicator
	calls atomic.Int64
	// fail, when set, decides whether a call fails after its write.
	fail func(call int64) error
	// output is what the handler returns.
	output func(msg *message.Message) []*message.Message
}

func setupMiddleware(t *testing.T, h Harness, cfg dedup.Config) *mw {
	t.Helper()
	b := setup(t, h, inbox.Config{})
	if cfg.Key == nil {
		cfg.Key = dedup.KeyFromMetadata("event_id")
	}
	if cfg.Operation == "" {
		cfg.Operation = "record_effect"
	}
	if cfg.EventTime == nil {
		cfg.EventTime = h.EventTime
	}
	if h.Group != nil {
		switch m := cfg.Mode.(type) {
		case nil:
			cfg.Mode = dedup.Transactional{Group: h.Group}
		case dedup.Transactional:
			if m.JoinTx == nil && m.Group == nil {
				m.Group = h.Group
				cfg.Mode = m
			}
		}
	}
	d, err := dedup.New(b.store, cfg)
	require.NoError(t, err)
	return &mw{bundle: b, d: d}
}

// setupJoined is setupMiddleware joining the consuming transaction the
// test stores in the returned pointer (none while it is nil), as a
// transport's TxJoiner finds it.
func setupJoined(t *testing.T, h Harness) (*mw, *atomic.Pointer[sql.Tx]) {
	t.Helper()
	var consuming atomic.Pointer[sql.Tx]
	m := setupMiddleware(t, h, dedup.Config{Mode: dedup.Transactional{
		JoinTx: func(context.Context) (*sql.Tx, bool) {
			tx := consuming.Load()
			return tx, tx != nil
		},
	}})
	return m, &consuming
}

func (m *mw) handler(msg *message.Message) ([]*message.Message, error) {
	call := m.calls.Add(1)
	tx, ok := handlerTx(msg.Context())
	if !ok {
		return nil, errors.New("no transaction in the handler's context")
	}
	claim, ok := dedup.ClaimFromContext(msg.Context())
	if !ok || claim.Attempt != 1 || len(claim.IdempotencyKey) != 64 {
		return nil, fmt.Errorf("bad claim in context: %+v", claim)
	}
	if err := m.effect(msg.Context(), tx, msg.Metadata.Get("event_id"), string(msg.Payload)); err != nil {
		return nil, err
	}
	if m.fail != nil {
		if err := m.fail(call); err != nil {
			return nil, err
		}
	}
	if m.output != nil {
		return m.output(msg), nil
	}
	return nil, nil
}

func (m *mw) deliver(msg *message.Message) ([]*message.Message, error) {
	return m.d.Middleware(m.handler)(msg)
}

// recordEffect is the identity of event key under the suite's operation.
func recordEffect(key string) inbox.ID { return inbox.ID{Operation: "record_effect", Key: key} }

// event builds a delivery of an event: a fresh message UUID every time, as
// a producer's retry or a broker's redelivery would have.
func event(id, payload string, meta ...string) *message.Message {
	return NewMessage(id, payload, meta...)
}

func runMiddleware(t *testing.T, h Harness) {
	t.Run("ConcurrentDeliveriesOfOneEventHaveOneEffect", func(t *testing.T) {
		t.Parallel()
		m := setupMiddleware(t, h, dedup.Config{})
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			bad     []error
			retries atomic.Int64
		)
		start := make(chan struct{})
		for range h.Concurrency {
			wg.Go(func() {
				<-start
				// Redeliver until acked, as a broker would after a nack.
				for {
					_, err := m.deliver(event("evt-hot", `{"amount":100}`))
					if err == nil {
						return
					}
					if !dedup.IsRetryable(err) {
						mu.Lock()
						bad = append(bad, err)
						mu.Unlock()
						return
					}
					retries.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		require.Empty(t, bad, "only retryable errors are allowed")
		require.Equal(t, 1, m.countEffects(t, "evt-hot"))
		require.EqualValues(t, 1, m.calls.Load(), "the handler runs once")
		st := m.d.Stats()
		require.EqualValues(t, 1, st.Executed)
		require.EqualValues(t, h.Concurrency-1, st.Duplicates)
		t.Logf("%d deliveries, %d retryable errors", h.Concurrency, retries.Load())
	})

	t.Run("FailedHandlerIsRolledBackAndRetriedClean", func(t *testing.T) {
		t.Parallel()
		m := setupMiddleware(t, h, dedup.Config{})
		boom := errors.New("downstream unavailable")
		m.fail = func(call int64) error {
			if call == 1 {
				return boom
			}
			return nil
		}
		_, err := m.deliver(event("evt-1", `{"n":1}`))
		require.ErrorIs(t, err, boom)
		require.Equal(t, 0, m.countEffects(t, "evt-1"), "the failed attempt's write was rolled back")
		require.Equal(t, 0, m.records(t), "the failed attempt left no record")

		_, err = m.deliver(event("evt-1", `{"n":1}`))
		require.NoError(t, err)
		require.Equal(t, 1, m.countEffects(t, "evt-1"))
		_, err = m.deliver(event("evt-1", `{"n":1}`))
		require.NoError(t, err)
		require.Equal(t, 1, m.countEffects(t, "evt-1"))
		require.EqualValues(t, 2, m.calls.Load())
	})

	t.Run("PanickingHandlerIsRolledBackAndRetriedClean", func(t *testing.T) {
		t.Parallel()
		m := setupMiddleware(t, h, dedup.Config{})
		m.fail = func(call int64) error {
			if call == 1 {
				panic("handler bug")
			}
			return nil
		}
		msg := event("evt-1", `{"n":1}`)
		_, err := m.deliver(msg)
		var pe *dedup.PanicError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, "handler bug", pe.Value)
		_, hasTx := handlerTx(msg.Context())
		require.False(t, hasTx, "the message does not keep the finished transaction")
		require.Equal(t, 0, m.countEffects(t, "evt-1"))

		_, err = m.deliver(msg) // the same message value, redelivered
		require.NoError(t, err)
		require.Equal(t, 1, m.countEffects(t, "evt-1"))
	})

	t.Run("RedeliveryAfterCommitReturnsTheSameOutput", func(t *testing.T) {
		t.Parallel()
		m := setupMiddleware(t, h, dedup.Config{})
		m.output = func(msg *message.Message) []*message.Message {
			out := message.NewMessage(watermill.NewUUID(), []byte(`{"order":"o-1","\u00e9":"\x01"}`))
			out.Metadata.Set("event_id", "derived-"+msg.Metadata.Get("event_id"))
			out.Metadata.Set("content-type", "application/json")
			bin := message.NewMessage(watermill.NewUUID(), []byte{0, 1, 2, 255})
			return []*message.Message{out, bin}
		}
		first, err := m.deliver(event("evt-1", `{"n":1}`))
		require.NoError(t, err)
		require.Len(t, first, 2)

		// The ack was lost (crash after commit): the broker delivers again.
		again, err := m.deliver(event("evt-1", `{"n":1}`))
		require.NoError(t, err)
		require.EqualValues(t, 1, m.calls.Load(), "the handler did not run again")
		require.Equal(t, 1, m.countEffects(t, "evt-1"))
		require.Len(t, again, len(first))
		for i := range first {
			require.Equal(t, first[i].UUID, again[i].UUID)
			require.Equal(t, first[i].Payload, again[i].Payload)
			require.Equal(t, first[i].Metadata, again[i].Metadata)
		}
	})

	t.Run("SameKeyDifferentPayloadIsAConflict", func(t *testing.T) {
		t.Parallel()
		m := setupMiddleware(t, h, dedup.Config{})
		_, err := m.deliver(event("evt-1", `{"amount":100}`))
		require.NoError(t, err)
		before, err := m.store.Get(m.ctx, m.db, recordEffect("evt-1"))
		require.NoError(t, err)

		_, err = m.deliver(event("evt-1", `{"amount":999}`))
		require.ErrorIs(t, err, dedup.ErrPayloadConflict)
		require.True(t, dedup.IsPoison(err))
		require.False(t, dedup.IsRetryable(err))
		require.EqualValues(t, 1, m.calls.Load(), "the handler did not run for the conflict")
		require.Equal(t, 1, m.countEffects(t, "evt-1"))
		after, err := m.store.Get(m.ctx, m.db, recordEffect("evt-1"))
		require.NoError(t, err)
		require.Equal(t, before, after, "the record is untouched")
		require.EqualValues(t, 1, m.d.Stats().Conflicts)
	})

	t.Run("SameKeyInTwoTenantsOrTwoOperationsRunsTwice", func(t *testing.T) {
		t.Parallel()
		m := setupMiddleware(t, h, dedup.Config{Scope: dedup.ScopeFromMetadata("tenant_id")})
		for _, tenant := range []string{"acme", "globex"} {
			_, err := m.deliver(event("evt-1", `{"n":1}`, "tenant_id", tenant))
			require.NoError(t, err)
		}
		other, err := dedup.New(m.store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"),
			Scope: dedup.ScopeFromMetadata("tenant_id"), Operation: "second_handler"})
		require.NoError(t, err)
		_, err = other.Middleware(m.handler)(event("evt-1", `{"n":1}`, "tenant_id", "acme"))
		require.NoError(t, err)
		require.Equal(t, 3, m.countEffects(t, "evt-1"))

		_, err = m.deliver(event("evt-1", `{"n":1}`, "tenant_id", "acme"))
		require.NoError(t, err)
		require.Equal(t, 3, m.countEffects(t, "evt-1"), "a duplicate within a tenant still runs once")

		_, err = m.deliver(event("evt-1", `{"n":1}`))
		require.ErrorIs(t, err, dedup.ErrMissingKey, "no tenant: refused, not merged into a shared scope")
	})

	t.Run("MissingEmptyOrOversizedKeyIsRefused", func(t *testing.T) {
		t.Parallel()
		m := setupMiddleware(t, h, dedup.Config{})
		noKey := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		_, err := m.deliver(noKey)
		require.ErrorIs(t, err, dedup.ErrMissingKey)
		require.True(t, dedup.IsPoison(err))

		_, err = m.deliver(event("", `{}`))
		require.ErrorIs(t, err, dedup.ErrMissingKey)

		_, err = m.deliver(event(strings.Repeat("k", inbox.MaxKeyLen+1), `{}`))
		require.ErrorIs(t, err, dedup.ErrInvalidKey)
		require.True(t, dedup.IsPoison(err))

		require.Zero(t, m.calls.Load())
		require.Zero(t, m.records(t))
		require.EqualValues(t, 3, m.d.Stats().Invalid)
	})

	t.Run("KeyFromJSONPayload", func(t *testing.T) {
		t.Parallel()
		m := setupMiddleware(t, h, dedup.Config{Key: dedup.KeyFromJSON("data.id")})
		for range 3 {
			msg := message.NewMessage(watermill.NewUUID(), []byte(`{"data":{"id":"evt-9","v":1}}`))
			msg.Metadata.Set("event_id", "evt-9")
			_, err := m.deliver(msg)
			require.NoError(t, err)
		}
		require.Equal(t, 1, m.countEffects(t, "evt-9"))
		_, err := m.store.Get(m.ctx, m.db, recordEffect("evt-9"))
		require.NoError(t, err)
	})

	t.Run("FingerprintIgnoresKeyOrderAndIgnoredFields", func(t *testing.T) {
		t.Parallel()
		m := setupMiddleware(t, h, dedup.Config{IgnoreFields: []string{"sent_at", "meta.trace"}})
		for _, p := range []string{
			`{"amount":100,"currency":"EUR","sent_at":"2026-01-01T00:00:00Z","meta":{"trace":"a","src":"x"}}`,
			`{"currency":"EUR","amount":100,"sent_at":"2026-01-02T09:00:00Z","meta":{"src":"x","trace":"b"}}`,
			"{\n  \"meta\": {\"src\": \"x\"},\n  \"currency\": \"EUR\",\n  \"amount\": 100\n}",
		} {
			_, err := m.deliver(event("evt-1", p))
			require.NoError(t, err, p)
		}
		require.Equal(t, 1, m.countEffects(t, "evt-1"))
		_, err := m.deliver(event("evt-1", `{"amount":100,"currency":"USD"}`))
		require.ErrorIs(t, err, dedup.ErrPayloadConflict)
	})

	t.Run("ContextCancelledBeforeClaimRunsNothing", func(t *testing.T) {
		t.Parallel()
		m := setupMiddleware(t, h, dedup.Config{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		msg := event("evt-1", `{}`)
		msg.SetContext(ctx)
		_, err := m.deliver(msg)
		require.Error(t, err)
		require.Zero(t, m.calls.Load())
		require.Zero(t, m.records(t))
	})

	t.Run("ContextEndingBeforeTheCommitLeavesNothing", func(t *testing.T) {
		t.Parallel()
		// A router closing cancels the deliveries' contexts. One cancelled
		// after its handler, before the commit is sent, is rolled back and
		// nacked: nothing recorded, and its redelivery runs clean; never
		// committed and nacked. (Once
		// the commit is sent, a cancel no longer ends it; that race is the
		// one RouterClosingWhileAGroupLingersAcksOnlyCommittedWork meets.)
		m := setupMiddleware(t, h, dedup.Config{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		m.fail = func(call int64) error {
			if call == 1 {
				cancel()
			}
			return nil
		}
		msg := event("evt-1", `{}`)
		msg.SetContext(ctx)
		_, err := m.deliver(msg)
		if err == nil {
			// A group whose commit was under way when the context ended
			// (pipelined groups always are): committed, and acked.
			require.Equal(t, 1, m.countEffects(t, "evt-1"))
		} else {
			require.ErrorIs(t, err, context.Canceled)
			require.Zero(t, m.countEffects(t, "evt-1"), "nacked, so nothing may be committed")
			require.Zero(t, m.records(t))
		}
		_, err = m.deliver(event("evt-1", `{}`))
		require.NoError(t, err)
		require.Equal(t, 1, m.countEffects(t, "evt-1"))
		require.Equal(t, inbox.StatusCompleted, m.get(t, "record_effect", "evt-1").Status)
	})

	t.Run("ReadingFirstKeepsTheGuarantees", func(t *testing.T) {
		t.Parallel()
		m := setupMiddleware(t, h, dedup.Config{Mode: dedup.Transactional{ReadFirst: dedup.ReadFirstAlways}})
		m.output = func(msg *message.Message) []*message.Message {
			return []*message.Message{message.NewMessage("out-"+msg.Metadata.Get("event_id"), []byte("x"))}
		}
		var wg sync.WaitGroup
		var bad atomic.Int64
		for range h.Concurrency {
			wg.Go(func() {
				for {
					out, err := m.deliver(event("evt-1", `{"a":1}`))
					if err == nil {
						if len(out) != 1 || out[0].UUID != "out-evt-1" {
							bad.Add(1)
						}
						return
					}
					if !dedup.IsRetryable(err) {
						bad.Add(1)
						return
					}
				}
			})
		}
		wg.Wait()
		require.Zero(t, bad.Load())
		require.Equal(t, 1, m.countEffects(t, "evt-1"))
		require.EqualValues(t, 1, m.calls.Load())

		_, err := m.deliver(event("evt-1", `{"a":2}`))
		require.ErrorIs(t, err, dedup.ErrPayloadConflict, "a read-first conflict is still refused")
		require.EqualValues(t, 1, m.calls.Load())

		m.fail = func(int64) error { return dedup.Permanent(errors.New("invalid order")) }
		_, err = m.deliver(event("evt-2", `{}`))
		require.True(t, dedup.IsPoison(err))
		require.Equal(t, 0, m.countEffects(t, "evt-2"), "a permanent failure rolls the handler's writes back")
		_, err = m.deliver(event("evt-2", `{}`))
		require.NoError(t, err, "a failed intent found by the read is acked")
		require.EqualValues(t, 2, m.calls.Load())
		rec, err := m.store.Get(m.ctx, m.db, recordEffect("evt-2"))
		require.NoError(t, err)
		require.Equal(t, inbox.StatusFailed, rec.Status)
		require.Contains(t, rec.Error, "invalid order")
	})

	// Concurrent deliveries of an intent that fails for good: each claim
	// waits on the one before it, which rolls back, so several may run
	// the handler; the failure must still be recorded, counted and sent to
	// the poison queue once, and every other delivery acked as its
	// duplicate.
	t.Run("ConcurrentPermanentFailuresAreRecordedOnce", func(t *testing.T) {
		t.Parallel()
		m := setupMiddleware(t, h, dedup.Config{Mode: dedup.Transactional{ReadFirst: dedup.ReadFirstNever}})
		m.fail = func(int64) error {
			time.Sleep(5 * time.Millisecond) // keep the claim open while the others queue behind it
			return dedup.Permanent(errors.New("invalid order"))
		}
		const n = 8
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				_, err := m.deliver(event("evt-perm", `{}`))
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		poisoned, nacked := 0, 0
		for err := range errs {
			switch {
			case err == nil:
			case dedup.IsPoison(err):
				poisoned++
			default:
				// A claim that lost a deadlock on MySQL: nacked, redelivered.
				require.True(t, dedup.IsRetryable(err), "%v", err)
				nacked++
			}
		}
		for range nacked {
			_, err := m.deliver(event("evt-perm", `{}`))
			require.NoError(t, err, "a redelivery is a duplicate of the recorded failure")
		}
		require.Equal(t, 1, poisoned, "one delivery goes to the poison queue, the others are its duplicates")
		require.EqualValues(t, 1, m.d.Stats().Failed)
		require.Equal(t, 0, m.countEffects(t, "evt-perm"))
		require.Equal(t, inbox.StatusFailed, m.get(t, "record_effect", "evt-perm").Status)
	})

	t.Run("PermanentFailureIsRecordedAndItsDuplicatesAcked", func(t *testing.T) {
		t.Parallel()
		m := setupMiddleware(t, h, dedup.Config{Mode: dedup.Transactional{ReadFirst: dedup.ReadFirstNever}})
		m.fail = func(int64) error { return dedup.Permanent(errors.New("invalid order")) }
		_, err := m.deliver(event("evt-1", `{}`))
		require.True(t, dedup.IsPoison(err))
		require.False(t, dedup.IsRetryable(err))
		require.Equal(t, 0, m.countEffects(t, "evt-1"), "a permanent failure rolls the handler's writes back")
		rec, err := m.store.Get(m.ctx, m.db, recordEffect("evt-1"))
		require.NoError(t, err)
		require.Equal(t, inbox.StatusFailed, rec.Status)
		require.Equal(t, "invalid order", rec.Error)
		for range 2 {
			_, err = m.deliver(event("evt-1", `{}`))
			require.NoError(t, err, "a failed intent's duplicates are acked without running the handler")
		}
		require.EqualValues(t, 1, m.calls.Load())
		_, err = m.deliver(event("evt-1", `{"other":true}`))
		require.ErrorIs(t, err, dedup.ErrPayloadConflict, "a failed intent still guards its key")
		st := m.d.Stats()
		require.EqualValues(t, 1, st.Failed)
		require.EqualValues(t, 2, st.Duplicates)
		require.EqualValues(t, 1, st.Conflicts)
	})

	t.Run("CorrelationIDIsKeptWhenStorableAndDroppedOtherwise", func(t *testing.T) {
		t.Parallel()
		m := setupMiddleware(t, h, dedup.Config{})
		_, err := m.deliver(event("evt-1", `{}`, "correlation_id", "corr-1"))
		require.NoError(t, err)
		require.Equal(t, "corr-1", m.get(t, "record_effect", "evt-1").CorrelationID)
		for i, bad := range []string{"a\x00b", "a\xffb", strings.Repeat("c", inbox.MaxCorrelationIDLen+1)} {
			key := fmt.Sprintf("evt-bad-%d", i)
			_, err := m.deliver(event(key, `{}`, "correlation_id", bad))
			require.NoError(t, err, "an unstorable correlation ID is no reason to refuse the message")
			require.Empty(t, m.get(t, "record_effect", key).CorrelationID)
		}
		require.EqualValues(t, 4, m.calls.Load())
	})

	t.Run("JoinedConsumingTransactionUndoesAFailedAttempt", func(t *testing.T) {
		t.Parallel()
		// A transport that consumes in a transaction (watermill-sql) resends
		// a nacked message in the same transaction, and commits the ack with
		// whatever the last attempt wrote.
		m, consuming := setupJoined(t, h)
		boom := errors.New("downstream unavailable")
		m.fail = func(call int64) error {
			if call == 1 {
				return boom
			}
			return nil
		}
		tx, err := m.db.BeginTx(m.ctx, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback() })
		b := dedup.RegisterConsumingTx(tx)
		consuming.Store(tx)
		msg := event("evt-1", `{"n":1}`)
		_, err = m.deliver(msg)
		require.ErrorIs(t, err, boom)
		_, err = m.deliver(msg) // the nack resends the same message in the same transaction
		require.NoError(t, err)
		var inTx int
		require.NoError(t, tx.QueryRowContext(m.ctx, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE event_id = %s",
			m.effects, m.ph(1)), "evt-1").Scan(&inTx))
		require.Equal(t, 1, inTx, "the failed attempt's write was rolled back to its savepoint")
		require.True(t, b.End())
		require.NoError(t, tx.Commit())
		consuming.Store(nil)

		require.Equal(t, 1, m.countEffects(t, "evt-1"))
		require.Equal(t, 1, m.records(t), "one record, committed with the consuming transaction")
		_, err = m.deliver(event("evt-1", `{"n":1}`))
		require.NoError(t, err, "after the commit a redelivery is a duplicate")
		require.Equal(t, 1, m.countEffects(t, "evt-1"))
		require.EqualValues(t, 2, m.calls.Load())
	})

	t.Run("UnregisteredConsumingTransactionIsRefused", func(t *testing.T) {
		t.Parallel()
		// A transport that did not register its transaction may commit it
		// under a running attempt (watermill-sql's own subscriber does, past
		// a message's ack deadline): the middleware does not join it.
		m, consuming := setupJoined(t, h)
		tx, err := m.db.BeginTx(m.ctx, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback() })
		consuming.Store(tx)
		_, err = m.deliver(event("evt-1", `{"n":1}`))
		require.ErrorIs(t, err, dedup.ErrUnregisteredConsumingTx)
		require.False(t, dedup.IsPoison(err), "nacked, not sent to a poison queue: the message is fine")
		require.Zero(t, m.calls.Load(), "the handler did not run")
		require.NoError(t, tx.Commit())
		require.Zero(t, m.records(t), "nothing was claimed")
	})

	t.Run("JoinedBatchedConsumingTransaction", func(t *testing.T) {
		t.Parallel()
		// A transport that registers its consuming transaction
		// (dedup.RegisterConsumingTx) acks only the messages delivered and
		// acked: several messages share it, each attempt under a savepoint,
		// and its end waits for an attempt still running.
		m, consuming := setupJoined(t, h)
		boom := errors.New("downstream unavailable")
		var (
			block   = make(chan struct{})
			blocked = make(chan struct{})
		)
		m.fail = func(call int64) error {
			switch call {
			case 3:
				return boom
			case 5:
				close(blocked)
				<-block
			}
			return nil
		}
		tx, err := m.db.BeginTx(m.ctx, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback() })
		b := dedup.RegisterConsumingTx(tx)
		consuming.Store(tx)
		_, err = m.deliver(event("evt-1", `{"n":1}`))
		require.NoError(t, err)
		_, err = m.deliver(event("evt-2", `{"n":2}`))
		require.NoError(t, err, "a second message in a registered transaction")
		_, err = m.deliver(event("evt-1", `{"n":1}`))
		require.NoError(t, err, "a duplicate in the same transaction")
		msg := event("evt-3", `{"n":3}`)
		_, err = m.deliver(msg)
		require.ErrorIs(t, err, boom)
		_, err = m.deliver(msg) // resent in the same transaction
		require.NoError(t, err)
		require.True(t, b.Wait())

		// An attempt still running when the transport ends the transaction.
		running := make(chan error, 1)
		go func() { _, err := m.deliver(event("evt-4", `{"n":4}`)); running <- err }()
		<-blocked
		ended := make(chan bool, 1)
		go func() { ended <- b.End() }()
		select {
		case <-ended:
			t.Fatal("End returned while an attempt was running")
		case <-time.After(50 * time.Millisecond):
		}
		close(block)
		require.NoError(t, <-running)
		require.True(t, <-ended)
		_, err = m.deliver(event("evt-5", `{"n":5}`))
		require.ErrorIs(t, err, dedup.ErrConsumingTxEnded, "nothing is written once the transport ended it")
		require.NoError(t, tx.Commit())
		consuming.Store(nil)

		for _, key := range []string{"evt-1", "evt-2", "evt-3", "evt-4"} {
			require.Equal(t, 1, m.countEffects(t, key), key)
		}
		require.Equal(t, 0, m.countEffects(t, "evt-5"))
		require.Equal(t, 4, m.records(t))
		require.EqualValues(t, 5, m.calls.Load())
	})

	t.Run("RedeliveredConcurrentlyTheHandlerRunsOnceAndEveryAckReplaysItsOutput", func(t *testing.T) {
		t.Parallel()
		m := setupMiddleware(t, h, dedup.Config{})
		m.output = func(msg *message.Message) []*message.Message {
			return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("shipped "+msg.Metadata.Get("event_id")))}
		}
		rep := Redeliver(t, m.d, m.handler, event("evt-1", `{"amount":100}`),
			Times(h.Concurrency), Concurrently(), UntilAcked(100))
		require.Equal(t, h.Concurrency, rep.Acked, "%v", rep)
		for _, err := range rep.Errors() {
			require.True(t, dedup.IsRetryable(err), "only retryable refusals on the way: %v", err)
		}
		require.Equal(t, 1, rep.Runs, "%v", rep)
		require.Equal(t, 1, m.countEffects(t, "evt-1"))
		outs := rep.Outputs()
		require.Len(t, outs, h.Concurrency)
		for _, out := range outs {
			require.Len(t, out, 1)
			require.Equal(t, outs[0][0].UUID, out[0].UUID, "every ack hands the router the same output")
			require.Equal(t, "shipped evt-1", string(out[0].Payload))
		}
	})

	t.Run("ManyEventsRedeliveredConcurrentlyEachHaveOneEffect", func(t *testing.T) {
		t.Parallel()
		m := setupMiddleware(t, h, dedup.Config{})
		events := 200
		if raceEnabled {
			events = 40
		}
		const copies = 3
		var (
			wg  sync.WaitGroup
			mu  sync.Mutex
			bad []error
		)
		slots := make(chan struct{}, h.Concurrency)
		for i := range events {
			for range copies {
				wg.Go(func() {
					slots <- struct{}{}
					defer func() { <-slots }()
					for {
						_, err := m.deliver(event(fmt.Sprintf("evt-%d", i), fmt.Sprintf(`{"order":%d}`, i)))
						if err == nil {
							return
						}
						if !dedup.IsRetryable(err) {
							mu.Lock()
							bad = append(bad, err)
							mu.Unlock()
							return
						}
					}
				})
			}
		}
		wg.Wait()
		require.Empty(t, bad, "only retryable errors are allowed")
		var rows, distinct int
		require.NoError(t, m.db.QueryRowContext(m.ctx,
			fmt.Sprintf("SELECT COUNT(*), COUNT(DISTINCT event_id) FROM %s", m.effects)).Scan(&rows, &distinct))
		require.Equal(t, events, distinct, "every event had its effect")
		require.Equal(t, events, rows, "and only one")
		require.Equal(t, events, m.records(t))
		st := m.d.Stats()
		require.EqualValues(t, events, st.Executed)
		require.EqualValues(t, events*(copies-1), st.Duplicates)
	})
}
