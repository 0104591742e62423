package reconcile_test

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
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inboxmill/inboxmill/handlers/reconcile"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
	"github.com/inboxmill/inboxmill/tests/testdb"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

// env is a migrated SQLite inbox on a clock the test moves.
type env struct {
	t     *testing.T
	ctx   context.Context
	db    *sql.DB
	store *inbox.Store
	clock *testkit.Clock
}

func newEnv(t *testing.T, table string) *env {
	t.Helper()
	return envOn(t, testdb.Open(t, testdb.SQLite), table)
}

func envOn(t *testing.T, db *sql.DB, table string) *env {
	t.Helper()
	e := &env{t: t, ctx: context.Background(), db: db, clock: &testkit.Clock{}}
	e.store = testkit.MigratedStore(t, db, sqlite.Dialect(), inbox.Config{Table: table, Now: e.clock.Now})
	return e
}

// processing inserts a record reserved by worker "w" for lease, and
// returns it with the worker's handle.
func (e *env) processing(key string, lease time.Duration) (*inbox.Record, *inbox.Lease) {
	e.t.Helper()
	res, err := e.store.Reserve(e.ctx, inbox.ReserveParams{ID: inbox.ID{Operation: "charge", Key: key},
		PayloadHash: []byte(key), Owner: "w", Lease: lease})
	require.NoError(e.t, err)
	require.NotNil(e.t, res.Lease, "reserved")
	return e.get(key), res.Lease
}

// pending inserts a record whose outcome is uncertain, as a reserve-mode
// handler that returned dedup.Uncertain leaves it.
func (e *env) pending(key, ref string) *inbox.Record {
	e.t.Helper()
	_, lease := e.processing(key, time.Minute)
	require.NoError(e.t, lease.Pend(e.ctx, ref, "timeout"))
	return e.get(key)
}

func (e *env) get(key string) *inbox.Record {
	e.t.Helper()
	rec, err := e.store.Get(e.ctx, e.db, inbox.ID{Operation: "charge", Key: key})
	require.NoError(e.t, err)
	return rec
}

// requireUntouched checks that rec is want apart from updated_at, which a
// pass moves on a pending record it leaves unresolved (so that the next pass
// pages past it).
func requireUntouched(t *testing.T, want, rec *inbox.Record, msgAndArgs ...any) {
	t.Helper()
	w, r := *want, *rec
	require.False(t, r.UpdatedAt.Before(w.UpdatedAt), "updated_at does not go back")
	w.UpdatedAt, r.UpdatedAt = time.Time{}, time.Time{}
	require.Equal(t, w, r, msgAndArgs...)
}

func (e *env) reconciler(cfg reconcile.Config) *reconcile.Reconciler {
	e.t.Helper()
	r, err := reconcile.New(e.store, cfg)
	require.NoError(e.t, err)
	return r
}

func resolveAll(v reconcile.Verdict) reconcile.ResolveFunc {
	return func(context.Context, *inbox.Record) (reconcile.Resolution, error) {
		return reconcile.Resolution{Verdict: v}, nil
	}
}

// metric returns the value of the gauge or counter name whose labels
// include labels, and whether it exists.
func metric(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue(), true
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

func requireMetric(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string, want float64) {
	t.Helper()
	v, ok := metric(t, g, name, labels)
	require.True(t, ok, "%s%v exists", name, labels)
	require.InDelta(t, want, v, 5, "%s%v", name, labels)
}

func TestNewReconcilerRejectsInvalidConfig(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "inbox")
	valid := func() reconcile.Config {
		return reconcile.Config{Resolve: resolveAll(reconcile.Unresolved)}
	}
	tests := []struct {
		name   string
		store  *inbox.Store
		mutate func(*reconcile.Config)
		want   string
	}{
		{name: "nil store", mutate: func(*reconcile.Config) {}, want: "store is nil"},
		{name: "missing Resolve", store: e.store, mutate: func(c *reconcile.Config) { c.Resolve = nil }, want: "Resolve is required"},
		{name: "negative Interval", store: e.store, mutate: func(c *reconcile.Config) { c.Interval = -time.Second }, want: "Interval -1s is negative"},
		{name: "negative BatchSize", store: e.store, mutate: func(c *reconcile.Config) { c.BatchSize = -1 }, want: "BatchSize -1 is negative"},
		{name: "StaleAfter -2ns", store: e.store, mutate: func(c *reconcile.Config) { c.StaleAfter = -2 }, want: "StaleAfter -2ns is negative"},
		{name: "negative Lease", store: e.store, mutate: func(c *reconcile.Config) { c.Lease = -time.Minute }, want: "Lease -1m0s is negative"},
		{name: "negative MaxTries", store: e.store, mutate: func(c *reconcile.Config) { c.MaxTries = -1 }, want: "MaxTries -1 is negative"},
		{name: "Owner of 256 bytes", store: e.store, mutate: func(c *reconcile.Config) { c.Owner = strings.Repeat("o", 256) }, want: "Owner is 256 bytes, more than 255"},
		{name: "Owner with a NUL byte", store: e.store, mutate: func(c *reconcile.Config) { c.Owner = "r\x00" }, want: "Owner contains a NUL byte"},
		{name: "Owner not UTF-8", store: e.store, mutate: func(c *reconcile.Config) { c.Owner = "r\xff" }, want: "Owner is not valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := valid()
			tt.mutate(&cfg)
			r, err := reconcile.New(tt.store, cfg)
			require.Nil(t, r)
			require.ErrorIs(t, err, reconcile.ErrInvalidConfig)
			require.Contains(t, err.Error(), tt.want)
		})
	}

	t.Run("every problem at once", func(t *testing.T) {
		t.Parallel()
		_, err := reconcile.New(nil, reconcile.Config{Interval: -1, BatchSize: -1, StaleAfter: -5,
			Lease: -1, MaxTries: -1, Owner: strings.Repeat("x", 300)})
		require.ErrorIs(t, err, reconcile.ErrInvalidConfig)
		for _, w := range []string{"store is nil", "Resolve is required", "Interval", "BatchSize", "StaleAfter",
			"Lease", "MaxTries", "Owner"} {
			require.Contains(t, err.Error(), w)
		}
	})

	t.Run("valid", func(t *testing.T) {
		t.Parallel()
		for _, cfg := range []reconcile.Config{
			valid(),
			{Resolve: resolveAll(reconcile.Unresolved), StaleAfter: -1},
			{Resolve: resolveAll(reconcile.Unresolved), Interval: time.Second, BatchSize: 1, StaleAfter: time.Hour,
				Lease: time.Second, MaxTries: 1, Owner: strings.Repeat("o", 255), Logger: watermill.NopLogger{}},
		} {
			r, err := reconcile.New(e.store, cfg)
			require.NoError(t, err)
			require.NotNil(t, r)
		}
	})
}

func TestVerdictString(t *testing.T) {
	t.Parallel()
	for v, want := range map[reconcile.Verdict]string{
		reconcile.Unresolved: "unresolved", reconcile.Succeeded: "succeeded", reconcile.Failed: "failed",
		reconcile.NotHappened: "not_happened", reconcile.Verdict(42): "Verdict(42)",
	} {
		require.Equal(t, want, v.String())
	}
}

func TestReconcilerEmptyTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "inbox")
	reg := prometheus.NewRegistry()
	var asked atomic.Int64
	r := e.reconciler(reconcile.Config{Registerer: reg,
		Resolve: func(context.Context, *inbox.Record) (reconcile.Resolution, error) {
			asked.Add(1)
			return reconcile.Resolution{}, nil
		}})
	for range 2 {
		rep, err := r.RunOnce(e.ctx)
		require.NoError(t, err)
		require.Zero(t, rep.Examined)
		require.Zero(t, rep.Unresolved)
		require.Zero(t, rep.GaveUp)
		require.NotNil(t, rep.Resolved)
		require.Empty(t, rep.Resolved)
	}
	require.Zero(t, asked.Load())
	labels := map[string]string{"table": "inbox"}
	requireMetric(t, reg, "inboxmill_reconciler_pending", labels, 0)
	requireMetric(t, reg, "inboxmill_reconciler_oldest_pending_age_seconds", labels, 0)
	requireMetric(t, reg, "inboxmill_reconciler_unresolved", labels, 0)
}

