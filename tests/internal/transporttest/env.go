package transporttest

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testdb"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

// waitLimit bounds every wait; generous for -race on two loaded cores,
// never reached when things work.
const waitLimit = 45 * time.Second

// Options configure one test's environment.
type Options struct {
	// DB is testdb.PostgresPGX or testdb.SQLite.
	DB   testdb.Kind
	Mode Mode
	// RedeliverAfter is Spec.RedeliverAfter. Defaults to 2s.
	RedeliverAfter time.Duration
	// Lease, Heartbeat and InFlightWait go to every Spec (reserve mode).
	// Lease defaults to 2s, InFlightWait to 500ms.
	Lease, Heartbeat, InFlightWait time.Duration
}

// Env is one test's topic, consumer group, inbox and business table, and
// the consumers it started. Make it with [Setup].
type Env struct {
	T     *testing.T
	Tr    Transport
	DB    *sql.DB
	Store *inbox.Store
	base  Spec

	logDir string
	mu     sync.Mutex
	lines  []Line
	procs  []*Proc
}

// Setup makes a test's environment: tables of its own in the database
// (a SQLite file that the consumer processes open too), a topic and a group
// of its own on the broker, all removed when the test ends.
func Setup(t *testing.T, tr Transport, o Options) *Env {
	t.Helper()
	if o.RedeliverAfter == 0 {
		o.RedeliverAfter = 2 * time.Second
	}
	if o.Lease == 0 {
		o.Lease = 2 * time.Second
	}
	if o.InFlightWait == 0 {
		o.InFlightWait = 500 * time.Millisecond
	}
	e := &Env{T: t, Tr: tr, logDir: t.TempDir()}
	e.base = Spec{
		Topic: testdb.UniqueName("orders"), Group: testdb.UniqueName("shipping"), RedeliverAfter: o.RedeliverAfter,
		DB: o.DB, Inbox: testdb.UniqueName("inbox"), Effects: testdb.UniqueName("effects"),
		Mode: o.Mode, Lease: o.Lease, Heartbeat: o.Heartbeat, InFlightWait: o.InFlightWait,
	}
	switch o.DB {
	case testdb.SQLite:
		e.base.DSN = filepath.Join(t.TempDir(), "inbox.db")
		e.DB = testdb.OpenSQLite(t, e.base.DSN)
	case testdb.PostgresPGX:
		e.base.DSN = testdb.PostgresDSN()
		e.DB = testdb.Open(t, o.DB)
	default:
		t.Fatalf("transporttest runs on %s or %s, not %s", testdb.PostgresPGX, testdb.SQLite, o.DB)
	}
	tr.Provision(t, e.base)
	ctx := t.Context()
	var err error
	e.Store, err = inbox.NewStore(e.DB, testdb.Dialect(o.DB), inbox.Config{Table: e.base.Inbox})
	require.NoError(t, err)
	require.NoError(t, e.Store.Migrate(ctx))
	// No unique constraint on purpose: an effect made twice must show up
	// as a second row.
	_, err = e.DB.ExecContext(ctx, "CREATE TABLE "+e.base.Effects+" (event_id VARCHAR(64) NOT NULL, seq INTEGER NOT NULL, "+
		"consumer VARCHAR(64) NOT NULL, attempt INTEGER NOT NULL, idem_key VARCHAR(64) NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() {
		e.killAll()
		if t.Failed() {
			e.dumpLines()
			e.dumpLogs()
		}
		_ = e.Store.Close()
		for _, tbl := range []string{e.base.Effects, e.base.Inbox, e.base.Inbox + "_migrations"} {
			_, _ = e.DB.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tbl)
		}
	})
	return e
}

// Spec returns the environment's consumer spec, for consumer name.
func (e *Env) Spec(name string) Spec {
	s := e.base
	s.Consumer = name
	return s
}

