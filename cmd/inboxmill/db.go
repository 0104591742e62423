package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql" // registers "mysql"
	_ "github.com/jackc/pgx/v5/stdlib"           // registers "pgx"
	_ "modernc.org/sqlite"                       // registers "sqlite"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/mysql"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
	dsnpkg "github.com/inboxmill/inboxmill/internal/dsn"
)

// dialects are the databases the command speaks, by the name --dialect
// takes: the database/sql driver it opens and the inbox dialect.
var dialects = map[string]struct {
	driver  string
	dialect func() inbox.Dialect
}{
	"postgres": {"pgx", postgres.Dialect},
	"mysql":    {"mysql", mysql.Dialect},
	"sqlite":   {"sqlite", sqlite.Dialect},
}

// dialectAliases are other spellings --dialect accepts.
var dialectAliases = map[string]string{
	"postgresql": "postgres", "pg": "postgres", "pgx": "postgres",
	"mariadb": "mysql",
	"sqlite3": "sqlite",
}

// errUnknownDialect is a --dialect the command does not speak, or a DSN
// whose dialect cannot be told.
var errUnknownDialect = errors.New("unknown dialect")

// dbFlags are the flags every subcommand takes to reach the inbox.
type dbFlags struct {
	dsn, dialect, table string
	connectTimeout      time.Duration
	// The layout of a partitioned PostgreSQL table: found by looking at
	// the table, created by migrate --partitioned.
	partitionWidth, partitionRetention time.Duration
	partitioned                        bool
}

// partitioning is the layout the flags give a partitioned table.
func (f dbFlags) partitioning() postgres.Partitions {
	return postgres.Partitions{Width: f.partitionWidth, Retention: f.partitionRetention}
}

// dialectOf returns the dialect of name, partitioned when the flags ask
// for it.
func (f dbFlags) dialectOf(name string) (inbox.Dialect, error) {
	if f.partitioned {
		if name != "postgres" {
			return nil, usageErr(fmt.Errorf("--partitioned is for PostgreSQL; the %s dialect has no partitioned table", name))
		}
		return postgres.Partitioned(f.partitioning()), nil
	}
	return dialects[name].dialect(), nil
}

// target is a resolved --dsn/--dialect pair: what to open, and how to
// name it in messages without its password.
type target struct {
	dialect string // a key of dialects
	// dsn is what the driver opens.
	dsn string
	// shown is the DSN as messages print it: the password replaced.
	shown string
	// password is the DSN's password, scrubbed from driver errors.
	password string
	// sqlitePath is the file an SQLite DSN names; "" for an in-memory
	// database.
	sqlitePath string
}

// resolveDialect returns the dialect a --dialect value names, or the one
// inferred from the DSN when it is empty.
func resolveDialect(flag, dsn string) (string, error) {
	if flag != "" {
		name := strings.ToLower(strings.TrimSpace(flag))
		if alias, ok := dialectAliases[name]; ok {
			name = alias
		}
		if _, ok := dialects[name]; !ok {
			return "", fmt.Errorf("%w %q: --dialect takes postgres, mysql or sqlite", errUnknownDialect, flag)
		}
		return name, nil
	}
	if d := dsnpkg.Dialect(strings.TrimSpace(dsn)); d != "" {
		return d, nil
	}
	if dsn == "" {
		return "", fmt.Errorf("%w: give --dsn (or INBOXMILL_DSN), or --dialect postgres|mysql|sqlite", errUnknownDialect)
	}
	return "", fmt.Errorf("%w: cannot tell the database from the DSN %s; pass --dialect postgres, mysql or sqlite",
		errUnknownDialect, redact(dsn))
}

// resolveTarget turns the flags into what to open.
func resolveTarget(f dbFlags) (target, error) {
	if strings.TrimSpace(f.dsn) == "" {
		return target{}, errors.New("no database given: pass --dsn or set INBOXMILL_DSN")
	}
	d, err := resolveDialect(f.dialect, f.dsn)
	if err != nil {
		return target{}, err
	}
	t := target{dialect: d, dsn: f.dsn, shown: redact(f.dsn)}
	switch d {
	case "postgres":
		if u, err := url.Parse(f.dsn); err == nil && u.Scheme != "" {
			if u.User != nil {
				t.password, _ = u.User.Password()
			}
			if t.password == "" {
				t.password = u.Query().Get("password")
			}
		} else if m := kvPassword.FindStringSubmatch(f.dsn); m != nil {
			t.password = strings.Trim(m[1], `'`)
		}
	case "mysql":
		cfg, err := mysqlConfig(f.dsn)
		if err != nil {
			return target{}, fmt.Errorf("the MySQL DSN %s: %w", t.shown, err)
		}
		t.password = cfg.Passwd
		t.dsn = cfg.FormatDSN()
	case "sqlite":
		t.dsn, t.sqlitePath = sqliteDSN(f.dsn)
	}
	return t, nil
}

