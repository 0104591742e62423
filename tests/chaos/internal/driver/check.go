package driver

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// result is what the end-of-mode check found.
type result struct {
	events, messages   int
	byKind             [4]int
	effects            int
	duplicated, lost   int
	wrongPayload       int // effects made with a payload that came first on no partition of the topic
	unknown            int // effects of events never published
	conflicts          int // conflicting payloads published (distinct events)
	conflictsRouted    int // of those, distinct events found on the poison topic with the conflicting payload
	poisonMessages     int
	unexpectedPoison   int // poison messages for events without a conflicting payload
	refusedFirst       int // poison messages carrying the payload the event's effect was made with
	topicMessages      int // messages read back from the topic
	notOnTopic         int // published payloads (event and amount) not found on the topic
	conflictFirst      int // events whose conflicting payload came first on every partition
	undecided          int // events whose payloads came first on different partitions
	records            int
	unfinished         int // inbox records not completed
	retried            int // inbox records at attempt > 1 (reserve mode: taken over)
	doubleCharged      int
	outOfOrder         int // kafka-parallel: effects made before an earlier event of their account's
	accountsChecked    int
	faults             providerFaults
	stats              wire.Stats
	checkErr           error
	history            historyVerdict
	historyChecked     bool
	publishedEventIDs  map[string]bool
	publishedConflicts map[string]bool
}

// check counts, for every event published, its effects in the business
// table (or the provider's ledger), its inbox record and what reached the
// poison topic, and records a failure for anything that is not exactly one
// effect with the event's first payload — first as the topic, read back,
// has it, not as it was published.
func (m *modeRun) check(ctx context.Context) {
	res := &m.res
	res.stats = m.sumStats()
	published := m.st.chunks[:m.nextChunk]
	topic, err := m.readTopic(ctx)
	if err != nil {
		m.fail("reading the topic back: %v", err)
		topic = publishOrder(published) // the best guess left
	}
	effects, err := m.readEffects(ctx)
	if err != nil {
		res.checkErr = err
		m.fail("reading the effects: %v", err)
	}
	poison, err := m.readPoison(ctx)
	if err != nil {
		m.fail("reading the poison topic: %v", err)
	}
	res.judge(m.st, published, topic, effects, poison)
	if err := m.checkInbox(ctx); err != nil {
		m.fail("reading the inbox: %v", err)
	}
	for _, f := range res.verdicts() {
		m.fail("%s", f)
	}
	if res.unfinished > 0 || (res.checkErr == nil && res.records != res.events) {
		m.fail("inbox: %d records for %d events, %d not completed", res.records, res.events, res.unfinished)
	}
	if res.doubleCharged > 0 {
		m.fail("the provider charged %d intents more than once", res.doubleCharged)
	}
	if m.mode == wire.KafkaGroup && res.stats.Members <= res.stats.Groups {
		// As many members as groups: every group had one, and group
		// commit was never tried on more than a single delivery.
		m.fail("group commit: %d groups of %d members in all: no group of more than one member formed",
			res.stats.Groups, res.stats.Members)
	}
	if m.mode == wire.KafkaReserve && m.r.cfg.ReserveBatch && res.stats.Members <= res.stats.Groups {
		m.fail("reserve batches: %d statements for %d reservations: no statement carried more than one",
			res.stats.Groups, res.stats.Members)
	}
	if m.mode == wire.KafkaParallel {
		if err := m.checkOrder(ctx, topic); err != nil {
			m.fail("reading the effects' order: %v", err)
		}
		if res.outOfOrder > 0 {
			m.fail("%d effects made before an earlier event of their account's: the parallel consumer broke a key's order",
				res.outOfOrder)
		}
		if int(res.stats.Peak) <= int(m.partitions()) && res.events >= 1000 {
			// One message a partition at a time, or less: the parallel
			// consumer never ran more than watermill-kafka's would have.
			// (A small run, the smoke test's, has too little backlog to
			// tell.)
			m.fail("parallel consumer: at most %d deliveries at once in a consumer, no more than the topic's %d partitions",
				res.stats.Peak, m.partitions())
		}
	}
}

