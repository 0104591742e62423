// Package driver is the chaos suite's conductor. It starts a Kafka-protocol
// broker (kfake) as a process of its own, publishes streams of business
// events full of duplicates and some conflicting payloads, runs consumer
// processes that use inboxmill against PostgreSQL and MySQL/MariaDB, and
// while they work kills them (SIGKILL from outside, or at a chosen point
// from inside), cuts their database connections, restarts them, and
// restarts the broker. At the end it counts every event's effects: exactly
// one each, none missing, every conflicting payload refused and on the
// poison topic; and it checks the history of claims, commits, acks and
// effects with porcupine (see history.go).
//
// Four modes run on each database, each with its own tables, topics and
// consumers:
// kafka-transactional, kafka-reserve (reserve/complete against a fake
// payment provider that does not deduplicate), sql-queue (watermill-sql's
// PostgreSQL queue, joined to the consuming transaction) and kafka-group
// (kafka-transactional with group commit on, on a topic of more partitions
// so that each consumer has several deliveries in flight).
package driver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"

	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// DefaultDSN is the PostgreSQL the suite uses unless INBOXMILL_POSTGRES_DSN
// or -dsn says otherwise; DefaultMySQLDSN the MySQL/MariaDB unless
// INBOXMILL_MYSQL_DSN or -mysql-dsn says otherwise.
const (
	DefaultDSN      = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultMySQLDSN = "root@tcp(127.0.0.1:3306)/test?parseTime=true"
)

// Config is one run. Counts of consumers and faults are per mode.
type Config struct {
	// Seed drives the stream, the fault plan and the provider's dice.
	Seed uint64
	// Events is the number of distinct business events, split across the
	// modes in the proportions 2:1:1:1 (kafka-transactional: kafka-reserve,
	// sql-queue, kafka-group).
	Events int
	// Consumers is the number of consumer processes per mode; in the Kafka
	// modes a quarter of them (at least one) form a second consumer group
	// that starts halfway and replays the topic from the oldest offset.
	Consumers int
	// Kills is the number of SIGKILLs the driver sends per mode, at random
	// points of progress, to random consumers.
	Kills int
	// DBKills is the number of times per mode the driver terminates
	// consumers' database connections (pg_terminate_backend).
	DBKills int
	// Restarts is the number of graceful restarts (SIGTERM, then a new
	// process) per mode.
	Restarts int
	// BrokerRestarts is the number of times in the whole run the broker
	// process is stopped and a new one started on the same port and data
	// directory (kfake.DataDir), spread over the modes.
	BrokerRestarts int
	// SelfKillShare is the share of consumer starts told to kill themselves
	// at a kill point after DieAfter[0] to DieAfter[1] deliveries reach it.
	SelfKillShare float64
	DieAfter      [2]int
	// Modes to run; nil runs all.
	Modes []string
	// Databases to run every mode on; nil runs all (wire.Databases). The
	// events are split evenly between the databases.
	Databases []string
	// Parallel runs the modes at the same time instead of one by one.
	Parallel bool
	// ParallelDatabases runs the databases at the same time, the modes of
	// each one by one: half the wall time of a long run when the machine
	// has the room, with the connections of one mode per database.
	ParallelDatabases bool
	// DSN is the PostgreSQL of the inbox and the business tables; MySQLDSN
	// the MySQL/MariaDB (go-sql-driver/mysql form, parseTime=true).
	DSN, MySQLDSN string
	// Deadline bounds the whole run; Stall fails a mode that makes no
	// progress for that long.
	Deadline, Stall time.Duration
	// PartitionedPostgres makes PostgreSQL's inbox tables partitioned
	// (postgres.Partitioned, the default layout), for every mode on it:
	// the claims then go through the partitioned table's key lock and
	// check of every partition, under the same faults.
	PartitionedPostgres bool
	// PipelinePostgres runs kafka-group on PostgreSQL with its groups in
	// pgx pipelines (dedup/pgxgroup): the handler queues its effect, which
	// goes to the server with the group's COMMIT.
	PipelinePostgres bool
	// ReserveBatch runs kafka-reserve with batches (dedup.Reserve.Batch,
	// one statement of each kind at a time, so that deliveries in flight
	// share them): reservations and completions go to the database
	// several at once, under the same faults.
	ReserveBatch bool
	// Keep keeps the tables (and the logs) instead of dropping them.
	Keep bool
	// Verbose makes the consumers log to their log files.
	Verbose bool
	// LogDir receives one log file per process; empty: a new temporary
	// directory, removed after a successful run unless Keep.
	LogDir string
	// Command builds the command that runs a "broker" or a "consumer" with
	// the given arguments.
	Command func(role string, args ...string) *exec.Cmd
	// Out receives the report; its last line is the CHAOS line.
	Out io.Writer
}

