package testkit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

func TestClock(t *testing.T) {
	t.Parallel()
	var c testkit.Clock // the zero value is the wall clock
	require.WithinDuration(t, time.Now(), c.Now(), time.Minute)
	c.Advance(time.Hour)
	c.Advance(30 * time.Minute)
	require.WithinDuration(t, time.Now().Add(90*time.Minute), c.Now(), time.Minute)
}

func TestLogger(t *testing.T) {
	t.Parallel()
	l := testkit.NewLogger()
	boom := errors.New("boom")
	l.Error("e", boom, watermill.LogFields{"a": 1})
	l.Info("i", nil)
	child := l.With(watermill.LogFields{"mode": "reserve", "a": 0})
	child.Debug("d", watermill.LogFields{"a": 2})
	child.With(watermill.LogFields{"op": "x"}).Trace("t", nil)

	require.Equal(t, []testkit.LogEntry{
		{Level: "error", Msg: "e", Err: boom, Fields: watermill.LogFields{"a": 1}},
		{Level: "info", Msg: "i", Fields: watermill.LogFields{}},
		{Level: "debug", Msg: "d", Fields: watermill.LogFields{"mode": "reserve", "a": 2}},
		{Level: "trace", Msg: "t", Fields: watermill.LogFields{"mode": "reserve", "a": 0, "op": "x"}},
	}, l.Entries())
	require.Equal(t, "error e err=boom map[a:1]", l.Entries()[0].String())
	require.Len(t, l.At("debug"), 1)
	require.Equal(t, "d", l.At("debug")[0].Msg)
	require.Empty(t, l.At("warn"))

	entries := l.Entries()
	entries[0].Msg = "changed"
	require.Equal(t, "e", l.Entries()[0].Msg, "Entries returns a copy")

	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { child.Info("concurrent", nil) })
	}
	wg.Wait()
	require.Len(t, l.At("info"), 9)
}

func TestSQLiteStore(t *testing.T) {
	t.Parallel()
	clk := &testkit.Clock{}
	clk.Advance(time.Hour)
	store, db := testkit.SQLiteStore(t, inbox.Config{Table: "my_inbox", Now: clk.Now})
	require.Same(t, db, store.DB())
	require.Equal(t, "my_inbox", store.Table())
	require.WithinDuration(t, clk.Now(), store.Now(), time.Minute)
	ctx := context.Background()
	_, err := store.Claim(ctx, db, inbox.ClaimParams{ID: inbox.ID{Operation: "op", Key: "k"}, PayloadHash: []byte{1}})
	require.NoError(t, err, "the store is migrated")
	var n int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM my_inbox").Scan(&n))
	require.Equal(t, 1, n)

	other := testkit.MigratedStore(t, db, sqlite.Dialect(), inbox.Config{Table: "other_inbox"})
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM other_inbox").Scan(&n))
	require.Zero(t, n)
	require.Same(t, db, other.DB())

	// A test may close the database itself; the cleanups still pass.
	require.NoError(t, db.Close())
}

// TestOnlyTestsImportTestkit: no package of the module imports testkit
// outside its _test.go files, but the test harnesses under tests/internal/
// (transporttest, ...), which only tests import (Go's internal rule, and
// internal/layout, check that).
func TestOnlyTestsImportTestkit(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command:", err)
	}
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}:{{range .Imports}} {{.}}{{end}}",
		"github.com/inboxmill/inboxmill/...").CombinedOutput()
	require.NoError(t, err, "%s", out)
	const self = "github.com/inboxmill/inboxmill/tests/testkit"
	for line := range strings.Lines(string(out)) {
		pkg, imports, _ := strings.Cut(strings.TrimSpace(line), ":")
		if strings.HasPrefix(pkg, "github.com/inboxmill/inboxmill/tests/internal/") {
			continue
		}
		require.NotContains(t, strings.Fields(imports), self, "%s imports testkit outside its tests", pkg)
	}
}

// FreePorts gives distinct ports below the ephemeral range, each free to
// bind.
func TestFreePorts(t *testing.T) {
	ports := testkit.FreePorts(t, 12)
	require.Len(t, ports, 12)
	seen := map[int]bool{}
	for _, p := range ports {
		require.False(t, seen[p], "port %d twice", p)
		seen[p] = true
		if low, ok := ephemeralLowForTest(); ok && low > 21000 {
			require.Less(t, p, low, "port %d in the ephemeral range", p)
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		require.NoError(t, err)
		require.NoError(t, l.Close())
	}
}

func ephemeralLowForTest() (int, bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, false
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil {
		return 0, false
	}
	return lo, true
}
