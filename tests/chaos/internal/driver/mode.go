package driver

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// actKind is a fault the plan injects at a point of progress.
type actKind int

const (
	actKill    actKind = iota // SIGKILL a random consumer
	actDBKill                 // terminate one consumer's (or every consumer's) connections
	actRestart                // SIGTERM a random consumer; the supervisor starts a new one
	actReplay                 // Kafka: start the second group, reading from the oldest offset
	actReset                  // SQL queue: mark the first half of the acked messages unacked
	actBroker                 // stop the broker and start a new one on the same port and data
)

type action struct {
	at   float64 // share of the events done
	kind actKind
}

// slot is one consumer position: a process, replaced when it dies.
type slot struct {
	idx         int
	group       string
	app         string
	active      bool
	cur         *proc
	incarnation int
	restartAt   time.Time
}

// modeRun is one mode of a run: its tables, topics, stream, consumers,
// fault plan and tallies.
type modeRun struct {
	r      *runner
	db     *database
	mode   string
	label  string // database/mode
	short  string
	rng    *rand.Rand
	events int
	st     *stream

	inboxTable, effectsTable, queueTopic string
	topic, poisonTopic, group, replayGrp string

	kafka *kafkaConn
	prov  *provider
	queue message.Publisher

	slots    []*slot
	all      []*proc
	plan     []action
	arms     []string
	stopping bool

	idx                  int // the mode's and the database's number, for seeds
	nextChunk, published int
	chunkSent            int       // messages of chunks[nextChunk] already produced
	publishFailingSince  time.Time // zero while publishing works
	done                 int       // effects so far, the measure of progress

	// tallies
	driverKills, dbKills, dbConns, restarts, replayed int
	brokerRestarts                                    int // planned for this mode
	brokerDone                                        []time.Duration
	selfKills                                         map[string]int
	failures                                          []string
	started                                           time.Time
	res                                               result
}

var (
	shortNames = map[string]string{wire.KafkaTx: "ktx", wire.KafkaReserve: "krs", wire.SQLQueue: "sqq", wire.KafkaGroup: "kgr",
		wire.KafkaParallel: "kpl"}
	shortDBNames = map[string]string{wire.Postgres: "pg", wire.MySQL: "my"}
)

func newModeRun(r *runner, db *database, mode string, events int) *modeRun {
	idx := slices.Index(wire.Databases, db.kind)*len(wire.Modes) + slices.Index(wire.Modes, mode)
	m := &modeRun{r: r, db: db, mode: mode, label: db.kind + "/" + mode, short: shortDBNames[db.kind] + shortNames[mode],
		events: events, selfKills: map[string]int{}, idx: idx,
		rng: rand.New(rand.NewPCG(r.cfg.Seed, uint64(idx)+1))}
	prefix := "imc_" + r.id + "_" + m.short
	m.inboxTable = prefix + "_inbox"
	m.effectsTable = prefix + "_effects"
	m.queueTopic = prefix + "_queue"
	m.topic = "imc." + r.id + "." + m.short
	m.poisonTopic = m.topic + ".poison"
	m.group = "imc-" + r.id + "-" + m.short
	m.replayGrp = m.group + "-replay"
	return m
}

func (m *modeRun) isKafka() bool { return m.mode != wire.SQLQueue }

// cooperative reports whether the mode's consumers rebalance with the
// cooperative-sticky strategy: kafka-parallel's do in every other run
// (by seed), so that both the eager path (a rebalance ends the session)
// and the cooperative one (it closes a revoked partition's claim) come up.
func (m *modeRun) cooperative() bool {
	return m.mode == wire.KafkaParallel && (m.r.cfg.Seed+uint64(m.idx))%2 == 1
}

// accounts is how many accounts the kafka-parallel stream has: about ten
// events each (0: the other modes' streams have none).
func (m *modeRun) accounts() int {
	if m.mode != wire.KafkaParallel {
		return 0
	}
	return max(4, m.events/10)
}

// kafkaTopics are the topics the broker creates for the mode, as its
// -topics flag takes them (name, or name:partitions).
func (m *modeRun) kafkaTopics() []string {
	if m.isKafka() {
		return []string{fmt.Sprintf("%s:%d", m.topic, m.partitions()), m.poisonTopic}
	}
	return []string{m.poisonTopic}
}

// partitions is the partition count of the mode's topic (1: the SQL
// queue).
func (m *modeRun) partitions() int32 {
	switch m.mode {
	case wire.SQLQueue:
		return 1
	case wire.KafkaGroup:
		return wire.GroupPartitions
	}
	return brokerPartitions
}

func (m *modeRun) fail(format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	m.failures = append(m.failures, msg)
	m.r.printf("chaos: %s: FAIL: %s", m.label, msg)
}

func (m *modeRun) kills() int {
	n := m.driverKills
	for _, k := range m.selfKills {
		n += k
	}
	return n
}

// run runs the mode to its end; failures are recorded on m.
func (m *modeRun) run(ctx context.Context) {
	m.started = time.Now()
	m.st = newStream(m.rng, m.events, m.partitions(), m.accounts())
	m.planFaults()
	defer m.teardown()
	if err := os.MkdirAll(m.historyDir(), 0o755); err != nil {
		m.fail("history directory: %v", err)
		return
	}
	if err := m.setup(ctx); err != nil {
		m.fail("setup: %v", err)
		m.res.events = m.events
		return
	}
	m.loop(ctx)
	m.stopAll()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	m.check(cctx)
	m.checkLinearizable(cctx)
	m.report()
}

// planFaults draws the faults and the points of progress they happen at.
func (m *modeRun) planFaults() {
	cfg := m.r.cfg
	add := func(kind actKind, n int) {
		for range n {
			m.plan = append(m.plan, action{at: 0.05 + 0.9*m.rng.Float64(), kind: kind})
		}
	}
	add(actKill, cfg.Kills)
	add(actDBKill, cfg.DBKills)
	add(actRestart, cfg.Restarts)
	add(actBroker, m.brokerRestarts)
	if m.isKafka() {
		m.plan = append(m.plan, action{at: 0.5, kind: actReplay})
	} else {
		m.plan = append(m.plan, action{at: 0.5, kind: actReset})
	}
	slices.SortStableFunc(m.plan, func(a, b action) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return 0
	})
	// The points consumers are told to die at: the n-th process of slot i
	// gets arms[(i+n) % 4], so that every point comes up.
	m.arms = slices.Clone(wire.Points)
	m.rng.Shuffle(len(m.arms), func(i, j int) { m.arms[i], m.arms[j] = m.arms[j], m.arms[i] })

	consumers := cfg.Consumers
	replay := 0
	if m.isKafka() && consumers > 1 {
		replay = max(1, consumers/4)
	}
	for i := range consumers {
		s := &slot{idx: i, group: m.group, app: fmt.Sprintf("imc_%s_%s_c%d", m.r.id, m.short, i), active: true}
		if i >= consumers-replay {
			s.group, s.active = m.replayGrp, false
		}
		m.slots = append(m.slots, s)
	}
}

