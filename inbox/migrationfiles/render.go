package migrationfiles

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/inboxmill/inboxmill/inbox"
)

// File is one rendered migration file.
type File struct {
	// Name is the file's name, without a directory: what the tool expects
	// to find in its migrations directory.
	Name string
	// Body is the file's content.
	Body []byte
}

// DefaultTable is the table Render and Write use for an empty name, as
// inbox.Config does.
const DefaultTable = "inbox"

// ErrForeignFiles is returned, wrapped, by Write in FormatAtlas when the
// directory holds .sql files it did not write: atlas.sum would not
// account for them, and Atlas would refuse the directory.
var ErrForeignFiles = errors.New("migrationfiles: the directory holds other migration files")

// version is one schema version with every statement its files run.
type version struct {
	inbox.Migration
	up, down []string
}

// Render returns the migration files of dialect d for table ("" for
// [DefaultTable]) in format f, in version order (atlas.sum last). Each version's files run the statements [inbox.Store.Migrate]
// runs and record the version in "<table>_migrations" as it does, so that
// [inbox.Store.Validate] works for tool users too. Render does no I/O.
//
// Errors: a table name inbox.Config would reject wraps
// [inbox.ErrInvalidConfig]; an unknown format wraps [ErrUnknownFormat].
func Render(d inbox.Dialect, table string, f Format) ([]File, error) {
	if d == nil {
		return nil, fmt.Errorf("%w: dialect is nil", inbox.ErrInvalidConfig)
	}
	if table == "" {
		table = DefaultTable
	}
	if err := errors.Join(checkTable(table), f.valid()); err != nil {
		return nil, err
	}
	vs, err := versions(d, table, f)
	if err != nil {
		return nil, err
	}
	h := header{dialect: d.Name(), table: table, format: f}
	var files []File
	switch {
	case f == FormatSQL:
		files = upDownFiles(vs, h)
	case f == FormatGoose:
		files = gooseFiles(vs, h)
	case f == FormatGolangMigrate && d.Name() == "mysql":
		files = procedureFiles(vs, h, table)
	case f == FormatGolangMigrate:
		files = upDownFiles(vs, h)
	case f == FormatAtlas:
		files = atlasFiles(vs, h)
	}
	return files, nil
}

// versions loads d's migrations for table and adds the recording
// statements to each.
func versions(d inbox.Dialect, table string, f Format) ([]version, error) {
	ms, err := inbox.LoadMigrations(d.Migrations(), table)
	if err != nil {
		return nil, err
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("migrationfiles: dialect %s has no migrations", d.Name())
	}
	rec, err := newRecorder(d, table, ms[0].Version)
	if err != nil {
		return nil, err
	}
	vs := make([]version, 0, len(ms))
	for _, m := range ms {
		if !name.MatchString(m.Name) {
			return nil, fmt.Errorf("migrationfiles: dialect %s: migration %d's name %q is not [a-z0-9_]+", d.Name(), m.Version, m.Name)
		}
		if f == FormatGoose && (strings.Contains(m.Up, "+goose") || strings.Contains(m.Down, "+goose")) {
			// goose reads such a comment line as an annotation.
			return nil, fmt.Errorf("migrationfiles: dialect %s: migration %d mentions +goose, which goose would take for an annotation", d.Name(), m.Version)
		}
		record, err := rec.up(m)
		if err != nil {
			return nil, err
		}
		forget, drop, err := rec.down(m)
		if err != nil {
			return nil, err
		}
		v := version{Migration: m}
		v.up = append(m.UpStatements(), record...)
		v.down = append(append(forget, m.DownStatements()...), drop...)
		vs = append(vs, v)
	}
	return vs, nil
}

// header is the comment that opens every file.
type header struct {
	dialect, table string
	format         Format
}

func (h header) text(v version, what string) string {
	return fmt.Sprintf("-- inboxmill %s schema version %d (%s)%s, for table %s, in the %s format.\n"+
		"-- Rendered from the dialect's migrations; render again rather than edit.\n"+
		"-- It keeps %s_migrations as Store.Migrate does, so that Store.Validate sees the version.\n",
		h.dialect, v.Version, v.Name, what, h.table, h.format, h.table)
}

func base(v version) string { return fmt.Sprintf("%03d_%s", v.Version, v.Name) }

// script joins statements into a file body, each ended by a semicolon.
func script(stmts []string) string {
	var b strings.Builder
	for i, s := range stmts {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString(s)
		b.WriteString(";\n")
	}
	return b.String()
}

func upDownFiles(vs []version, h header) []File {
	var files []File
	for _, v := range vs {
		files = append(files,
			File{Name: base(v) + ".up.sql", Body: []byte(h.text(v, "") + "\n" + script(v.up))},
			File{Name: base(v) + ".down.sql", Body: []byte(h.text(v, ", undone") + "\n" + script(v.down))})
	}
	return files
}