// Quick is the configuration of `scripts/chaos.sh --quick`: a few thousand
// events over both databases, every mode, three consumers per mode, modes
// in parallel, two broker restarts (see restartOrder); under a minute on
// two cores.
func Quick() Config {
	return Config{Events: 3000, Consumers: 3, Kills: 4, DBKills: 2, Restarts: 1, BrokerRestarts: 2, SelfKillShare: 0.5,
		DieAfter: [2]int{5, 60}, Parallel: true, Deadline: 150 * time.Second, Stall: 60 * time.Second}
}

// Full is the default configuration: 100,000 events, eight consumers per
// mode, 20 SIGKILLs per mode from the driver plus the consumers' own, a
// broker restart per mode.
func Full() Config {
	return Config{Events: 100_000, Consumers: 8, Kills: 20, DBKills: 6, Restarts: 3, BrokerRestarts: 8, SelfKillShare: 0.5,
		DieAfter: [2]int{20, 600}, Deadline: 45 * time.Minute, Stall: 3 * time.Minute}
}

// modeShare is each mode's share of Config.Events.
var modeShare = map[string]float64{wire.KafkaTx: 0.5, wire.KafkaReserve: 0.25, wire.SQLQueue: 0.25, wire.KafkaGroup: 0.25,
	wire.KafkaParallel: 0.5}

func (c Config) validate() error {
	var errs []error
	if c.Events < 10 {
		errs = append(errs, fmt.Errorf("events %d: want at least 10", c.Events))
	}
	if c.Consumers < 1 {
		errs = append(errs, fmt.Errorf("consumers %d: want at least 1", c.Consumers))
	}
	if c.Kills < 0 || c.DBKills < 0 || c.Restarts < 0 || c.BrokerRestarts < 0 {
		errs = append(errs, errors.New("kills, db-kills and restarts must not be negative"))
	}
	if c.SelfKillShare < 0 || c.SelfKillShare > 1 || c.DieAfter[0] < 1 || c.DieAfter[1] < c.DieAfter[0] {
		errs = append(errs, fmt.Errorf("self-kill share %v, die after %v: want a share in [0, 1] and 1 <= lo <= hi",
			c.SelfKillShare, c.DieAfter))
	}
	for _, m := range c.Modes {
		if _, ok := modeShare[m]; !ok {
			errs = append(errs, fmt.Errorf("unknown mode %q (want %s)", m, strings.Join(wire.Modes, ", ")))
		}
	}
	for _, d := range c.Databases {
		if !wire.ValidDatabase(d) {
			errs = append(errs, fmt.Errorf("unknown database %q (want %s)", d, strings.Join(wire.Databases, ", ")))
		}
		if d == wire.MySQL && c.MySQLDSN == "" {
			errs = append(errs, errors.New("the MySQL DSN is required to run on mysql"))
		}
	}
	if c.DSN == "" || c.Command == nil || c.Out == nil {
		errs = append(errs, errors.New("DSN, Command and Out are required"))
	}
	if c.Deadline <= 0 || c.Stall <= 0 {
		errs = append(errs, errors.New("deadline and stall must be positive"))
	}
	return errors.Join(errs...)
}

// Totals are the numbers of the CHAOS line.
type Totals struct {
	Events, Effects, DuplicatedEffects, Lost, ConflictsRouted, Kills int
	DBCuts, BrokerRestarts                                           int
	Seed                                                             uint64
	// Linearizable is porcupine's verdict on every mode's history (false
	// when a history could not be checked).
	Linearizable bool
}