func (m *modeRun) setup(ctx context.Context) error {
	db := m.db.db
	store, err := inbox.NewStore(db, m.db.dialect(), inbox.Config{Table: m.inboxTable})
	if err != nil {
		return err
	}
	if err := m.db.retryTransient(ctx, "migrate the inbox", store.Migrate); err != nil {
		return err
	}
	if m.mode != wire.KafkaReserve {
		// A retry after a lost connection may find the table made.
		ddl := strings.Replace(m.db.effectsDDL(m.effectsTable), "CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ", 1)
		if err := m.db.retryTransient(ctx, "create the effects table", func(ctx context.Context) error {
			_, err := db.ExecContext(ctx, ddl)
			return err
		}); err != nil {
			return err
		}
	}
	if m.kafka, err = dialKafkaRetrying(ctx, m.r.brokers, "imc-"+m.r.id+"-driver-"+m.short, time.Minute); err != nil {
		return err
	}
	switch m.mode {
	case wire.KafkaReserve:
		if m.prov, err = startProvider(m.r.cfg.Seed, time.Second); err != nil {
			return err
		}
	case wire.SQLQueue:
		schema, offsets := m.db.queueSchema()
		sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
			SchemaAdapter: schema, OffsetsAdapter: offsets}, watermill.NopLogger{})
		if err != nil {
			return err
		}
		err = m.db.retryTransient(ctx, "create the queue table", func(context.Context) error {
			return sub.SubscribeInitialize(m.queueTopic)
		})
		_ = sub.Close()
		if err != nil {
			return err
		}
		if err := m.db.retryTransient(ctx, "index the queue table", func(ctx context.Context) error {
			_, err := db.ExecContext(ctx, m.db.queueIndex(m.queueTable(), m.queueTopic+"_unacked"))
			return err
		}); err != nil {
			return err
		}
		if m.queue, err = wsql.NewPublisher(wsql.BeginnerFromStdSQL(db), wsql.PublisherConfig{SchemaAdapter: schema},
			watermill.NopLogger{}); err != nil {
			return err
		}
	}
	return nil
}

func (m *modeRun) teardown() {
	if m.prov != nil {
		m.prov.close()
	}
	if m.kafka != nil {
		m.kafka.close()
	}
	if m.r.cfg.Keep {
		m.r.printf("chaos: %s: kept tables %s", m.label, strings.Join(m.tables(), ", "))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, t := range m.tables() {
		if _, err := m.db.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
			m.r.printf("chaos: %s: drop %s: %v", m.label, t, err)
		}
	}
}

// tables are the mode's tables, unique to the run.
func (m *modeRun) tables() []string {
	t := inbox.TableNames(m.inboxTable)
	if m.mode != wire.KafkaReserve {
		t = append(t, m.effectsTable)
	}
	if m.mode == wire.SQLQueue {
		t = append(t, m.queueTable())
	}
	return t
}

// queueTable is the SQL queue's table, quoted.
func (m *modeRun) queueTable() string { return m.db.quote("watermill_" + m.queueTopic) }