// checkOrder reads when each effect was made and counts, per account,
// the effects made after one of a later event of the account's: the
// parallel consumer runs an account's events one after the other, so
// their effects must come in the order the events first appear on the
// account's partition. That is the topic's order (read back), not the
// publish order: a producer that retries a batch after a broker restart
// can land an event after one published later.
func (m *modeRun) checkOrder(ctx context.Context, topic *topicOrder) error {
	q, err := m.db.db.QueryContext(ctx, `SELECT event_id, `+m.db.epochMicros("created_at")+` FROM `+m.effectsTable)
	if err != nil {
		return err
	}
	defer q.Close()
	var made []madeEffect
	for q.Next() {
		var id string
		var at int64
		if err := q.Scan(&id, &at); err != nil {
			return err
		}
		if ev := m.st.byID[id]; ev != nil && ev.account != "" {
			made = append(made, madeEffect{account: ev.account, at: at, order: topic.orderOf(id, ev.seq)})
		}
	}
	if err := q.Err(); err != nil {
		return err
	}
	m.res.outOfOrder, m.res.accountsChecked = outOfOrder(made)
	return nil
}

// madeEffect is an effect of an account's event: when it was made, and
// where its event comes in the account's order.
type madeEffect struct {
	account string
	at      int64
	order   int
}

// outOfOrder counts, per account, the effects made after one of an event
// that comes later in the account's order, and the accounts it saw.
func outOfOrder(made []madeEffect) (n, accounts int) {
	byAccount := map[string][]madeEffect{}
	for _, e := range made {
		byAccount[e.account] = append(byAccount[e.account], e)
	}
	for _, ms := range byAccount {
		slices.SortFunc(ms, func(a, b madeEffect) int {
			if a.at != b.at {
				return cmp.Compare(a.at, b.at)
			}
			return cmp.Compare(a.order, b.order)
		})
		for i := 1; i < len(ms); i++ {
			if ms[i].order < ms[i-1].order {
				n++
			}
		}
	}
	return n, len(byAccount)
}

// effectRow is one group of equal effects: n effects of event id made with
// amount.
type effectRow struct {
	id     string
	amount int
	n      int
}

// poisonMsg is one message of the poison topic: the event and the amount
// of the payload that was refused.
type poisonMsg struct {
	id     string
	amount int
}

