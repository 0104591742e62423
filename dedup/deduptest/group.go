package deduptest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/pgxgroup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/internal/pipeline"
)

// gw is a group commit test bundle: a middleware with group commit over
// the bundle's store, whose handler records one effect per call and
// whatever each key's behaviour (set per test) adds.
type gw struct {
	*bundle
	d     *dedup.Deduplicator
	mu    sync.Mutex
	calls map[string]int // by key
	runs  map[string]int // by message UUID
	// txs identifies the transaction of each key's last call: its
	// *sql.Tx, or the server's transaction ID in a pipelined group.
	txs map[string]any
	// act, when set, runs in the handler after its write.
	act func(msg *message.Message, tx inbox.DBTX) ([]*message.Message, error)
}

func setupGroup(t *testing.T, h Harness, g dedup.Group) *gw {
	t.Helper()
	b := setup(t, h, inbox.Config{})
	w := &gw{bundle: b, calls: map[string]int{}, runs: map[string]int{}, txs: map[string]any{}}
	if h.Group != nil {
		g.Pipeline = h.Group.Pipeline
	}
	key := dedup.KeyFromMetadata(EventIDKey)
	d, err := dedup.New(b.store, dedup.Config{
		Key:       key,
		Operation: "record_effect",
		Mode:      dedup.Transactional{Group: &g},
		EventTime: h.EventTime,
	})
	require.NoError(t, err)
	w.d = d
	return w
}

// pipelineOf is the harness's Group.Pipeline, if any.
func pipelineOf(h Harness) pipeline.Opener {
	if h.Group == nil {
		return nil
	}
	return h.Group.Pipeline
}

func (w *gw) handler(msg *message.Message) ([]*message.Message, error) {
	tx, ok := handlerTx(msg.Context())
	if !ok {
		return nil, errors.New("no transaction in the handler's context")
	}
	var txID any = tx
	if _, piped := tx.(*pgxgroup.Tx); piped {
		// Each member has a Tx of its own; the server's ID tells.
		var id int64
		if err := tx.QueryRowContext(msg.Context(), "SELECT txid_current()").Scan(&id); err != nil {
			return nil, err
		}
		txID = id
	}
	key := msg.Metadata.Get(EventIDKey)
	w.mu.Lock()
	w.calls[key]++
	w.runs[msg.UUID]++
	w.txs[key] = txID
	w.mu.Unlock()
	if err := w.effect(msg.Context(), tx, key, string(msg.Payload)); err != nil {
		return nil, err
	}
	if w.act != nil {
		return w.act(msg, tx)
	}
	return nil, nil
}

func (w *gw) deliver(msg *message.Message) ([]*message.Message, error) {
	return w.d.Middleware(w.handler)(msg)
}

func (w *gw) callsOf(key string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.calls[key]
}

// result is what one delivery of a group test got.
type result struct {
	out []*message.Message
	err error
	// effects is the number of the key's effects another connection saw
	// the moment the delivery returned: committed ones only.
	effects int
	at      time.Time
}

// inOneGroup delivers msgs while a first delivery holds the only
// coordinator, so that they all join one group, which runs once that
// delivery is released. The deduplicator must have one coordinator.
func (w *gw) inOneGroup(t *testing.T, msgs ...*message.Message) []result {
	t.Helper()
	return w.inOneGroupWithHook(t, msgs, func(int) {})
}

func (w *gw) countEffectsNoT(eventID string) int {
	var n int
	if err := w.db.QueryRowContext(context.Background(),
		fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE event_id = %s", w.effects, w.ph(1)), eventID).Scan(&n); err != nil {
		return -1
	}
	return n
}

func (w *gw) noRecord(t *testing.T, key string) {
	t.Helper()
	_, err := w.store.Get(w.ctx, w.db, recordEffect(key))
	require.ErrorIs(t, err, inbox.ErrNotFound, key)
}

