package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

// reserveStore returns a migrated SQLite store on a clock the test moves.
func reserveStore(t *testing.T) (*inbox.Store, *testkit.Clock) {
	t.Helper()
	clk := &testkit.Clock{}
	store, _ := testkit.SQLiteStore(t, inbox.Config{Now: clk.Now})
	return store, clk
}

// newReserve returns a reserve-mode middleware over store with
// test-friendly defaults: key from metadata "event_id", operation "charge",
// a 5 ms poll.
func newReserve(t *testing.T, store *inbox.Store, cfg dedup.Config, rs dedup.Reserve) *dedup.Deduplicator {
	t.Helper()
	if cfg.Key == nil {
		cfg.Key = dedup.KeyFromMetadata("event_id")
	}
	if cfg.Operation == "" {
		cfg.Operation = "charge"
	}
	if rs.InFlightPoll == 0 {
		rs.InFlightPoll = 5 * time.Millisecond
	}
	cfg.Mode = rs
	d, err := dedup.New(store, cfg)
	require.NoError(t, err)
	return d
}

func chargeRecord(t *testing.T, store *inbox.Store, key string) *inbox.Record {
	t.Helper()
	rec, err := store.Get(context.Background(), store.DB(), inbox.ID{Operation: "charge", Key: key})
	require.NoError(t, err)
	return rec
}

// holdLease inserts a processing record for key as if worker owner had
// reserved it with a lease of lease, and returns it.
func holdLease(t *testing.T, store *inbox.Store, key, payload, owner string, lease time.Duration) *inbox.Record {
	t.Helper()
	// The payload hash must be the one the middleware computes.
	fpf, err := dedup.JSONFingerprint()
	require.NoError(t, err)
	h, err := fpf(obsMsg(key, payload))
	require.NoError(t, err)
	res, err := store.Reserve(context.Background(), inbox.ReserveParams{
		ID: inbox.ID{Operation: "charge", Key: key}, PayloadHash: h, Owner: owner, Lease: lease,
	})
	require.NoError(t, err)
	require.NotNil(t, res.Lease, "reserved")
	return chargeRecord(t, store, key)
}

func TestReserveConfigRejectsInvalid(t *testing.T) {
	t.Parallel()
	store := unmigratedStore(t)
	tests := []struct {
		name string
		mode dedup.Reserve
		want string
	}{
		// HeartbeatInterval is set explicitly in some: its default derives
		// from Lease (see TestReserveNegativeLeaseReportsItsOwnProblem).
		{name: "negative Lease", mode: dedup.Reserve{Lease: -time.Second, HeartbeatInterval: -1}, want: "Lease -1s is negative"},
		{name: "HeartbeatInterval equal to Lease", mode: dedup.Reserve{Lease: time.Second, HeartbeatInterval: time.Second},
			want: "HeartbeatInterval 1s must be shorter than Lease 1s"},
		{name: "HeartbeatInterval longer than Lease", mode: dedup.Reserve{Lease: time.Second, HeartbeatInterval: time.Minute},
			want: "HeartbeatInterval 1m0s must be shorter than Lease 1s"},
		{name: "HeartbeatInterval equal to the default Lease", mode: dedup.Reserve{HeartbeatInterval: dedup.DefaultLease},
			want: "HeartbeatInterval 30s must be shorter than Lease 30s"},
		{name: "HeartbeatInterval -2ns", mode: dedup.Reserve{HeartbeatInterval: -2}, want: "HeartbeatInterval -2ns"},
		{name: "HeartbeatInterval -1s", mode: dedup.Reserve{HeartbeatInterval: -time.Second}, want: "HeartbeatInterval -1s"},
		{name: "InFlightWait -2ns", mode: dedup.Reserve{InFlightWait: -2}, want: "InFlightWait -2ns is negative"},
		{name: "InFlightWait -1s", mode: dedup.Reserve{InFlightWait: -time.Second}, want: "InFlightWait -1s is negative"},
		{name: "negative InFlightPoll", mode: dedup.Reserve{InFlightPoll: -1}, want: "InFlightPoll -1ns is negative"},
		{name: "Owner of 256 bytes", mode: dedup.Reserve{Owner: strings.Repeat("o", 256)}, want: "Owner is 256 bytes, more than 255"},
		{name: "Owner with a NUL byte", mode: dedup.Reserve{Owner: "worker\x00a"}, want: "Owner contains a NUL byte"},
		{name: "Owner not UTF-8", mode: dedup.Reserve{Owner: "worker-\xff"}, want: "Owner is not valid UTF-8"},
	}
	for _, tt := range tests {
		for _, byPointer := range []bool{false, true} {
			name := tt.name
			var mode dedup.Mode = tt.mode
			if byPointer {
				name += " by pointer"
				mode = &tt.mode
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				cfg := dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "charge", Mode: mode}
				d, err := dedup.New(store, cfg)
				require.Nil(t, d)
				require.ErrorIs(t, err, dedup.ErrInvalidConfig)
				require.Contains(t, err.Error(), tt.want)
				require.Len(t, leafErrors(err), 1, "exactly one problem: %v", err)
				require.False(t, dedup.IsPoison(err))
				require.False(t, dedup.IsRetryable(err))
			})
		}
	}
}

