// Command inboxmill operates an inbox without hand-written SQL: it migrates
// the schema, shows what the inbox holds, resolves or forgets single
// records under the same fencing the workers obey, purges expired records,
// lists the audit trail of those actions, dry-runs a Kafka replay and
// serves the web console.
//
//	inboxmill migrate [up|down|status|validate]   the schema (--print: the SQL, for your own migration tool)
//	inboxmill stats                               counts by operation and status, oldest pending, purge lag
//	inboxmill list                                records by status, operation, scope, age, attempt
//	inboxmill inspect                             one record, by --scope/--operation/--key or --digest
//	inboxmill resolve                             a pending (or abandoned) record to completed or failed
//	inboxmill forget                              delete one record: its next delivery runs again
//	inboxmill purge                               delete expired completed and failed records
//	inboxmill audit                               who resolved, forgot or purged what, and why
//	inboxmill replay                              what replaying a Kafka topic range would do
//	inboxmill serve                               the web console
//
// Every subcommand takes --dsn (or INBOXMILL_DSN), --dialect (postgres,
// mysql or sqlite; inferred from the DSN when left out) and --table
// (default inbox). resolve, forget and purge take a required --reason and
// --actor (default the OS user), and write an audit row in the transaction
// of the change; --dry-run does every check and changes nothing. forget
// and purge, which delete, ask on a terminal before they do; --yes goes
// ahead without asking, and without it they refuse (exit 2) when standard
// input is not a terminal.
//
// Exit status: 0 done, 1 failed, 2 usage error, 3 refused (the record
// moved on, is held by a live lease, or is in a status the action does not
// apply to), 4 not found (inspect, resolve, forget or audit named a record
// that does not exist), 130 interrupted.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"os/user"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/inboxmill/inboxmill/inbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// The first Ctrl-C asks the command to stop at a safe point; from
		// then on a second one ends the process at once.
		<-ctx.Done()
		stop()
	}()
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit statuses.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitRefused     = 3
	exitNotFound    = 4 // a record the flags name does not exist
	exitInterrupted = 130
)

// exitError carries the exit status of an error.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usageErr(err error) error   { return &exitError{exitUsage, err} }
func refusedErr(err error) error { return &exitError{exitRefused, err} }

// shownError is an error whose message says all an operator needs, so
// that the chain under it (kept for errors.Is and errors.As) is not
// printed a second time after it.
type shownError struct {
	msg string
	err error
}

func (e *shownError) Error() string { return e.msg }
func (e *shownError) Unwrap() error { return e.err }

// app is one run of the command: its streams, environment and the flags
// every subcommand shares.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	db             dbFlags
	// actorDefault names the operator when --actor is not given.
	actorDefault func() string
	// isTerminal reports whether stdin is a terminal, where forget and
	// purge ask before they act.
	isTerminal func(io.Reader) bool
}

// run runs the command with args (without the program name) and returns
// its exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return (&app{stdin: stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv, actorDefault: osUser,
		isTerminal: stdinTerminal}).run(ctx, args)
}

