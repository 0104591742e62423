package dedup

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/internal/pipeline"
)

// Group turns on group commit in transactional mode
// (Transactional.Group): deliveries handled at the same time share one
// transaction. A group claims every member's key with one statement,
// runs the claimed members' handlers one after the other in the shared
// transaction, stores their outputs and commits once; then each member's
// middleware call returns, so the router acks only committed work.
// Duplicates of committed records and payload conflicts are answered as
// soon as the claim has read them, without waiting for the commit.
//
// A member whose handler fails or panics is nacked alone: the group's
// transaction is rolled back and the group runs again without it, so the
// other members' handlers run a second time from a clean state (their
// writes in the first run were rolled back). A commit that fails, or
// whose outcome is unknown (a lost connection), nacks every member that
// was waiting for it; their redeliveries find out what was recorded.
//
// What it requires of handlers: the transaction is shared, so a handler
// must not use it from another goroutine, nor keep it busy for long — a
// slow handler delays every member of its group. Its effects must live in
// the transaction (as in transactional mode without groups), since a
// member's handler may run again when another member fails.
//
// What it costs: a delivery may wait up to MaxLinger for others to join,
// but only while the middleware is handling deliveries that have not
// joined yet; a delivery alone in flight starts at once. Then it waits for
// the handlers of the members before it and for the commit. A member
// whose context ends before its group begins is nacked without running.
//
// Differences from ungrouped deliveries: ReadFirst is not used (the claim
// is shared already); a second member of a key with another payload than
// the first's uncommitted claim is answered as a conflict at once. The
// trace of a grouped delivery has its claim, handler and commit phases
// like an ungrouped one's, the claim and commit spans carrying the
// number of members that shared them (inboxmill.group_members); a group
// run again after a member failed adds another claim, handler and commit
// for every member that ran again.
type Group struct {
	// MaxSize is the most deliveries one group takes. Defaults to
	// DefaultGroupMaxSize (64); at most inbox.MaxClaimMany.
	MaxSize int

	// MaxLinger bounds how long a forming group waits for deliveries in
	// flight to join it. It stops waiting as soon as every delivery the
	// middleware is handling has joined (or the group is full), so a lone
	// delivery pays no linger. Defaults to DefaultGroupLinger (2 ms); -1
	// never waits: a group is whoever joined while the previous groups
	// kept the coordinators busy.
	MaxLinger time.Duration

	// Coordinators is how many groups run at once, each in a transaction
	// (and on a connection) of its own. Deliveries that arrive while every
	// coordinator is busy join the next group: fewer coordinators make
	// larger groups, more keep more commits in flight.
	//
	// Defaults to 0, adaptive: every delivery runs alone, as without
	// groups, until a trial of fewer coordinators (for one epoch of a few
	// hundred deliveries) lowers the deliveries' mean latency — which,
	// for a consumer that takes its next message when one is done, is
	// raising its throughput; trials go on in both directions, less often
	// after each that loses, so the number follows the load and grouping
	// stays off where it would only make deliveries wait
	// (GroupStats.Coordinators says how many are in force). Where the
	// database has one writer at a time (inbox.Capabilities.SingleWriter:
	// SQLite) the default is 1, fixed. A positive number fixes it.
	Coordinators int

	// Pipeline, when set, sends each group's statements in pipelines:
	// its BEGIN with its claim in one round trip, the statements its
	// handlers queued with its COMMIT in another. pgxgroup.Pipeline()
	// (package dedup/pgxgroup) does it for PostgreSQL through pgx's
	// database/sql driver; its handlers take their share of the
	// transaction with pgxgroup.FromContext instead of TxFromContext.
	// Defaults to nil: one statement per round trip, handlers use the
	// *sql.Tx.
	Pipeline pipeline.Opener
}

// Defaults of Group's settings.
const (
	DefaultGroupMaxSize = 64
	DefaultGroupLinger  = 2 * time.Millisecond
)

