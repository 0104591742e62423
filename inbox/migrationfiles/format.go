package migrationfiles

import (
	"errors"
	"fmt"
	"strings"
)

// Format is the layout of the rendered files: which tool reads them. The
// zero value is no format; [ParseFormat] and [Format.Set] turn a flag's
// text into one.
type Format int

const (
	// FormatSQL is plain SQL, NNN_name.up.sql and NNN_name.down.sql, for
	// running by hand (psql, mysql, sqlite3) or by a tool that reads such
	// files and runs several statements per file.
	FormatSQL Format = iota + 1
	// FormatGoose is one NNN_name.sql per version with the
	// "-- +goose Up" and "-- +goose Down" annotations, for
	// github.com/pressly/goose.
	FormatGoose
	// FormatGolangMigrate is NNN_name.up.sql and NNN_name.down.sql for
	// github.com/golang-migrate/migrate. On MySQL every file is a single
	// statement (see the package documentation), so that no
	// multiStatements=true is needed in the DSN.
	FormatGolangMigrate
	// FormatAtlas is an Atlas versioned migration directory: one
	// NNN_name.sql per version (up only: Atlas plans downs itself) and the
	// atlas.sum integrity file.
	FormatAtlas
)

// ErrUnknownFormat is returned, wrapped, for a format name or value that
// is none of the formats.
var ErrUnknownFormat = errors.New("migrationfiles: unknown format")

var formatNames = map[Format]string{
	FormatSQL:           "sql",
	FormatGoose:         "goose",
	FormatGolangMigrate: "golang-migrate",
	FormatAtlas:         "atlas",
}

// Formats lists every format, in the order of their constants: for a
// flag's help text.
func Formats() []Format { return []Format{FormatSQL, FormatGoose, FormatGolangMigrate, FormatAtlas} }

// String returns the format's name as [ParseFormat] reads it: "sql",
// "goose", "golang-migrate" or "atlas".
func (f Format) String() string {
	if name, ok := formatNames[f]; ok {
		return name
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// ParseFormat reads a format's name, case-insensitively; "migrate" is
// taken for "golang-migrate", the name of that tool's command. Anything
// else is an error wrapping [ErrUnknownFormat] that lists the names.
func ParseFormat(s string) (Format, error) {
	name := strings.ToLower(strings.TrimSpace(s))
	if name == "migrate" {
		return FormatGolangMigrate, nil
	}
	for _, f := range Formats() {
		if formatNames[f] == name {
			return f, nil
		}
	}
	return 0, fmt.Errorf("%w %q (want one of %s)", ErrUnknownFormat, s, strings.Join(formatList(), ", "))
}

// Set makes *Format a flag.Value (and, with [Format.Type], a
// github.com/spf13/pflag Value): it parses s with [ParseFormat].
func (f *Format) Set(s string) error {
	v, err := ParseFormat(s)
	if err != nil {
		return err
	}
	*f = v
	return nil
}

// Type names the flag's value in pflag's help text.
func (f *Format) Type() string { return "format" }

// MarshalText returns the format's name; an unknown format is an error.
func (f Format) MarshalText() ([]byte, error) {
	if err := f.valid(); err != nil {
		return nil, err
	}
	return []byte(f.String()), nil
}

// UnmarshalText reads a format's name with [ParseFormat].
func (f *Format) UnmarshalText(b []byte) error { return f.Set(string(b)) }

func (f Format) valid() error {
	if _, ok := formatNames[f]; !ok {
		return fmt.Errorf("%w %v (want one of %s)", ErrUnknownFormat, f, strings.Join(formatList(), ", "))
	}
	return nil
}

func formatList() []string {
	var names []string
	for _, f := range Formats() {
		names = append(names, f.String())
	}
	return names
}
