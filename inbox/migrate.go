package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Migration is one schema version of a dialect, rendered for the store's
// table name.
type Migration struct {
	Version int
	Name    string
	// Up applies the version; Down undoes it.
	Up, Down string
}

// UpStatements returns the statements of Up in the order [Store.Migrate]
// runs them, each on its own: the file cut at every semicolon that ends a
// line (outside a comment line), without that semicolon, comment-only
// pieces dropped. For tools that apply the schema statement by statement.
func (m Migration) UpStatements() []string { return splitStatements(m.Up) }

// DownStatements is [Migration.UpStatements] for Down.
func (m Migration) DownStatements() []string { return splitStatements(m.Down) }

// Migrations returns the store dialect's migrations in version order,
// rendered for the store's table name: what [Store.Migrate] applies, for
// tools that keep migrations of their own.
func (s *Store) Migrations() ([]Migration, error) {
	return LoadMigrations(s.dialect.Migrations(), s.table)
}

// LoadMigrations reads NNN_name.up.sql and NNN_name.down.sql files from
// fsys in version order, rendered for table ([RenderSQL]). Every version
// needs both files.
func LoadMigrations(fsys fs.FS, table string) ([]Migration, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	byVersion := map[int]*Migration{}
	for _, name := range names {
		base := path.Base(name)
		var dir string
		switch {
		case strings.HasSuffix(base, ".up.sql"):
			dir, base = "up", strings.TrimSuffix(base, ".up.sql")
		case strings.HasSuffix(base, ".down.sql"):
			dir, base = "down", strings.TrimSuffix(base, ".down.sql")
		default:
			return nil, fmt.Errorf("inbox: migration file %q is not named NNN_name.up.sql or NNN_name.down.sql", name)
		}
		num, label, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("inbox: migration file %q is not named NNN_name.%s.sql", name, dir)
		}
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		text, err := RenderSQL(string(body), table)
		if err != nil {
			return nil, fmt.Errorf("inbox: migration file %q: %w", name, err)
		}
		m := byVersion[v]
		if m == nil {
			m = &Migration{Version: v, Name: label}
			byVersion[v] = m
		} else if m.Name != label {
			return nil, fmt.Errorf("inbox: migration version %d has two names, %q and %q", v, m.Name, label)
		}
		target := &m.Up
		if dir == "down" {
			target = &m.Down
		}
		if *target != "" {
			return nil, fmt.Errorf("inbox: migration version %d has two %s files", v, dir)
		}
		*target = text
	}
	ms := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.Up == "" || m.Down == "" {
			return nil, fmt.Errorf("inbox: migration version %d (%s) lacks its up or down file", m.Version, m.Name)
		}
		ms = append(ms, *m)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	return ms, nil
}

// Migrate brings the inbox table to the newest schema version:
// MigrateTo(ctx, 0).
func (s *Store) Migrate(ctx context.Context) error { return s.MigrateTo(ctx, 0) }