// A negative Lease is reported; the HeartbeatInterval left at its default
// adds no second, derived complaint: the default (Lease/3) is only
// computed from a positive Lease.
func TestReserveNegativeLeaseReportsItsOwnProblem(t *testing.T) {
	t.Parallel()
	_, err := dedup.New(unmigratedStore(t), dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "charge",
		Mode: dedup.Reserve{Lease: -time.Second}})
	require.ErrorIs(t, err, dedup.ErrInvalidConfig)
	require.Contains(t, err.Error(), "Lease -1s is negative")
	require.Len(t, leafErrors(err), 1, "%v", err)
}

func TestReserveConfigReportsEveryProblemAtOnce(t *testing.T) {
	t.Parallel()
	_, err := dedup.New(unmigratedStore(t), dedup.Config{
		Key: dedup.KeyFromMetadata("event_id"), Operation: "charge", Retention: -2,
		Mode: dedup.Reserve{Lease: time.Second, HeartbeatInterval: 2 * time.Second, InFlightWait: -3,
			InFlightPoll: -time.Millisecond, Owner: strings.Repeat("x", 300)},
	})
	require.ErrorIs(t, err, dedup.ErrInvalidConfig)
	want := []string{"Retention -2ns", "HeartbeatInterval 2s", "InFlightWait -3ns", "InFlightPoll -1ms", "Owner is 300 bytes"}
	for _, w := range want {
		require.Contains(t, err.Error(), w)
	}
	leaves := leafErrors(err)
	require.Len(t, leaves, len(want), "%v", err)
	for _, leaf := range leaves {
		require.ErrorIs(t, leaf, dedup.ErrInvalidConfig, "every problem wraps ErrInvalidConfig: %v", leaf)
	}
}

func TestReserveConfigAcceptsValid(t *testing.T) {
	t.Parallel()
	store := unmigratedStore(t)
	for name, rs := range map[string]dedup.Reserve{
		"defaults":                       {},
		"heartbeat disabled":             {HeartbeatInterval: -1},
		"heartbeat just below the lease": {Lease: time.Second, HeartbeatInterval: time.Second - 1},
		"nack at once":                   {InFlightWait: -1},
		"Owner of 255 bytes":             {Owner: strings.Repeat("o", 255)},
		"Owner of 255 bytes of UTF-8":    {Owner: strings.Repeat("é", 127) + "o"},
		"everything set": {Lease: time.Minute, HeartbeatInterval: 10 * time.Second, InFlightWait: time.Second,
			InFlightPoll: time.Millisecond, Owner: "worker-1", AckPending: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			for _, mode := range []dedup.Mode{rs, &rs} {
				d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "charge", Mode: mode})
				require.NoError(t, err)
				require.NotNil(t, d)
			}
		})
	}
}

// ownerOf runs one delivery through d and returns the lease owner the
// reservation was made under.
func ownerOf(t *testing.T, store *inbox.Store, d *dedup.Deduplicator, key string) string {
	t.Helper()
	var owner string
	_, err := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		owner = chargeRecord(t, store, key).LeaseOwner
		return nil, nil
	})(obsMsg(key, `{}`))
	require.NoError(t, err)
	return owner
}

