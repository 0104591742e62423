package driver

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// TestDialWaitsForABrokerRestart: a mode that sets up while another mode
// has the broker down for a planned restart waits for it to come back
// instead of failing its setup (seen under load, when setups and
// restarts overlap), and gives up once its patience is spent.
func TestDialWaitsForABrokerRestart(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close() // nothing answers there now
	addr := []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}

	if _, err := dialKafkaRetrying(context.Background(), addr, "impatient", 300*time.Millisecond); err == nil {
		t.Fatal("a dial with no broker up succeeded")
	}

	started := make(chan *kfake.Cluster, 1)
	go func() {
		time.Sleep(time.Second) // the broker comes back up
		c, err := kfake.NewCluster(kfake.Ports(port), kfake.SeedTopics(1, "t"))
		if err != nil {
			t.Error(err)
		}
		started <- c
	}()
	k, err := dialKafkaRetrying(context.Background(), addr, "patient", 30*time.Second)
	if c := <-started; c != nil {
		defer c.Close()
	}
	if err != nil {
		t.Fatalf("the dial did not wait for the broker: %v", err)
	}
	k.close()
}