// judge counts, from what was published, what the topic holds, the
// effects and the poison topic, the effects of each event, the payloads
// they were made with and the payloads refused. Which payload of an event
// is its first, the one that must make the effect while the other is
// refused, the topic decides (onTopic.mayWin): a broker restart can land a
// retried first payload after the conflicting one. judge reads nothing:
// what it decides can be tested on constructed cases.
func (res *result) judge(st *stream, published [][]streamMsg, topic *topicOrder, effects []effectRow, poison []poisonMsg) {
	res.publishedEventIDs = map[string]bool{}
	res.publishedConflicts = map[string]bool{}
	for _, chunk := range published {
		for _, sm := range chunk {
			res.messages++
			res.byKind[sm.kind]++
			switch sm.kind {
			case kindOriginal:
				res.publishedEventIDs[sm.ev.id] = true
			case kindConflict:
				res.publishedConflicts[sm.ev.id] = true
			}
		}
	}
	res.events = len(res.publishedEventIDs)
	res.conflicts = len(res.publishedConflicts)

	res.topicMessages = topic.messages
	missing := map[poisonMsg]bool{}
	for _, chunk := range published {
		for _, sm := range chunk {
			if e := topic.events[sm.ev.id]; e == nil || !slices.Contains(e.amounts, sm.amount) {
				missing[poisonMsg{sm.ev.id, sm.amount}] = true
			}
		}
	}
	res.notOnTopic = len(missing)
	for id := range res.publishedEventIDs {
		switch e := topic.events[id]; {
		case e == nil:
		case len(e.firsts) > 1:
			res.undecided++
		case e.firsts[0] != st.byID[id].amount:
			res.conflictFirst++
		}
	}

	counts := map[string]int{}
	made := map[string]int{} // the amount an event's effect was made with
	for _, r := range effects {
		res.effects += r.n
		ev := st.byID[r.id]
		if ev == nil || !res.publishedEventIDs[r.id] {
			res.unknown += r.n
			continue
		}
		counts[r.id] += r.n
		made[r.id] = r.amount
		if e := topic.events[r.id]; e == nil || !e.mayWin(r.amount) {
			res.wrongPayload += r.n
		}
	}
	for id := range res.publishedEventIDs {
		switch c := counts[id]; {
		case c == 0:
			res.lost++
		case c > 1:
			res.duplicated += c - 1
		}
	}

	// The payload that must not be refused: the one the effect was made
	// with, or, for an event without an effect (lost, and failed for
	// that), the one first on every partition.
	first := func(id string, e *onTopic) (int, bool) {
		if a, ok := made[id]; ok {
			return a, true
		}
		if len(e.firsts) == 1 {
			return e.firsts[0], true
		}
		return 0, false
	}
	routed := map[string]bool{}
	for _, pm := range poison {
		res.poisonMessages++
		e := topic.events[pm.id]
		if e == nil || len(e.amounts) < 2 || !slices.Contains(e.amounts, pm.amount) || !res.publishedConflicts[pm.id] {
			res.unexpectedPoison++
			continue
		}
		if a, ok := first(pm.id, e); ok && a == pm.amount {
			res.refusedFirst++
			continue
		}
		routed[pm.id] = true
	}
	res.conflictsRouted = len(routed)
}

// verdicts are the failures judge's counts show.
func (res *result) verdicts() []string {
	var out []string
	if res.duplicated > 0 {
		out = append(out, fmt.Sprintf("%d duplicated effects: events whose effect happened more than once", res.duplicated))
	}
	if res.lost > 0 {
		out = append(out, fmt.Sprintf("%d events lost: published, no effect", res.lost))
	}
	if res.wrongPayload > 0 {
		out = append(out, fmt.Sprintf("%d effects made with a payload that came first on no partition of the topic: a conflicting payload taken instead of the event's first",
			res.wrongPayload))
	}
	if res.unknown > 0 {
		out = append(out, fmt.Sprintf("%d effects of events that were never published", res.unknown))
	}
	if res.conflictsRouted != res.conflicts {
		out = append(out, fmt.Sprintf("%d conflicting payloads published, %d found refused on the poison topic",
			res.conflicts, res.conflictsRouted))
	}
	if res.unexpectedPoison > 0 || res.refusedFirst > 0 {
		out = append(out, fmt.Sprintf("poison topic: %d messages of events without a conflict, %d refused with the payload their effect was made with",
			res.unexpectedPoison, res.refusedFirst))
	}
	if res.notOnTopic > 0 {
		out = append(out, fmt.Sprintf("%d published payloads (event and amount) not found on the topic read back (%d messages)",
			res.notOnTopic, res.topicMessages))
	}
	return out
}