func TestReserveDefaultOwner(t *testing.T) {
	t.Parallel()
	store, _ := reserveStore(t)
	a := ownerOf(t, store, newReserve(t, store, dedup.Config{}, dedup.Reserve{}), "k1")
	b := ownerOf(t, store, newReserve(t, store, dedup.Config{}, dedup.Reserve{}), "k2")
	require.NotEmpty(t, a)
	require.NotEmpty(t, b)
	require.NotEqual(t, a, b, "every Deduplicator has an owner of its own")
	require.LessOrEqual(t, len(a), 255)
	require.Equal(t, "worker-7", ownerOf(t, store, newReserve(t, store, dedup.Config{}, dedup.Reserve{Owner: "worker-7"}), "k3"))
}

func TestPermanentAndUncertainOfNil(t *testing.T) {
	t.Parallel()
	require.NoError(t, dedup.Permanent(nil))
	require.Nil(t, dedup.Permanent(nil))
	require.NoError(t, dedup.Uncertain(nil, "x"))
	require.Nil(t, dedup.Uncertain(nil, "x"))

	base := errors.New("boom")
	p := dedup.Permanent(base)
	require.ErrorIs(t, p, base)
	require.Equal(t, "permanent failure: boom", p.Error())
	u := dedup.Uncertain(base, "ref")
	require.ErrorIs(t, u, base)
	require.Equal(t, "uncertain outcome: boom", u.Error())
	var ue *dedup.UncertainError
	require.ErrorAs(t, u, &ue)
	require.Equal(t, "ref", ue.ExternalRef)
	require.False(t, dedup.IsPoison(u))
	require.False(t, dedup.IsRetryable(u))
}

func TestReserveUncertainIsPendingRetryableAndNotPoison(t *testing.T) {
	t.Parallel()
	store, _ := reserveStore(t)
	d := newReserve(t, store, dedup.Config{}, dedup.Reserve{InFlightWait: -1})
	timeout := errors.New("provider timed out")
	_, err := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("ignored", nil)}, dedup.Uncertain(timeout, "ch_1")
	})(obsMsg("pay-1", `{}`))
	require.ErrorIs(t, err, dedup.ErrPending)
	require.ErrorIs(t, err, timeout, "the handler's error is wrapped")
	var ue *dedup.UncertainError
	require.ErrorAs(t, err, &ue)
	require.Equal(t, "ch_1", ue.ExternalRef)
	require.True(t, dedup.IsRetryable(err))
	require.False(t, dedup.IsPoison(err))

	rec := chargeRecord(t, store, "pay-1")
	require.Equal(t, inbox.StatusPending, rec.Status)
	require.Equal(t, "ch_1", rec.ExternalRef)
	require.Equal(t, "provider timed out", rec.Error)
	require.Empty(t, rec.Result, "an uncertain outcome stores no output")
	require.Empty(t, rec.LeaseOwner)
	require.Equal(t, dedup.Stats{Pending: 1}, d.Stats())
}

func TestReservePermanentIsPoison(t *testing.T) {
	t.Parallel()
	store, _ := reserveStore(t)
	d := newReserve(t, store, dedup.Config{}, dedup.Reserve{})
	declined := errors.New("card declined")
	_, err := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		return nil, dedup.Permanent(declined)
	})(obsMsg("pay-1", `{}`))
	require.ErrorIs(t, err, declined)
	var pe *dedup.PermanentError
	require.ErrorAs(t, err, &pe)
	require.True(t, dedup.IsPoison(err))
	require.False(t, dedup.IsRetryable(err))
	require.False(t, errors.Is(err, dedup.ErrPending))
	rec := chargeRecord(t, store, "pay-1")
	require.Equal(t, inbox.StatusFailed, rec.Status)
	require.Equal(t, "card declined", rec.Error)
	require.Equal(t, dedup.Stats{Failed: 1}, d.Stats())
}