// mysqlConfig parses the driver's DSN form or a mysql:// URL, and turns
// parseTime on: the store reads DATETIME columns as times.
func mysqlConfig(dsn string) (*mysqldriver.Config, error) {
	if lower := strings.ToLower(dsn); strings.HasPrefix(lower, "mysql://") || strings.HasPrefix(lower, "mariadb://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return nil, err
		}
		form := ""
		if u.User != nil {
			form = u.User.Username()
			if p, ok := u.User.Password(); ok {
				form += ":" + p
			}
		}
		host := u.Host
		if host != "" && u.Port() == "" {
			host += ":3306"
		}
		form += "@tcp(" + host + ")/" + strings.TrimPrefix(u.Path, "/")
		if u.RawQuery != "" {
			form += "?" + u.RawQuery
		}
		dsn = form
	}
	cfg, err := mysqldriver.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	cfg.ParseTime = true
	return cfg, nil
}

// sqliteDSN returns the driver DSN for an SQLite --dsn, and the file it
// names ("" for an in-memory database). A plain path gets the settings
// sqlite.DSN gives; a file: URI is used as written.
func sqliteDSN(dsn string) (driverDSN, path string) {
	if rest, ok := strings.CutPrefix(dsn, "sqlite://"); ok {
		dsn = rest
	}
	if dsn == ":memory:" {
		return "file::memory:?_pragma=busy_timeout(10000)", ""
	}
	if rest, ok := strings.CutPrefix(dsn, "file:"); ok {
		p, query, _ := strings.Cut(rest, "?")
		if strings.HasPrefix(p, "//") {
			p = strings.TrimPrefix(p, "//") // file:///abs/path
		}
		if p == ":memory:" || strings.Contains(query, "mode=memory") {
			return dsn, ""
		}
		return dsn, p
	}
	return sqlite.DSN(dsn), dsn
}

var kvPassword = regexp.MustCompile(`(?i)\bpassword=('[^']*'|\S+)`)

// redact returns dsn with its password replaced, for messages.
func redact(dsn string) string { return dsnpkg.Redact(dsn) }

// scrub removes the password from a driver's error text, should the
// driver have quoted the DSN.
func (t target) scrub(err error) error {
	if err == nil || t.password == "" || !strings.Contains(err.Error(), t.password) {
		return err
	}
	return &scrubbed{msg: strings.ReplaceAll(err.Error(), t.password, "xxxxx"), err: err}
}

// scrubbed is an error whose text had a password removed; errors.Is and
// errors.As still see the original.
type scrubbed struct {
	msg string
	err error
}

func (e *scrubbed) Error() string { return e.msg }
func (e *scrubbed) Unwrap() error { return e.err }

// access is what a subcommand does to the database, which decides how an
// SQLite file that does not exist is treated.
type access int

const (
	// existing: never create anything. An SQLite file must exist.
	existing access = iota
	// mayCreate: migrate up, which creates an SQLite file.
	mayCreate
	// readOnly: as existing, and an SQLite file is opened read-only,
	// without the pragmas that would change it (its journal mode), so that
	// looking at an inbox leaves the file as it was.
	readOnly
)

// readOnlySQLite returns the driver DSN that opens path read-only.
func readOnlySQLite(path string) string {
	return "file:" + path + "?mode=ro&_pragma=busy_timeout(10000)"
}

// inboxDB is an open inbox: the database, its store, and how to name it.
type inboxDB struct {
	db     *sql.DB
	store  *inbox.Store
	target target
	table  string
}

func (i *inboxDB) Close() error {
	return errors.Join(i.store.Close(), i.db.Close())
}

// openInbox opens the database the flags name, checks that it answers and,
// unless schemaCheck is false, that the inbox table's schema is the one
// this command knows. Every error says what to do about it.
func openInbox(ctx context.Context, f dbFlags, a access, schemaCheck bool) (*inboxDB, error) {
	t, err := resolveTarget(f)
	if err != nil {
		return nil, usageErr(err)
	}
	if err := checkTable(f.table); err != nil {
		return nil, usageErr(err)
	}
	if t.dialect == "sqlite" && t.sqlitePath != "" && a != mayCreate {
		if _, err := os.Stat(t.sqlitePath); errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("no SQLite database at %s: check --dsn, or create it with `inboxmill migrate --dsn %s`",
				t.sqlitePath, shellQuote(f.dsn))
		} else if err != nil {
			return nil, fmt.Errorf("the SQLite database %s: %w", t.sqlitePath, err)
		}
	}
	if t.dialect == "sqlite" && t.sqlitePath != "" && a == readOnly && !strings.HasPrefix(f.dsn, "file:") {
		// A file: URI is used as written; a path is opened read-only.
		t.dsn = readOnlySQLite(t.sqlitePath)
	}
	d := dialects[t.dialect]
	db, err := sql.Open(d.driver, t.dsn)
	if err != nil {
		return nil, fmt.Errorf("open the %s database %s: %w", t.dialect, t.shown, t.scrub(err))
	}
	// A command needs few connections; tests run many commands at once
	// against one server.
	db.SetMaxOpenConns(4)
	if t.dialect == "sqlite" && t.sqlitePath == "" {
		db.SetMaxOpenConns(1) // every connection to :memory: is a database of its own
	}
	timeout := f.connectTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	err = db.PingContext(pctx)
	cancel()
	if err != nil {
		_ = db.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("cannot reach the %s database at %s: %w\n"+
			"check --dsn (or INBOXMILL_DSN), the credentials, and that the server is up and reachable from here",
			t.dialect, t.shown, t.scrub(err))
	}
	dialect, err := f.dialectOf(t.dialect)
	if err == nil && t.dialect == "postgres" {
		dialect, err = partitionedIfSo(ctx, db, dialect, f)
	}
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	store, err := inbox.NewStore(db, dialect, inbox.Config{Table: f.table})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("--table %q: %w", f.table, err)
	}
	i := &inboxDB{db: db, store: store, target: t, table: store.Table()}
	if schemaCheck {
		if err := i.validate(ctx, f); err != nil {
			_ = i.Close()
			return nil, err
		}
	}
	if err := store.SyncClock(ctx); err != nil {
		_ = i.Close()
		return nil, t.scrub(err)
	}
	return i, nil
}