// MigrateTo applies every version up to target (0: the newest) that is
// not applied yet. It is idempotent, and safe to run from several
// processes at once: where the dialect needs it (Capabilities.MigrationLock)
// a lock named after the table is held for the duration; every version is
// recorded in "<table>_migrations" in the same transaction that applies
// it. A target below the newest applied version changes nothing; see
// [Store.MigrateDown].
//
// On MySQL DDL commits implicitly: a crash between a version's DDL and its
// recording leaves the version applied but unrecorded, and the next
// Migrate runs it again; every MySQL migration file therefore checks
// before each step whether it is still needed.
//
// Nothing migrates by itself: no schema is created on a first message.
// A partitioned table gets its partitions ([Store.EnsurePartitions]).
func (s *Store) MigrateTo(ctx context.Context, target int) error {
	ms, err := s.Migrations()
	if err != nil {
		return err
	}
	if target < 0 || (target > 0 && !hasVersion(ms, target)) {
		return fmt.Errorf("inbox: migrate: no version %d", target)
	}
	err = s.migrating(ctx, false, func(conn *sql.Conn) error {
		for _, m := range ms {
			if target > 0 && m.Version > target {
				break
			}
			if err := s.applyMigration(ctx, conn, m, true); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil && s.parts != nil {
		// A partitioned table starts with the partitions its first claims
		// need.
		_, err = s.EnsurePartitions(ctx)
	}
	return err
}

// MigrateDown undoes every applied version above target, newest first;
// MigrateDown(ctx, 0) drops the inbox table and with it every record — all
// intents are forgotten — and then the versions table. Each version's down file runs in the transaction
// that forgets the version.
func (s *Store) MigrateDown(ctx context.Context, target int) error {
	ms, err := s.Migrations()
	if err != nil {
		return err
	}
	if target < 0 || (target > 0 && !hasVersion(ms, target)) {
		return fmt.Errorf("inbox: migrate down: no version %d", target)
	}
	return s.migrating(ctx, true, func(conn *sql.Conn) error {
		for i := len(ms) - 1; i >= 0 && ms[i].Version > target; i-- {
			if err := s.applyMigration(ctx, conn, ms[i], false); err != nil {
				return err
			}
		}
		if target == 0 {
			if _, err := s.exec(ctx, conn, s.q.dropMigrations, &params{}); err != nil {
				return s.migrationError(true, nil, MigrateDropVersions, 0, err)
			}
		}
		return nil
	})
}

func hasVersion(ms []Migration, v int) bool {
	for _, m := range ms {
		if m.Version == v {
			return true
		}
	}
	return false
}

// migrating runs f on a dedicated connection holding the migration lock,
// with the versions table created.
func (s *Store) migrating(ctx context.Context, down bool, f func(conn *sql.Conn) error) (err error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return s.migrationError(down, nil, MigrateConnect, 0, err)
	}
	defer conn.Close()

	lock := &params{lockName: "inboxmill:" + s.table}
	if s.caps.MigrationLock {
		var got int
		if err := s.queryRow(ctx, conn, s.q.lockMigrations, lock).Scan(&got); err != nil {
			return s.migrationError(down, nil, MigrateLock, 0, err)
		}
		if got != 1 {
			// Another process held it for the whole wait (or the database
			// failed to grant it): a later attempt may get it.
			return s.migrationError(down, nil, MigrateLock, 0,
				Transient(fmt.Errorf("could not take lock %q", lock.lockName)))
		}
		defer func() {
			// A fresh context: the caller's may be done, and the lock must go
			// (closing the connection would release it too).
			var released int
			uerr := s.queryRow(context.WithoutCancel(ctx), conn, s.q.unlockMigrations, lock).Scan(&released)
			if uerr != nil && err == nil {
				err = s.migrationError(down, nil, MigrateUnlock, 0, uerr)
			}
		}()
	}
	if _, err := s.exec(ctx, conn, s.q.createMigrations, &params{}); err != nil {
		return s.migrationError(down, nil, MigrateCreateVersions, 0, err)
	}
	return f(conn)
}

// applyMigration applies m (up) or undoes it (down) unless that was done
// already, and records the change, in one transaction.
func (s *Store) applyMigration(ctx context.Context, conn *sql.Conn, m Migration, up bool) (err error) {
	fail := func(step MigrateStep, statement int, err error) error {
		return s.migrationError(!up, &m, step, statement, err)
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return fail(MigrateBegin, 0, err)
	}
	defer func() {
		if err != nil {
			if rerr := ignoreDone(tx.Rollback()); rerr != nil {
				var me *MigrationError
				if errors.As(err, &me) {
					me.Err = errors.Join(me.Err, fmt.Errorf("roll back: %w", rerr))
				}
			}
		}
	}()
	// Checked inside the transaction: another process may have applied the
	// version since this one looked.
	var n int
	if err := s.queryRow(ctx, tx, s.q.selectMigration, &params{version: m.Version}).Scan(&n); err != nil {
		return fail(MigrateCheck, 0, err)
	}
	if (n > 0) == up {
		return tx.Rollback()
	}
	body, record := m.Up, s.q.insertMigration
	if !up {
		body, record = m.Down, s.q.deleteMigration
	}
	for i, stmt := range splitStatements(body) {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fail(MigrateStatement, i+1, err)
		}
	}
	if _, err := s.exec(ctx, tx, record, &params{version: m.Version, name: m.Name, now: s.now()}); err != nil {
		if up && s.recordedMeanwhile(ctx, conn, tx, m) {
			// Another process applied and recorded the version since the
			// check, which no lock kept apart (GET_LOCK is node-local on
			// Galera): whatever the database called it (a duplicate key,
			// a certification failure), running the migrations again
			// finds the version applied.
			err = Transient(err)
		}
		return fail(MigrateRecord, 0, err)
	}
	if err := tx.Commit(); err != nil {
		return fail(MigrateCommit, 0, err)
	}
	return nil
}

// recordedMeanwhile rolls tx back and reports whether m is recorded as
// applied now, read afresh on conn.
func (s *Store) recordedMeanwhile(ctx context.Context, conn *sql.Conn, tx *sql.Tx, m Migration) bool {
	if ignoreDone(tx.Rollback()) != nil {
		return false
	}
	var n int
	err := s.queryRow(ctx, conn, s.q.selectMigration, &params{version: m.Version}).Scan(&n)
	return err == nil && n > 0
}

// MigrateStep names the step of [Store.Migrate], [Store.MigrateTo] or
// [Store.MigrateDown] that failed, in a [MigrationError].
type MigrateStep string

const (
	// MigrateConnect: getting the connection migrations run on.
	MigrateConnect MigrateStep = "connect"
	// MigrateLock: taking the lock that keeps migrating processes apart
	// (Capabilities.MigrationLock); MigrateUnlock: releasing it.
	MigrateLock   MigrateStep = "take lock"
	MigrateUnlock MigrateStep = "release lock"
	// MigrateCreateVersions: creating "<table>_migrations" if it does not
	// exist; MigrateDropVersions: dropping it (MigrateDown to 0).
	MigrateCreateVersions MigrateStep = "create migrations table"
	MigrateDropVersions   MigrateStep = "drop migrations table"
	// MigrateBegin, MigrateCheck and MigrateCommit: beginning a version's
	// transaction, reading whether it is applied, committing it.
	MigrateBegin  MigrateStep = "begin"
	MigrateCheck  MigrateStep = "check version"
	MigrateCommit MigrateStep = "commit"
	// MigrateStatement: a statement of the version's file
	// (MigrationError.Statement says which).
	MigrateStatement MigrateStep = "statement"
	// MigrateRecord: recording the version as applied (or forgetting it,
	// down) in "<table>_migrations".
	MigrateRecord MigrateStep = "record version"
)

// MigrationError is why a migration stopped: which version and step, and
// the database's error. Versions before it stay applied (on MySQL, whose
// DDL commits implicitly, the failed version's statements before the
// failed one too: every MySQL migration file can run again). Whether
// running the migrations again may succeed is [IsRetryable]: true when the
// database's error is transient — a deadlock, a lock wait timeout, a lost
// connection, and on Galera a certification failure (MySQL error 1213)
// when two nodes migrate at once — and when recording the version failed
// because another process recorded it meanwhile.
type MigrationError struct {
	// Table is the inbox table's name.
	Table string
	// Down is set when undoing versions (MigrateDown).
	Down bool
	// Version and Name identify the migration the step belongs to; 0 and
	// "" for the steps around every version (connect, lock, the versions
	// table).
	Version int
	Name    string
	// Step is what failed.
	Step MigrateStep
	// Statement is the 1-based index of the statement of the version's
	// file that failed (see [Migration.UpStatements]) when Step is
	// MigrateStatement; 0 otherwise.
	Statement int
	// Err is the database's error, classified by the dialect (wrapped
	// with [ErrTransient] when transient).
	Err error
}

func (e *MigrationError) Error() string {
	var b strings.Builder
	b.WriteString("inbox: migrate")
	if e.Down {
		b.WriteString(" down")
	}
	b.WriteString(": table " + e.Table)
	if e.Version > 0 {
		fmt.Fprintf(&b, ": version %d (%s)", e.Version, e.Name)
	}
	b.WriteString(": " + string(e.Step))
	if e.Statement > 0 {
		fmt.Fprintf(&b, " %d", e.Statement)
	}
	return b.String() + ": " + e.Err.Error()
}

// Unwrap returns the database's error, so that errors.As finds the
// driver's error type and errors.Is [ErrTransient].
func (e *MigrationError) Unwrap() error { return e.Err }

func (s *Store) migrationError(down bool, m *Migration, step MigrateStep, statement int, err error) error {
	e := &MigrationError{Table: s.table, Down: down, Step: step, Statement: statement, Err: s.Classify(err)}
	if m != nil {
		e.Version, e.Name = m.Version, m.Name
	}
	return e
}

// AppliedMigrations lists the schema versions recorded as applied; none
// when the versions table does not exist.
func (s *Store) AppliedMigrations(ctx context.Context) ([]int, error) {
	var exists int
	if err := s.queryRow(ctx, s.db, s.q.migrationsExist, &params{}).Scan(&exists); err != nil {
		return nil, fmt.Errorf("inbox: applied migrations: %w", s.Classify(err))
	}
	if exists == 0 {
		return nil, nil
	}
	rows, err := s.query(ctx, s.db, s.q.selectMigrations, &params{})
	if err != nil {
		return nil, fmt.Errorf("inbox: applied migrations: %w", s.Classify(err))
	}
	defer rows.Close()
	var vs []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		vs = append(vs, v)
	}
	return vs, rows.Err()
}