func (g Group) withDefaults() Group {
	if g.MaxSize == 0 {
		g.MaxSize = DefaultGroupMaxSize
	}
	if g.MaxLinger == 0 {
		g.MaxLinger = DefaultGroupLinger
	}
	return g // Coordinators: newGrouper, which knows the database
}

func (g Group) validate() []error {
	return validateGathering("Group", g.MaxSize, g.MaxLinger, "Coordinators", g.Coordinators)
}

// validateGathering checks the settings Group and Batch share: a size
// within one multi-row statement's, a linger of -1 or more, and a
// non-negative number of statements (named slots) at once.
func validateGathering(what string, size int, linger time.Duration, slots string, n int) []error {
	var errs []error
	if size < 0 || size > inbox.MaxClaimMany {
		errs = append(errs, fmt.Errorf("%w: %s.MaxSize %d is not between 1 and %d", ErrInvalidConfig, what, size, inbox.MaxClaimMany))
	}
	if linger < -1 {
		errs = append(errs, fmt.Errorf("%w: %s.MaxLinger %v is negative (use -1 not to linger)", ErrInvalidConfig, what, linger))
	}
	if n < 0 {
		errs = append(errs, fmt.Errorf("%w: %s.%s %d is negative", ErrInvalidConfig, what, slots, n))
	}
	return errs
}

// grouper forms the groups of one Deduplicator. The first member of a
// group (its leader) runs it in its own call, and hands it to a goroutine
// of its own, which ends with the group, once the leader has its result.
type grouper struct {
	d     *Deduplicator
	cfg   Group
	slots *slotPool // one slot per coordinator
	// savepoints isolates each member's handler under a savepoint instead
	// of rolling the group back when one fails. Off: it costs two round
	// trips per member while rolling back costs nothing until a handler
	// fails (see BenchmarkGroupFailures). Tests and benchmarks set it.
	savepoints bool
	mu         sync.Mutex
	busy       int    // deliveries in the middleware (under mu)
	held       int    // members of groups that no longer take members (under mu)
	open       *group // the group taking members, if any (under mu)
	// waiting counts members whose group has not begun (under mu).
	waiting int
	// groups and members count the group transactions begun and their
	// members, solo the deliveries that found a coordinator free and no
	// group forming and so ran alone, as without groups (under mu).
	groups, members, solo uint64
}

// GroupStats describe the groups of a Deduplicator with group commit.
type GroupStats struct {
	// Waiting is the number of deliveries in groups that have not begun
	// their transaction yet (forming, lingering or waiting for a
	// coordinator).
	Waiting int
	// Groups counts the group transactions begun so far, a group run
	// again without a failed member counting again; Members counts their
	// members. Members / Groups is the mean group size.
	Groups, Members uint64
	// Solo counts the deliveries that ran alone, as without group commit:
	// a coordinator was free and no group was forming.
	Solo uint64
	// Coordinators is how many groups may run at once now; 0 when every
	// delivery may run at once (the adaptive default before grouping
	// paid). Trials counts the adaptive trials of another number and
	// Kept those that were kept (see Group.Coordinators).
	Coordinators int
	Trials, Kept uint64
}

// GroupStats returns the group commit counts so far; all zero without
// group commit.
func (d *Deduplicator) GroupStats() GroupStats {
	if d.grp == nil {
		return GroupStats{}
	}
	g := d.grp
	limit, trials, kept := g.slots.stats()
	g.mu.Lock()
	defer g.mu.Unlock()
	return GroupStats{Waiting: g.waiting, Groups: g.groups, Members: g.members, Solo: g.solo,
		Coordinators: limit, Trials: trials, Kept: kept}
}

type group struct {
	members []*member
	kick    chan struct{} // a member joined or a delivery left
	first   [1]*member    // members' first array: a group of one needs no other
}

// member is one delivery in a group.
type member struct {
	msg  *message.Message
	ctx  context.Context
	h    message.HandlerFunc
	id   identity
	done chan struct{}
	// Set before done is closed.
	out     []*message.Message
	outcome Outcome
	err     error
	// The group's working state, owned by its leader.
	rec     *inbox.Record
	enc     []byte
	follows *member // the member of the same key that claimed it
}