func gooseFiles(vs []version, h header) []File {
	section := func(b *strings.Builder, stmts []string) {
		for _, s := range stmts {
			b.WriteString("\n")
			if gooseSplitsAlike(s) {
				b.WriteString(s + ";\n")
				continue
			}
			// goose would cut it at a semicolon inside it.
			b.WriteString("-- +goose StatementBegin\n" + s + ";\n-- +goose StatementEnd\n")
		}
	}
	var files []File
	for _, v := range vs {
		var b strings.Builder
		b.WriteString(h.text(v, ""))
		b.WriteString("\n-- +goose Up\n")
		section(&b, v.up)
		b.WriteString("\n-- +goose Down\n")
		section(&b, v.down)
		files = append(files, File{Name: base(v) + ".sql", Body: []byte(b.String())})
	}
	return files
}

func atlasFiles(vs []version, h header) []File {
	var files []File
	for _, v := range vs {
		files = append(files, File{Name: base(v) + ".sql", Body: []byte(h.text(v, "") + "\n" + script(v.up))})
	}
	return append(files, File{Name: AtlasSumName, Body: atlasSum(files)})
}

// procedureFiles renders golang-migrate files for MySQL, which runs a file
// as one statement: without multiStatements=true in the DSN a file of
// several fails, after golang-migrate has marked the database dirty. Each
// version becomes three golang-migrate versions of one statement per
// file, 10v+1 to 10v+3, each undoing its predecessor's state exactly:
//
//	10v+1 define:  up creates the procedure <table>_migrate_<v>(apply),
//	               which runs the version's statements (apply) or its
//	               undoing ones (not apply); down drops it.
//	10v+2 apply:   up calls it with TRUE, down with FALSE.
//	10v+3 cleanup: up drops it, down creates it again.
//
// No procedure is left behind at 10v+3, nor after undoing 10v+1.
func procedureFiles(vs []version, h header, table string) []File {
	var files []File
	for _, v := range vs {
		proc := fmt.Sprintf("`%s_migrate_%d`", table, v.Version)
		create := fmt.Sprintf("CREATE PROCEDURE %s(IN apply BOOLEAN)\nBEGIN\nIF apply THEN\n%sELSE\n%sEND IF;\nEND;\n",
			proc, script(v.up), script(v.down))
		drop := "DROP PROCEDURE IF EXISTS " + proc + ";\n"
		steps := []struct{ label, what, up, down string }{
			{"define", ", step 1 of 3: define the procedure", create, drop},
			{"apply", ", step 2 of 3: apply", "CALL " + proc + "(TRUE);\n", "CALL " + proc + "(FALSE);\n"},
			{"cleanup", ", step 3 of 3: drop the procedure", drop, create},
		}
		for i, s := range steps {
			n := fmt.Sprintf("%03d%d_%s_%s", v.Version, i+1, v.Name, s.label)
			files = append(files,
				File{Name: n + ".up.sql", Body: []byte(h.text(v, s.what) + "\n" + s.up)},
				File{Name: n + ".down.sql", Body: []byte(h.text(v, s.what+", undone") + "\n" + s.down)})
		}
	}
	return files
}

// Write renders the files (see [Render]) into dir, creating it if needed
// and replacing files of the same names, and returns their paths. Other
// files are left alone; in FormatAtlas other .sql files are an error
// wrapping [ErrForeignFiles], since atlas.sum would not cover them. Keep
// the inbox's files in a directory of their own: their versions start at
// 1, like an application's own.
func Write(dir string, d inbox.Dialect, table string, f Format) ([]string, error) {
	files, err := Render(d, table, f)
	if err != nil {
		return nil, err
	}
	if f == FormatAtlas {
		if err := checkForeign(dir, files); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("migrationfiles: %w", err)
	}
	var paths []string
	for _, file := range files {
		p := filepath.Join(dir, file.Name)
		if err := os.WriteFile(p, file.Body, 0o644); err != nil {
			return paths, fmt.Errorf("migrationfiles: %w", err)
		}
		paths = append(paths, p)
	}
	return paths, nil
}

func checkForeign(dir string, files []File) error {
	present, err := fs.Glob(os.DirFS(dir), "*.sql")
	if err != nil || len(present) == 0 {
		return nil // a missing directory is created
	}
	var foreign []string
	for _, p := range present {
		if !slices.ContainsFunc(files, func(f File) bool { return f.Name == p }) {
			foreign = append(foreign, p)
		}
	}
	if len(foreign) > 0 {
		return fmt.Errorf("%w: %s has %s", ErrForeignFiles, dir, strings.Join(foreign, ", "))
	}
	return nil
}