func TestReconcilerResolveErrorCountsAsUnresolved(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "inbox")
	before := e.pending("pay-1", "ch_1")
	logger := testkit.NewLogger()
	r := e.reconciler(reconcile.Config{Logger: logger,
		Resolve: func(context.Context, *inbox.Record) (reconcile.Resolution, error) {
			// The verdict is ignored when an error comes with it.
			return reconcile.Resolution{Verdict: reconcile.Succeeded}, errors.New("provider unreachable")
		}})
	rep, err := r.RunOnce(e.ctx)
	require.NoError(t, err, "a single record's failure is not the pass's")
	require.Equal(t, 1, rep.Examined)
	require.Equal(t, 1, rep.Unresolved)
	require.Empty(t, rep.Resolved)
	requireUntouched(t, before, e.get("pay-1"), "the record is unchanged")
	infos := logger.At("info")
	require.Len(t, infos, 1)
	require.Contains(t, infos[0].Msg, "resolve failed")
	require.Equal(t, "provider unreachable", infos[0].Fields["error"])
	require.Empty(t, logger.At("error"), "a pass cut short by Close is not a failure")
}

func TestReconcilerUnknownVerdictIsAnError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "inbox")
	before := e.pending("pay-1", "")
	r := e.reconciler(reconcile.Config{Resolve: resolveAll(reconcile.Verdict(42))})
	rep, err := r.RunOnce(e.ctx)
	require.Error(t, err)
	require.Contains(t, err.Error(), "unknown verdict 42")
	require.Equal(t, 1, rep.Examined)
	require.Equal(t, 1, rep.Unresolved)
	require.Empty(t, rep.Resolved)
	require.Equal(t, before, e.get("pay-1"))
}

func TestReconcilerFailedVerdictStoresTheError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "inbox")
	e.pending("pay-1", "ch_1")
	r := e.reconciler(reconcile.Config{
		Resolve: func(context.Context, *inbox.Record) (reconcile.Resolution, error) {
			return reconcile.Resolution{Verdict: reconcile.Failed, Error: "card declined"}, nil
		}})
	rep, err := r.RunOnce(e.ctx)
	require.NoError(t, err)
	require.Equal(t, map[reconcile.Verdict]int{reconcile.Failed: 1}, rep.Resolved)
	require.Zero(t, rep.Unresolved)
	rec := e.get("pay-1")
	require.Equal(t, inbox.StatusFailed, rec.Status)
	require.Equal(t, "card declined", rec.Error)
	require.Equal(t, "ch_1", rec.ExternalRef, "an empty ExternalRef keeps the stored one")
	require.Empty(t, rec.LeaseOwner)
	require.True(t, rec.LeaseUntil.IsZero())

	rep, err = r.RunOnce(e.ctx)
	require.NoError(t, err)
	require.Zero(t, rep.Examined, "a failed record is final")
}

func TestReconcilerSucceededVerdictStoresTheResult(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "inbox")
	e.pending("pay-1", "ch_1")
	r := e.reconciler(reconcile.Config{
		Resolve: func(context.Context, *inbox.Record) (reconcile.Resolution, error) {
			return reconcile.Resolution{Verdict: reconcile.Succeeded, Result: []byte("replay me"), ExternalRef: "ch_2"}, nil
		}})
	rep, err := r.RunOnce(e.ctx)
	require.NoError(t, err)
	require.Equal(t, map[reconcile.Verdict]int{reconcile.Succeeded: 1}, rep.Resolved)
	rec := e.get("pay-1")
	require.Equal(t, inbox.StatusCompleted, rec.Status)
	require.Equal(t, []byte("replay me"), rec.Result)
	require.Equal(t, "ch_2", rec.ExternalRef)
	require.Empty(t, rec.Error, "the uncertainty's error is cleared")
}