func newGrouper(d *Deduplicator, cfg Group) *grouper {
	fixed := cfg.Coordinators
	if fixed == 0 && d.store.Dialect().Capabilities().SingleWriter {
		fixed = 1
	}
	return &grouper{d: d, cfg: cfg, slots: newSlotPool(fixed, unbounded, poolSize(d.store))}
}

// enter and leave count the deliveries in the middleware: a forming
// group waits for those that have not joined it yet.
func (g *grouper) enter() {
	g.mu.Lock()
	g.busy++
	busy := g.busy
	g.mu.Unlock()
	g.slots.demand(busy)
}

func (g *grouper) leave() {
	g.mu.Lock()
	g.busy--
	if g.open != nil {
		kick(g.open)
	}
	g.mu.Unlock()
}

func kick(gr *group) {
	select {
	case gr.kick <- struct{}{}:
	default:
	}
}

// do runs one delivery: alone, as without groups, when a coordinator is
// free and no group is forming (never with a Pipeline, whose handlers
// queue on a group's session); as a member of a group otherwise.
func (g *grouper) do(msg *message.Message, h message.HandlerFunc, id identity) ([]*message.Message, Outcome, error) {
	start, tk := time.Now(), g.slots.enter()
	g.mu.Lock()
	if g.open == nil && g.cfg.Pipeline == nil && g.slots.tryTake() {
		g.held++ // not in a group, and no group waits for it
		g.solo++
		g.mu.Unlock()
		out, outcome, err := g.d.alone(msg, h, id)
		g.slots.put()
		g.mu.Lock()
		g.held--
		g.mu.Unlock()
		g.slots.done(time.Since(start), tk)
		return out, outcome, err
	}
	// A member only now: the lone delivery above needs none.
	m := &member{msg: msg, ctx: msg.Context(), h: h, id: id, done: make(chan struct{})}
	gr, lead := g.open, false
	if gr == nil {
		gr, lead = &group{kick: make(chan struct{}, 1)}, true
		gr.members = gr.first[:0]
		g.open = gr
	}
	gr.members = append(gr.members, m)
	g.waiting++
	if len(gr.members) >= g.cfg.MaxSize {
		g.seal(gr)
	}
	kick(gr)
	g.mu.Unlock()
	if lead {
		// In a goroutine of its own, so that the leader's delivery, too,
		// returns as soon as it has its result (a duplicate, a failure)
		// rather than when the group is done.
		go g.lead(gr)
	}
	<-m.done
	g.mu.Lock()
	g.held--
	g.mu.Unlock()
	g.slots.done(time.Since(start), tk)
	if m.err != nil {
		// Declared here, since it escapes: no allocation on success.
		var pe *PermanentError
		if errors.As(m.err, &pe) {
			return g.d.recordPermanent(m.ctx, msg, id, pe, m.err)
		}
	}
	return m.out, m.outcome, m.err
}

// seal stops gr taking members; g.mu is held.
func (g *grouper) seal(gr *group) {
	if g.open == gr {
		g.open = nil
		g.held += len(gr.members)
	}
}

// lead waits for a coordinator, lets the group fill while it lingers, and
// drives it.
func (g *grouper) lead(gr *group) {
	g.slots.take() // freed by drive
	var expired <-chan time.Time
	lingering := g.cfg.MaxLinger > 0
	for {
		g.mu.Lock()
		if g.open != gr || len(gr.members) >= g.busy-g.held || !lingering {
			g.seal(gr)
			g.mu.Unlock()
			break
		}
		g.mu.Unlock()
		if expired == nil {
			// Made only for a group that waits: most never do.
			t := time.NewTimer(g.cfg.MaxLinger)
			defer t.Stop()
			expired = t.C
		}
		select {
		case <-gr.kick:
		case <-expired:
			lingering = false
		}
	}
	members := gr.members // sealed: nobody appends any more
	g.mu.Lock()
	g.waiting -= len(members)
	g.mu.Unlock()
	g.drive(&groupRun{members: members, ctx: context.WithoutCancel(members[0].ctx), tries: 1}, true)
}

