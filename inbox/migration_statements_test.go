package inbox_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
)

// TestMigrationStatements: a migration is cut into the statements
// Store.Migrate runs, as tools that apply it statement by statement need.
func TestMigrationStatements(t *testing.T) {
	body := `-- header
CREATE TABLE a (x text DEFAULT 'a;b');

-- about b
CREATE INDEX b ON a (x)
    WHERE x <> '';
SELECT 1; -- a trailing comment keeps the statement open
SELECT 2;
-- only a comment;
`
	m := inbox.Migration{Version: 1, Name: "x", Up: body, Down: "SELECT 3"}
	require.Equal(t, []string{
		"-- header\nCREATE TABLE a (x text DEFAULT 'a;b')",
		"-- about b\nCREATE INDEX b ON a (x)\n    WHERE x <> ''",
		"SELECT 1; -- a trailing comment keeps the statement open\nSELECT 2",
	}, m.UpStatements())
	require.Equal(t, []string{"SELECT 3"}, m.DownStatements(), "the last statement needs no semicolon")
}