// SchemaError reports how the applied schema differs from the code's.
type SchemaError struct {
	Table string
	// Missing are versions the code has and the database lacks.
	Missing []int
	// Unknown are versions the database has and the code does not know.
	Unknown []int
	// MissingTables are tables of the schema that do not exist although
	// every version of the code is recorded as applied: they were dropped
	// outside the migrations. Only looked for when Missing is empty.
	MissingTables []string
}

func (e *SchemaError) Error() string {
	switch {
	case len(e.MissingTables) > 0 && len(e.Missing) == 0 && len(e.Unknown) == 0:
		return fmt.Sprintf("inbox: table %s: every schema version is recorded in %s_migrations, but tables %v do not exist; "+
			"they were dropped outside the migrations: restore them, or drop %s_migrations and run the migrations again, "+
			"which create what is missing", e.Table, e.Table, e.MissingTables, e.Table)
	case len(e.MissingTables) > 0:
		return fmt.Sprintf("inbox: table %s lacks schema versions %v, has unknown versions %v and lacks tables %v",
			e.Table, e.Missing, e.Unknown, e.MissingTables)
	case len(e.Missing) > 0 && len(e.Unknown) == 0:
		return fmt.Sprintf("inbox: table %s lacks schema versions %v; run the migrations (Store.Migrate, or inboxmill migrate)",
			e.Table, e.Missing)
	case len(e.Missing) == 0:
		return fmt.Sprintf("inbox: table %s has schema versions %v that this code does not know; it was migrated by a newer release",
			e.Table, e.Unknown)
	}
	return fmt.Sprintf("inbox: table %s lacks schema versions %v and has unknown versions %v", e.Table, e.Missing, e.Unknown)
}