func TestReserveOutputIsStoredAndHandedBackToDuplicates(t *testing.T) {
	t.Parallel()
	store, _ := reserveStore(t)
	d := newReserve(t, store, dedup.Config{}, dedup.Reserve{})
	var calls int
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		calls++
		a := message.NewMessage("out-1", []byte(`{"charged":100}`))
		a.Metadata.Set("charge_id", "ch_1")
		a.Metadata.Set("bin", "\xff\x00")
		b := message.NewMessage("out-2", []byte{0, 1, 2, 0xfe})
		return []*message.Message{a, b}, nil
	})
	first, err := h(obsMsg("pay-1", `{"amount":100}`))
	require.NoError(t, err)
	require.Len(t, first, 2)
	rec := chargeRecord(t, store, "pay-1")
	require.Equal(t, inbox.StatusCompleted, rec.Status)
	require.NotEmpty(t, rec.Result, "the output is stored with the record")

	for range 2 {
		again, err := h(obsMsg("pay-1", `{"amount":100}`))
		require.NoError(t, err)
		require.Len(t, again, len(first))
		for i := range first {
			require.Equal(t, first[i].UUID, again[i].UUID)
			require.Equal(t, first[i].Metadata, again[i].Metadata)
			require.Equal(t, []byte(first[i].Payload), []byte(again[i].Payload))
		}
	}
	require.Equal(t, 1, calls)
	require.Equal(t, dedup.Stats{Executed: 1, Duplicates: 2}, d.Stats())
}

func TestReserveNilOutputMessageStillRecordsCompletion(t *testing.T) {
	t.Parallel()
	store, _ := reserveStore(t)
	logger := testkit.NewLogger()
	d := newReserve(t, store, dedup.Config{Logger: logger}, dedup.Reserve{})
	var calls int
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		calls++
		return []*message.Message{message.NewMessage("out-1", []byte("x")), nil}, nil
	})
	out, err := h(obsMsg("pay-1", `{}`))
	require.NoError(t, err, "the effect happened: the delivery is acked")
	require.Empty(t, out, "the unusable output is dropped")
	rec := chargeRecord(t, store, "pay-1")
	require.Equal(t, inbox.StatusCompleted, rec.Status)
	require.Empty(t, rec.Result)

	out, err = h(obsMsg("pay-1", `{}`))
	require.NoError(t, err)
	require.Empty(t, out)
	require.Equal(t, 1, calls, "a duplicate does not run the handler again")
	require.Equal(t, dedup.Stats{Executed: 1, Duplicates: 1}, d.Stats())

	var found bool
	for _, e := range logger.Entries() {
		if strings.Contains(e.Msg, "output cannot be stored") {
			found = true
			require.Equal(t, "info", e.Level)
			require.Contains(t, e.Fields["error"], "nil message at index 1")
		}
	}
	require.True(t, found, "the dropped output is logged: %v", logger.Entries())
}

func TestReserveStats(t *testing.T) {
	t.Parallel()
	store, clk := reserveStore(t)
	d := newReserve(t, store, dedup.Config{}, dedup.Reserve{Lease: time.Minute, InFlightWait: -1})
	boom := errors.New("503")
	var calls atomic.Int64
	h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		calls.Add(1)
		switch msg.Metadata.Get("event_id") {
		case "uncertain":
			return nil, dedup.Uncertain(boom, "")
		case "permanent":
			return nil, dedup.Permanent(boom)
		case "transient":
			if c, _ := dedup.ClaimFromContext(msg.Context()); c.Attempt == 1 {
				return nil, boom
			}
		}
		return nil, nil
	})
	deliver := func(key string) error {
		_, err := h(obsMsg(key, `{}`))
		return err
	}

	require.NoError(t, deliver("ok"))
	require.NoError(t, deliver("ok"))
	require.ErrorIs(t, deliver("uncertain"), dedup.ErrPending)
	require.ErrorIs(t, deliver("uncertain"), dedup.ErrPending, "redelivery of a pending intent")
	require.ErrorIs(t, deliver("permanent"), boom)
	require.NoError(t, deliver("permanent"), "a failed intent's duplicate is acked")
	require.ErrorIs(t, deliver("transient"), boom)
	require.NoError(t, deliver("transient"), "released: taken over at once")
	holdLease(t, store, "held", `{}`, "other", time.Minute)
	require.ErrorIs(t, deliver("held"), dedup.ErrInFlight)
	clk.Advance(2 * time.Minute)
	require.NoError(t, deliver("held"), "expired: taken over")
	require.ErrorIs(t, deliver(""), dedup.ErrMissingKey)
	_, err := h(obsMsg("ok", `{"other":true}`))
	require.ErrorIs(t, err, dedup.ErrPayloadConflict)

	require.Equal(t, dedup.Stats{
		Executed:   3, // ok, transient's second attempt, held
		Duplicates: 2, // ok, permanent
		Conflicts:  1,
		InFlight:   1,
		Invalid:    1,
		Retries:    1, // transient's first attempt
		Failed:     1,
		Pending:    2,
		Takeovers:  2, // transient, held
	}, d.Stats())
	require.EqualValues(t, 6, calls.Load())
	require.EqualValues(t, 2, chargeRecord(t, store, "held").Attempt)
}

