package migrationfiles_test

import (
	"bytes"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"ariga.io/atlas/sql/migrate"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/migrationfiles"
	"github.com/inboxmill/inboxmill/inbox/mysql"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
)

func dialects(t *testing.T) []inbox.Dialect {
	var ds []inbox.Dialect
	for _, d := range []inbox.Dialect{postgres.Dialect(), mysql.Dialect(), sqlite.Dialect()} {
		ds = append(ds, d, extend(t, d))
	}
	return ds
}

func label(d inbox.Dialect) string {
	if _, ok := d.(extended); ok {
		return d.Name() + "+extra"
	}
	return d.Name()
}

// wantNames is the file list each format must have for the dialect's
// migrations, derived from inbox.LoadMigrations on its own.
func wantNames(t *testing.T, d inbox.Dialect, table string, f migrationfiles.Format) []string {
	ms, err := inbox.LoadMigrations(d.Migrations(), table)
	require.NoError(t, err)
	var names []string
	for _, m := range ms {
		base := fmt.Sprintf("%03d_%s", m.Version, m.Name)
		switch {
		case f == migrationfiles.FormatGoose || f == migrationfiles.FormatAtlas:
			names = append(names, base+".sql")
		case f == migrationfiles.FormatGolangMigrate && d.Name() == "mysql":
			for i, step := range []string{"define", "apply", "cleanup"} {
				n := fmt.Sprintf("%03d%d_%s_%s", m.Version, i+1, m.Name, step)
				names = append(names, n+".up.sql", n+".down.sql")
			}
		default:
			names = append(names, base+".up.sql", base+".down.sql")
		}
	}
	if f == migrationfiles.FormatAtlas {
		names = append(names, "atlas.sum")
	}
	return names
}

var comment = regexp.MustCompile(`(?m)--.*$`)

// TestRenderEveryVersionForTheTable checks every format for every dialect:
// one file (or set of files) per version, named as the tool wants, the
// table's name everywhere and no marker or default name left, and every
// line of each migration in its files, in order.
func TestRenderEveryVersionForTheTable(t *testing.T) {
	t.Parallel()
	const table = "acme_orders"
	leftover := regexp.MustCompile(`\binbox\b|\binbox_`)
	for _, d := range dialects(t) {
		ms, err := inbox.LoadMigrations(d.Migrations(), table)
		require.NoError(t, err)
		for _, f := range migrationfiles.Formats() {
			t.Run(label(d)+"/"+f.String(), func(t *testing.T) {
				files, err := migrationfiles.Render(d, table, f)
				require.NoError(t, err)
				var names []string
				var all strings.Builder
				for _, file := range files {
					names = append(names, file.Name)
					body := string(file.Body)
					require.NotContains(t, body, "{{", file.Name)
					require.True(t, strings.HasSuffix(body, "\n"), file.Name)
					if file.Name != migrationfiles.AtlasSumName {
						require.Contains(t, body, table, file.Name)
						require.NotRegexp(t, leftover, comment.ReplaceAllString(body, ""), file.Name)
						require.Contains(t, body, table+"_migrations", "%s keeps the versions table", file.Name)
					}
					all.WriteString(body)
				}
				require.Equal(t, wantNames(t, d, table, f), names)
				for _, m := range ms {
					inOrder(t, all.String(), m.Up, "version %d up", m.Version)
					if f != migrationfiles.FormatAtlas {
						inOrder(t, all.String(), m.Down, "version %d down", m.Version)
					}
				}
				again, err := migrationfiles.Render(d, table, f)
				require.NoError(t, err)
				require.Equal(t, files, again, "rendering is deterministic")
			})
		}
	}
}

// inOrder checks that every non-blank line of part occurs in text, in
// order.
func inOrder(t *testing.T, text, part string, msg string, args ...any) {
	t.Helper()
	at := 0
	for line := range strings.Lines(part) {
		line = strings.TrimRight(line, "\r\n")
		if strings.TrimSpace(line) == "" {
			continue
		}
		i := strings.Index(text[at:], line)
		require.GreaterOrEqual(t, i, 0, "%s: %q missing or out of order", fmt.Sprintf(msg, args...), line)
		at += i + len(line)
	}
}

