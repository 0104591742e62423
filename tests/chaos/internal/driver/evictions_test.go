package driver

import (
	"os"
	"path/filepath"
	"testing"
)

// TestBrokerEvictions counts the removals in every broker log, and only
// those that succeeded.
func TestBrokerEvictions(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("broker.log", "broker: group g: member m1 silent for 4.1s in a stable group: removed\n")
	write("broker_2.log", "other\nbroker: group g: member m2 silent for 4.2s in a stable group: removed\n"+
		"broker: group g: member m3 silent for 4.3s in a stable group: could not remove: unknown member\n")
	write("mysql_kafka-group_c0_1.log", "broker: group g: member m4 silent for 4.4s in a stable group: removed\n")
	if n := brokerEvictions(dir); n != 2 {
		t.Errorf("brokerEvictions = %d, want 2", n)
	}
	if n := brokerEvictions(filepath.Join(dir, "none")); n != 0 {
		t.Errorf("brokerEvictions of a missing directory = %d", n)
	}
}