func TestReserveWaitsForAnInFlightDelivery(t *testing.T) {
	t.Parallel()
	store, _ := reserveStore(t)
	first := newReserve(t, store, dedup.Config{}, dedup.Reserve{})
	started, release := make(chan struct{}), make(chan struct{})
	firstDone := make(chan error, 1)
	go func() {
		_, err := first.Middleware(func(*message.Message) ([]*message.Message, error) {
			close(started)
			<-release
			return []*message.Message{message.NewMessage("out-1", []byte("done"))}, nil
		})(obsMsg("pay-1", `{}`))
		firstDone <- err
	}()
	<-started

	var ran atomic.Int64
	h := func(*message.Message) ([]*message.Message, error) {
		ran.Add(1)
		return nil, nil
	}
	// Without waiting, the second delivery nacks at once.
	impatient := newReserve(t, store, dedup.Config{}, dedup.Reserve{InFlightWait: -1})
	_, err := impatient.Middleware(h)(obsMsg("pay-1", `{}`))
	require.ErrorIs(t, err, dedup.ErrInFlight)

	// With InFlightWait it waits for the first to finish and is a duplicate.
	// Its wait is far longer than the first handler runs, however slow the
	// machine: the outcome does not hang on a race between the two.
	patient := newReserve(t, store, dedup.Config{}, dedup.Reserve{InFlightWait: time.Minute})
	type result struct {
		out []*message.Message
		err error
	}
	second := make(chan result, 1)
	go func() {
		out, err := patient.Middleware(h)(obsMsg("pay-1", `{}`))
		second <- result{out, err}
	}()
	time.Sleep(50 * time.Millisecond) // let the second start waiting; the first handler runs until released
	close(release)
	require.NoError(t, <-firstDone)
	res := <-second
	require.NoError(t, res.err, "a duplicate, not ErrInFlight")
	require.Len(t, res.out, 1)
	require.Equal(t, "out-1", res.out[0].UUID)
	require.Zero(t, ran.Load())
	require.Equal(t, dedup.Stats{Duplicates: 1}, patient.Stats())
	require.Equal(t, dedup.Stats{InFlight: 1}, impatient.Stats())
}