func TestReconcilerMaxTries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "inbox")
	e.pending("pay-1", "ch_1")
	before := e.get("pay-1")
	logger := testkit.NewLogger()
	reg := prometheus.NewRegistry()
	var verdict atomic.Int64 // reconcile.Unresolved
	r := e.reconciler(reconcile.Config{MaxTries: 3, Logger: logger, Registerer: reg,
		Resolve: func(context.Context, *inbox.Record) (reconcile.Resolution, error) {
			return reconcile.Resolution{Verdict: reconcile.Verdict(verdict.Load())}, nil
		}})
	unresolved := map[string]string{"table": "inbox"}
	for pass := 1; pass <= 2; pass++ {
		rep, err := r.RunOnce(e.ctx)
		require.NoError(t, err)
		require.Equal(t, 1, rep.Unresolved, "pass %d", pass)
		require.Zero(t, rep.GaveUp, "pass %d", pass)
		require.Empty(t, logger.At("error"), "pass %d", pass)
		requireMetric(t, reg, "inboxmill_reconciler_unresolved", unresolved, 0)
	}
	rep, err := r.RunOnce(e.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Unresolved)
	require.Equal(t, 1, rep.GaveUp, "unresolved after MaxTries passes")
	errs := logger.At("error")
	require.Len(t, errs, 1)
	require.Contains(t, errs[0].Msg, "MaxTries")
	require.Equal(t, "charge", errs[0].Fields["operation"])
	require.Equal(t, "ch_1", errs[0].Fields["external_ref"])
	require.NotContains(t, fmt.Sprint(errs[0].Fields), "pay-1", "the key is logged as a digest")
	requireMetric(t, reg, "inboxmill_reconciler_unresolved", unresolved, 1)
	requireUntouched(t, before, e.get("pay-1"), "it stays pending")

	// Resolved at last: the record leaves the unresolved count.
	verdict.Store(int64(reconcile.Succeeded))
	rep, err = r.RunOnce(e.ctx)
	require.NoError(t, err)
	require.Zero(t, rep.GaveUp)
	require.Equal(t, 1, rep.Resolved[reconcile.Succeeded])
	requireMetric(t, reg, "inboxmill_reconciler_unresolved", unresolved, 0)
}

func TestReconcilerMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "payments_inbox")
	reg := prometheus.NewRegistry()
	e.pending("pay-1", "")
	e.pending("pay-2", "")
	e.clock.Advance(90 * time.Minute)
	verdicts := map[string]reconcile.Verdict{"pay-1": reconcile.Succeeded, "pay-2": reconcile.Unresolved}
	var mu sync.Mutex
	r := e.reconciler(reconcile.Config{MaxTries: 1, Registerer: reg,
		Resolve: func(_ context.Context, rec *inbox.Record) (reconcile.Resolution, error) {
			mu.Lock()
			defer mu.Unlock()
			return reconcile.Resolution{Verdict: verdicts[rec.Key]}, nil
		}})
	table := map[string]string{"table": "payments_inbox"}
	for _, name := range []string{"inboxmill_reconciler_pending", "inboxmill_reconciler_oldest_pending_age_seconds",
		"inboxmill_reconciler_unresolved"} {
		requireMetric(t, reg, name, table, 0)
	}

	rep, err := r.RunOnce(e.ctx)
	require.NoError(t, err)
	require.Equal(t, 2, rep.Examined)
	requireMetric(t, reg, "inboxmill_reconciler_pending", table, 1)
	requireMetric(t, reg, "inboxmill_reconciler_oldest_pending_age_seconds", table, (90 * time.Minute).Seconds())
	requireMetric(t, reg, "inboxmill_reconciler_unresolved", table, 1)
	requireMetric(t, reg, "inboxmill_reconciler_resolved_total",
		map[string]string{"table": "payments_inbox", "verdict": "succeeded"}, 1)

	mu.Lock()
	verdicts["pay-2"] = reconcile.Failed
	mu.Unlock()
	_, err = r.RunOnce(e.ctx)
	require.NoError(t, err)
	requireMetric(t, reg, "inboxmill_reconciler_pending", table, 0)
	requireMetric(t, reg, "inboxmill_reconciler_oldest_pending_age_seconds", table, 0)
	requireMetric(t, reg, "inboxmill_reconciler_unresolved", table, 0)
	requireMetric(t, reg, "inboxmill_reconciler_resolved_total",
		map[string]string{"table": "payments_inbox", "verdict": "succeeded"}, 1)
	requireMetric(t, reg, "inboxmill_reconciler_resolved_total",
		map[string]string{"table": "payments_inbox", "verdict": "failed"}, 1)
	_, ok := metric(t, reg, "inboxmill_reconciler_resolved_total", map[string]string{"verdict": "not_happened"})
	require.False(t, ok)
}