// partitionedIfSo returns the partitioned dialect when the table is a
// partitioned one, checking --partition-width against its partitions, and
// refuses --partitioned for a table that exists unpartitioned.
func partitionedIfSo(ctx context.Context, db *sql.DB, d inbox.Dialect, f dbFlags) (inbox.Dialect, error) {
	var kind sql.NullString
	err := db.QueryRowContext(ctx, `SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)`, `"`+f.table+`"`).Scan(&kind)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("look up table %s: %w", f.table, err)
	}
	switch {
	case !kind.Valid:
		return d, nil // no table yet
	case kind.String != "p":
		if f.partitioned {
			return nil, usageErr(fmt.Errorf("table %s exists and is not partitioned; a table is not partitioned by migrating: "+
				"migrate a new --table and switch over once the old one's records have expired", f.table))
		}
		return d, nil
	}
	var width sql.NullFloat64
	err = db.QueryRowContext(ctx, `SELECT extract(epoch FROM max(
	(regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz -
	(regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]::timestamptz))
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass($1)`, `"`+f.table+`"`).Scan(&width)
	if err != nil {
		return nil, fmt.Errorf("look up the partitions of table %s: %w", f.table, err)
	}
	p := f.partitioning().WithDefaults()
	if width.Valid && time.Duration(width.Float64*float64(time.Second)) != p.Width {
		return nil, usageErr(fmt.Errorf("table %s is partitioned by %v, not %v: pass --partition-width %v",
			f.table, time.Duration(width.Float64*float64(time.Second)), p.Width, time.Duration(width.Float64*float64(time.Second))))
	}
	return postgres.Partitioned(p), nil
}

// validate checks the schema, and says what to do when it is not current.
func (i *inboxDB) validate(ctx context.Context, f dbFlags) error {
	err := i.store.Validate(ctx)
	var se *inbox.SchemaError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &se) && errors.Is(err, inbox.ErrSchemaNewer):
		return fmt.Errorf("%w\nthis inboxmill is older than the schema: use the inboxmill of the release that migrated it", err)
	case errors.As(err, &se) && errors.Is(err, inbox.ErrTableMissing):
		return tablesMissing(se, i.connFlags(f))
	case errors.As(err, &se):
		what := fmt.Sprintf("the inbox table %s lacks schema versions %v", i.table, se.Missing)
		if applied, aerr := i.store.AppliedMigrations(ctx); aerr == nil && len(applied) == 0 {
			what = fmt.Sprintf("there is no inbox table %s in %s", i.table, i.target.shown)
		}
		return fmt.Errorf("%s: run `inboxmill migrate%s` with the same --dsn (or check --table)", what, i.connFlags(f))
	}
	return i.target.scrub(err)
}

// tablesMissing says what to do about tables dropped outside the
// migrations: the versions table must go before migrate recreates them.
func tablesMissing(se *inbox.SchemaError, flags string) error {
	return fmt.Errorf("every schema version of table %s is recorded, but tables %v do not exist (dropped outside the migrations): "+
		"restore them, or drop %s_migrations and run `inboxmill migrate%s` with the same --dsn, which creates what is missing",
		se.Table, se.MissingTables, se.Table, flags)
}

// connFlags renders the --dialect and --table flags of a suggested
// command; the DSN is left out (it may hold a password): the suggestion
// says to run it with the same --dsn.
func (i *inboxDB) connFlags(f dbFlags) string {
	var b strings.Builder
	if f.dialect != "" {
		b.WriteString(" --dialect " + i.target.dialect)
	}
	if i.table != "inbox" {
		b.WriteString(" --table " + i.table)
	}
	return b.String()
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