func runGroup(t *testing.T, h Harness) {
	t.Run("GroupRunsMembersInOneTransactionAndNacksOnlyFailedOnes", func(t *testing.T) {
		t.Parallel()
		w := setupGroup(t, h, dedup.Group{Coordinators: 1, MaxLinger: 5 * time.Second})
		// Committed before the group: a duplicate and a conflict.
		_, err := w.deliver(event("dup", `{"n":1}`))
		require.NoError(t, err)
		_, err = w.deliver(event("conflict", `{"n":1}`))
		require.NoError(t, err)

		boom := errors.New("downstream unavailable")
		dupDone := make(chan struct{})
		var dupAnsweredEarly atomic.Bool
		w.act = func(msg *message.Message, tx inbox.DBTX) ([]*message.Message, error) {
			switch key := msg.Metadata.Get(EventIDKey); key {
			case "fail":
				return nil, boom
			case "panic":
				panic("handler bug")
			case "timeout":
				<-msg.Context().Done()
				return nil, msg.Context().Err()
			case "ok-1":
				// The duplicate is answered without waiting for this
				// group's commit, which cannot come before it.
				select {
				case <-dupDone:
					dupAnsweredEarly.Store(true)
				case <-time.After(5 * time.Second):
				}
			case "twin":
				return []*message.Message{message.NewMessage("out-"+key, []byte("twin output"))}, nil
			}
			return nil, nil
		}
		timeout := event("timeout", `{}`)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		timeout.SetContext(ctx)
		// The duplicate leads the group (it joins first): even the
		// delivery whose call forms the group returns with its answer.
		msgs := []*message.Message{
			event("dup", `{"n":1}`), event("ok-2", `{}`), event("fail", `{}`), event("ok-3", `{}`), event("panic", `{}`),
			timeout, event("twin", `{"t":1}`), event("twin", `{"t":1}`), event("ok-1", `{}`),
			event("conflict", `{"n":2}`), event("ok-4", `{}`),
		}
		// The duplicate signals its answer as soon as it has it.
		dupMsg := msgs[0]
		res := w.inOneGroupWithHook(t, msgs, func(i int) {
			if msgs[i] == dupMsg {
				close(dupDone)
			}
		})

		for _, i := range []int{8, 1, 3, 10} {
			key := msgs[i].Metadata.Get(EventIDKey)
			require.NoError(t, res[i].err, key)
			require.Equal(t, 1, res[i].effects, "%s was committed before it was acked", key)
		}
		require.True(t, dupAnsweredEarly.Load(), "the duplicate was answered before the group committed")
		require.NoError(t, res[0].err, "a duplicate of a committed record is acked")
		require.Equal(t, 1, w.callsOf("dup"))
		require.ErrorIs(t, res[9].err, dedup.ErrPayloadConflict)
		require.Equal(t, 1, w.callsOf("conflict"))

		require.ErrorIs(t, res[2].err, boom)
		var pe *dedup.PanicError
		require.ErrorAs(t, res[4].err, &pe)
		require.ErrorIs(t, res[5].err, context.DeadlineExceeded)
		for _, key := range []string{"fail", "panic", "timeout"} {
			require.Equal(t, 0, w.countEffects(t, key), key)
			w.noRecord(t, key)
		}

		require.NoError(t, res[6].err)
		require.NoError(t, res[7].err)
		require.Equal(t, 1, w.countEffects(t, "twin"))
		w.mu.Lock()
		ran6, ran7 := w.runs[msgs[6].UUID] > 0, w.runs[msgs[7].UUID] > 0
		require.True(t, ran6 != ran7, "one member of a key runs, the one that joined second never does")
		w.mu.Unlock()
		for _, i := range []int{6, 7} {
			require.Len(t, res[i].out, 1)
			require.Equal(t, "twin output", string(res[i].out[0].Payload), "both get the output")
		}

		// The members that committed did so in one transaction.
		w.mu.Lock()
		tx := w.txs["ok-1"]
		for _, key := range []string{"ok-2", "ok-3", "ok-4", "twin"} {
			if _, ok := tx.(*sql.Tx); ok {
				require.Same(t, tx, w.txs[key], key)
			} else {
				require.Equal(t, tx, w.txs[key], key)
			}
		}
		w.mu.Unlock()
		st := w.d.Stats()
		require.EqualValues(t, 2+5+1, st.Executed, "dup, conflict, blocker, ok-1..4, twin")
		require.EqualValues(t, 2, st.Duplicates, "dup and the second twin")

		// The failed members' redeliveries run clean.
		w.act = nil
		for _, key := range []string{"fail", "panic", "timeout"} {
			_, err := w.deliver(event(key, `{}`))
			require.NoError(t, err, key)
			require.Equal(t, 1, w.countEffects(t, key), key)
		}
	})

	t.Run("LeaderThatFailsIsNackedBeforeTheGroupCommits", func(t *testing.T) {
		t.Parallel()
		w := setupGroup(t, h, dedup.Group{Coordinators: 1, MaxLinger: 5 * time.Second})
		boom := errors.New("leader failed")
		failed := make(chan struct{})
		var nackedFirst atomic.Bool
		w.act = func(msg *message.Message, _ inbox.DBTX) ([]*message.Message, error) {
			switch msg.Metadata.Get(EventIDKey) {
			case "a-leader":
				return nil, boom
			case "b-member":
				select {
				case <-failed:
					nackedFirst.Store(true)
				case <-time.After(5 * time.Second):
				}
			}
			return nil, nil
		}
		msgs := []*message.Message{event("a-leader", `{}`), event("b-member", `{}`)}
		res := w.inOneGroupWithHook(t, msgs, func(i int) {
			if i == 0 {
				close(failed)
			}
		})
		require.ErrorIs(t, res[0].err, boom)
		require.True(t, nackedFirst.Load(), "the failed leader's delivery returned while the group went on")
		require.NoError(t, res[1].err)
		require.Equal(t, 1, res[1].effects)
		require.Equal(t, 0, w.countEffects(t, "a-leader"))
		w.noRecord(t, "a-leader")
	})

	t.Run("DuplicateFromAnotherGroupWaitsForTheCommitAndReplaysTheOutput", func(t *testing.T) {
		t.Parallel()
		w := setupGroup(t, h, dedup.Group{Coordinators: 2})
		started, unblock := make(chan struct{}), make(chan struct{})
		var once sync.Once
		w.act = func(msg *message.Message, _ inbox.DBTX) ([]*message.Message, error) {
			once.Do(func() { close(started) })
			<-unblock
			return []*message.Message{message.NewMessage("out", []byte("output of "+msg.UUID))}, nil
		}
		first := make(chan result, 1)
		go func() {
			out, err := w.deliver(event("hot", `{}`))
			first <- result{out: out, err: err}
		}()
		<-started
		second := make(chan result, 1)
		go func() {
			out, err := w.deliver(event("hot", `{}`))
			second <- result{out: out, err: err}
		}()
		select {
		case r := <-second:
			t.Fatalf("the duplicate returned before the claim it duplicates committed: %v", r.err)
		case <-time.After(200 * time.Millisecond):
		}
		close(unblock)
		r1, r2 := <-first, <-second
		require.NoError(t, r1.err)
		require.NoError(t, r2.err)
		require.Equal(t, 1, w.callsOf("hot"))
		require.Equal(t, 1, w.countEffects(t, "hot"))
		require.Len(t, r2.out, 1)
		require.Equal(t, string(r1.out[0].Payload), string(r2.out[0].Payload), "the duplicate replays the stored output")
	})

	t.Run("CommitThatFailsNacksEveryMember", func(t *testing.T) {
		t.Parallel()
		if h.Dialect.Name() != "postgres" {
			t.Skip("needs a deferred constraint, which only PostgreSQL has; the killed connection covers the others")
		}
		w := setupGroup(t, h, dedup.Group{Coordinators: 1})
		deferred := uniqueName("deferred")
		_, err := w.db.ExecContext(w.ctx, "CREATE TABLE "+deferred+
			" (id int, CONSTRAINT "+deferred+"_u UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)")
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = w.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+deferred) })
		w.act = func(msg *message.Message, tx inbox.DBTX) ([]*message.Message, error) {
			if msg.Metadata.Get(EventIDKey) == "c" {
				// Violates the constraint, which is checked at COMMIT.
				_, err := tx.ExecContext(msg.Context(), "INSERT INTO "+deferred+" (id) VALUES (1), (1)")
				return nil, err
			}
			return nil, nil
		}
		res := w.inOneGroup(t, event("a", `{}`), event("b", `{}`), event("c", `{}`))
		for i, key := range []string{"a", "b", "c"} {
			require.ErrorContains(t, res[i].err, "commit", key)
			require.Equal(t, 0, w.countEffects(t, key), key)
			w.noRecord(t, key)
		}
	})

	t.Run("ConnectionKilledMidGroupNacksEveryMember", func(t *testing.T) {
		t.Parallel()
		var selfID, kill string
		switch h.Dialect.Name() {
		case "postgres":
			selfID, kill = "SELECT pg_backend_pid()", "SELECT pg_terminate_backend(%d)"
		case "mysql":
			selfID, kill = "SELECT CONNECTION_ID()", "KILL %d"
		default:
			t.Skip("an embedded database has no connection to kill")
		}
		w := setupGroup(t, h, dedup.Group{Coordinators: 1})
		w.act = func(msg *message.Message, tx inbox.DBTX) ([]*message.Message, error) {
			if msg.Metadata.Get(EventIDKey) != "c" {
				return nil, nil
			}
			var id int64
			if err := tx.QueryRowContext(msg.Context(), selfID).Scan(&id); err != nil {
				return nil, err
			}
			// Killed from another connection after the handler's work:
			// the commit that follows cannot succeed.
			_, err := w.db.ExecContext(msg.Context(), fmt.Sprintf(kill, id))
			return nil, err
		}
		res := w.inOneGroup(t, event("a", `{}`), event("b", `{}`), event("c", `{}`))
		for i, key := range []string{"a", "b", "c"} {
			require.Error(t, res[i].err, key)
			require.True(t, dedup.IsRetryable(res[i].err), "%s: a lost connection is retryable: %v", key, res[i].err)
			require.Equal(t, 0, w.countEffects(t, key), key)
			w.noRecord(t, key)
		}
		w.act = nil
		for _, key := range []string{"a", "b", "c"} {
			_, err := w.deliver(event(key, `{}`))
			require.NoError(t, err, key)
			require.Equal(t, 1, w.countEffects(t, key), key)
		}
	})

	t.Run("LoneDeliveryPaysNoLinger", func(t *testing.T) {
		t.Parallel()
		w := setupGroup(t, h, dedup.Group{MaxLinger: 10 * time.Second})
		start := time.Now()
		_, err := w.deliver(event("alone", `{}`))
		require.NoError(t, err)
		require.Less(t, time.Since(start), 5*time.Second, "a delivery alone in flight does not wait for others")
		require.Equal(t, 1, w.countEffects(t, "alone"))
	})

	t.Run("RouterClosingWhileAGroupLingersAcksOnlyCommittedWork", func(t *testing.T) {
		t.Parallel()
		b := setup(t, h, inbox.Config{})
		const linger = 300 * time.Millisecond
		key := dedup.KeyFromMetadata(EventIDKey)
		var slowJoined atomic.Bool
		d, err := dedup.New(b.store, dedup.Config{
			Key: func(msg *message.Message) (string, error) {
				if string(msg.Payload) == "slow" {
					// In flight but not joined yet: the first group lingers.
					time.Sleep(2 * linger)
					slowJoined.Store(true)
				}
				return key(msg)
			},
			Operation: "record_effect",
			Mode:      dedup.Transactional{Group: &dedup.Group{MaxLinger: linger, Pipeline: pipelineOf(h)}},
		})
		require.NoError(t, err)
		pubsub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, watermill.NopLogger{})
		t.Cleanup(func() { _ = pubsub.Close() })
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
		require.NoError(t, err)
		var acked sync.Map  // event ID -> effects committed when the handler returned
		var nacked sync.Map // event ID -> the middleware's errors, for a failure's message
		router.AddConsumerHandler("record_effect", "events", pubsub, func(msg *message.Message) error {
			_, err := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				tx, _ := handlerTx(msg.Context())
				return nil, b.effect(msg.Context(), tx, msg.Metadata.Get(EventIDKey), string(msg.Payload))
			})(msg)
			if err != nil {
				prev, _ := nacked.Load(msg.Metadata.Get(EventIDKey))
				nacked.Store(msg.Metadata.Get(EventIDKey), fmt.Sprint(prev, " [", err, "]"))
			}
			if err == nil {
				var n int
				_ = b.db.QueryRowContext(context.Background(), fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE event_id = %s",
					b.effects, b.ph(1)), msg.Metadata.Get(EventIDKey)).Scan(&n)
				acked.Store(msg.Metadata.Get(EventIDKey), n)
			}
			return err
		})
		// Two subscribers' worth of concurrency: gochannel delivers one
		// message at a time per subscriber, so a second handler runs the
		// slow one.
		router.AddConsumerHandler("record_effect_2", "events-slow", pubsub, func(msg *message.Message) error {
			_, err := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				tx, _ := handlerTx(msg.Context())
				return nil, b.effect(msg.Context(), tx, msg.Metadata.Get(EventIDKey), string(msg.Payload))
			})(msg)
			if err == nil {
				acked.Store(msg.Metadata.Get(EventIDKey), -1)
			}
			return err
		})
		runDone := make(chan error, 1)
		go func() { runDone <- router.Run(context.Background()) }()
		<-router.Running()
		require.NoError(t, pubsub.Publish("events-slow", event("slow", "slow")))
		time.Sleep(20 * time.Millisecond)
		require.NoError(t, pubsub.Publish("events", event("fast", "fast")))
		time.Sleep(linger / 3) // the fast one's group is lingering for the slow one
		closing := time.Now()
		require.NoError(t, router.Close())
		require.NoError(t, <-runDone)
		require.Less(t, time.Since(closing), 10*linger, "the linger is bounded")
		// Closing ends the deliveries' contexts: a member whose context
		// ended before its group ran is nacked and nothing is recorded;
		// one acked was committed first. Either way, one effect at most.
		require.True(t, slowJoined.Load())
		for _, key := range []string{"fast", "slow"} {
			if n, ok := acked.Load(key); ok {
				if key == "fast" {
					require.Equal(t, 1, n, "acked after its commit")
				}
				require.Equal(t, 1, b.countEffects(t, key), key)
				continue
			}
			errs, _ := nacked.Load(key)
			require.Equal(t, 0, b.countEffects(t, key), "%s: not acked (the middleware said:%v), yet committed", key, errs)
			_, err := b.store.Get(b.ctx, b.db, inbox.ID{Operation: "record_effect", Key: key})
			require.ErrorIs(t, err, inbox.ErrNotFound, key)
		}
	})
}

// inOneGroupWithHook is inOneGroup calling hook(i) the moment delivery i
// returns.
func (w *gw) inOneGroupWithHook(t *testing.T, msgs []*message.Message, hook func(i int)) []result {
	t.Helper()
	res := make([]result, len(msgs))
	started, unblock := make(chan struct{}), make(chan struct{})
	act := w.act
	w.act = func(msg *message.Message, tx inbox.DBTX) ([]*message.Message, error) {
		if msg.Metadata.Get(EventIDKey) == "blocker" {
			close(started)
			<-unblock
			return nil, nil
		}
		if act != nil {
			return act(msg, tx)
		}
		return nil, nil
	}
	blocked := make(chan error, 1)
	go func() {
		_, err := w.deliver(event("blocker", `{}`))
		blocked <- err
	}()
	<-started
	var wg sync.WaitGroup
	for i, msg := range msgs {
		wg.Go(func() {
			out, err := w.deliver(msg)
			res[i] = result{out: out, err: err, at: time.Now()}
			hook(i)
			if err == nil {
				res[i].effects = w.countEffectsNoT(msg.Metadata.Get(EventIDKey))
			}
		})
		// One after the other, so that they join in this order and the
		// first leads the group.
		require.Eventually(t, func() bool { return w.d.GroupStats().Waiting == i+1 }, 10*time.Second, time.Millisecond,
			"delivery %d joins the group waiting for the coordinator", i)
	}
	close(unblock)
	wg.Wait()
	require.NoError(t, <-blocked)
	w.act = act
	return res
}