func (t Totals) String() string {
	return fmt.Sprintf("CHAOS events=%d effects=%d duplicated_effects=%d lost=%d conflicts_routed=%d kills=%d db_cuts=%d broker_restarts=%d seed=%d linearizable=%t",
		t.Events, t.Effects, t.DuplicatedEffects, t.Lost, t.ConflictsRouted, t.Kills, t.DBCuts, t.BrokerRestarts, t.Seed,
		t.Linearizable)
}

var (
	errDeadline    = errors.New("the run's deadline passed")
	errInterrupted = errors.New("interrupted")
)

// runner is what the modes of one run share.
type runner struct {
	cfg     Config
	id      string
	dbs     map[string]*database
	brokers []string
	procs   *procSet

	brokerMu       sync.Mutex
	broker         *proc
	brokerArgs     []string
	brokerRestarts int
	logDir         string

	outMu sync.Mutex
}

func (r *runner) printf(format string, a ...any) {
	r.outMu.Lock()
	defer r.outMu.Unlock()
	fmt.Fprintf(r.cfg.Out, format+"\n", a...)
}

// Run runs the modes and prints the report, whose last line is the CHAOS
// line, whatever happens. The error says why the run failed.
func Run(ctx context.Context, cfg Config) (tot Totals, err error) {
	tot.Seed = cfg.Seed
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	defer func() { fmt.Fprintln(cfg.Out, tot.String()) }()
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(cfg.Out, "chaos: FAIL: invalid configuration:", err)
		return tot, err
	}
	modes := cfg.Modes
	if len(modes) == 0 {
		modes = wire.Modes
	}
	dbKinds := cfg.Databases
	if len(dbKinds) == 0 {
		dbKinds = wire.Databases
	}
	r := &runner{cfg: cfg, procs: newProcSet(), dbs: map[string]*database{}}
	var b [4]byte
	_, _ = rand.Read(b[:])
	r.id = hex.EncodeToString(b[:])
	r.printf("chaos: seed=%d run=%s databases=%s modes=%s events=%d consumers=%d/mode kills=%d/mode db_kills=%d/mode restarts=%d/mode broker_restarts=%d parallel=%t parallel_databases=%t",
		cfg.Seed, r.id, strings.Join(dbKinds, ","), strings.Join(modes, ","), cfg.Events, cfg.Consumers, cfg.Kills, cfg.DBKills, cfg.Restarts, cfg.BrokerRestarts, cfg.Parallel, cfg.ParallelDatabases)

	ctx, cancel := context.WithTimeoutCause(ctx, cfg.Deadline, errDeadline)
	defer cancel()
	// Nothing outlives the run: consumers and broker are killed however it
	// ends (they also die with the driver's process, see dieWithParent).
	defer r.procs.killAll()

	if r.logDir = cfg.LogDir; r.logDir == "" {
		r.logDir, err = os.MkdirTemp("", "inboxmill-chaos-"+r.id+"-")
	} else {
		err = os.MkdirAll(r.logDir, 0o755)
	}
	if err != nil {
		fmt.Fprintln(cfg.Out, "chaos: FAIL: log directory:", err)
		return tot, err
	}
	failed := func(format string, a ...any) (Totals, error) {
		err := fmt.Errorf(format, a...)
		r.printf("chaos: FAIL: %v", err)
		r.printf("chaos: logs in %s", r.logDir)
		return tot, err
	}

	for _, kind := range dbKinds {
		dsn := cfg.DSN
		if kind == wire.MySQL {
			dsn = cfg.MySQLDSN
		}
		d, err := openDatabase(ctx, kind, dsn, "imc_"+r.id+"_driver")
		if err != nil {
			return failed("%s at %s is unreachable (set INBOXMILL_POSTGRES_DSN / INBOXMILL_MYSQL_DSN, or -dsn / -mysql-dsn): %v",
				kind, dsn, err)
		}
		d.partitioned = kind == wire.Postgres && cfg.PartitionedPostgres
		d.pipeline = kind == wire.Postgres && cfg.PipelinePostgres
		defer d.db.Close()
		r.dbs[kind] = d
	}

	// Each mode's share of the events, rounded down; what the rounding
	// left goes one event each to the first modes, so that the run has
	// exactly cfg.Events.
	counts := make([]int, 0, len(dbKinds)*len(modes))
	left := cfg.Events
	for range dbKinds {
		for _, m := range modes {
			n := int(float64(cfg.Events) * modeShare[m] / totalShare(modes) / float64(len(dbKinds)))
			counts = append(counts, n)
			left -= n
		}
	}
	for i := 0; left > 0; i, left = (i+1)%len(counts), left-1 {
		counts[i]++
	}
	runs := make([]*modeRun, 0, len(counts))
	var topics []string
	for i, kind := range dbKinds {
		for j, m := range modes {
			mr := newModeRun(r, r.dbs[kind], m, counts[i*len(modes)+j])
			runs = append(runs, mr)
			topics = append(topics, mr.kafkaTopics()...)
		}
	}
	order := restartOrder(runs, modes, dbKinds)
	for i := range cfg.BrokerRestarts {
		order[i%len(order)].brokerRestarts++
	}
	if err := r.startBroker(ctx, topics); err != nil {
		return failed("broker: %v", err)
	}
	defer func() {
		r.brokerMu.Lock()
		broker := r.broker
		r.brokerMu.Unlock()
		broker.terminate()
		select {
		case <-broker.done:
		case <-time.After(5 * time.Second):
		}
	}()

	peak := watchSize(r.logDir)
	defer func() {
		r.printf("chaos: the log directory (histories, logs, the broker's data) peaked at %d MB", peak()>>20)
	}()

	switch {
	case cfg.Parallel:
		var wg sync.WaitGroup
		for _, mr := range runs {
			wg.Go(func() { mr.run(ctx) })
		}
		wg.Wait()
	case cfg.ParallelDatabases:
		var wg sync.WaitGroup
		for _, kind := range dbKinds {
			wg.Go(func() {
				for _, mr := range runs {
					if mr.db.kind == kind {
						mr.run(ctx)
					}
				}
			})
		}
		wg.Wait()
	default:
		for _, mr := range runs {
			mr.run(ctx)
		}
	}

	if n := brokerEvictions(r.logDir); n > 0 {
		r.printf("chaos: broker: removed %d group members silent in a stable group (consumers that died joining; docs/chaos.md)", n)
	}

	var failures []string
	tot.Linearizable = true
	for _, mr := range runs {
		tot.Linearizable = tot.Linearizable && mr.res.historyChecked && mr.res.history.linearizable
		res := mr.res
		tot.Events += res.events
		tot.Effects += res.effects
		tot.DuplicatedEffects += res.duplicated
		tot.Lost += res.lost
		tot.ConflictsRouted += res.conflictsRouted
		tot.Kills += mr.kills()
		tot.DBCuts += mr.dbKills
		for _, f := range mr.failures {
			failures = append(failures, mr.label+": "+f)
		}
	}
	if len(failures) > 0 {
		for _, f := range failures {
			r.printf("chaos: FAIL: %s", f)
		}
		r.printf("chaos: logs in %s; rerun with --seed %d", r.logDir, cfg.Seed)
		tot.BrokerRestarts = r.brokerRestarts
		return tot, fmt.Errorf("%d failures, the first: %s", len(failures), failures[0])
	}
	tot.BrokerRestarts = r.brokerRestarts
	if cfg.LogDir == "" && !cfg.Keep {
		_ = os.RemoveAll(r.logDir)
	}
	return tot, nil
}

