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

// Migration is one schema version of a dialect.
type Migration struct {
	Version int
	Name    string
	// Up is the SQL, rewritten for the store's table name.
	Up string
}

// Migrations returns the store dialect's up migrations in version order,
// rewritten for the store's table name.
func (s *Store) Migrations() ([]Migration, error) {
	return loadMigrations(s.dialect.Migrations(), s.table)
}

func loadMigrations(fsys fs.FS, table string) ([]Migration, error) {
	names, err := fs.Glob(fsys, "*.up.sql")
	if err != nil {
		return nil, err
	}
	var ms []Migration
	seen := map[int]string{}
	for _, name := range names {
		base := strings.TrimSuffix(path.Base(name), ".up.sql")
		num, label, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("inbox: migration file %q is not named NNN_name.up.sql", name)
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("inbox: migrations %q and %q share version %d", prev, name, v)
		}
		seen[v] = name
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: label, Up: renameTable(string(body), table)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	return ms, nil
}

// Migrate brings the inbox table to the newest schema version. It is
// idempotent, and safe to run from several processes at once: PostgreSQL and
// MySQL take a lock named after the table for the duration, SQLite
// serializes the migration transactions itself, and every version is
// recorded in "<table>_migrations" in the same transaction that applies it
// (MySQL commits DDL implicitly; the lock covers it there).
//
// On MySQL a crash between a version's DDL and its recording leaves the
// version applied but unrecorded, and the next Migrate runs it again; every
// MySQL migration file therefore checks before each step whether it is still
// needed, and running it twice changes nothing.
//
// Migrate never runs by itself: nothing creates schema on a first message.
func (s *Store) Migrate(ctx context.Context) (err error) {
	ms, err := s.Migrations()
	if err != nil {
		return err
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("inbox: migrate: %w", err)
	}
	defer conn.Close()

	lockName := "inboxmill:" + s.table
	if s.q.LockMigrations != "" {
		var got int
		if err := conn.QueryRowContext(ctx, s.q.LockMigrations, lockName).Scan(&got); err != nil {
			return fmt.Errorf("inbox: migrate: take lock: %w", err)
		}
		if got != 1 {
			return fmt.Errorf("inbox: migrate: could not take lock %q", lockName)
		}
		defer func() {
			// A fresh context: the caller's may be done, and the lock must go
			// (closing the connection would release it too).
			var released int
			uerr := conn.QueryRowContext(context.WithoutCancel(ctx), s.q.UnlockMigrations, lockName).Scan(&released)
			if uerr != nil && err == nil {
				err = fmt.Errorf("inbox: migrate: release lock: %w", uerr)
			}
		}()
	}

	if _, err := conn.ExecContext(ctx, s.q.CreateMigrationsTable); err != nil {
		return fmt.Errorf("inbox: migrate: create migrations table: %w", err)
	}
	for _, m := range ms {
		if err := s.applyMigration(ctx, conn, m); err != nil {
			return fmt.Errorf("inbox: migrate: version %d (%s): %w", m.Version, m.Name, err)
		}
	}
	return nil
}

func (s *Store) applyMigration(ctx context.Context, conn *sql.Conn, m Migration) (err error) {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, ignoreDone(tx.Rollback()))
		}
	}()
	// Checked inside the transaction: another process may have applied the
	// version since this one looked.
	var n int
	if err := tx.QueryRowContext(ctx, s.q.SelectMigration, m.Version).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return tx.Rollback()
	}
	for _, stmt := range splitStatements(m.Up) {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, s.q.InsertMigration, m.Version, m.Name, s.timeArg(s.now())); err != nil {
		return err
	}
	return tx.Commit()
}

// AppliedMigrations lists the schema versions recorded as applied.
func (s *Store) AppliedMigrations(ctx context.Context) ([]int, error) {
	rows, err := s.db.QueryContext(ctx, s.q.SelectMigrations)
	if err != nil {
		return nil, fmt.Errorf("inbox: applied migrations: %w", err)
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

func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

// splitStatements cuts a migration file into statements at semicolons that
// end a line, dropping comment-only and empty pieces. Drivers differ on
// whether one Exec may carry several statements, so each runs alone. The
// migration files keep to that shape: no semicolons inside literals or
// bodies at a line's end.
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
	for line := range strings.Lines(sqlText) {
		trimmed := strings.TrimSpace(line)
		if strings.HasSuffix(trimmed, ";") && !strings.HasPrefix(trimmed, "--") {
			cur.WriteString(strings.TrimSuffix(strings.TrimRight(line, " \t\r\n"), ";"))
			flush()
			continue
		}
		cur.WriteString(line)
	}
	flush()
	return out
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
