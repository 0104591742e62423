package failover_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/tests/testkit"
)

// binDir holds the PostgreSQL 15 server programs; INBOXMILL_PG_BIN overrides it.
func binDir() string {
	if d := os.Getenv("INBOXMILL_PG_BIN"); d != "" {
		return d
	}
	return "/usr/lib/postgresql/15/bin"
}

// pair is a scratch PostgreSQL primary with a streaming synchronous standby,
// in a directory of its own on free loopback ports. It never touches any
// other server.
type pair struct {
	t                *testing.T
	dir              string
	primary, standby string // data directories
	ports            [2]int
	asRoot           bool
}

// requireBinaries skips, or fails when CI is set, without the server
// programs.
func requireBinaries(t *testing.T) {
	t.Helper()
	for _, prog := range []string{"initdb", "pg_ctl", "pg_basebackup", "postgres"} {
		if _, err := os.Stat(filepath.Join(binDir(), prog)); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("PostgreSQL server programs are missing and CI is set, so this test fails instead of skipping: %v", err)
			}
			t.Skipf("PostgreSQL server programs are missing (install postgresql-15 or set INBOXMILL_PG_BIN; with CI set this fails): %v", err)
		}
	}
}

// startPair starts the primary and its standby, and stops both and removes
// their directory when the test ends, whatever happened. With syncCommit
// false the primary runs with synchronous_commit = off.
func startPair(t *testing.T, syncCommit bool) *pair {
	t.Helper()
	requireBinaries(t)
	p := &pair{t: t, asRoot: os.Geteuid() == 0}
	dir, err := os.MkdirTemp("", "inboxmill-failover-")
	require.NoError(t, err)
	p.dir = dir
	t.Cleanup(p.destroy)
	// The server programs refuse to run as root: as root they run as
	// postgres, in a directory postgres owns.
	if p.asRoot {
		u, err := user.Lookup("postgres")
		require.NoError(t, err, "running as root needs a postgres user for the server programs")
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		require.NoError(t, os.Chown(dir, uid, gid))
	}
	require.NoError(t, os.Chmod(dir, 0o700))
	p.primary, p.standby = filepath.Join(dir, "primary"), filepath.Join(dir, "standby")
	ports := testkit.FreePorts(t, 2)
	p.ports = [2]int{ports[0], ports[1]}

	p.run("initdb", "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "-D", p.primary)
	commit := "on"
	if !syncCommit {
		commit = "off"
	}
	p.appendConf(p.primary, map[string]string{
		"port":                      strconv.Itoa(p.ports[0]),
		"listen_addresses":          "'127.0.0.1'",
		"unix_socket_directories":   "'" + dir + "'",
		"synchronous_standby_names": "'*'",
		"synchronous_commit":        commit,
		"max_connections":           "60",
		"shared_buffers":            "32MB",
	})
	p.run("pg_ctl", "start", "-w", "-t", "30", "-D", p.primary, "-l", filepath.Join(dir, "primary.log"))
	p.run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(p.ports[0]), "-U", "postgres",
		"-D", p.standby, "-R", "-X", "stream", "-c", "fast", "-C", "-S", "standby1")
	// The standby copies the primary's settings: without its own empty
	// synchronous_standby_names every commit after promotion would wait for
	// a standby that does not exist.
	p.appendConf(p.standby, map[string]string{
		"port":                      strconv.Itoa(p.ports[1]),
		"synchronous_standby_names": "''",
	})
	p.run("pg_ctl", "start", "-w", "-t", "30", "-D", p.standby, "-l", filepath.Join(dir, "standby.log"))

	// Wait for the standby to stream and be the synchronous one.
	db, err := sql.Open("pgx", p.nodeDSN(0))
	require.NoError(t, err)
	defer db.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var state string
		err := db.QueryRow(`SELECT sync_state FROM pg_stat_replication LIMIT 1`).Scan(&state)
		if err == nil && state == "sync" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the standby did not become synchronous: state %q, %v\n%s", state, err, p.logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p
}

func (p *pair) command(ctx context.Context, prog string, args ...string) *exec.Cmd {
	path := filepath.Join(binDir(), prog)
	if p.asRoot {
		return exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.CommandContext(ctx, path, args...)
}

func (p *pair) run(prog string, args ...string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := p.command(ctx, prog, args...).CombinedOutput()
	if err != nil {
		p.t.Fatalf("%s %s: %v\n%s\n%s", prog, strings.Join(args, " "), err, out, p.logs())
	}
}

func (p *pair) appendConf(dataDir string, settings map[string]string) {
	p.t.Helper()
	var b strings.Builder
	b.WriteString("\n# inboxmill failover test\n")
	for k, v := range settings {
		fmt.Fprintf(&b, "%s = %s\n", k, v)
	}
	f, err := os.OpenFile(filepath.Join(dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(p.t, err)
	_, err = f.WriteString(b.String())
	require.NoError(p.t, errors.Join(err, f.Close()))
}

// killPrimary stops the primary as a crash would: no checkpoint, no
// goodbye to the clients beyond what the dying backends send.
func (p *pair) killPrimary() { p.run("pg_ctl", "stop", "-m", "immediate", "-D", p.primary) }

// promote makes the standby the primary and waits until it accepts writes.
func (p *pair) promote() { p.run("pg_ctl", "promote", "-w", "-t", "30", "-D", p.standby) }

// nodeDSN reaches one server, for the test's own checks (pgx).
func (p *pair) nodeDSN(i int) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.ports[i])
}

// dsn is the clients' DSN for a driver: both hosts, and only the one that
// accepts writes.
func (p *pair) dsn(driver string) string {
	if driver == "postgres" {
		// lib/pq reads "127.0.0.1:55440" in a host list as a host name: the
		// ports go in a list of their own.
		return fmt.Sprintf("postgres://postgres@127.0.0.1,127.0.0.1/postgres?port=%d,%d&target_session_attrs=read-write&sslmode=disable",
			p.ports[0], p.ports[1])
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?target_session_attrs=read-write&sslmode=disable",
		p.ports[0], p.ports[1])
}

// destroy stops whatever still runs and removes the directory.
func (p *pair) destroy() {
	for _, d := range []string{p.primary, p.standby} {
		if d == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "postmaster.pid")); err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		if out, err := p.command(ctx, "pg_ctl", "stop", "-m", "immediate", "-D", d).CombinedOutput(); err != nil {
			p.t.Logf("pg_ctl stop %s: %v\n%s", d, err, out)
			p.killByPID(d)
		}
		cancel()
	}
	if p.t.Failed() {
		p.t.Logf("server logs:\n%s", p.logs())
	}
	_ = os.RemoveAll(p.dir)
}

// killByPID is the last resort when pg_ctl could not stop a server.
func (p *pair) killByPID(dataDir string) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil || pid <= 1 {
		return
	}
	if proc, err := os.FindProcess(pid); err == nil {
		_ = proc.Kill()
	}
}

// logs is the tail of both servers' logs.
func (p *pair) logs() string {
	var b strings.Builder
	for _, name := range []string{"primary.log", "standby.log"} {
		data, err := os.ReadFile(filepath.Join(p.dir, name))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > 25 {
			lines = lines[len(lines)-25:]
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", name, strings.Join(lines, "\n"))
	}
	return b.String()
}