// TestGooseAnnotations checks the goose files' shape: Up before Down, and
// StatementBegin/End exactly around the statements goose would cut at an
// inner semicolon (the extra migration's function and trigger bodies).
func TestGooseAnnotations(t *testing.T) {
	t.Parallel()
	for _, d := range dialects(t) {
		files, err := migrationfiles.Render(d, "acme", migrationfiles.FormatGoose)
		require.NoError(t, err)
		for _, file := range files {
			body := string(file.Body)
			up, down := strings.Index(body, "\n-- +goose Up\n"), strings.Index(body, "\n-- +goose Down\n")
			require.Positive(t, up, file.Name)
			require.Greater(t, down, up, file.Name)
			require.Equal(t, strings.Count(body, "-- +goose StatementBegin\n"), strings.Count(body, "-- +goose StatementEnd\n"))
			wrapped := strings.Contains(body, "-- +goose StatementBegin")
			isExtra := strings.HasPrefix(file.Name, "090_")
			switch {
			case isExtra && d.Name() != "mysql":
				require.True(t, wrapped, "%s %s: the body's '; --' lines need StatementBegin", label(d), file.Name)
				require.Equal(t, 1, strings.Count(body, "-- +goose StatementBegin"), "%s: only the body", label(d))
			default:
				require.False(t, wrapped, "%s %s: plain statements stay plain", label(d), file.Name)
			}
		}
	}
}

// TestGolangMigrateMySQLFilesAreOneStatement checks that every file of
// the MySQL golang-migrate layout is a single top-level statement, and
// that the other dialects' golang-migrate files are the plain ones.
func TestGolangMigrateMySQLFilesAreOneStatement(t *testing.T) {
	t.Parallel()
	for _, d := range dialects(t) {
		files, err := migrationfiles.Render(d, "acme", migrationfiles.FormatGolangMigrate)
		require.NoError(t, err)
		if d.Name() != "mysql" {
			plain, err := migrationfiles.Render(d, "acme", migrationfiles.FormatSQL)
			require.NoError(t, err)
			require.Len(t, files, len(plain))
			for i := range files {
				require.Equal(t, plain[i].Name, files[i].Name)
				require.Equal(t, strings.Replace(string(plain[i].Body), "in the sql format", "in the golang-migrate format", 1),
					string(files[i].Body))
			}
			continue
		}
		for _, file := range files {
			code := strings.TrimSpace(comment.ReplaceAllString(string(file.Body), ""))
			switch {
			case strings.HasPrefix(code, "CREATE PROCEDURE"):
				require.True(t, strings.HasSuffix(code, "END IF;\nEND;"), file.Name)
			case strings.HasPrefix(code, "CALL "), strings.HasPrefix(code, "DROP PROCEDURE IF EXISTS "):
				require.Equal(t, 1, strings.Count(code, ";"), file.Name)
				require.True(t, strings.HasSuffix(code, ";"), file.Name)
			default:
				t.Fatalf("%s: unexpected statement %q", file.Name, code)
			}
		}
	}
}

// TestTableNamesAreCheckedAsTheStoreChecksThem compares Render's verdict
// on table names with inbox.NewStore's.
func TestTableNamesAreCheckedAsTheStoreChecksThem(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("sqlite", ":memory:")
	require.NoError(t, err)
	defer db.Close()
	for _, name := range []string{"", "inbox", "acme", "order", "Select", "_x", "a1", strings.Repeat("a", inbox.MaxTableLen),
		strings.Repeat("a", inbox.MaxTableLen+1), "inbox; DROP TABLE x", "inbox--", `"inbox"`, "inbox`", "1inbox", "in box",
		"inbox.x", "{{table}}", "inbox'", "ínbox"} {
		s, serr := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{Table: name})
		if serr == nil {
			require.NoError(t, s.Close())
		}
		_, rerr := migrationfiles.Render(sqlite.Dialect(), name, migrationfiles.FormatSQL)
		require.Equal(t, serr == nil, rerr == nil, "%q: store says %v, Render says %v", name, serr, rerr)
		if rerr != nil {
			require.ErrorIs(t, rerr, inbox.ErrInvalidConfig, name)
		}
	}
	files, err := migrationfiles.Render(sqlite.Dialect(), "", migrationfiles.FormatSQL)
	require.NoError(t, err)
	require.Contains(t, string(files[0].Body), `"inbox"`, "an empty name is the default table")
}