// groupRun is a group's progress: its members, its tries, and the try
// between its claim and its commit.
type groupRun struct {
	members []*member
	// The group's statements outlive any one member's context: a member
	// whose context ends is released, the others go on.
	ctx   context.Context
	tries int
	cur   *try // claimed, handlers not run yet; nil before a claim
}

// try is one try of a group in one transaction, once it has claimed:
// an *inbox.Tx, or with Group.Pipeline a session on a connection.
type try struct {
	tx           *inbox.Tx
	conn         *sql.Conn
	sess         pipeline.Session
	run, waiting []*member
}

// rollback ends t's transaction without committing and frees its
// connection.
func (t *try) rollback(ctx context.Context) {
	if t.sess == nil {
		_ = t.tx.Rollback()
		return
	}
	_ = t.sess.Rollback(context.WithoutCancel(ctx))
	_ = t.conn.Close()
}

// checkPipeline refuses a Group.Pipeline the store cannot run.
func checkPipeline(store *inbox.Store, p pipeline.Opener) error {
	if err := p.Check(store.DB()); err != nil {
		return fmt.Errorf("%w: Group.Pipeline: %w", ErrInvalidConfig, err)
	}
	if _, err := store.PlanClaimMany(context.Background(), store.DB(), nil); err != nil {
		return fmt.Errorf("%w: Group.Pipeline: %w", ErrInvalidConfig, err)
	}
	return nil
}

// drive runs r's steps until every member is released, then frees the
// coordinator. The leader drives in its own call (inline), which costs no
// goroutine switch; once the leader has its result (a duplicate, a
// conflict, its own failure) while others wait, the rest of the work moves
// to a goroutine, so that the leader's delivery returns at once too.
func (g *grouper) drive(r *groupRun, inline bool) {
	handedOff := false
	defer func() {
		if handedOff {
			return
		}
		// A bug must neither leave members waiting forever nor take the
		// process down from a goroutine no recoverer watches: each
		// member's delivery fails with it instead.
		if rec := recover(); rec != nil {
			if r.cur != nil {
				r.cur.rollback(r.ctx)
			}
			err := &PanicError{Value: fmt.Sprintf("dedup: group commit: %v", rec), Stack: string(debug.Stack())}
			for _, m := range r.members {
				g.release(m, nil, OutcomeRetry, err)
			}
		}
		g.slots.put()
	}()
	for g.step(r) {
		if inline && released(r.members[0]) {
			handedOff = true
			go g.drive(r, false)
			return
		}
	}
}

// release hands m its result; later calls for m do nothing.
func (g *grouper) release(m *member, out []*message.Message, o Outcome, err error) {
	select {
	case <-m.done:
		return
	default:
	}
	m.out, m.outcome, m.err = out, o, err
	close(m.done)
}

func released(m *member) bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

// step does the group's next piece of work: a claim, or the handlers and
// the commit of the try that claimed. It reports whether work remains:
// another try without a member whose handler failed, or from the start
// after a transient failure before any handler ran.
func (g *grouper) step(r *groupRun) bool {
	if t := r.cur; t != nil {
		r.cur = nil
		return g.finish(r.ctx, t)
	}
	var live []*member
	for _, m := range r.members {
		if released(m) {
			continue
		}
		if err := m.ctx.Err(); err != nil {
			g.release(m, nil, OutcomeRetry, err)
			continue
		}
		m.rec, m.enc, m.follows = nil, nil, nil
		live = append(live, m)
	}
	if len(live) == 0 {
		return false
	}
	g.mu.Lock()
	g.groups++
	g.members += uint64(len(live))
	g.mu.Unlock()
	t, transient := g.claimTry(r.ctx, live)
	if transient != nil {
		r.tries++
		if r.tries <= g.d.tx.ClaimAttempts {
			return true
		}
		for _, m := range live {
			g.release(m, nil, OutcomeRetry, transient)
		}
		return false
	}
	r.cur = t
	return t != nil
}

// fail releases every member of ms with err.
func (g *grouper) fail(ms []*member, err error) {
	for _, m := range ms {
		g.release(m, nil, OutcomeRetry, err)
	}
}

// claimTry begins a try of the live members and claims their keys,
// answering at once those that need no commit. It returns the try with
// the members that claimed (nil when none did: every member was
// answered), or transient, a retryable failure with every member still
// waiting.
func (g *grouper) claimTry(ctx context.Context, live []*member) (_ *try, transient error) {
	d := g.d
	ps := make([]inbox.ClaimParams, len(live))
	for i, m := range live {
		ps[i] = inbox.ClaimParams{ID: m.id.ID, PayloadHash: m.id.hash, Status: inbox.StatusCompleted,
			CorrelationID: correlationID(m.msg), Retention: d.retention(), EventTime: m.id.eventTime}
	}
	// Each member's trace gets the shared claim as a phase of its own.
	spans := make([]span, len(live))
	if d.trace.on() {
		for i, m := range live {
			_, spans[i] = d.startPhase(m.ctx, spanClaim, m.id)
			spans[i].setInt(attrGroupMembers, int64(len(live)))
		}
	}
	var t *try
	var res []inbox.ClaimResult
	var err error
	start := time.Now()
	if g.cfg.Pipeline != nil {
		t, res, err = g.claimPipelined(ctx, ps)
	} else {
		var tx *inbox.Tx
		if tx, err = d.store.BeginTx(ctx, d.tx.TxOptions); err != nil {
			err = fmt.Errorf("dedup: begin: %w", d.store.Classify(err))
		} else {
			t = &try{tx: tx}
			if res, err = g.claim(ctx, tx, ps); err != nil {
				t.rollback(ctx)
			}
		}
	}
	took := time.Since(start)
	if err != nil {
		for _, sp := range spans {
			sp.end(string(OutcomeRetry), 0, err)
		}
		if inbox.IsRetryable(err) {
			return nil, err
		}
		g.fail(live, err)
		return nil, nil
	}
	claimedBy := map[*inbox.Record]*member{}
	for i, m := range live {
		d.metrics.observeClaim(m.id.Operation, took)
		r := res[i]
		switch {
		case errors.Is(r.Err, ErrPayloadConflict):
			spans[i].end(string(OutcomeConflict), 0, r.Err)
			g.release(m, nil, OutcomeConflict, r.Err)
		case r.Err != nil:
			spans[i].end(string(claimFailure(r.Err)), 0, r.Err)
			g.release(m, nil, claimFailure(r.Err), r.Err)
		case r.Claimed:
			spans[i].end(phaseClaimed, r.Record.Attempt, nil)
			m.rec = r.Record
			claimedBy[r.Record] = m
			t.run = append(t.run, m)
		}
	}
	for i, m := range live {
		r := res[i]
		if r.Err != nil || r.Claimed {
			continue
		}
		if first := claimedBy[r.Record]; first != nil {
			// The same key as a member that claimed it: not committed yet,
			// so it waits for the commit and replays its output.
			spans[i].end(phaseFollows, r.Record.Attempt, nil)
			m.follows = first
			t.waiting = append(t.waiting, m)
			continue
		}
		// A committed record: answered now.
		out, outcome, err := d.replay(r.Record)
		spans[i].end(string(outcome), r.Record.Attempt, err)
		g.release(m, out, outcome, err)
	}
	if len(t.run) == 0 {
		t.rollback(ctx)
		return nil, nil
	}
	return t, nil
}