// loop publishes, injects the planned faults and keeps the consumers
// running until everything published is consumed by every group.
func (m *modeRun) loop(ctx context.Context) {
	cfg := m.r.cfg
	for _, s := range m.slots {
		if s.active {
			m.startConsumer(s)
		}
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var (
		lastCheck    time.Time
		behind       = int64(-1) // not measured before everything is published
		lastProgress = time.Now()
		lastSig      string
		quietNoted   bool
	)
	for {
		select {
		case <-ctx.Done():
			m.fail("%v after %v: %s", context.Cause(ctx), time.Since(m.started).Round(time.Second), m.where(behind))
			return
		case <-tick.C:
		}
		if err := m.measure(ctx); err != nil && ctx.Err() == nil {
			m.r.printf("chaos: %s: measuring progress: %v", m.label, err)
		}
		if err := m.publish(ctx); err != nil && ctx.Err() == nil {
			// The broker may be restarting (this mode's plan or another's):
			// publishing resumes where it stopped, for up to a minute.
			if m.publishFailingSince.IsZero() {
				m.publishFailingSince = time.Now()
				m.r.printf("chaos: %s: publishing failed, retrying: %v", m.label, err)
			} else if time.Since(m.publishFailingSince) > time.Minute {
				m.fail("publish: failing for a minute: %v", err)
				return
			}
		} else {
			m.publishFailingSince = time.Time{}
		}
		m.act(ctx)
		m.supervise()

		if m.nextChunk == len(m.st.chunks) && len(m.plan) == 0 && time.Since(lastCheck) > 500*time.Millisecond {
			lastCheck = time.Now()
			drained, n, err := m.drained(ctx)
			behind = n
			if err != nil && ctx.Err() == nil {
				m.r.printf("chaos: %s: checking the consumers' progress: %v", m.label, err)
			}
			if drained {
				return
			}
		}
		sig := fmt.Sprint(m.done, m.published, m.sumStats(), behind, len(m.plan))
		if sig != lastSig {
			lastSig, lastProgress, quietNoted = sig, time.Now(), false
		} else if q := time.Since(lastProgress); q > cfg.Stall/4 && !quietNoted {
			// Said once per quiet spell, long before the timer fails the
			// mode: where the mode stands while it stands still.
			quietNoted = true
			m.r.printf("chaos: %s: no progress for %v: %s", m.label, q.Round(time.Second), m.where(behind))
		} else if q > cfg.Stall {
			m.fail("no progress for %v: %s", cfg.Stall, m.where(behind))
			return
		}
	}
}

// where describes the state of the mode for a failure message.
func (m *modeRun) where(behind int64) string {
	live := 0
	for _, s := range m.slots {
		if s.cur != nil && !s.cur.exited() {
			live++
		}
	}
	unconsumed := "not measured yet"
	if behind >= 0 {
		unconsumed = fmt.Sprint(behind)
	}
	w := fmt.Sprintf("published %d/%d messages, effects %d/%d, %d faults not injected yet, messages not consumed: %s, %d consumers running",
		m.published, m.st.messages, m.done, m.events, len(m.plan), unconsumed, live)
	if behind != 0 && m.isKafka() && m.kafka != nil {
		// Which partitions are left, and to whom the group gave them: a
		// partition no one consumes and a consumer that stopped look alike
		// from the counts.
		for _, g := range m.groups() {
			w += "; " + m.kafka.lag(g, m.topic)
		}
	}
	return w
}

// groups are the mode's consumer groups that consume: the first, and the
// replay group once started.
func (m *modeRun) groups() []string {
	groups := []string{m.group}
	for _, s := range m.slots {
		if s.group == m.replayGrp && s.active {
			return append(groups, m.replayGrp)
		}
	}
	return groups
}

// measure reads how many effects exist: the progress that publishing and
// the fault plan follow.
func (m *modeRun) measure(ctx context.Context) error {
	if m.prov != nil {
		m.done = m.prov.chargeCount()
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return m.db.db.QueryRowContext(qctx, `SELECT count(*) FROM `+m.effectsTable).Scan(&m.done)
}

// publish publishes the next chunks while the consumers keep up: at most
// two chunks' worth of events wait unprocessed. Publishing thus spreads
// over the whole run, and a later republication really comes later.
func (m *modeRun) publish(ctx context.Context) error {
	window := 2 * m.events / len(m.st.chunks)
	for m.nextChunk < len(m.st.chunks) {
		k := m.nextChunk
		if k > 0 && m.st.originals[k-1]-m.done > window {
			return nil
		}
		chunk := m.st.chunks[k][m.chunkSent:]
		var (
			sent int
			err  error
		)
		if m.isKafka() {
			sent, err = m.kafka.produce(m.topic, chunk)
		} else {
			sent, err = m.publishQueue(chunk)
		}
		m.chunkSent += sent
		m.published += sent
		if err != nil {
			return err
		}
		m.nextChunk++
		m.chunkSent = 0
		if ctx.Err() != nil {
			return nil
		}
	}
	return nil
}

// publishQueue publishes chunk in batches and returns how many messages
// were published.
func (m *modeRun) publishQueue(chunk []streamMsg) (int, error) {
	const batch = 500
	for start := 0; start < len(chunk); start += batch {
		msgs := make([]*message.Message, 0, batch)
		for _, sm := range chunk[start:min(start+batch, len(chunk))] {
			msg := message.NewMessage(watermill.NewUUID(), sm.payload())
			msg.Metadata.Set(wire.MetaEventID, sm.ev.id)
			msg.Metadata.Set(wire.MetaTenant, sm.ev.tenant)
			msgs = append(msgs, msg)
		}
		if err := m.queue.Publish(m.queueTopic, msgs...); err != nil {
			return start, fmt.Errorf("publish to the queue: %w", err)
		}
	}
	return len(chunk), nil
}

// act injects the faults whose point of progress has come. A fault that
// needs a running consumer waits for one.
func (m *modeRun) act(ctx context.Context) {
	frac := float64(m.done) / float64(m.events)
	for len(m.plan) > 0 && m.plan[0].at <= frac {
		if !m.inject(ctx, m.plan[0].kind) {
			return
		}
		m.plan = m.plan[1:]
	}
}

func (m *modeRun) inject(ctx context.Context, kind actKind) bool {
	var live, ready []*slot
	for _, s := range m.slots {
		if s.cur != nil && !s.cur.exited() && !s.cur.termedNow() {
			live = append(live, s)
			if s.cur.isReady() {
				ready = append(ready, s)
			}
		}
	}
	switch kind {
	case actKill:
		if len(live) == 0 {
			return false
		}
		live[m.rng.IntN(len(live))].cur.kill()
	case actRestart:
		// Only a consumer that has started handles SIGTERM.
		if len(ready) == 0 {
			return false
		}
		ready[m.rng.IntN(len(ready))].cur.terminate()
	case actDBKill:
		if len(live) == 0 {
			return false
		}
		targets := []*slot{live[m.rng.IntN(len(live))]}
		if m.rng.IntN(3) == 0 {
			targets = live // every consumer of the mode at once
		}
		for _, s := range targets {
			n, err := m.db.cutConnections(ctx, s.app, s.cur)
			if err != nil {
				m.r.printf("chaos: %s: cutting the connections of %s: %v", m.label, s.app, err)
			}
			m.dbConns += n
		}
		m.dbKills++
	case actReplay:
		for _, s := range m.slots {
			if !s.active {
				s.active = true
				m.startConsumer(s)
			}
		}
	case actBroker:
		took, err := m.r.restartBroker(ctx)
		if err != nil {
			m.fail("broker restart: %v", err)
			return true
		}
		m.brokerDone = append(m.brokerDone, took)
		m.r.printf("chaos: %s: broker restarted at %d/%d effects (down %v)", m.label, m.done, m.events, took.Round(time.Millisecond))
	case actReset:
		qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		n, err := m.db.resetQueue(qctx, m.queueTable())
		if err != nil {
			m.r.printf("chaos: %s: offset reset: %v", m.label, err)
			return ctx.Err() != nil
		}
		m.replayed = int(n)
	}
	return true
}

// startConsumer starts the slot's next process; some are told to kill
// themselves at a point after a number of deliveries reach it.
func (m *modeRun) startConsumer(s *slot) {
	cfg := m.r.cfg
	s.incarnation++
	name := fmt.Sprintf("%s/c%d#%d", m.label, s.idx, s.incarnation)
	pool := 4
	if m.mode == wire.SQLQueue {
		pool = 3
	}
	args := []string{"-mode", m.mode, "-db", m.db.kind, "-dsn", m.db.dsn, "-app", s.app, "-name", fmt.Sprintf("c%d.%d", s.idx, s.incarnation),
		"-brokers", strings.Join(m.r.brokers, ","), "-poison-topic", m.poisonTopic, "-inbox-table", m.inboxTable,
		"-pool", fmt.Sprint(pool), "-lifeline", fmt.Sprintf("-partitioned=%v", m.db.partitioned),
		"-history", filepath.Join(m.historyDir(), strings.NewReplacer("/", "_", "#", "_").Replace(name)+".jsonl")}
	if m.mode == wire.KafkaGroup && m.db.pipeline {
		args = append(args, "-pipeline")
	}
	if m.mode == wire.KafkaReserve && cfg.ReserveBatch {
		args = append(args, "-reserve-batch")
	}
	if m.cooperative() {
		args = append(args, "-cooperative")
	}
	switch m.mode {
	case wire.KafkaTx, wire.KafkaGroup, wire.KafkaParallel:
		args = append(args, "-topic", m.topic, "-group", s.group, "-effects-table", m.effectsTable)
	case wire.KafkaReserve:
		args = append(args, "-topic", m.topic, "-group", s.group, "-provider", m.prov.url)
	case wire.SQLQueue:
		args = append(args, "-topic", m.queueTopic, "-effects-table", m.effectsTable)
	}
	// Drawn from the seed, the mode, the slot and the incarnation alone, so
	// that the same process of the same run is told the same whatever the
	// timing: "c2's third process dies at mid-handler after 37 deliveries".
	var armed string
	arm := rand.New(rand.NewPCG(cfg.Seed, uint64(m.idx)<<40|uint64(s.idx)<<20|uint64(s.incarnation)))
	if arm.Float64() < cfg.SelfKillShare {
		point := m.arms[(s.idx+s.incarnation)%len(m.arms)]
		after := cfg.DieAfter[0] + arm.IntN(cfg.DieAfter[1]-cfg.DieAfter[0]+1)
		args = append(args, "-die-at", point, "-die-after", fmt.Sprint(after))
		armed = fmt.Sprintf("%s/%d", point, after)
	}
	if cfg.Verbose {
		args = append(args, "-v")
	}
	p, err := m.r.procs.start(cfg.Command, "consumer", name, m.r.logDir, args)
	if err != nil {
		m.fail("start %s: %v", name, err)
		s.restartAt = time.Now().Add(time.Second)
		return
	}
	p.armed = armed
	s.cur = p
	m.all = append(m.all, p)
}

// supervise reaps consumers that ended, tells how they ended, and starts
// replacements after a short random pause, as a process supervisor would.
func (m *modeRun) supervise() {
	now := time.Now()
	for _, s := range m.slots {
		if !s.active {
			continue
		}
		if s.cur != nil && s.cur.exited() {
			m.reap(s.cur)
			s.cur = nil
			s.restartAt = now.Add(time.Duration(200+m.rng.IntN(1300)) * time.Millisecond)
		}
		if s.cur == nil && !m.stopping && !now.Before(s.restartAt) {
			m.startConsumer(s)
		}
	}
}

func (m *modeRun) reap(p *proc) {
	kind, why := p.classify()
	switch kind {
	case exitClean:
		m.restarts++
	case exitSelfKill:
		died, _, _, _, _, _ := p.snapshot()
		m.selfKills[died]++
	case exitDriverKill:
		m.driverKills++
	case exitBad:
		m.fail("%s", why)
	}
}

// drained reports whether every group has consumed everything published,
// and how many messages are still to be consumed.
func (m *modeRun) drained(ctx context.Context) (bool, int64, error) {
	if !m.isKafka() {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var n int64
		err := m.db.db.QueryRowContext(qctx, `SELECT count(*) FROM `+m.queueTable()+` WHERE NOT acked`).Scan(&n)
		return err == nil && n == 0, n, err
	}
	var total int64
	all := true
	for _, g := range m.groups() {
		ok, n, err := m.kafka.consumed(g, m.topic)
		if err != nil {
			return false, total, err
		}
		all = all && ok
		total += n
	}
	return all, total, nil
}

// stopAll stops every consumer with SIGTERM and checks that each exits
// cleanly, in time.
func (m *modeRun) stopAll() {
	m.stopping = true
	var running []*proc
	for _, s := range m.slots {
		if s.cur != nil {
			running = append(running, s.cur)
		}
	}
	// A consumer handles SIGTERM once it has started; one started a moment
	// ago is given the time to, so that the signal finds its handler.
	for _, p := range running {
		select {
		case <-p.ready:
		case <-p.done:
		case <-time.After(30 * time.Second):
		}
		p.terminate()
	}
	for _, p := range running {
		select {
		case <-p.done:
		case <-time.After(45 * time.Second):
			m.fail("%s did not stop within 45s of SIGTERM; killed (log: %s)", p.name, p.logPath)
			p.kill()
			<-p.done
			continue
		}
		// A consumer stopped at the end is not a restart.
		if kind, why := p.classify(); kind == exitBad {
			m.fail("%s", why)
		} else if kind == exitSelfKill {
			m.reap(p)
		} else if kind == exitDriverKill {
			m.driverKills++
		}
	}
	for _, s := range m.slots {
		s.cur = nil
	}
}

func (m *modeRun) sumStats() wire.Stats {
	var sum wire.Stats
	for _, p := range m.all {
		_, st, _, _, _, _ := p.snapshot()
		sum = sum.Add(st)
	}
	return sum
}
