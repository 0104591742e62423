package migrationfiles_test

import (
	"flag"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox/migrationfiles"
)

func TestFormatNamesRoundTrip(t *testing.T) {
	t.Parallel()
	want := []string{"sql", "goose", "golang-migrate", "atlas"}
	fs := migrationfiles.Formats()
	require.Len(t, fs, len(want))
	for i, f := range fs {
		require.Equal(t, want[i], f.String())
		got, err := migrationfiles.ParseFormat(f.String())
		require.NoError(t, err)
		require.Equal(t, f, got)
		text, err := f.MarshalText()
		require.NoError(t, err)
		var back migrationfiles.Format
		require.NoError(t, back.UnmarshalText(text))
		require.Equal(t, f, back)
	}
	for in, f := range map[string]migrationfiles.Format{"GOOSE": migrationfiles.FormatGoose, " atlas ": migrationfiles.FormatAtlas,
		"migrate": migrationfiles.FormatGolangMigrate} {
		got, err := migrationfiles.ParseFormat(in)
		require.NoError(t, err, in)
		require.Equal(t, f, got, in)
	}
}

func TestUnknownFormatsAreErrors(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"", "flyway", "golang_migrate", "sql,goose"} {
		_, err := migrationfiles.ParseFormat(in)
		require.ErrorIs(t, err, migrationfiles.ErrUnknownFormat, in)
		require.Contains(t, err.Error(), "golang-migrate", "the error lists the formats")
	}
	var zero migrationfiles.Format
	require.Equal(t, "Format(0)", zero.String())
	_, err := zero.MarshalText()
	require.ErrorIs(t, err, migrationfiles.ErrUnknownFormat)
}

// A Format is a flag.Value, as a command's --format flag needs.
func TestFormatIsAFlag(t *testing.T) {
	t.Parallel()
	f := migrationfiles.FormatSQL
	set := flag.NewFlagSet("migrate", flag.ContinueOnError)
	set.Var(&f, "format", "one of sql, goose, golang-migrate, atlas")
	require.NoError(t, set.Parse([]string{"-format", "golang-migrate"}))
	require.Equal(t, migrationfiles.FormatGolangMigrate, f)
	set.SetOutput(discard{})
	require.ErrorContains(t, set.Parse([]string{"-format", "liquibase"}), "unknown format")
	require.Equal(t, "format", f.Type())
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