// brokerEvictions counts the members the broker processes removed from
// their groups for having gone silent (package broker's evictor), as
// their logs in logDir say.
func brokerEvictions(logDir string) int {
	logs, _ := filepath.Glob(filepath.Join(logDir, "broker*.log"))
	n := 0
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		n += bytes.Count(b, []byte(" in a stable group: removed\n"))
	}
	return n
}

// restartPriority orders the modes for the broker restarts: the Kafka
// modes first, the two transactional ones before the others.
var restartPriority = []string{wire.KafkaTx, wire.KafkaGroup, wire.KafkaParallel, wire.KafkaReserve, wire.SQLQueue}

// restartOrder is the order in which the broker restarts are handed to the
// modes, one each in turn: by restartPriority, each mode on another
// database than the one before, so that the quick run's two restarts go
// to kafka-transactional on PostgreSQL and kafka-group on MySQL, and the
// full run's eight to every mode once.
func restartOrder(runs []*modeRun, modes, dbKinds []string) []*modeRun {
	var order []*modeRun
	for round := range dbKinds {
		j := 0
		for _, mode := range restartPriority {
			if !slices.Contains(modes, mode) {
				continue
			}
			kind := dbKinds[(j+round)%len(dbKinds)]
			j++
			for _, mr := range runs {
				if mr.mode == mode && mr.db.kind == kind {
					order = append(order, mr)
				}
			}
		}
	}
	return order
}

