package migrationfiles

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGooseSplitsAlike(t *testing.T) {
	t.Parallel()
	for stmt, alike := range map[string]bool{
		"CREATE TABLE a (x int)":                         true,
		"-- a comment;\nCREATE TABLE a (x int)":          true,
		"CREATE TABLE a (x text DEFAULT 'a;b')":          true,
		"BEGIN x = 1; -- set\nEND":                       false, // goose cuts after "x = 1;"
		"BEGIN x = 1;\nEND":                              false,
		"SELECT 'a -- b'":                                false, // goose sees a comment and no end
		"CREATE FUNCTION f() AS $$ BEGIN x; END $$":      true,
		"CREATE FUNCTION f() AS $$\nBEGIN x; y\nEND $$":  true,
		"CREATE FUNCTION f() AS $$\nBEGIN x;\nEND $$":    false,
		"CREATE TRIGGER t BEGIN UPDATE a; -- c\n    END": false,
	} {
		require.Equal(t, alike, gooseSplitsAlike(stmt), stmt)
	}
}