func (a *app) run(ctx context.Context, args []string) int {
	root := a.rootCmd()
	if c, _, err := root.Find(args); err == nil && c.Name() == "replay" {
		args = legacyFlags(c, args)
	}
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	code := exitFailed
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		code = ee.code
	case errors.Is(err, errNoRecord):
		code = exitNotFound
	case strings.HasPrefix(err.Error(), "unknown command"), strings.HasPrefix(err.Error(), "unknown flag"):
		code = exitUsage
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		code = exitInterrupted
	}
	name := "inboxmill"
	if c, _, ferr := root.Find(args); ferr == nil && c != root {
		name = c.CommandPath()
	}
	fmt.Fprintf(a.stderr, "%s: %v\n", name, err)
	if code == exitUsage {
		fmt.Fprintf(a.stderr, "run '%s --help' for usage\n", name)
	}
	return code
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "inboxmill",
		Short: "Operate an inboxmill inbox: schema, records, audit trail, replays, web console",
		Long: `inboxmill operates an inbox without hand-written SQL. Every action that
changes a record (resolve, forget, purge) is fenced the way the workers are,
refuses what a worker still holds, and is written to the audit trail in the
same transaction as the change.

The database is given by --dsn (or INBOXMILL_DSN): a PostgreSQL URL
(postgres://user:pass@host:5432/db), a MySQL DSN (user:pass@tcp(host:3306)/db
or mysql://user:pass@host:3306/db) or an SQLite file (inbox.db, file:inbox.db).
--dialect is inferred from it; give it when the DSN does not tell.

Exit status: 0 done, 1 failed, 2 usage error, 3 refused (the record moved on,
is held by a live lease, or is in a status the action does not apply to),
4 not found (the record named does not exist), 130 interrupted.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.fromEnv(cmd); err != nil {
				return err
			}
			return a.checkDBFlags()
		},
	}
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageErr(flagError(err)) })
	pf := root.PersistentFlags()
	pf.StringVar(&a.db.dsn, "dsn", "", "the inbox database (default $INBOXMILL_DSN): a PostgreSQL URL, a MySQL DSN or an SQLite file")
	pf.StringVar(&a.db.dialect, "dialect", "", "postgres, mysql or sqlite (default: inferred from the DSN, or $INBOXMILL_DIALECT)")
	pf.StringVar(&a.db.table, "table", "inbox", "the inbox table (or $INBOXMILL_TABLE)")
	pf.DurationVar(&a.db.connectTimeout, "connect-timeout", 10*time.Second, "how long to wait for the database to answer")
	pf.DurationVar(&a.db.partitionWidth, "partition-width", inbox.DefaultPartitionWidth,
		"for a partitioned PostgreSQL table: the time one partition covers (as its stores are configured)")
	pf.DurationVar(&a.db.partitionRetention, "partition-retention", inbox.DefaultPartitionRetention,
		"for a partitioned PostgreSQL table: how long a bucket is kept after it ends (as its stores are configured)")

	root.AddCommand(
		a.migrateCmd(),
		a.statsCmd(),
		a.listCmd(),
		a.inspectCmd(),
		a.resolveCmd(),
		a.forgetCmd(),
		a.purgeCmd(),
		a.auditCmd(),
		a.replayCmd(),
		a.serveCmd(),
	)
	return root
}

// fromEnv fills the shared flags that were not given from the
// environment. The DSN is not a flag default: help would print its
// password.
func (a *app) fromEnv(cmd *cobra.Command) error {
	for flag, env := range map[string]string{"dsn": "INBOXMILL_DSN", "dialect": "INBOXMILL_DIALECT", "table": "INBOXMILL_TABLE"} {
		if cmd.Flags().Changed(flag) {
			continue
		}
		if v := a.getenv(env); v != "" {
			if err := cmd.Flags().Set(flag, v); err != nil {
				return usageErr(fmt.Errorf("$%s: %w", env, err))
			}
		}
	}
	return nil
}

// The parsers' own words after pflag's `invalid argument "x" for "--f"
// flag: `, which quote the value a second time.
var (
	numberError   = regexp.MustCompile(`: strconv\.Parse\w+: parsing "(?:[^"\\]|\\.)*": (.*)$`)
	durationError = regexp.MustCompile(`: time: (?:invalid|unknown unit|missing unit)[^"]*"(?:[^"\\]|\\.)*"(?: in duration "(?:[^"\\]|\\.)*")?$`)
)

// flagError is a flag's parse error as an operator reads it: pflag names
// the value and the flag, then adds the parser's error, which names the
// value again; that part is said once, in words.
func flagError(err error) error {
	msg := err.Error()
	switch {
	case numberError.MatchString(msg):
		msg = numberError.ReplaceAllString(msg, ": $1")
	case durationError.MatchString(msg):
		msg = durationError.ReplaceAllString(msg, ": not a duration (such as 90s, 15m or 2h)")
	default:
		return err
	}
	return &shownError{msg: msg, err: err}
}

// checkDBFlags refuses the shared flags' values that would otherwise be
// taken silently for something else: a connect timeout that is not
// positive (it meant the default), a partition layout no store runs with.
func (a *app) checkDBFlags() error {
	var errs []error
	if a.db.connectTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--connect-timeout %v: want a positive duration", a.db.connectTimeout))
	}
	// The rest of a layout is checked against the table's own.
	if w := a.db.partitionWidth; w < time.Minute || w%time.Minute != 0 {
		errs = append(errs, fmt.Errorf("--partition-width %v: want a positive whole number of minutes", w))
	}
	if r := a.db.partitionRetention; r <= 0 {
		errs = append(errs, fmt.Errorf("--partition-retention %v: want a positive duration", r))
	}
	if err := errors.Join(errs...); err != nil {
		return usageErr(err)
	}
	return nil
}

// noArgs is cobra.NoArgs as a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErr(fmt.Errorf("unexpected arguments %q", args))
	}
	return nil
}

// osUser is the --actor default: the OS user running the command.
func osUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	for _, env := range []string{"USER", "USERNAME", "LOGNAME"} {
		if v := os.Getenv(env); v != "" {
			return v
		}
	}
	return ""
}

// legacyFlags accepts the single-dash long flags (-topic orders) that
// inboxmill-replay took, by rewriting them to the double-dash form for the
// flags cmd knows: scripts written for it keep working.
func legacyFlags(cmd *cobra.Command, args []string) []string {
	out := make([]string, 0, len(args))
	for i, arg := range args {
		if arg == "--" {
			return append(out, args[i:]...)
		}
		if strings.HasPrefix(arg, "-") && !strings.HasPrefix(arg, "--") && len(arg) > 2 {
			name, _, _ := strings.Cut(arg[1:], "=")
			if cmd.Flags().Lookup(name) != nil {
				arg = "-" + arg
			}
		}
		out = append(out, arg)
	}
	return out
}
