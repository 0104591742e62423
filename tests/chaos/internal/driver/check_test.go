package driver

import (
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/inboxmill/inboxmill/internal/kafkatest"
	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// checkCase is one constructed end of a mode: what was published, what
// the topic holds (in offset order per partition), the effects and the
// poison topic.
type checkCase struct {
	topic   []onPartition
	effects []effectRow
	poison  []poisonMsg
	// want are substrings of the verdicts, one each; none: the check passes.
	want []string
}

type onPartition struct {
	p      int32
	id     string
	amount int
}

// TestCheckFollowsTheTopic: the conflict check decides an event's first
// payload from the topic's order, not from the publish order. evt-1 is
// published with 100, then reused with 150 on its partition 0; evt-2 (200)
// goes to partition 1.
func TestCheckFollowsTheTopic(t *testing.T) {
	ev1 := &event{id: "evt-1", tenant: "t", amount: 100}
	ev2 := &event{id: "evt-2", tenant: "t", amount: 200}
	st := &stream{byID: map[string]*event{ev1.id: ev1, ev2.id: ev2}, conflicts: map[string]int{ev1.id: 150}}
	published := [][]streamMsg{{
		{ev: ev1, kind: kindOriginal, amount: 100, partition: 0},
		{ev: ev2, kind: kindOriginal, amount: 200, partition: 1},
		{ev: ev1, kind: kindConflict, amount: 150, partition: 0},
	}}
	inOrder := []onPartition{{0, "evt-1", 100}, {0, "evt-1", 150}, {1, "evt-2", 200}}
	// A broker restart failed the batch of evt-1's first payload after the
	// conflicting one was written; the producer's retry put it behind.
	reordered := []onPartition{{0, "evt-1", 150}, {0, "evt-1", 100}, {1, "evt-2", 200}}

	tests := map[string]checkCase{
		"topic in publish order": {
			topic:   inOrder,
			effects: []effectRow{{"evt-1", 100, 1}, {"evt-2", 200, 1}},
			poison:  []poisonMsg{{"evt-1", 150}},
		},
		// The case the publish order gets wrong: the consumers saw 150
		// first and did right to take it and refuse 100.
		"conflicting payload first on the topic": {
			topic:   reordered,
			effects: []effectRow{{"evt-1", 150, 1}, {"evt-2", 200, 1}},
			poison:  []poisonMsg{{"evt-1", 100}},
		},
		// A consumer that took the payload published first, though the
		// topic had the other first, is wrong.
		"reordered topic, effect with the payload published first": {
			topic:   reordered,
			effects: []effectRow{{"evt-1", 100, 1}, {"evt-2", 200, 1}},
			poison:  []poisonMsg{{"evt-1", 150}},
			want:    []string{"1 effects made with a payload that came first on no partition"},
		},
		"reordered topic, the payload that made the effect refused too": {
			topic:   reordered,
			effects: []effectRow{{"evt-1", 150, 1}, {"evt-2", 200, 1}},
			poison:  []poisonMsg{{"evt-1", 100}, {"evt-1", 150}},
			want:    []string{"1 refused with the payload their effect was made with"},
		},
		"reordered topic, nothing refused": {
			topic:   reordered,
			effects: []effectRow{{"evt-1", 150, 1}, {"evt-2", 200, 1}},
			want:    []string{"1 conflicting payloads published, 0 found refused"},
		},
		// A later republication of 100 on partition 1 comes first there:
		// which payload wins is the consumers' race, and either is right.
		"payloads first on different partitions, first payload wins": {
			topic:   append(append([]onPartition(nil), reordered...), onPartition{1, "evt-1", 100}),
			effects: []effectRow{{"evt-1", 100, 1}, {"evt-2", 200, 1}},
			poison:  []poisonMsg{{"evt-1", 150}},
		},
		"payloads first on different partitions, conflicting payload wins": {
			topic:   append(append([]onPartition(nil), reordered...), onPartition{1, "evt-1", 100}),
			effects: []effectRow{{"evt-1", 150, 1}, {"evt-2", 200, 1}},
			poison:  []poisonMsg{{"evt-1", 100}},
		},
		"conflicting payload missing from the topic": {
			topic:   []onPartition{{0, "evt-1", 100}, {1, "evt-2", 200}},
			effects: []effectRow{{"evt-1", 100, 1}, {"evt-2", 200, 1}},
			want:    []string{"1 conflicting payloads published, 0 found", "1 published payloads (event and amount) not found on the topic"},
		},
		"duplicated and lost effects": {
			topic:   inOrder,
			effects: []effectRow{{"evt-1", 100, 2}},
			poison:  []poisonMsg{{"evt-1", 150}},
			want:    []string{"1 duplicated effects", "1 events lost"},
		},
		"poison for an event without a conflict": {
			topic:   inOrder,
			effects: []effectRow{{"evt-1", 100, 1}, {"evt-2", 200, 1}},
			poison:  []poisonMsg{{"evt-1", 150}, {"evt-2", 200}},
			want:    []string{"poison topic: 1 messages of events without a conflict"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			topic := newTopicOrder()
			for _, m := range tc.topic {
				topic.add(m.p, m.id, m.amount)
			}
			var res result
			res.judge(st, published, topic, tc.effects, tc.poison)
			got := res.verdicts()
			if len(got) != len(tc.want) {
				t.Fatalf("verdicts %q, want %d matching %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("verdict %d = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

// TestPublishOrderHasTheFirstPayloadFirst: the fallback when the topic
// cannot be read back is the publish order, which has every event's first
// payload first.
func TestPublishOrderHasTheFirstPayloadFirst(t *testing.T) {
	st := newStream(rand.New(rand.NewPCG(1, 2)), 400, 4, 0)
	topic := publishOrder(st.chunks)
	if topic.messages != st.messages {
		t.Fatalf("%d messages, want %d", topic.messages, st.messages)
	}
	for _, ev := range st.events {
		e := topic.events[ev.id]
		if e == nil || len(e.firsts) != 1 || e.firsts[0] != ev.amount {
			t.Fatalf("%s: %+v, want the first payload %d first", ev.id, e, ev.amount)
		}
	}
	var res result
	res.judge(st, st.chunks, topic, nil, nil)
	if res.conflicts < 2 || res.conflictFirst != 0 || res.undecided != 0 || res.notOnTopic != 0 {
		t.Fatalf("conflicts %d, conflicting first %d, undecided %d, not on the topic %d",
			res.conflicts, res.conflictFirst, res.undecided, res.notOnTopic)
	}
}

// TestReadTopicBack: the topic is read back from the broker in offset
// order per partition, whatever order the stream was published in: here
// evt-1's conflicting payload is on its partition before its first one.
func TestReadTopicBack(t *testing.T) {
	const topic = "chaos-read-back"
	brokers := kafkatest.Start(t, 2, topic)
	k, err := dialKafka(brokers, "read-back")
	if err != nil {
		t.Fatal(err)
	}
	defer k.close()
	ev1 := &event{id: "evt-1", tenant: "t", amount: 100}
	ev2 := &event{id: "evt-2", tenant: "t", amount: 200}
	for _, batch := range [][]streamMsg{
		{{ev: ev1, kind: kindConflict, amount: 150, partition: 0}, {ev: ev2, kind: kindOriginal, amount: 200, partition: 1}},
		{{ev: ev1, kind: kindOriginal, amount: 100, partition: 0}, {ev: ev1, kind: kindLater, amount: 100, partition: 1}},
	} {
		if _, err := k.produce(topic, batch); err != nil {
			t.Fatal(err)
		}
	}
	m := &modeRun{mode: wire.KafkaTx, topic: topic, kafka: k, r: &runner{cfg: Config{Out: io.Discard}}}
	got, err := m.readTopic(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got.messages != 4 {
		t.Errorf("%d messages read back, want 4", got.messages)
	}
	e1, e2 := got.events["evt-1"], got.events["evt-2"]
	if e1 == nil || e2 == nil {
		t.Fatalf("events read back: %v", got.events)
	}
	if !slices.Equal(e1.firsts, []int{150, 100}) || !slices.Equal(e1.amounts, []int{150, 100}) {
		t.Errorf("evt-1: firsts %v, amounts %v; want [150 100] for both (partition 0 first)", e1.firsts, e1.amounts)
	}
	if !slices.Equal(e2.firsts, []int{200}) || !e2.mayWin(200) || e2.mayWin(100) {
		t.Errorf("evt-2: firsts %v", e2.firsts)
	}
}

// TestOrderFollowsTheTopic: an account's effects must follow the order
// its events first appear on the topic, which a producer's retry after a
// broker restart can make differ from the publish order (evt-2 published
// after evt-1 but on the partition before it).
func TestOrderFollowsTheTopic(t *testing.T) {
	topic := newTopicOrder()
	topic.add(0, "evt-2", 200) // a retried batch landed evt-1 after evt-2
	topic.add(0, "evt-1", 100)
	topic.add(0, "evt-1", 100) // and again: its first copy counts
	topic.add(1, "evt-3", 300)
	seq := map[string]int{"evt-1": 1, "evt-2": 2, "evt-3": 1} // the publish order
	made := func(at map[string]int64) []madeEffect {
		var ms []madeEffect
		for id, a := range at {
			account := "acct-a"
			if id == "evt-3" {
				account = "acct-b"
			}
			ms = append(ms, madeEffect{account: account, at: a, order: topic.orderOf(id, seq[id])})
		}
		return ms
	}
	if n, accounts := outOfOrder(made(map[string]int64{"evt-2": 10, "evt-1": 20, "evt-3": 5})); n != 0 || accounts != 2 {
		t.Fatalf("effects in the topic's order: %d out of order over %d accounts, want 0 over 2", n, accounts)
	}
	if n, _ := outOfOrder(made(map[string]int64{"evt-1": 10, "evt-2": 20, "evt-3": 5})); n != 1 {
		t.Fatalf("effects in the publish order, against the topic's: %d out of order, want 1", n)
	}
	if got := topic.orderOf("evt-9", 7); got != 7 {
		t.Fatalf("an event not on the topic takes its publish order: %d, want 7", got)
	}
}