// claimPipelined begins a try on a connection of its own and claims ps
// in the round trip that begins the transaction. On an error the
// transaction is rolled back and the connection freed.
func (g *grouper) claimPipelined(ctx context.Context, ps []inbox.ClaimParams) (*try, []inbox.ClaimResult, error) {
	d := g.d
	conn, err := d.store.DB().Conn(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("dedup: begin: %w", d.store.Classify(err))
	}
	t := &try{conn: conn, sess: g.cfg.Pipeline.Open(conn)}
	plan, err := d.store.PlanClaimMany(ctx, conn, ps)
	if err != nil {
		t.rollback(ctx)
		return nil, nil, err
	}
	query := plan.SQL
	if query == "" {
		query = "SELECT '', '', '' WHERE false" // nothing to claim; the round trip still begins
	}
	ids := make([]inbox.ID, 0, len(ps))
	err = t.sess.BeginQuery(ctx, pipeline.Begin{Opts: d.tx.TxOptions, Query: query, Args: plan.Args,
		Row: func(row pipeline.Row) error {
			ids = append(ids, inbox.ID{})
			id := &ids[len(ids)-1]
			if err := row.Scan(&id.Scope, &id.Operation, &id.Key); err != nil {
				ids = ids[:len(ids)-1]
				return err
			}
			return nil
		}})
	res, err := plan.Finish(ctx, conn, ids, err)
	if err != nil {
		t.rollback(ctx)
		return nil, nil, err
	}
	return t, res, nil
}

// finish runs the handlers of t's members one after the other, stores
// their outputs and commits, then releases them and the members waiting
// for them. It reports whether the group must run again: a member failed
// and was released, the others were rolled back.
func (g *grouper) finish(ctx context.Context, t *try) (again bool) {
	if t.sess != nil {
		return g.finishPipelined(ctx, t)
	}
	d, tx, run, waiting := g.d, t.tx, t.run, t.waiting
	rollback := func() { _ = tx.Rollback() }
	ok := run[:0:0]
	for _, m := range run {
		var out []*message.Message
		hctx, sp := d.startPhase(m.ctx, spanHandler, m.id)
		step := func() error {
			var err error
			out, err = d.run(hctx, tx.Tx, m.msg, m.h, d.claimFor(m.id, m.rec.Attempt))
			sp.endHandler(m.rec.Attempt, err)
			if err == nil && len(out) > 0 {
				err = g.saveOutput(ctx, tx, m, out)
			}
			return err
		}
		if g.savepoints {
			err := d.store.WithSavepoint(ctx, tx, step)
			if err != nil && !errors.Is(err, inbox.ErrTxAborted) {
				// Undone alone; the group goes on without it.
				err = d.classifyHandlerErr(m.ctx, tx.Tx, err)
				g.release(m, nil, handlerOutcome(err), err)
				continue
			}
			if err != nil {
				rollback()
				g.release(m, nil, OutcomeRetry, err)
				return true
			}
		} else if err := step(); err != nil {
			// Roll the group back and run it again without this member:
			// nothing is recorded for it, and its redelivery runs clean.
			err = d.classifyHandlerErr(m.ctx, tx.Tx, err)
			rollback()
			g.release(m, nil, handlerOutcome(err), err)
			return true
		}
		m.out = out
		ok = append(ok, m)
	}
	run = ok
	if len(run) == 0 {
		rollback()
		return true // the waiting members, if any, claim again
	}
	commits := g.startCommits(run)
	if err := tx.Commit(); err != nil {
		// Nothing was recorded, or the connection broke and nobody knows:
		// either way the redeliveries' claims find the truth.
		err = fmt.Errorf("dedup: commit: %w", d.store.Classify(err))
		endAll(commits, OutcomeRetry, err)
		g.fail(run, err)
		g.fail(waiting, err)
		return false
	}
	endAll(commits, OutcomeExecuted, nil)
	g.committed(run, waiting)
	return false
}

// startCommits begins the commit phase of every member of run (nothing
// when tracing is off).
func (g *grouper) startCommits(run []*member) []span {
	if !g.d.trace.on() {
		return nil
	}
	spans := make([]span, len(run))
	for i, m := range run {
		_, spans[i] = g.d.startPhase(m.ctx, spanCommit, m.id)
		spans[i].setInt(attrGroupMembers, int64(len(run)))
	}
	return spans
}

func endAll(spans []span, o Outcome, err error) {
	for _, sp := range spans {
		sp.end(string(o), 0, err)
	}
}