// Stream returns what a retrying producer sends for n events: each event
// once and, for about share of them, a retry some messages later — half
// the same message resent (same UUID: a publish whose confirmation was
// lost), half a message built again (a new UUID, sent_at stamped again).
// Every message carries a seq of its own in its metadata, which the checks
// follow. events maps each event ID to its tenant.
func Stream(n int, share float64, seed uint64) (msgs []*message.Message, events map[string]string) {
	rng := rand.New(rand.NewPCG(seed, uint64(n)))
	type entry struct {
		pos   float64
		event int
		retry bool
	}
	entries := make([]entry, 0, n+n/2)
	for i := range n {
		entries = append(entries, entry{pos: float64(i), event: i})
	}
	for _, i := range rng.Perm(n)[:int(float64(n)*share)] {
		entries = append(entries, entry{pos: float64(i) + 0.5 + float64(rng.IntN(20)), event: i, retry: true})
	}
	sort.SliceStable(entries, func(a, b int) bool { return entries[a].pos < entries[b].pos })

	events = make(map[string]string, n)
	first := make(map[int]*message.Message, n)
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for seq, en := range entries {
		id := fmt.Sprintf("evt-%05d", en.event)
		tenant := fmt.Sprintf("tenant-%d", en.event%3)
		events[id] = tenant
		var msg *message.Message
		switch orig := first[en.event]; {
		case orig != nil && rng.IntN(2) == 0:
			msg = message.NewMessage(orig.UUID, orig.Payload) // resent as it was
		default:
			sent := base
			if orig != nil {
				sent = base.Add(time.Second) // rebuilt: a new UUID, stamped again
			}
			payload, _ := json.Marshal(Event{EventID: id, Order: fmt.Sprintf("o-%d", en.event), Qty: 1 + en.event%5,
				SentAt: sent.Format(time.RFC3339)})
			msg = message.NewMessage(watermill.NewUUID(), payload)
		}
		msg.Metadata.Set(MetaEventID, id)
		msg.Metadata.Set(MetaTenant, tenant)
		msg.Metadata.Set(MetaSeq, strconv.Itoa(seq+1))
		if first[en.event] == nil {
			first[en.event] = msg
		}
		msgs = append(msgs, msg)
	}
	return msgs, events
}

// Publish publishes msgs, in order, with a publisher of the transport's.
func (e *Env) Publish(msgs ...*message.Message) {
	e.T.Helper()
	pub := e.Tr.NewPublisher(e.T)
	defer pub.Close()
	for _, m := range msgs {
		require.NoError(e.T, pub.Publish(e.base.Topic, m))
	}
}

// Backlog is the transport's Backlog of the environment's topic and group.
func (e *Env) Backlog() (int, error) {
	ctx, cancel := context.WithTimeout(e.T.Context(), 10*time.Second)
	defer cancel()
	return e.Tr.Backlog(ctx, e.base)
}

// WaitFor polls cond until it holds, failing the test after waitLimit.
func (e *Env) WaitFor(what string, cond func() (bool, error)) {
	e.T.Helper()
	testkit.WaitFor(e.T, waitLimit, what, cond)
}

// StartInProcess starts a consumer in the test process; it is closed when
// the test ends unless the test closes it first.
func (e *Env) StartInProcess(s Spec) *Consumer {
	e.T.Helper()
	c, err := NewConsumer(e.Tr, s, watermill.NopLogger{}, func(l Line) {
		l.Consumer, l.At = s.Consumer, time.Now()
		e.record(l)
	})
	require.NoError(e.T, err)
	e.T.Cleanup(func() { _ = c.Close() })
	return c
}

func (e *Env) record(l Line) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lines = append(e.lines, l)
}

// dumpLines logs the last lines the consumers reported.
func (e *Env) dumpLines() {
	lines := e.Lines()
	if len(lines) > 60 {
		lines = lines[len(lines)-60:]
	}
	var b strings.Builder
	for _, l := range lines {
		fmt.Fprintf(&b, "%s %s %s seq=%d %s attempt=%d found=%v %s\n", l.At.Format("15:04:05.000"), l.Consumer, l.Word,
			l.Seq, l.Event, l.Attempt, l.Found, l.Err)
	}
	e.T.Logf("the last lines the consumers reported:\n%s", b.String())
}

// Lines returns every line reported so far, in the order they arrived.
func (e *Env) Lines() []Line {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Line(nil), e.lines...)
}

