package driver

import (
	"testing"

	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// TestRestartOrder: the quick run's two broker restarts go to the two
// transactional Kafka modes, on different databases; the full run's eight
// to every mode once.
func TestRestartOrder(t *testing.T) {
	var runs []*modeRun
	for _, kind := range wire.Databases {
		for _, mode := range wire.Modes {
			runs = append(runs, &modeRun{mode: mode, db: &database{kind: kind}, label: kind + "/" + mode})
		}
	}
	order := restartOrder(runs, wire.Modes, wire.Databases)
	if len(order) != len(runs) {
		t.Fatalf("order has %d modes, want %d", len(order), len(runs))
	}
	if got := order[0].label + "," + order[1].label; got != "postgres/kafka-transactional,mysql/kafka-group" {
		t.Errorf("the first two restarts go to %s", got)
	}
	seen := map[*modeRun]bool{}
	for _, mr := range order {
		if seen[mr] {
			t.Errorf("%s comes twice", mr.label)
		}
		seen[mr] = true
	}
	if one := restartOrder(runs[:4], wire.Modes, []string{wire.Postgres}); len(one) != 4 || one[1].mode != wire.KafkaGroup {
		t.Errorf("one database: %d modes, the second %s", len(one), one[1].label)
	}
}