func TestReconcilerMetricsRegistration(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "inbox")
	other := envOn(t, e.db, "other_inbox")
	reg := prometheus.NewRegistry()
	cfg := reconcile.Config{Resolve: resolveAll(reconcile.Unresolved), Registerer: reg}
	_, err := reconcile.New(e.store, cfg)
	require.NoError(t, err)

	r, err := reconcile.New(e.store, cfg)
	require.Error(t, err, "a second reconciler for the same table on the same registry")
	require.Nil(t, r)
	require.Contains(t, err.Error(), "already registered")
	require.NotErrorIs(t, err, reconcile.ErrInvalidConfig)

	// Another table has series of its own on the same registry.
	r, err = reconcile.New(other.store, cfg)
	require.NoError(t, err)
	other.pending("pay-1", "")
	_, err = r.RunOnce(e.ctx)
	require.NoError(t, err)
	requireMetric(t, reg, "inboxmill_reconciler_pending", map[string]string{"table": "other_inbox"}, 1)
	requireMetric(t, reg, "inboxmill_reconciler_pending", map[string]string{"table": "inbox"}, 0)

	// And another registry is independent.
	_, err = reconcile.New(e.store, reconcile.Config{Resolve: resolveAll(reconcile.Unresolved),
		Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
}

func TestReconcilerStaleAfterDisabledLeavesProcessingRecordsAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "inbox")
	abandoned, _ := e.processing("abandoned", time.Minute)
	e.pending("pay-1", "")
	e.clock.Advance(30 * 24 * time.Hour)
	var asked []string
	r := e.reconciler(reconcile.Config{StaleAfter: -1,
		Resolve: func(_ context.Context, rec *inbox.Record) (reconcile.Resolution, error) {
			asked = append(asked, rec.Key)
			return reconcile.Resolution{Verdict: reconcile.Succeeded}, nil
		}})
	rep, err := r.RunOnce(e.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Examined)
	require.Equal(t, []string{"pay-1"}, asked, "pending records are still resolved")
	require.Equal(t, abandoned, e.get("abandoned"), "the processing record is not taken over")
}

func TestReconcilerCloseWithoutStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "inbox")
	r := e.reconciler(reconcile.Config{Resolve: resolveAll(reconcile.Unresolved)})
	require.NoError(t, r.Close())
	require.NoError(t, r.Close())
}

// TestReconcilerStartAndClose is not parallel: it checks that Close leaves
// no goroutine behind.
func TestReconcilerStartAndClose(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	e := newEnv(t, "inbox")
	e.pending("pay-1", "")

	// The first pass starts at once; Close cancels the context of a Resolve
	// under way and waits for the pass to end.
	asking := make(chan struct{})
	var asked atomic.Int64
	logger := testkit.NewLogger()
	r := e.reconciler(reconcile.Config{Interval: time.Hour, Logger: logger,
		Resolve: func(ctx context.Context, _ *inbox.Record) (reconcile.Resolution, error) {
			if asked.Add(1) == 1 {
				close(asking)
			}
			<-ctx.Done()
			return reconcile.Resolution{}, ctx.Err()
		}})
	require.NoError(t, r.Start())
	err := r.Start()
	require.Error(t, err, "started twice")
	require.Contains(t, err.Error(), "already running")
	select {
	case <-asking:
	case <-time.After(10 * time.Second):
		t.Fatal("Start ran no pass")
	}
	closeDone := make(chan error, 1)
	go func() { closeDone <- r.Close() }()
	select {
	case err := <-closeDone:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not stop a pass blocked in Resolve")
	}
	require.NoError(t, r.Close(), "Close twice")
	require.EqualValues(t, 1, asked.Load())
	require.Equal(t, inbox.StatusPending, e.get("pay-1").Status)
	require.Empty(t, logger.At("error"), "a pass cut short by Close is not a failure")

	require.NoError(t, e.db.Close())
	goleak.VerifyNone(t, ignore)
}