// Effect is one row of the business table.
type Effect struct {
	EventID  string
	Seq      int
	Consumer string
	Attempt  int64
}

// Effects returns every row of the business table.
func (e *Env) Effects() []Effect {
	e.T.Helper()
	rows, err := e.DB.QueryContext(e.T.Context(), "SELECT event_id, seq, consumer, attempt FROM "+e.base.Effects)
	require.NoError(e.T, err)
	defer rows.Close()
	var out []Effect
	for rows.Next() {
		var f Effect
		require.NoError(e.T, rows.Scan(&f.EventID, &f.Seq, &f.Consumer, &f.Attempt))
		out = append(out, f)
	}
	require.NoError(e.T, rows.Err())
	return out
}

// EffectsByEvent groups Effects by event ID.
func (e *Env) EffectsByEvent() map[string][]Effect {
	by := map[string][]Effect{}
	for _, f := range e.Effects() {
		by[f.EventID] = append(by[f.EventID], f)
	}
	return by
}

// Completed counts the inbox records whose outcome is recorded as completed.
func (e *Env) Completed() (int, error) {
	var n int
	err := e.DB.QueryRowContext(e.T.Context(), "SELECT COUNT(*) FROM "+e.base.Inbox+" WHERE status = "+
		testdb.Dialect(e.base.DB).Placeholder(1), string(inbox.StatusCompleted)).Scan(&n)
	return n, err
}

// Record returns the inbox record of an event.
func (e *Env) Record(eventID, tenant string) *inbox.Record {
	e.T.Helper()
	rec, err := e.Store.Get(e.T.Context(), e.DB, inbox.ID{Scope: tenant, Operation: HandlerName, Key: eventID})
	require.NoError(e.T, err, "the record of %s", eventID)
	return rec
}

// RequireOnce fails the test unless every event has exactly one effect row
// and a completed inbox record, and nothing else has either. It returns the
// effects by event.
func (e *Env) RequireOnce(events map[string]string) map[string][]Effect {
	t := e.T
	t.Helper()
	by := e.EffectsByEvent()
	var twice, missing, unknown []string
	for id := range events {
		switch len(by[id]) {
		case 1:
		case 0:
			missing = append(missing, id)
		default:
			twice = append(twice, fmt.Sprintf("%s %+v", id, by[id]))
		}
	}
	for id := range by {
		if _, ok := events[id]; !ok {
			unknown = append(unknown, id)
		}
	}
	require.Empty(t, twice, "events whose effect happened more than once")
	require.Empty(t, missing, "events whose effect is missing")
	require.Empty(t, unknown, "effects of events nobody published")
	for id, tenant := range events {
		rec := e.Record(id, tenant)
		require.Equal(t, inbox.StatusCompleted, rec.Status, "the record of %s", id)
	}
	var records int
	require.NoError(t, e.DB.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM "+e.base.Inbox).Scan(&records))
	require.Equal(t, len(events), records, "inbox records")
	return by
}

// Drain consumes whatever the broker still holds for the group with one
// more consumer, in this process, until the backlog stays empty, closes it
// and requires the backlog to be empty with no consumer attached. It
// returns what that consumer's middleware did.
func (e *Env) Drain() dedup.Stats {
	t := e.T
	t.Helper()
	c := e.StartInProcess(e.Spec("drain"))
	quiet := 0
	e.WaitFor("the broker to hand out what is left", func() (bool, error) {
		n, err := e.Backlog()
		if err != nil || n > 0 || c.InFlight() > 0 {
			quiet = 0
			return false, err
		}
		quiet++
		if quiet < 3 {
			time.Sleep(100 * time.Millisecond)
		}
		return quiet >= 3, nil
	})
	require.NoError(t, c.Close())
	n, err := e.Backlog()
	require.NoError(t, err)
	require.Zero(t, n, "messages left unacked on the broker")
	return c.Stats()
}

// Of returns the lines about message seq, in order.
func Of(lines []Line, seq int) []Line {
	var out []Line
	for _, l := range lines {
		if l.Seq == seq {
			out = append(out, l)
		}
	}
	return out
}