func TestReserveWaitingDeliveryHonoursItsContext(t *testing.T) {
	t.Parallel()
	store, _ := reserveStore(t)
	d := newReserve(t, store, dedup.Config{}, dedup.Reserve{InFlightWait: time.Hour})
	held := holdLease(t, store, "held", `{}`, "other", time.Hour)
	res, err := store.Reserve(context.Background(), inbox.ReserveParams{ID: inbox.ID{Operation: "charge", Key: "pending"},
		PayloadHash: held.PayloadHash, Owner: "other", Lease: time.Hour})
	require.NoError(t, err)
	require.NoError(t, res.Lease.Pend(context.Background(), "", "timeout"))

	var ran atomic.Int64
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		ran.Add(1)
		return nil, nil
	})
	for _, key := range []string{"held", "pending"} {
		t.Run(key, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			msg := obsMsg(key, `{}`)
			msg.SetContext(ctx)
			done := make(chan error, 1)
			go func() {
				_, err := h(msg)
				done <- err
			}()
			time.Sleep(20 * time.Millisecond) // let it start waiting
			cancel()
			select {
			case err := <-done:
				require.ErrorIs(t, err, context.Canceled)
			case <-time.After(5 * time.Second):
				t.Fatal("the waiting delivery ignored its context's cancellation")
			}
		})
	}

	// A delivery whose context is gone before it starts does not run either.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	msg := obsMsg("fresh", `{}`)
	msg.SetContext(ctx)
	_, err = h(msg)
	require.Error(t, err)
	require.ErrorIs(t, err, context.Canceled)

	require.Zero(t, ran.Load(), "the handler never ran")
	require.Equal(t, held, chargeRecord(t, store, "held"), "the held record is untouched")
	require.Equal(t, inbox.StatusPending, chargeRecord(t, store, "pending").Status)
	_, err = store.Get(context.Background(), store.DB(), inbox.ID{Operation: "charge", Key: "fresh"})
	require.ErrorIs(t, err, inbox.ErrNotFound)
	require.Equal(t, dedup.Stats{Retries: 3}, d.Stats())
}

func TestReserveNeverLogsAtErrorLevel(t *testing.T) {
	t.Parallel()
	store, _ := reserveStore(t)
	logger := testkit.NewLogger()
	d := newReserve(t, store, dedup.Config{Logger: logger}, dedup.Reserve{InFlightWait: -1})
	h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		switch msg.Metadata.Get("event_id") {
		case "uncertain":
			return nil, dedup.Uncertain(errors.New("timeout"), "ref")
		case "permanent":
			return nil, dedup.Permanent(errors.New("declined"))
		case "transient":
			return nil, errors.New("503")
		case "panic":
			panic("handler bug")
		case "nil-output":
			return []*message.Message{nil}, nil
		}
		return nil, nil
	})
	holdLease(t, store, "held", `{}`, "other", time.Hour)
	for _, key := range []string{"ok", "ok", "uncertain", "uncertain", "permanent", "permanent", "transient",
		"panic", "nil-output", "held", ""} {
		_, _ = h(obsMsg(key, `{}`))
	}
	_, _ = h(obsMsg("ok", `{"x":1}`)) // conflict

	entries := logger.Entries()
	require.NotEmpty(t, entries)
	outcomes := map[string]bool{}
	for _, e := range entries {
		require.NotEqual(t, "error", e.Level, "never at Error level: %v", e)
		require.Equal(t, "reserve", e.Fields["mode"], "%v", e)
		if o, ok := e.Fields["outcome"].(string); ok {
			outcomes[o] = true
		}
	}
	for _, o := range []dedup.Outcome{dedup.OutcomeExecuted, dedup.OutcomeDuplicate, dedup.OutcomePending,
		dedup.OutcomeFailed, dedup.OutcomeRetry, dedup.OutcomeInFlight, dedup.OutcomeInvalid, dedup.OutcomeConflict} {
		require.True(t, outcomes[string(o)], "outcome %s was logged", o)
	}
}

// The conformance suite checks that a lost lease cancels the handler's
// context; this checks how it is reported: at Info, never Error, and the
// record left to the worker that holds it.
func TestReserveLostLeaseIsLoggedAtInfo(t *testing.T) {
	t.Parallel()
	store, _ := reserveStore(t)
	logger := testkit.NewLogger()
	d := newReserve(t, store, dedup.Config{Logger: logger}, dedup.Reserve{Lease: time.Minute, HeartbeatInterval: 5 * time.Millisecond})
	var cause error
	_, err := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		// Another worker takes the intent over behind this one's back.
		_, err := store.DB().ExecContext(context.Background(),
			`UPDATE inbox SET attempt = attempt + 1, lease_owner = 'thief'`)
		if err != nil {
			return nil, err
		}
		select {
		case <-msg.Context().Done():
			cause = context.Cause(msg.Context())
		case <-time.After(10 * time.Second):
		}
		return nil, nil // the effect happened, but too late to be recorded
	})(obsMsg("pay-1", `{}`))
	require.ErrorIs(t, cause, dedup.ErrLeaseLost, "the heartbeat cancelled the handler's context")
	require.ErrorIs(t, err, dedup.ErrLeaseLost)
	require.True(t, dedup.IsRetryable(err))
	require.False(t, dedup.IsPoison(err))
	rec := chargeRecord(t, store, "pay-1")
	require.Equal(t, inbox.StatusProcessing, rec.Status, "this worker's outcome was not recorded")
	require.Equal(t, "thief", rec.LeaseOwner)
	require.EqualValues(t, 2, rec.Attempt)

	var lostLogged bool
	for _, e := range logger.Entries() {
		require.NotEqual(t, "error", e.Level, "%v", e)
		if strings.Contains(e.Msg, "lease lost") {
			lostLogged = true
			require.Equal(t, "info", e.Level)
		}
	}
	require.True(t, lostLogged, "%v", logger.Entries())
	require.Equal(t, dedup.Stats{Retries: 1}, d.Stats())
}

func TestReserveClaimInContext(t *testing.T) {
	t.Parallel()
	store, _ := reserveStore(t)
	d := newReserve(t, store, dedup.Config{}, dedup.Reserve{})
	var (
		claim dedup.Claim
		ok    bool
		hasTx bool
	)
	msg := obsMsg("pay-1", `{}`)
	_, err := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		_, hasTx = dedup.TxFromContext(msg.Context())
		claim, ok = dedup.ClaimFromContext(msg.Context())
		return nil, nil
	})(msg)
	require.NoError(t, err)
	require.False(t, hasTx, "reserve mode runs the handler with no transaction")
	require.True(t, ok)
	require.Equal(t, "", claim.Scope)
	require.Equal(t, "charge", claim.Operation)
	require.Equal(t, "pay-1", claim.Key)
	require.EqualValues(t, 1, claim.Attempt)
	require.Len(t, claim.IdempotencyKey, 64)
	require.Equal(t, chargeRecord(t, store, "pay-1").IdempotencyKey(), claim.IdempotencyKey)
	require.Equal(t, inbox.ID{Operation: "charge", Key: "pay-1"}, claim.ID)
	_, ok = dedup.ClaimFromContext(msg.Context())
	require.False(t, ok, "the message's context is restored after the handler")
}

// TestReserveHeartbeatLeavesNoGoroutine is not parallel: it checks that no
// goroutine is left once its deliveries are done and its database closed.
func TestReserveHeartbeatLeavesNoGoroutine(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	store, db := testkit.SQLiteStore(t, inbox.Config{})
	d := newReserve(t, store, dedup.Config{}, dedup.Reserve{Lease: 50 * time.Millisecond, HeartbeatInterval: 5 * time.Millisecond,
		InFlightWait: -1})

	boom := errors.New("boom")
	h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		key := msg.Metadata.Get("event_id")
		first := chargeRecord(t, store, key).LeaseUntil
		time.Sleep(50 * time.Millisecond)
		// The heartbeat keeps extending the lease while the handler runs.
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if chargeRecord(t, store, key).LeaseUntil.After(first) {
				break
			}
		}
		if until := chargeRecord(t, store, key).LeaseUntil; !until.After(first) {
			return nil, fmt.Errorf("the lease was not extended: %v then %v", first, until)
		}
		switch key {
		case "fails":
			return nil, boom
		case "panics":
			panic("handler bug")
		}
		return nil, nil
	})

	_, err := h(obsMsg("succeeds", `{}`))
	require.NoError(t, err)
	_, err = h(obsMsg("fails", `{}`))
	require.ErrorIs(t, err, boom)
	_, err = h(obsMsg("panics", `{}`))
	var pe *dedup.PanicError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "handler bug", pe.Value)
	require.Equal(t, dedup.Stats{Executed: 1, Retries: 2}, d.Stats())

	require.Equal(t, inbox.StatusCompleted, chargeRecord(t, store, "succeeds").Status)
	for _, key := range []string{"fails", "panics"} {
		rec := chargeRecord(t, store, key)
		require.Equal(t, inbox.StatusProcessing, rec.Status)
		require.True(t, rec.LeaseUntil.IsZero(), "%s: released", key)
	}

	require.NoError(t, db.Close())
	goleak.VerifyNone(t, ignore)
}
