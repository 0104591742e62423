package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/kafkaparallel"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/internal/kafkatest"
)

// The backlog scenario measures the parallel consumer's memory against a
// deep backlog: a broker in a process of its own holds --backlog messages
// (and, to compare, a topic of a hundredth as many), and for each of the
// in-flight settings a consumer process of its own consumes
// --backlog-consume of them through the middleware on PostgreSQL, then
// reports its peak resident set (VmHWM). Bounded memory is the same peak
// whatever the backlog, growing with the in-flight settings only.
//
//	BACKLOG backlog=<n> in_flight=<per partition>/<in all> consumed=<n> peak_rss_kb=<n> rss_now_kb=<n> seconds=<x>

// Roles the bench binary takes when it runs itself as a child process.
const childRoleEnv = "INBOXMILL_BENCH_ROLE"

// backlogSettings are the in-flight settings measured: per partition and
// in all, four partitions.
var backlogSettings = [][2]int{{8, 32}, {32, 128}, {128, 512}}

const backlogPartitions = 4

func (b *bench) backlog(ctx context.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	deep, shallow := b.opts.backlog, max(b.opts.backlog/100, int64(b.opts.backlogConsume))
	brokerCmd := exec.CommandContext(ctx, exe)
	brokerCmd.Env = append(os.Environ(), childRoleEnv+"=broker")
	brokerCmd.Stderr = b.log
	out, err := brokerCmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := brokerCmd.Start(); err != nil {
		return err
	}
	defer func() { _ = brokerCmd.Process.Kill(); _ = brokerCmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		return fmt.Errorf("backlog broker: %w", err)
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "LISTEN ")
	if !ok {
		return fmt.Errorf("backlog broker said %q", line)
	}
	brokers := []string{addr}
	h := &harness{}
	defer h.close()
	for _, t := range []struct {
		name string
		n    int64
	}{{"backlog_shallow", shallow}, {"backlog_deep", deep}} {
		start := time.Now()
		const chunk = 50_000
		for done := int64(0); done < t.n; done += chunk {
			n := min(chunk, t.n-done)
			records := make([]kafkatest.Record, n)
			for i := range records {
				j := done + int64(i)
				records[i] = kafkatest.Record{Partition: int32(j % backlogPartitions), Key: fmt.Appendf(nil, "acct-%d", j%kafkaKeys),
					Value:   fmt.Appendf(nil, eventPayload, j, 100+j%900),
					Headers: map[string]string{"event_id": fmt.Sprintf("%s-%d", t.name, j)}}
			}
			if err := produceRecords(h, brokers, t.name, records); err != nil {
				return err
			}
		}
		b.logf("backlog: %d messages produced to %s in %v", t.n, t.name, time.Since(start).Round(time.Millisecond))
	}
	for _, s := range backlogSettings {
		for _, t := range []struct {
			name string
			n    int64
		}{{"backlog_shallow", shallow}, {"backlog_deep", deep}} {
			cmd := exec.CommandContext(ctx, exe, "--dialects", "pg")
			cmd.Env = append(os.Environ(), childRoleEnv+"=consume",
				"INBOXMILL_BENCH_BACKLOG="+strings.Join([]string{addr, t.name, strconv.Itoa(s[0]), strconv.Itoa(s[1]),
					strconv.Itoa(b.opts.backlogConsume)}, ","))
			cmd.Stderr = b.log
			res, err := cmd.Output()
			if err != nil {
				return fmt.Errorf("backlog consumer %v on %s: %w", s, t.name, err)
			}
			fmt.Fprintf(b.out, "BACKLOG backlog=%d in_flight=%d/%d %s\n", t.n, s[0], s[1], strings.TrimSpace(string(res)))
		}
	}
	return nil
}

// produceRecords is kafkatest.Produce as an error.
func produceRecords(h *harness, brokers []string, topic string, records []kafkatest.Record) (err error) {
	defer h.recover(&err)
	kafkatest.Produce(h, brokers, topic, records)
	return nil
}

// runChild runs the role the environment names, if any, and reports
// whether it did.
func runChild() (bool, error) {
	switch os.Getenv(childRoleEnv) {
	case "broker":
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(backlogPartitions, "backlog_shallow", "backlog_deep"),
			kfake.GroupMinSessionTimeout(500*time.Millisecond))
		if err != nil {
			return true, err
		}
		defer c.Close()
		fmt.Println("LISTEN", c.ListenAddrs()[0])
		select {} // until the parent kills it
	case "consume":
		return true, consumeBacklog()
	}
	return false, nil
}

// consumeBacklog is the consumer process of the backlog scenario.
func consumeBacklog() error {
	f := strings.Split(os.Getenv("INBOXMILL_BENCH_BACKLOG"), ",")
	if len(f) != 5 {
		return errors.New("INBOXMILL_BENCH_BACKLOG: want brokers,topic,per-partition,in-all,count")
	}
	perPartition, _ := strconv.Atoi(f[2])
	inAll, _ := strconv.Atoi(f[3])
	count, _ := strconv.Atoi(f[4])
	ctx := context.Background()
	b, err := newBench(options{dialects: []string{"pg"}, prepare: inbox.PrepareAuto}, os.Stdout, os.Stderr)
	if err != nil {
		return err
	}
	defer b.close()
	d, _ := dialectByName("pg")
	fx, err := b.newFixture(ctx, d, "backlog", 16)
	if err != nil {
		return err
	}
	defer fx.close()
	store, err := fx.newStore(ctx)
	if err != nil {
		return err
	}
	dd, err := dedup.New(store, dedupConfig(dedup.Transactional{}))
	if err != nil {
		return err
	}
	sub, err := kafkaparallel.NewSubscriber(kafka.SubscriberConfig{
		Brokers: []string{f[0]}, ConsumerGroup: "backlog_" + f[1] + "_" + f[2] + "_" + f[3], OverwriteSaramaConfig: kafkatest.Config(),
	}, kafkaparallel.Config{MaxInFlightPerPartition: perPartition, MaxInFlight: inAll}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	var done atomic.Int64
	finished := make(chan struct{})
	router.AddMiddleware(dd.Middleware)
	router.AddConsumerHandler("backlog", f[1], sub, func(msg *message.Message) error {
		if _, err := fx.inClaimTx(msg); err != nil {
			return err
		}
		if done.Add(1) == int64(count) {
			close(finished)
		}
		return nil
	})
	start := time.Now()
	go func() { _ = router.Run(ctx) }()
	select {
	case <-finished:
	case <-time.After(e2eTimeout):
		return fmt.Errorf("%d of %d messages consumed", done.Load(), count)
	}
	took := time.Since(start)
	_ = router.Close()
	peak, now := memoryKB()
	fmt.Printf("consumed=%d peak_rss_kb=%d rss_now_kb=%d seconds=%.1f\n", count, peak, now, took.Seconds())
	return nil
}

// memoryKB returns the process's peak resident set (VmHWM) and its
// resident set now, in KiB.
func memoryKB() (peak, now int64) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1, -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		fields := strings.Fields(l)
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "VmHWM:":
			peak = v
		case "VmRSS:":
			now = v
		}
	}
	return peak, now
}
