// Package broker is the chaos suite's Kafka: a one-broker kfake cluster
// (github.com/twmb/franz-go/pkg/kfake) in a process of its own, listening on
// 127.0.0.1, so that killing consumers never touches the broker's state.
// With -data-dir the cluster persists its state (kfake.DataDir) and a new
// process on the same port and directory carries on where the last one
// stopped: the driver restarts the broker that way mid-stream.
package broker

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Main runs the broker until SIGTERM or SIGINT, or, with -lifeline, until
// stdin reaches EOF (the driver is gone). It prints "LISTEN <host:port>" once it accepts
// connections, and returns the exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("broker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	partitions := fs.Int("partitions", 8, "partitions of every seeded topic")
	topics := fs.String("topics", "", "comma-separated topics to create, each name or name:partitions (-partitions when not given)")
	port := fs.Int("port", 0, "port on 127.0.0.1 (0: any free port)")
	dataDir := fs.String("data-dir", "", "keep the cluster's state (topics, records, groups' offsets) in this directory and reload it at start, so that a restarted broker has the data of the one before")
	lifeline := fs.Bool("lifeline", false, "stop when stdin reaches EOF (the process that started this one is gone)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	// Caught from the start, not only once LISTEN is out: the driver may
	// stop a broker the moment it listens (two restarts due at once), and
	// one killed by the signal writes no state for the next.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(*port),
		// Lets the consumers' two-second sessions through: a member that
		// died is evicted, and its partitions reassigned, within seconds.
		kfake.GroupMinSessionTimeout(500 * time.Millisecond),
	}
	if *dataDir != "" {
		opts = append(opts, kfake.DataDir(*dataDir))
	}
	if *topics != "" {
		for _, t := range strings.Split(*topics, ",") {
			n := *partitions
			if name, count, ok := strings.Cut(t, ":"); ok {
				var err error
				if n, err = strconv.Atoi(count); err != nil || n < 1 {
					fmt.Fprintf(stderr, "broker: -topics %q: want name:partitions with a positive count\n", t)
					return 2
				}
				t = name
			}
			opts = append(opts, kfake.SeedTopics(int32(n), t))
		}
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		fmt.Fprintln(stderr, "broker:", err)
		return 1
	}
	defer c.Close()
	// Removes the members kfake would keep although they died joining
	// (see evictor).
	stopEvictor := make(chan struct{})
	defer close(stopEvictor)
	watch(c, c.ListenAddrs()[0], stderr, stopEvictor)
	fmt.Fprintln(stdout, "LISTEN", c.ListenAddrs()[0])

	orphaned := make(chan struct{})
	if *lifeline {
		go func() {
			_, _ = io.Copy(io.Discard, stdin)
			close(orphaned)
		}()
	}
	select {
	case <-ctx.Done():
	case <-orphaned:
		fmt.Fprintln(stderr, "broker: stdin closed (driver gone); stopping")
	}
	return 0
}

// Run is main for cmd programs.
func Run() { os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }
