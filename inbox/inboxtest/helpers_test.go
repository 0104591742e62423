package inboxtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

func TestNewStoreIsMigratedAndCleanedUp(t *testing.T) {
	db := testdb.Open(t, testdb.SQLite)
	count := func(prefix string) int {
		var n int
		require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name LIKE ?",
			prefix+"%").Scan(&n))
		return n
	}
	var table string
	t.Run("test", func(t *testing.T) {
		store := inboxtest.NewStore(t, db, sqlite.Dialect(), inbox.Config{})
		table = store.Table()
		require.NotEqual(t, "inbox", table, "a table of its own")
		require.NoError(t, store.Validate(context.Background()))
		res, err := store.Claim(context.Background(), db, inbox.ClaimParams{ID: inbox.ID{Operation: "op", Key: "k"},
			PayloadHash: []byte{1}})
		require.NoError(t, err)
		require.True(t, res.Claimed)
		require.Equal(t, 3, count(table), "the inbox, its audit and its versions")

		named := inboxtest.NewStore(t, db, sqlite.Dialect(), inbox.Config{Table: "named_inbox"})
		require.Equal(t, "named_inbox", named.Table())
	})
	require.Zero(t, count(table), "dropped when the test ended")
	require.Zero(t, count("named_inbox"))
}

func TestUniqueTable(t *testing.T) {
	db := testdb.Open(t, testdb.SQLite)
	seen := map[string]bool{}
	for range 100 {
		name := inboxtest.UniqueTable("inbox")
		require.False(t, seen[name])
		seen[name] = true
		require.LessOrEqual(t, len(name), inbox.MaxTableLen)
		_, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{Table: name})
		require.NoError(t, err, "a valid table name")
	}
}

func TestClock(t *testing.T) {
	var c inboxtest.Clock // the zero value is the wall clock
	require.WithinDuration(t, time.Now(), c.Now(), time.Minute)
	c.Advance(2 * time.Hour)
	require.WithinDuration(t, time.Now().Add(2*time.Hour), c.Now(), time.Minute)
}