// saveOutput stores m's output in its record through q. Inserted as
// completed without a result: only members that produce messages pay
// for this statement.
func (g *grouper) saveOutput(ctx context.Context, q inbox.DBTX, m *member, out []*message.Message) error {
	var err error
	if m.enc, err = encodeMessages(out); err != nil {
		return err
	}
	if err := g.d.store.SaveOutput(ctx, q, m.rec, m.enc); err != nil {
		return fmt.Errorf("dedup: store output: %w", err)
	}
	return nil
}

// finishPipelined is finish on a pipeline session: the handlers queue
// their statements, which go to the server with the COMMIT. A member
// whose statement (or its check) fails is released, and the group runs
// again without it, as when its handler fails.
func (g *grouper) finishPipelined(ctx context.Context, t *try) (again bool) {
	d, sess, run := g.d, t.sess, t.run
	for _, m := range run {
		hctx, sp := d.startPhase(m.ctx, spanHandler, m.id)
		out, err := d.run(sess.Member(hctx), nil, m.msg, m.h, d.claimFor(m.id, m.rec.Attempt))
		sp.endHandler(m.rec.Attempt, err)
		if f, ferr := sess.Failed(); f >= 0 {
			// What a member queued failed when this handler ran a
			// statement at once: that member is to blame.
			t.rollback(ctx)
			ferr = d.store.Dialect().Classify(ferr)
			g.release(run[f], nil, handlerOutcome(ferr), ferr)
			return true
		}
		if err == nil && len(out) > 0 {
			err = g.saveOutput(ctx, t.conn, m, out)
		}
		if err != nil {
			err = d.store.Dialect().Classify(err)
			t.rollback(ctx)
			g.release(m, nil, handlerOutcome(err), err)
			return true
		}
		m.out = out
	}
	commits := g.startCommits(run)
	f, err := sess.Commit(ctx)
	if f >= 0 {
		_ = t.conn.Close()
		err = d.store.Dialect().Classify(err)
		endAll(commits, OutcomeRetry, err)
		g.release(run[f], nil, handlerOutcome(err), err)
		return true
	}
	_ = t.conn.Close()
	if err != nil {
		// As in finish: nothing was recorded, or nobody knows.
		err = fmt.Errorf("dedup: commit: %w", d.store.Classify(err))
		endAll(commits, OutcomeRetry, err)
		g.fail(run, err)
		g.fail(t.waiting, err)
		return false
	}
	endAll(commits, OutcomeExecuted, nil)
	g.committed(run, t.waiting)
	return false
}

// committed releases the members of a committed try and those waiting
// for them.
func (g *grouper) committed(run, waiting []*member) {
	for _, m := range run {
		g.release(m, m.out, OutcomeExecuted, nil)
	}
	for _, m := range waiting {
		if released(m.follows) && m.follows.outcome != OutcomeExecuted {
			// Its first member failed under a savepoint: not committed.
			g.release(m, nil, OutcomeInFlight, fmt.Errorf("%w (in the same group, and it failed)", ErrInFlight))
			continue
		}
		out, err := decodeMessages(m.follows.enc)
		if err != nil {
			out = nil
		}
		g.release(m, out, OutcomeDuplicate, nil)
	}
}

// claim claims the members' keys: with the single-row claim when the
// group has one member, which is cheaper than any statement over several
// records (and prepared where the store prepares), with one ClaimMany
// otherwise.
func (g *grouper) claim(ctx context.Context, tx *inbox.Tx, ps []inbox.ClaimParams) ([]inbox.ClaimResult, error) {
	if len(ps) != 1 {
		return g.d.store.ClaimMany(ctx, tx, ps)
	}
	r, err := g.d.store.Claim(ctx, tx, ps[0])
	if errors.Is(err, ErrPayloadConflict) || errors.Is(err, ErrBeyondRetention) {
		r.Err, err = err, nil
	}
	if err != nil {
		return nil, err
	}
	return []inbox.ClaimResult{r}, nil
}