func TestRenderErrors(t *testing.T) {
	t.Parallel()
	_, err := migrationfiles.Render(nil, "acme", migrationfiles.FormatSQL)
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)
	for _, f := range []migrationfiles.Format{0, 99} {
		_, err = migrationfiles.Render(sqlite.Dialect(), "acme", f)
		require.ErrorIs(t, err, migrationfiles.ErrUnknownFormat)
	}
	_, err = migrationfiles.Render(sqlite.Dialect(), "1acme", 0)
	require.ErrorIs(t, err, inbox.ErrInvalidConfig, "every problem at once")
	require.ErrorIs(t, err, migrationfiles.ErrUnknownFormat, "every problem at once")
}

// TestAtlasSumIsAtlasOwn checks atlas.sum with Atlas's own code: it
// validates, it equals what Atlas computes for the directory, and it stops
// validating when a file changes.
func TestAtlasSumIsAtlasOwn(t *testing.T) {
	t.Parallel()
	for _, d := range dialects(t) {
		dir := t.TempDir()
		paths, err := migrationfiles.Write(dir, d, "acme", migrationfiles.FormatAtlas)
		require.NoError(t, err)
		ld, err := migrate.NewLocalDir(dir)
		require.NoError(t, err)
		require.NoError(t, migrate.Validate(ld), label(d))
		sum, err := ld.Checksum()
		require.NoError(t, err)
		text, err := sum.MarshalText()
		require.NoError(t, err)
		ours, err := os.ReadFile(filepath.Join(dir, migrationfiles.AtlasSumName))
		require.NoError(t, err)
		require.Equal(t, string(text), string(ours), label(d))

		require.NoError(t, os.WriteFile(paths[0], append(mustRead(t, paths[0]), "-- edited\n"...), 0o644))
		require.ErrorIs(t, migrate.Validate(ld), migrate.ErrChecksumMismatch, "%s: a changed file is caught", label(d))
	}
}

func mustRead(t *testing.T, path string) []byte {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

func TestWrite(t *testing.T) {
	t.Parallel()
	d := postgres.Dialect()
	for _, f := range migrationfiles.Formats() {
		dir := filepath.Join(t.TempDir(), "migrations", "inbox")
		paths, err := migrationfiles.Write(dir, d, "acme", f)
		require.NoError(t, err, f)
		files, err := migrationfiles.Render(d, "acme", f)
		require.NoError(t, err)
		require.Len(t, paths, len(files))
		for i, file := range files {
			require.Equal(t, filepath.Join(dir, file.Name), paths[i])
			require.Equal(t, file.Body, mustRead(t, paths[i]))
		}
		again, err := migrationfiles.Write(dir, d, "acme", f)
		require.NoError(t, err, "%v: writing again replaces the files", f)
		require.Equal(t, paths, again)
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		require.Len(t, entries, len(files))
	}

	// Atlas would refuse a directory whose atlas.sum misses a file.
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "20240101_app.sql"), []byte("SELECT 1;\n"), 0o644))
	_, err := migrationfiles.Write(dir, d, "acme", migrationfiles.FormatAtlas)
	require.ErrorIs(t, err, migrationfiles.ErrForeignFiles)
	require.Contains(t, err.Error(), "20240101_app.sql")
	_, err = migrationfiles.Write(dir, d, "acme", migrationfiles.FormatGoose)
	require.NoError(t, err, "the other formats leave other files alone")

	_, err = migrationfiles.Write(t.TempDir(), d, "bad name", migrationfiles.FormatSQL)
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)
}

// TestImportsOnlyInboxAndTheStandardLibrary keeps the tools, which the
// tests use, out of the package: a program rendering files links none.
func TestImportsOnlyInboxAndTheStandardLibrary(t *testing.T) {
	t.Parallel()
	list := func(format string) []string {
		cmd := exec.Command("go", "list", "-deps", "-f", format, ".")
		var out, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		require.NoError(t, cmd.Run(), stderr.String())
		return strings.Fields(out.String())
	}
	const module = "github.com/inboxmill/inboxmill"
	self := module + "/inbox/migrationfiles"
	var imports []string
	for _, line := range list(`{{if eq .ImportPath "` + self + `"}}{{join .Imports " "}}{{end}}`) {
		if strings.Contains(line, ".") { // not the standard library
			imports = append(imports, line)
		}
	}
	require.Equal(t, []string{module + "/inbox"}, imports)
	for _, dep := range list("{{if not .Standard}}{{.ImportPath}}{{end}}") {
		require.True(t, strings.HasPrefix(dep, module+"/"), "the package links %s", dep)
	}
}