// readEffects reads the effects: the business table's rows, or the
// provider's charges.
func (m *modeRun) readEffects(ctx context.Context) ([]effectRow, error) {
	res := &m.res
	var rows []effectRow
	if m.prov != nil {
		charges, doubles, faults := m.prov.ledger()
		res.doubleCharged, res.faults = doubles, faults
		for _, c := range charges {
			rows = append(rows, effectRow{c.EventID, c.Amount, 1})
		}
		return rows, nil
	}
	q, err := m.db.db.QueryContext(ctx, `SELECT event_id, amount, count(*) FROM `+m.effectsTable+` GROUP BY event_id, amount`)
	if err != nil {
		return nil, err
	}
	defer q.Close()
	for q.Next() {
		var r effectRow
		if err := q.Scan(&r.id, &r.amount, &r.n); err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return rows, q.Err()
}

func (m *modeRun) checkInbox(ctx context.Context) error {
	res := &m.res
	q, err := m.db.db.QueryContext(ctx, `SELECT status, count(*), count(CASE WHEN attempt > 1 THEN 1 END) FROM `+
		m.inboxTable+` GROUP BY status`)
	if err != nil {
		return err
	}
	defer q.Close()
	for q.Next() {
		var (
			status     string
			n, retaken int
		)
		if err := q.Scan(&status, &n, &retaken); err != nil {
			return err
		}
		res.records += n
		res.retried += retaken
		if status != "completed" {
			res.unfinished += n
		}
	}
	return q.Err()
}

// readTopic reads the mode's topic back after the run: the Kafka topic
// partition by partition, each in offset order, or the SQL queue's table
// in offset order (its consumers take the first unacked row, one at a
// time: one partition).
func (m *modeRun) readTopic(ctx context.Context) (*topicOrder, error) {
	if !m.isKafka() {
		t := newTopicOrder()
		q, err := m.db.db.QueryContext(ctx, `SELECT metadata, payload FROM `+m.queueTable()+` ORDER BY `+m.db.quote("offset"))
		if err != nil {
			return nil, err
		}
		defer q.Close()
		for q.Next() {
			var (
				meta, payload []byte
				md            map[string]string
				ev            wire.Event
			)
			if err := q.Scan(&meta, &payload); err != nil {
				return nil, err
			}
			_ = json.Unmarshal(meta, &md)
			_ = json.Unmarshal(payload, &ev)
			t.add(0, md[wire.MetaEventID], ev.Amount)
		}
		return t, q.Err()
	}
	// Another mode may restart the broker while this one reads: try again.
	for attempt := 1; ; attempt++ {
		t := newTopicOrder()
		err := m.kafka.scan(ctx, m.topic, func(msg *sarama.ConsumerMessage) {
			var ev wire.Event
			_ = json.Unmarshal(msg.Value, &ev)
			t.add(msg.Partition, header(msg, wire.MetaEventID), ev.Amount)
		})
		if err == nil || attempt == 10 || ctx.Err() != nil {
			return t, err
		}
		m.r.printf("chaos: %s: reading the topic back (attempt %d): %v", m.label, attempt, err)
		time.Sleep(time.Second)
	}
}

// publishOrder is the topic as published, for when it cannot be read back.
func publishOrder(published [][]streamMsg) *topicOrder {
	t := newTopicOrder()
	for _, chunk := range published {
		for _, sm := range chunk {
			t.add(sm.partition, sm.ev.id, sm.amount)
		}
	}
	return t
}

// readPoison reads the poison topic.
func (m *modeRun) readPoison(ctx context.Context) ([]poisonMsg, error) {
	// Another mode may restart the broker while this one reads: try again.
	var (
		msgs []*sarama.ConsumerMessage
		err  error
	)
	for attempt := 1; ; attempt++ {
		if msgs, err = m.kafka.readAll(ctx, m.poisonTopic); err == nil || attempt == 10 || ctx.Err() != nil {
			break
		}
		m.r.printf("chaos: %s: reading the poison topic (attempt %d): %v", m.label, attempt, err)
		time.Sleep(time.Second)
	}
	if err != nil {
		return nil, err
	}
	out := make([]poisonMsg, 0, len(msgs))
	for _, pm := range msgs {
		var ev wire.Event
		_ = json.Unmarshal(pm.Value, &ev)
		out = append(out, poisonMsg{id: header(pm, wire.MetaEventID), amount: ev.Amount})
	}
	return out, nil
}

// report prints the mode's summary lines.
func (m *modeRun) report() {
	res := m.res
	grouped := ""
	if m.mode == wire.KafkaGroup {
		grouped = fmt.Sprintf(" members_per_group=%.2f", res.stats.MeanGroup())
	}
	if m.db.partitioned {
		grouped += " table=partitioned"
	}
	if m.mode == wire.KafkaGroup && m.db.pipeline {
		grouped += " groups=pipelined"
	}
	if m.mode == wire.KafkaReserve && m.r.cfg.ReserveBatch {
		grouped += fmt.Sprintf(" batches=on reservations_per_statement=%.2f", res.stats.MeanGroup())
	}
	if m.mode == wire.KafkaParallel {
		rebalance := "eager"
		if m.cooperative() {
			rebalance = "cooperative"
		}
		grouped += fmt.Sprintf(" out_of_order=%d accounts=%d peak_in_flight=%d rebalance=%s", res.outOfOrder,
			res.accountsChecked, res.stats.Peak, rebalance)
	}
	m.r.printf("MODE %s events=%d messages=%d effects=%d duplicated_effects=%d lost=%d conflicts=%d conflicts_routed=%d kills=%d%s took=%v",
		m.label, res.events, res.messages, res.effects, res.duplicated, res.lost, res.conflicts, res.conflictsRouted,
		m.kills(), grouped, time.Since(m.started).Round(100*time.Millisecond))
	replay := fmt.Sprintf("a second consumer group from the oldest offset (%d consumers, started halfway)", m.replaySlots())
	if !m.isKafka() {
		replay = fmt.Sprintf("%d acked messages marked unacked halfway", m.replayed)
	}
	m.r.printf("  %s: stream: %d first deliveries, %d producer retries, %d republished later, %d conflicting; replay: %s",
		m.label, res.byKind[kindOriginal], res.byKind[kindRetry], res.byKind[kindLater], res.byKind[kindConflict], replay)
	m.r.printf("  %s: topic read back: %d messages; %d events with the conflicting payload first, %d with their payloads first on different partitions",
		m.label, res.topicMessages, res.conflictFirst, res.undecided)
	var self []string
	for _, p := range wire.Points {
		self = append(self, fmt.Sprintf("%s=%d", p, m.selfKills[p]))
	}
	m.r.printf("  %s: faults: SIGKILL by the driver %d, by the consumer itself %s; db connection kills %d (%d connections); graceful restarts %d; %d consumer processes in all",
		m.label, m.driverKills, strings.Join(self, " "), m.dbKills, m.dbConns, m.restarts, len(m.all))
	if len(m.brokerDone) > 0 {
		m.r.printf("  %s: broker restarts %d (down %v)", m.label, len(m.brokerDone), m.brokerDone)
	}
	m.r.printf("  %s: deliveries (as last reported by each process): %s; poison messages %d; inbox records %d (%d at attempt > 1)",
		m.label, res.stats, res.poisonMessages, res.records, res.retried)
	if m.mode == wire.KafkaGroup {
		m.r.printf("  %s: group commit: %d group transactions, %d members, %.2f members per group (as last reported by each process; a group run again without a failed member counts again)",
			m.label, res.stats.Groups, res.stats.Members, res.stats.MeanGroup())
	}
	if res.historyChecked {
		h := res.history
		m.r.printf("  %s: history: %d claims, %d commits, %d acks, %d effects over %d keys; linearizable=%t (checked in %v)",
			m.label, h.ops[wire.OpClaim], h.ops[wire.OpCommit], h.ops[wire.OpAck], h.ops[wire.OpEffect], h.keys,
			h.linearizable, h.took.Round(time.Millisecond))
	}
	if m.prov != nil {
		f := res.faults
		m.r.printf("  %s: provider: charges=%d double_charges=%d; unavailable=%d slow_before_charging=%d slow_after_charging=%d hung_up_after_charging=%d refused_late=%d lookup_failures=%d",
			m.label, res.effects, res.doubleCharged, f.unavailable, f.slowBefore, f.slowAfter, f.hangups, f.late, f.lookupFailures)
	}
}

func (m *modeRun) replaySlots() int {
	n := 0
	for _, s := range m.slots {
		if s.group == m.replayGrp {
			n++
		}
	}
	return n
}