// A record someone else settles between the pass loading it and recording
// its verdict is theirs: the pass records nothing, and counts the record
// neither as resolved nor as left unresolved (so it never reaches
// MaxTries).
func TestReconcilerLeavesARecordMovedMeanwhileAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "inbox")
	e.pending("pay-1", "ch_1")
	other := e.reconciler(reconcile.Config{Resolve: resolveAll(reconcile.Succeeded)})
	logger := testkit.NewLogger()
	reg := prometheus.NewRegistry()
	var otherRep reconcile.Report
	r := e.reconciler(reconcile.Config{MaxTries: 1, Logger: logger, Registerer: reg,
		Resolve: func(ctx context.Context, _ *inbox.Record) (reconcile.Resolution, error) {
			// Another reconciler gets there first.
			var err error
			otherRep, err = other.RunOnce(ctx)
			require.NoError(t, err)
			return reconcile.Resolution{Verdict: reconcile.Failed, Error: "declined"}, nil
		}})
	rep, err := r.RunOnce(e.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, otherRep.Resolved[reconcile.Succeeded])
	require.Equal(t, 1, rep.Examined)
	require.Empty(t, rep.Resolved)
	require.Zero(t, rep.Unresolved, "not left pending by this pass")
	require.Zero(t, rep.GaveUp)
	require.Empty(t, logger.At("error"))
	requireMetric(t, reg, "inboxmill_reconciler_unresolved", map[string]string{"table": "inbox"}, 0)
	rec := e.get("pay-1")
	require.Equal(t, inbox.StatusCompleted, rec.Status, "the first verdict stands")
	require.Empty(t, rec.Error)
}

// TestReconcilerRunStartCloseRestartLeaksNothing is not parallel: it checks
// that no goroutine is left once the reconciler has run every way it can,
// been stopped and restarted, and its database is closed.
func TestReconcilerRunStartCloseRestartLeaksNothing(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	e := newEnv(t, "inbox")
	e.pending("pay-1", "")
	var asked atomic.Int64
	r := e.reconciler(reconcile.Config{Interval: time.Millisecond,
		Resolve: func(context.Context, *inbox.Record) (reconcile.Resolution, error) {
			asked.Add(1)
			return reconcile.Resolution{Verdict: reconcile.Unresolved}, nil
		}})
	passes := func(n int64) {
		t.Helper()
		from := asked.Load()
		testkit.WaitFor(t, 10*time.Second, "passes", func() (bool, error) { return asked.Load() >= from+n, nil })
	}

	for round := range 3 {
		// Start ... Close.
		require.NoError(t, r.Start(), "round %d", round)
		<-r.Running()
		require.ErrorContains(t, r.Start(), "already running")
		require.ErrorContains(t, r.Run(e.ctx), "already running")
		passes(3)
		require.NoError(t, r.Close())
		require.NoError(t, r.Close(), "Close twice")
		select {
		case <-r.Running():
			t.Fatalf("round %d: still running after Close", round)
		default:
		}

		// Run until its context ends.
		ctx, cancel := context.WithCancel(e.ctx)
		ran := make(chan error, 1)
		go func() { ran <- r.Run(ctx) }()
		<-r.Running()
		require.ErrorContains(t, r.Start(), "already running")
		passes(3)
		cancel()
		require.NoError(t, <-ran)

		// Run until Close.
		go func() { ran <- r.Run(e.ctx) }()
		<-r.Running()
		passes(1)
		require.NoError(t, r.Close())
		require.NoError(t, <-ran)
	}
	require.Equal(t, inbox.StatusPending, e.get("pay-1").Status)

	require.NoError(t, e.db.Close())
	goleak.VerifyNone(t, ignore)
}
