// Package chaos_test runs the fault-injection suite (scripts/chaos.sh) in a
// smoke configuration: a few hundred events, two consumer processes per
// mode (kafka-group included), a kill, a database connection cut and a
// restart each, and one broker restart. The test
// binary plays every part: it re-executes itself as the broker and the
// consumers, so under -race the consumers are checked for data races too.
package chaos_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/tests/chaos/internal/broker"
	"github.com/inboxmill/inboxmill/tests/chaos/internal/consumer"
	"github.com/inboxmill/inboxmill/tests/chaos/internal/driver"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// roleEnv tells a re-executed test binary which program to be.
const roleEnv = "INBOXMILL_CHAOS_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "broker":
		broker.Run()
	case "consumer":
		consumer.Run()
	}
	os.Exit(m.Run())
}

var chaosLine = regexp.MustCompile(`^CHAOS events=(\d+) effects=(\d+) duplicated_effects=0 lost=0 conflicts_routed=(\d+) kills=(\d+) db_cuts=(\d+) broker_restarts=1 seed=7 linearizable=true$`)

var groupLine = regexp.MustCompile(`^MODE \S+/kafka-group .* members_per_group=([0-9.]+) `)

func TestSmoke(t *testing.T) {
	// Each skips, or fails with CI set, when its database does not answer.
	testdb.Open(t, testdb.PostgresPGX)
	testdb.Open(t, testdb.MySQL)
	exe, err := os.Executable()
	require.NoError(t, err)
	logs := t.TempDir()
	var out syncBuffer
	cfg := driver.Config{
		Seed: 7, Events: 240, Consumers: 2, Kills: 1, DBKills: 1, Restarts: 1, BrokerRestarts: 1,
		SelfKillShare: 0.4, DieAfter: [2]int{5, 25}, Parallel: true,
		DSN: testdb.PostgresDSN(), MySQLDSN: testdb.MySQLDSN(), Deadline: 50 * time.Second, Stall: 30 * time.Second,
		LogDir: logs, Out: &out,
		Command: func(role string, args ...string) *exec.Cmd {
			cmd := exec.Command(exe, args...)
			cmd.Env = append(os.Environ(), roleEnv+"="+role)
			return cmd
		},
	}
	tot, err := driver.Run(t.Context(), cfg)
	report := out.String()
	t.Log("\n" + report)
	if err != nil || t.Failed() {
		dumpLogs(t, logs)
	}
	require.NoError(t, err)

	lines := strings.Split(strings.TrimRight(report, "\n"), "\n")
	require.Regexp(t, chaosLine, lines[len(lines)-1], "the last line")
	// 240 split between the databases and the modes' shares, each
	// rounded down.
	require.Equal(t, 240, tot.Events, "the modes share exactly the events asked for")
	require.Equal(t, tot.Events, tot.Effects)
	require.Positive(t, tot.ConflictsRouted)
	require.True(t, tot.Linearizable, "porcupine's verdict on the history")
	require.GreaterOrEqual(t, tot.Kills, 8, "each mode's consumers were killed at least once")
	for _, db := range []string{"postgres", "mysql"} {
		for _, mode := range []string{"kafka-transactional", "kafka-reserve", "sql-queue", "kafka-group", "kafka-parallel"} {
			require.Contains(t, report, "MODE "+db+"/"+mode+" ")
		}
		// The driver fails the mode when no group had more than one
		// member; the mean is on its MODE line.
		m := groupLine.FindStringSubmatch(report[strings.Index(report, "MODE "+db+"/kafka-group "):])
		require.NotNil(t, m, "the kafka-group MODE line on %s names the members per group", db)
		mean, err := strconv.ParseFloat(m[1], 64)
		require.NoError(t, err)
		require.Greater(t, mean, 1.0, "members per group on %s", db)
	}
	requireNoRace(t, logs)
}

// requireNoRace fails when a consumer or the broker reported a data race
// (they are this test binary, built with -race or not).
func requireNoRace(t *testing.T, dir string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	require.NoError(t, err)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NotContains(t, string(b), "DATA RACE", "%s:\n%s", filepath.Base(f), b)
	}
}

// dumpLogs shows the end of every process's log.
func dumpLogs(t *testing.T, dir string) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		var tail []string
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			tail = append(tail, sc.Text())
			if len(tail) > 30 {
				tail = tail[1:]
			}
		}
		fh.Close()
		if len(tail) > 0 {
			t.Logf("%s:\n%s", filepath.Base(f), strings.Join(tail, "\n"))
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the driver's concurrent modes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
