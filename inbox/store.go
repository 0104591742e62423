package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"time"
)

// DBTX is what the store runs its SQL through: *sql.DB, *sql.Conn and *sql.Tx
// all satisfy it, so every store method can join the caller's transaction.
type DBTX interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var (
	_ DBTX = (*sql.DB)(nil)
	_ DBTX = (*sql.Conn)(nil)
	_ DBTX = (*sql.Tx)(nil)
)

// MaxTableLen bounds the table name so that the longest derived name
// ("<table>_status_updated_idx", on MySQL) fits PostgreSQL's 63-byte and
// MySQL's 64-byte identifiers.
const MaxTableLen = 40

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Config configures a [Store]. The zero value is usable.
type Config struct {
	// Table is the inbox table's name. Defaults to "inbox". It must be a
	// plain identifier (letters, digits and underscores, not starting with a
	// digit, at most MaxTableLen bytes), because it is put into SQL text;
	// anything else is rejected by NewStore. Every statement quotes it, so
	// a word the database reserves ("order", "window") works too, and
	// PostgreSQL keeps its case ("Inbox" is not "inbox"). The table lives in the
	// connection's default schema (PostgreSQL's search_path, MySQL's
	// database). "<table>_migrations" records applied schema versions.
	Table string

	// Now returns the current time for created_at, updated_at and the like.
	// Defaults to time.Now. Tests set it to move time.
	Now func() time.Time

	// ClockSync is how often the store measures how far Now is from the
	// database server's clock, and corrects Now by that offset. Leases,
	// take-overs, stale scans and expiry are then judged by one clock, the
	// database's, in every worker: a worker whose own clock ran ahead would
	// otherwise see live leases as expired and take them over. Defaults to
	// DefaultClockSync when Now is nil, and to off when Now is set (a test
	// moving time keeps its clock); negative turns it off. Dialects whose
	// clients share the database's clock (Capabilities.SharedClock: SQLite)
	// never sync. See [Store.SyncClock].
	ClockSync time.Duration

	// Prepare decides whether frequent statements are prepared once per
	// connection. Defaults to PrepareAuto: on where the dialect prefers it
	// (Capabilities.PreferPrepare: MySQL and SQLite), off elsewhere. See [Store.Close].
	Prepare Prepare

	// MaxResult, when positive, lowers the size in bytes of the largest
	// result the store writes below the database's own limit (see
	// [Store.ResultLimit]), for an operator who wants no huge rows in the
	// inbox. Defaults to 0: the database's limit only.
	MaxResult int
}

// DefaultClockSync is Config.ClockSync's default.
const DefaultClockSync = 30 * time.Second

func (c Config) withDefaults() Config {
	if c.Table == "" {
		c.Table = "inbox"
	}
	if c.ClockSync == 0 && c.Now == nil {
		c.ClockSync = DefaultClockSync
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if len(c.Table) > MaxTableLen {
		errs = append(errs, fmt.Errorf("%w: table name is %d bytes, more than %d", ErrInvalidConfig, len(c.Table), MaxTableLen))
	}
	if !identifier.MatchString(c.Table) {
		errs = append(errs, fmt.Errorf("%w: table name %q is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*)", ErrInvalidConfig, c.Table))
	}
	if c.MaxResult < 0 {
		errs = append(errs, fmt.Errorf("%w: MaxResult %d is negative", ErrInvalidConfig, c.MaxResult))
	}
	if c.Prepare < PrepareAuto || c.Prepare > PrepareNever {
		errs = append(errs, fmt.Errorf("%w: unknown %v", ErrInvalidConfig, c.Prepare))
	}
	return errors.Join(errs...)
}

// Store is the inbox table of one database. It is safe for concurrent use.
// It owns the record's life-cycle: callers ask for a transition (claim,
// reserve, take over, complete, ...) and the store decides whether it is
// legal, fenced by the record's attempt.
type Store struct {
	db      *sql.DB
	dialect Dialect
	caps    Capabilities
	table   string
	q       queries
	dq      Queries // the dialect's, for the statements whose text depends on a row count
	rows    rowsQueryCache
	clock   func() time.Time
	stmts   stmtCache
	sync    clockSync
	limit   resultLimit
	parts   *partitions // nil unless the dialect is partitioned
}

// NewStore returns a store over db that speaks dialect. It checks the
// configuration and the dialect's queries and touches no data; call
// [Store.Migrate] (or apply the dialect's migrations with a tool of your
// own) before the first claim, and [Store.Close] when done.
func NewStore(db *sql.DB, dialect Dialect, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	var errs []error
	if db == nil {
		errs = append(errs, fmt.Errorf("%w: db is nil", ErrInvalidConfig))
	}
	if dialect == nil {
		errs = append(errs, fmt.Errorf("%w: dialect is nil", ErrInvalidConfig))
	}
	errs = append(errs, cfg.validate())
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	q, err := loadQueries(dialect.Queries(cfg.Table))
	if err != nil {
		return nil, fmt.Errorf("inbox: dialect %s: %w", dialect.Name(), err)
	}
	s := &Store{
		db:      db,
		dialect: dialect,
		caps:    dialect.Capabilities(),
		table:   cfg.Table,
		q:       q,
		dq:      dialect.Queries(cfg.Table),
		clock:   cfg.Now,
	}
	if err := s.initPartitions(); err != nil {
		return nil, fmt.Errorf("inbox: dialect %s: %w", dialect.Name(), err)
	}
	s.limit.max = cfg.MaxResult
	s.stmts.on = cfg.Prepare.enabled(s.caps)
	if cfg.ClockSync > 0 && !s.caps.SharedClock {
		s.sync.every = cfg.ClockSync
	}
	s.sync.ctx, s.sync.stop = context.WithCancel(context.Background())
	return s, nil
}

// DB returns the database the store was created with.
func (s *Store) DB() *sql.DB { return s.db }

// Dialect returns the store's dialect.
func (s *Store) Dialect() Dialect { return s.dialect }

// Table returns the inbox table's name.
func (s *Store) Table() string { return s.table }

// TableNames returns every table the schema of a store configured with
// Table: table consists of — the inbox, its audit trail and the record of
// applied migrations — in an order they can be dropped in. It is for
// grants and for tests that drop them by hand; [Store.MigrateDown] to 0
// removes them all.
func TableNames(table string) []string {
	return []string{table, table + "_audit", table + "_migrations"}
}

// Now returns the store's current time: Config.Now, corrected by the
// offset to the database's clock measured last (Config.ClockSync), cut to
// the microsecond, which is what the databases keep of a time.
func (s *Store) Now() time.Time { return s.now() }

// Close stops the store's background clock measurement and releases the
// statements it prepared (see [Prepare]). It does not close the database.
// The store keeps working afterwards, sending SQL text and measuring the
// clock only when asked ([Store.SyncClock]); a call racing with Close
// does too. Call it when the store is no longer used but the database is:
// MySQL, for one, limits prepared statements server-wide
// (max_prepared_stmt_count).
func (s *Store) Close() error {
	s.sync.close()
	return s.stmts.close()
}

// Classify classifies an error of the store's own database calls:
// [Dialect.Classify], and a lost connection (database/sql's ErrBadConn, a
// reset or refused socket) as transient. For errors that may come from
// elsewhere, such as a handler's, use Dialect().Classify.
func (s *Store) Classify(err error) error {
	if err == nil {
		return nil
	}
	if c := s.dialect.Classify(err); c != err {
		return c
	}
	return classifyConnErr(err)
}

func joinErrs(errs []error) error { return errors.Join(errs...) }