func totalShare(modes []string) float64 {
	var s float64
	for _, m := range modes {
		s += modeShare[m]
	}
	return s
}

// brokerPartitions is every Kafka topic's partition count.
const brokerPartitions = 8

func (r *runner) startBroker(ctx context.Context, topics []string) error {
	r.brokerArgs = []string{"-partitions", fmt.Sprint(brokerPartitions), "-topics", strings.Join(topics, ","),
		"-data-dir", filepath.Join(r.logDir, "broker-data"), "-lifeline"}
	p, err := r.spawnBroker(ctx, "broker", r.brokerArgs)
	if err != nil {
		return err
	}
	r.brokerMu.Lock()
	defer r.brokerMu.Unlock()
	r.broker = p
	r.brokers = []string{p.listenAddr()}
	return nil
}

func (r *runner) spawnBroker(ctx context.Context, name string, args []string) (*proc, error) {
	p, err := r.procs.start(r.cfg.Command, "broker", name, r.logDir, args)
	if err != nil {
		return nil, err
	}
	select {
	case <-p.ready:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("exited before listening (log: %s)", p.logPath)
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("not listening after 30s (log: %s)", p.logPath)
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// restartBroker stops the broker (SIGTERM: kfake writes its state out) and
// starts a new process on the same port and data directory. Producers and
// consumers see their connections refused for the time in between and must
// reconnect; the records, the topics and the groups' committed offsets
// survive. One restart at a time: modes running in parallel queue.
func (r *runner) restartBroker(ctx context.Context) (time.Duration, error) {
	r.brokerMu.Lock()
	defer r.brokerMu.Unlock()
	start := time.Now()
	old := r.broker
	old.terminate()
	select {
	case <-old.done:
	case <-time.After(30 * time.Second):
		old.kill()
		<-old.done
		return 0, fmt.Errorf("the broker did not stop within 30s of SIGTERM (log: %s)", old.logPath)
	}
	if st := old.exitState(); st == nil || !st.Success() {
		return 0, fmt.Errorf("the broker did not exit cleanly (%v; log: %s)", st, old.logPath)
	}
	_, port, err := net.SplitHostPort(r.brokers[0])
	if err != nil {
		return 0, err
	}
	r.brokerRestarts++
	args := append([]string{"-port", port}, r.brokerArgs...)
	var p *proc
	// The port can take a moment to be free again.
	for attempt := 0; ; attempt++ {
		p, err = r.spawnBroker(ctx, fmt.Sprintf("broker#%d", r.brokerRestarts+1), args)
		if err == nil || attempt == 20 || ctx.Err() != nil {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		return 0, err
	}
	r.broker = p
	return time.Since(start), nil
}

// watchSize samples the size of the files under dir every few seconds
// until the function it returns is called, which stops the sampling and
// returns the largest size seen (in bytes): what a run needs of the disk.
func watchSize(dir string) func() int64 {
	stop, done := make(chan struct{}), make(chan struct{})
	var peak int64
	go func() {
		defer close(done)
		t := time.NewTicker(3 * time.Second)
		defer t.Stop()
		for {
			peak = max(peak, dirSize(dir))
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	var once sync.Once
	return func() int64 {
		once.Do(func() { close(stop); <-done; peak = max(peak, dirSize(dir)) })
		return peak
	}
}

// dirSize returns the size of the regular files under dir.
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