// Unwrap makes errors.Is match [ErrSchemaOutdated] when versions are
// missing, [ErrSchemaNewer] when unknown ones are applied, and
// [ErrTableMissing] when tables are.
func (e *SchemaError) Unwrap() []error {
	var errs []error
	if len(e.MissingTables) > 0 {
		errs = append(errs, ErrTableMissing)
	}
	if len(e.Missing) > 0 {
		errs = append(errs, ErrSchemaOutdated)
	}
	if len(e.Unknown) > 0 {
		errs = append(errs, ErrSchemaNewer)
	}
	return errs
}

// Validate checks that every schema version of the code is applied, and
// no unknown one, and then that the tables those versions created exist:
// call it at start-up to fail with a clear *SchemaError (errors.Is
// [ErrSchemaOutdated], [ErrSchemaNewer] or [ErrTableMissing]) before the
// first message fails with a missing column or table. It reads the
// catalog, not the columns: a table altered by hand is not noticed.
func (s *Store) Validate(ctx context.Context) error {
	ms, err := s.Migrations()
	if err != nil {
		return err
	}
	applied, err := s.AppliedMigrations(ctx)
	if err != nil {
		return err
	}
	have := map[int]bool{}
	for _, v := range applied {
		have[v] = true
	}
	e := &SchemaError{Table: s.table}
	known := map[int]bool{}
	for _, m := range ms {
		known[m.Version] = true
		if !have[m.Version] {
			e.Missing = append(e.Missing, m.Version)
		}
	}
	for _, v := range applied {
		if !known[v] {
			e.Unknown = append(e.Unknown, v)
		}
	}
	if len(e.Missing) == 0 {
		// The versions say the tables are there; a table dropped by hand
		// leaves its version recorded.
		if e.MissingTables, err = s.missingTables(ctx); err != nil {
			return err
		}
	}
	if len(e.Missing) > 0 || len(e.Unknown) > 0 || len(e.MissingTables) > 0 {
		return e
	}
	return nil
}

