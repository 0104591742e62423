package driver

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// Main is the driver program: it parses the flags, runs, and returns the
// exit code: 0 only when every check passed.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: chaos [--quick] [--seed N] [flags]\n\nRuns inboxmill consumers under fault injection and checks every event's effect happened exactly once.\nFlags override the --quick or full configuration.")
		fs.PrintDefaults()
	}
	var (
		quick     = fs.Bool("quick", false, "a short run for CI (3,000 events, both databases, 3 consumers per mode, modes in parallel, two broker restarts)")
		seed      = fs.Uint64("seed", 0, "seed of the stream, the fault plan and the provider (default: random, printed)")
		events    = fs.Int("events", 0, "distinct events, split across the databases and modes (full: 100000)")
		consumers = fs.Int("consumers", 0, "consumer processes per mode (full: 8)")
		kills     = fs.Int("kills", 0, "SIGKILLs by the driver per mode (full: 20)")
		dbKills   = fs.Int("db-kills", 0, "rounds of database connection cuts per mode: pg_terminate_backend, or KILL on MySQL (full: 6)")
		restarts  = fs.Int("restarts", 0, "graceful restarts per mode (full: 3)")
		brokerRe  = fs.Int("broker-restarts", 0, "broker restarts in the whole run, spread over the modes (quick: 2, full: 8)")
		selfKill  = fs.Float64("self-kill-share", 0, "share of consumer starts told to kill themselves at a point (0.5)")
		modes     = fs.String("modes", "", "comma-separated modes (default: "+strings.Join(wire.Modes, ",")+")")
		databases = fs.String("databases", "", "comma-separated databases to run every mode on (default: "+strings.Join(wire.Databases, ",")+")")
		mysqlDSN  = fs.String("mysql-dsn", "", "MySQL/MariaDB DSN (default: $INBOXMILL_MYSQL_DSN or "+DefaultMySQLDSN+")")
		parDBs    = fs.Bool("parallel-databases", false, "run the databases at the same time, the modes of each one by one")
		parallel  = fs.Bool("parallel", false, "run the modes at the same time (default with --quick)")
		dsn       = fs.String("dsn", "", "PostgreSQL DSN (default: $INBOXMILL_POSTGRES_DSN or "+DefaultDSN+")")
		deadline  = fs.Duration("deadline", 0, "fail when the run takes longer (quick: 150s, full: 45m)")
		stall     = fs.Duration("stall", 0, "fail a mode that makes no progress for this long (quick: 60s, full: 3m)")
		keep      = fs.Bool("keep", false, "keep the tables and logs")
		pgParts   = fs.Bool("pg-partitioned", false, "PostgreSQL's inbox tables are partitioned (postgres.Partitioned), in every mode")
		pgPipe    = fs.Bool("pg-pipeline", false, "kafka-group on PostgreSQL runs its groups in pgx pipelines (dedup/pgxgroup)")
		rBatch    = fs.Bool("reserve-batch", false, "kafka-reserve sends its reservations and completions in batches (dedup.Reserve.Batch)")
		verbose   = fs.Bool("v", false, "consumers log what Watermill and inboxmill do (to the log directory)")
		binDir    = fs.String("bin-dir", "", "directory of the broker and consumer programs (default: the driver's)")
		logDir    = fs.String("log-dir", "", "directory for the processes' logs (default: a temporary one)")
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "chaos: unexpected arguments %q\n", fs.Args())
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	cfg := Full()
	if *quick {
		cfg = Quick()
	}
	if set["seed"] {
		cfg.Seed = *seed
	} else {
		var b [8]byte
		_, _ = rand.Read(b[:])
		cfg.Seed = binary.BigEndian.Uint64(b[:]) >> 1 // positive as int64 too
	}
	override := map[string]func(){
		"events": func() { cfg.Events = *events }, "consumers": func() { cfg.Consumers = *consumers },
		"kills": func() { cfg.Kills = *kills }, "db-kills": func() { cfg.DBKills = *dbKills },
		"restarts": func() { cfg.Restarts = *restarts }, "self-kill-share": func() { cfg.SelfKillShare = *selfKill },
		"parallel": func() { cfg.Parallel = *parallel }, "deadline": func() { cfg.Deadline = *deadline },
		"stall":              func() { cfg.Stall = *stall },
		"broker-restarts":    func() { cfg.BrokerRestarts = *brokerRe },
		"parallel-databases": func() { cfg.ParallelDatabases = *parDBs },
		"pg-partitioned":     func() { cfg.PartitionedPostgres = *pgParts },
		"pg-pipeline":        func() { cfg.PipelinePostgres = *pgPipe },
		"reserve-batch":      func() { cfg.ReserveBatch = *rBatch },
		"modes":              func() { cfg.Modes = strings.Split(*modes, ",") },
		"databases":          func() { cfg.Databases = strings.Split(*databases, ",") },
	}
	for name, f := range override {
		if set[name] {
			f()
		}
	}
	cfg.DSN = *dsn
	if cfg.DSN == "" {
		cfg.DSN = os.Getenv("INBOXMILL_POSTGRES_DSN")
	}
	if cfg.DSN == "" {
		cfg.DSN = DefaultDSN
	}
	cfg.MySQLDSN = *mysqlDSN
	if cfg.MySQLDSN == "" {
		cfg.MySQLDSN = os.Getenv("INBOXMILL_MYSQL_DSN")
	}
	if cfg.MySQLDSN == "" {
		cfg.MySQLDSN = DefaultMySQLDSN
	}
	cfg.Keep, cfg.Verbose, cfg.LogDir, cfg.Out = *keep, *verbose, *logDir, stdout

	dir := *binDir
	if dir == "" {
		exe, err := os.Executable()
		if err != nil {
			fmt.Fprintln(stderr, "chaos:", err)
			return 2
		}
		dir = filepath.Dir(exe)
	}
	for _, prog := range []string{"broker", "consumer"} {
		if _, err := os.Stat(filepath.Join(dir, prog)); err != nil {
			fmt.Fprintf(stderr, "chaos: %s not found next to the driver (build it, or set --bin-dir): %v\n", prog, err)
			return 2
		}
	}
	cfg.Command = func(role string, args ...string) *exec.Cmd {
		return exec.Command(filepath.Join(dir, role), args...)
	}

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	go func() {
		if s, ok := <-sig; ok {
			cancel(fmt.Errorf("%w by signal %v", errInterrupted, s))
		}
	}()

	if _, err := Run(ctx, cfg); err != nil {
		return 1
	}
	return 0
}
