package main

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/migrationfiles"
)

func (a *app) migrateCmd() *cobra.Command {
	var up upFlags
	cmd := &cobra.Command{
		Use:   "migrate [up|down|status|validate]",
		Short: "Apply, undo, show or check the inbox schema (--print: its SQL)",
		Long: `migrate applies the inbox's schema migrations (as "migrate up" does): every
version not applied yet, each in a transaction of its own with its record in
<table>_migrations. It is idempotent and safe to run from several processes.

With --print it connects to nothing and writes the SQL of the dialect's
migrations, rendered for --table, to standard output, for goose,
golang-migrate, atlas or a migration folder of your own. The dialect is
--dialect, or the one the DSN names.`,
		Example: `  inboxmill migrate --dsn postgres://app@db:5432/shop
  inboxmill migrate --dialect mysql --table payment_inbox --print > 0001_inbox.sql
  inboxmill migrate status --dsn inbox.db
  inboxmill migrate down --to 1 --yes --dsn inbox.db`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.migrateUp(cmd, up) },
	}
	up.add(cmd)

	var upSub upFlags
	upCmd := &cobra.Command{
		Use:   "up",
		Short: "Apply every migration not applied yet (or up to --to)",
		Args:  noArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return a.migrateUp(cmd, upSub) },
	}
	upSub.add(upCmd)

	var down struct {
		to      int
		yes     bool
		print   bool
		version int
	}
	downCmd := &cobra.Command{
		Use:   "down --to VERSION --yes",
		Short: "Undo the migrations above --to (0: drop the inbox and every record)",
		Long: `migrate down undoes every applied version above --to, newest first. --to 0
drops the inbox table, and with it every record: every intent is forgotten and
its next delivery runs again. It asks for --yes. With --print it writes the
down SQL instead and connects to nothing.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if down.print {
				return a.printMigrations(cmd, false, down.version, 0)
			}
			if !cmd.Flags().Changed("to") {
				return usageErr(errors.New("--to is required: the version to go back to (0 drops the inbox table and every record)"))
			}
			if down.to < 0 {
				return usageErr(fmt.Errorf("--to %d: want a version, or 0", down.to))
			}
			return a.migrateDown(cmd, down.to, down.yes)
		},
	}
	downCmd.Flags().IntVar(&down.to, "to", 0, "the version to go back to; 0 drops the inbox table and every record")
	downCmd.Flags().BoolVar(&down.yes, "yes", false, "confirm: the versions above --to are undone, with what they hold")
	downCmd.Flags().BoolVar(&down.print, "print", false, "write the down SQL to standard output instead (connects to nothing)")
	downCmd.Flags().IntVar(&down.version, "version", 0, "with --print: only this version")

	statusCmd := &cobra.Command{
		Use:   "status",
		Short: "List the schema versions and whether each is applied",
		Args:  noArgs,
		RunE:  a.migrateStatus,
	}
	validateCmd := &cobra.Command{
		Use:   "validate",
		Short: "Exit 0 when the schema is the one this inboxmill knows, 1 with what to do when not",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			i, err := openInbox(cmd.Context(), a.db, readOnly, true)
			if err != nil {
				return err
			}
			defer i.Close()
			ms, err := i.store.Migrations()
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "the schema of table %s is current (version %d, %s)\n", i.table, ms[len(ms)-1].Version, i.target.dialect)
			return nil
		},
	}
	cmd.AddCommand(upCmd, downCmd, statusCmd, validateCmd)
	return cmd
}

// upFlags are the flags of migrate and migrate up.
type upFlags struct {
	to      int
	print   bool
	version int
	format  string
	dir     string
	// partitioned is copied to the app's dbFlags before the command runs.
	partitioned bool
}

func (f *upFlags) add(cmd *cobra.Command) {
	cmd.Flags().IntVar(&f.to, "to", 0, "apply the versions up to this one (default: all)")
	cmd.Flags().BoolVar(&f.print, "print", false, "write the SQL of the dialect's migrations to standard output instead (connects to nothing)")
	cmd.Flags().IntVar(&f.version, "version", 0, "with --print: only this version")
	cmd.Flags().StringVar(&f.format, "format", "", "with --print: render the migrations for a tool: "+
		strings.Join(formatNames(), ", ")+" (each file up and down, headed by its name; default: the up SQL alone)")
	cmd.Flags().StringVar(&f.dir, "dir", "", "with --print: write the files of --format (default sql) into this directory instead of standard output")
	cmd.Flags().BoolVar(&f.partitioned, "partitioned", false, "PostgreSQL: create the table partitioned by time (see --partition-width, --partition-retention)")
}

func formatNames() []string {
	var names []string
	for _, f := range migrationfiles.Formats() {
		names = append(names, f.String())
	}
	return names
}

func (a *app) migrateUp(cmd *cobra.Command, f upFlags) error {
	a.db.partitioned = f.partitioned
	if !f.print && (f.format != "" || f.dir != "") {
		return usageErr(fmt.Errorf("--format and --dir go with --print"))
	}
	if f.print && (f.format != "" || f.dir != "") {
		if f.version != 0 || f.to != 0 {
			return usageErr(fmt.Errorf("--format and --dir render every version; leave out --version and --to"))
		}
		return a.renderMigrations(cmd, f.format, f.dir)
	}
	if f.print {
		return a.printMigrations(cmd, true, f.version, f.to)
	}
	if f.to < 0 {
		return usageErr(fmt.Errorf("--to %d: want a version", f.to))
	}
	ctx := cmd.Context()
	i, err := openInbox(ctx, a.db, mayCreate, false)
	if err != nil {
		return err
	}
	defer i.Close()
	before, err := i.store.AppliedMigrations(ctx)
	if err != nil {
		return i.target.scrub(err)
	}
	if err := i.store.MigrateTo(ctx, f.to); err != nil {
		return i.target.scrub(err)
	}
	after, err := i.store.AppliedMigrations(ctx)
	if err != nil {
		return i.target.scrub(err)
	}
	var added []string
	for _, v := range after {
		if !slices.Contains(before, v) {
			added = append(added, fmt.Sprint(v))
		}
	}
	now := 0
	if len(after) > 0 {
		now = after[len(after)-1]
	}
	if len(added) == 0 {
		// The versions may be recorded for tables dropped since.
		var se *inbox.SchemaError
		if err := i.store.Validate(ctx); errors.As(err, &se) && errors.Is(err, inbox.ErrTableMissing) {
			return tablesMissing(se, i.connFlags(a.db))
		}
		fmt.Fprintf(a.stdout, "table %s is up to date (version %d, %s)\n", i.table, now, i.target.dialect)
		return nil
	}
	fmt.Fprintf(a.stdout, "table %s: applied version %s; now at version %d (%s)\n",
		i.table, strings.Join(added, ", "), now, i.target.dialect)
	return nil
}

func (a *app) migrateDown(cmd *cobra.Command, to int, yes bool) error {
	ctx := cmd.Context()
	i, err := openInbox(ctx, a.db, existing, false)
	if err != nil {
		return err
	}
	defer i.Close()
	applied, err := i.store.AppliedMigrations(ctx)
	if err != nil {
		return i.target.scrub(err)
	}
	var undo []string
	for _, v := range slices.Backward(applied) {
		if v > to {
			undo = append(undo, fmt.Sprint(v))
		}
	}
	if len(undo) == 0 && to > 0 {
		fmt.Fprintf(a.stdout, "table %s has no version above %d applied: nothing to undo\n", i.table, to)
		return nil
	}
	if !yes {
		what := fmt.Sprintf("undoes version %s of table %s", strings.Join(undo, ", "), i.table)
		if to == 0 {
			what = fmt.Sprintf("drops the inbox table %s and every record in it (every intent is forgotten)", i.table)
		}
		return usageErr(fmt.Errorf("migrate down --to %d %s: pass --yes to go ahead", to, what))
	}
	if err := i.store.MigrateDown(ctx, to); err != nil {
		return i.target.scrub(err)
	}
	if to == 0 {
		fmt.Fprintf(a.stdout, "table %s: undid version %s; the inbox table is dropped\n", i.table, strings.Join(undo, ", "))
		return nil
	}
	fmt.Fprintf(a.stdout, "table %s: undid version %s; now at version %d\n", i.table, strings.Join(undo, ", "), to)
	return nil
}

func (a *app) migrateStatus(cmd *cobra.Command, _ []string) error {
	ctx := cmd.Context()
	i, err := openInbox(ctx, a.db, readOnly, false)
	if err != nil {
		return err
	}
	defer i.Close()
	ms, err := i.store.Migrations()
	if err != nil {
		return err
	}
	applied, err := i.store.AppliedMigrations(ctx)
	if err != nil {
		return i.target.scrub(err)
	}
	fmt.Fprintf(a.stdout, "table %s (%s at %s):\n", i.table, i.target.dialect, i.target.shown)
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "VERSION\tNAME\tAPPLIED")
	missing := 0
	known := map[int]bool{}
	for _, m := range ms {
		known[m.Version] = true
		state := "yes"
		if !slices.Contains(applied, m.Version) {
			state, missing = "no", missing+1
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\n", m.Version, m.Name, state)
	}
	for _, v := range applied {
		if !known[v] {
			fmt.Fprintf(tw, "%d\t(unknown to this inboxmill)\tyes\n", v)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var se *inbox.SchemaError
	switch err := i.store.Validate(ctx); {
	case err == nil:
		fmt.Fprintln(a.stdout, "the schema is current")
	case errors.As(err, &se) && errors.Is(err, inbox.ErrTableMissing):
		fmt.Fprintln(a.stdout, tablesMissing(se, i.connFlags(a.db)))
	case errors.Is(err, inbox.ErrSchemaNewer):
		fmt.Fprintln(a.stdout, "the schema is newer than this inboxmill: use the inboxmill of the release that migrated it")
	case missing > 0:
		fmt.Fprintf(a.stdout, "%d version(s) missing: run `inboxmill migrate%s` with the same --dsn\n", missing, i.connFlags(a.db))
	}
	return nil
}

// printMigrations writes the dialect's migrations for --table, up in
// version order or down newest first; version selects one, upTo bounds
// the up versions.
func (a *app) printMigrations(cmd *cobra.Command, up bool, version, upTo int) error {
	d, err := resolveDialect(a.db.dialect, a.db.dsn)
	if err != nil {
		return usageErr(err)
	}
	if err := checkTable(a.db.table); err != nil {
		return usageErr(err)
	}
	dialect, err := a.db.dialectOf(d)
	if err != nil {
		return err
	}
	ms, err := inbox.LoadMigrations(dialect.Migrations(), a.db.table)
	if err != nil {
		return err
	}
	var out []inbox.Migration
	for _, m := range ms {
		if (version == 0 || m.Version == version) && (upTo == 0 || m.Version <= upTo) {
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		return usageErr(fmt.Errorf("the %s dialect has no version %d", d, max(version, upTo)))
	}
	if !up {
		slices.Reverse(out)
	}
	return writeMigrations(cmd.OutOrStdout(), d, a.db.table, out, up)
}

// renderMigrations writes the dialect's migrations in a tool's format, to
// dir or, headed by their names, to standard output.
func (a *app) renderMigrations(cmd *cobra.Command, format, dir string) error {
	d, err := resolveDialect(a.db.dialect, a.db.dsn)
	if err != nil {
		return usageErr(err)
	}
	if err := checkTable(a.db.table); err != nil {
		return usageErr(err)
	}
	dialect, err := a.db.dialectOf(d)
	if err != nil {
		return err
	}
	f := migrationfiles.FormatSQL
	if format != "" {
		if f, err = migrationfiles.ParseFormat(format); err != nil {
			return usageErr(err)
		}
	}
	if dir != "" {
		paths, err := migrationfiles.Write(dir, dialect, a.db.table, f)
		if err != nil {
			return err
		}
		for _, p := range paths {
			fmt.Fprintln(cmd.OutOrStdout(), p)
		}
		return nil
	}
	files, err := migrationfiles.Render(dialect, a.db.table, f)
	if err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	for n, file := range files {
		if n > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "-- file: %s (%s, %s, table %s)\n", file.Name, f, d, a.db.table)
		if _, err := w.Write(file.Body); err != nil {
			return err
		}
		if len(file.Body) > 0 && file.Body[len(file.Body)-1] != '\n' {
			fmt.Fprintln(w)
		}
	}
	return nil
}

func writeMigrations(w io.Writer, dialect, table string, ms []inbox.Migration, up bool) error {
	dir := "up"
	if !up {
		dir = "down"
	}
	for n, m := range ms {
		if n > 0 {
			fmt.Fprintln(w)
		}
		body := m.Up
		if !up {
			body = m.Down
		}
		fmt.Fprintf(w, "-- inboxmill migration %03d_%s.%s.sql (%s, table %s)\n", m.Version, m.Name, dir, dialect, table)
		if _, err := io.WriteString(w, strings.TrimRight(body, "\n")+"\n"); err != nil {
			return err
		}
	}
	return nil
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// checkTable validates --table as inbox.NewStore does, before anything is
// opened. An empty --table is refused, not taken for the default.
func checkTable(table string) error {
	if table == "" {
		return errors.New("--table is empty: give the inbox table's name (default inbox)")
	}
	if len(table) > inbox.MaxTableLen || !identifier.MatchString(table) {
		return fmt.Errorf("--table %q: want a plain identifier ([A-Za-z_][A-Za-z0-9_]*) of at most %d bytes",
			table, inbox.MaxTableLen)
	}
	return nil
}