// missingTables lists the schema's tables that do not exist.
func (s *Store) missingTables(ctx context.Context) ([]string, error) {
	rows, err := s.query(ctx, s.db, s.q.missingTables, &params{})
	if err != nil {
		return nil, fmt.Errorf("inbox: validate: %w", s.Classify(err))
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, fmt.Errorf("inbox: validate: %w", err)
		}
		names = append(names, name)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox: validate: %w", s.Classify(err))
	}
	return names, nil
}

func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

// splitStatements cuts a migration file into statements at semicolons that
// end a line, dropping comment-only and empty pieces. Drivers differ on
// whether one Exec may carry several statements, so each runs alone. The
// migration files keep to that shape: no semicolons at a line's end inside
// literals, and function bodies dollar-quoted (within which no line ends a
// statement).
func splitStatements(sqlText string) []string {
	var out []string
	var cur strings.Builder
	flush := func() {
		stmt := strings.TrimSpace(cur.String())
		cur.Reset()
		if stmt != "" && !onlyComments(stmt) {
			out = append(out, stmt)
		}
	}
	quote := "" // the tag of the dollar-quoted body the line is in
	for line := range strings.Lines(sqlText) {
		trimmed := strings.TrimSpace(line)
		if !strings.HasPrefix(trimmed, "--") {
			quote = dollarQuotes(line, quote)
		}
		if quote == "" && strings.HasSuffix(trimmed, ";") && !strings.HasPrefix(trimmed, "--") {
			cur.WriteString(strings.TrimSuffix(strings.TrimRight(line, " \t\r\n"), ";"))
			flush()
			continue
		}
		cur.WriteString(line)
	}
	flush()
	return out
}

// dollarQuotes follows PostgreSQL's dollar quoting ($fn$ ... $fn$, $$ ...
// $$) through line, starting inside the body of tag quote ("" for
// outside), and returns the tag the line ends inside.
func dollarQuotes(line, quote string) string {
	for i := 0; i < len(line); i++ {
		if line[i] != '$' {
			continue
		}
		j := i + 1
		for j < len(line) && (line[j] == '_' || 'a' <= line[j]|0x20 && line[j]|0x20 <= 'z' ||
			j > i+1 && '0' <= line[j] && line[j] <= '9') {
			j++
		}
		if j == len(line) || line[j] != '$' {
			continue
		}
		tag := line[i : j+1]
		switch quote {
		case "":
			quote = tag
		case tag:
			quote = ""
		}
		i = j
	}
	return quote
}

func onlyComments(stmt string) bool {
	for line := range strings.Lines(stmt) {
		t := strings.TrimSpace(line)
		if t != "" && !strings.HasPrefix(t, "--") {
			return false
		}
	}
	return true
}
