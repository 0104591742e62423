package galera

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
	"sync"
	"syscall"
	"testing"
	"time"

	driver "github.com/go-sql-driver/mysql"

	"github.com/inboxmill/inboxmill/tests/testkit"
)

// The binaries the cluster is made of; the environment may point elsewhere.
var (
	mariadbdBin  = envOr("INBOXMILL_MARIADBD", "/usr/sbin/mariadbd")
	installDBBin = envOr("INBOXMILL_MARIADB_INSTALL_DB", "mariadb-install-db")
	galeraLib    = envOr("INBOXMILL_GALERA_PROVIDER", "/usr/lib/galera/libgalera_smm.so")
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// unavailable skips the test on a developer's machine and fails it in CI,
// which must never pass by skipping.
func unavailable(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") != "" {
		t.Fatalf("%s; CI is set, so this fails instead of skipping", msg)
	}
	t.Skipf("%s (install mariadb-server, galera-4 and rsync, or set CI=1 to fail instead)", msg)
}

// requireTools finds the binaries a cluster needs.
func requireTools(t *testing.T) {
	t.Helper()
	for _, bin := range []string{mariadbdBin, installDBBin, "rsync", "wsrep_sst_rsync"} {
		if _, err := exec.LookPath(bin); err != nil {
			unavailable(t, "%s not found: %v", bin, err)
		}
	}
	if _, err := os.Stat(galeraLib); err != nil {
		unavailable(t, "Galera provider not found: %v", err)
	}
}

// node is one mariadbd of the cluster.
type node struct {
	n                     int
	dir                   string
	port, gcomm, ist, sst int
	mu                    sync.Mutex
	cmd                   *exec.Cmd
	exited                chan struct{}
	admin                 *sql.DB // root over the unix socket
}

func (nd *node) socket() string { return filepath.Join(nd.dir, "mysqld.sock") }
func (nd *node) cnf() string    { return filepath.Join(nd.dir, "my.cnf") }
func (nd *node) data() string   { return filepath.Join(nd.dir, "data") }

// cluster is a three-node MariaDB Galera cluster on loopback ports in a
// directory of its own.
type cluster struct {
	dir   string
	nodes []*node
	uid   int // the uid the servers run as, -1 for the test's own
	gid   int
}

// startCluster starts three nodes, the first bootstrapping the cluster,
// and waits until all three are synced members of it. Every node is
// stopped by its PID and the directory removed when t ends.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	requireTools(t)
	start := time.Now()
	dir, err := os.MkdirTemp("", "inboxmill-galera-")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{dir: dir, uid: -1, gid: -1}
	t.Cleanup(func() {
		c.stopAll(t)
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	if os.Geteuid() == 0 {
		// As root, rsync's state transfer daemon drops to nobody and
		// cannot write the joiner's data directory: the servers run as
		// mysql, in directories mysql owns.
		u, err := user.Lookup("mysql")
		if err != nil {
			unavailable(t, "running as root needs a mysql user for the servers: %v", err)
		}
		c.uid, _ = strconv.Atoi(u.Uid)
		c.gid, _ = strconv.Atoi(u.Gid)
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ports := testkit.FreePorts(t, 12)
	for i := range 3 {
		nd := &node{n: i + 1, dir: filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
			port: ports[4*i], gcomm: ports[4*i+1], ist: ports[4*i+2], sst: ports[4*i+3]}
		c.nodes = append(c.nodes, nd)
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i, nd := range c.nodes {
		wg.Go(func() { errs[i] = c.install(nd) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.nodes {
		if err := c.start(nd, nd.n == 1); err != nil {
			t.Fatal(err)
		}
		if err := nd.waitSynced(90 * time.Second); err != nil {
			t.Fatalf("node %d: %v\n%s", nd.n, err, nd.errorLog())
		}
		if nd.n == 1 {
			// The account the tests use over TCP; replicated to the
			// joiners by their state transfer.
			for _, q := range []string{
				"CREATE DATABASE inboxmill",
				"CREATE USER 'inbox'@'127.0.0.1'",
				"GRANT ALL ON *.* TO 'inbox'@'127.0.0.1'",
			} {
				if _, err := nd.admin.Exec(q); err != nil {
					t.Fatalf("node 1: %s: %v", q, err)
				}
			}
		}
	}
	size := c.nodes[0].status(t, "wsrep_cluster_size")
	if size != "3" {
		t.Fatalf("wsrep_cluster_size = %s, want 3", size)
	}
	for _, nd := range c.nodes {
		if r := nd.status(t, "wsrep_ready"); r != "ON" {
			t.Fatalf("node %d: wsrep_ready = %s", nd.n, r)
		}
	}
	t.Logf("galera: 3 nodes synced, wsrep_cluster_size=3, in %v (ports %d %d %d)",
		time.Since(start).Round(100*time.Millisecond), c.nodes[0].port, c.nodes[1].port, c.nodes[2].port)
	return c
}

func (c *cluster) chown(path string) error {
	if c.uid < 0 {
		return nil
	}
	return os.Chown(path, c.uid, c.gid)
}

// install writes the node's configuration and system tables.
func (c *cluster) install(nd *node) error {
	tmp := filepath.Join(nd.dir, "tmp")
	for _, p := range []string{nd.data(), tmp} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
	}
	for _, p := range []string{nd.dir, nd.data(), tmp} {
		if err := c.chown(p); err != nil {
			return err
		}
	}
	var addrs []string
	for _, o := range c.nodes {
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", o.gcomm))
	}
	cnf := fmt.Sprintf(`[mariadbd]
datadir=%[1]s
port=%[2]d
socket=%[3]s
pid-file=%[4]s/mysqld.pid
log-error=%[4]s/error.log
tmpdir=%[4]s/tmp
bind-address=127.0.0.1
skip-name-resolve
binlog_format=ROW
default_storage_engine=InnoDB
innodb_autoinc_lock_mode=2
innodb_buffer_pool_size=64M
innodb_log_file_size=32M
innodb_flush_log_at_trx_commit=2
max_connections=300
wsrep_on=ON
wsrep_provider=%[5]s
wsrep_cluster_name=inboxmill_test
wsrep_node_name=n%[6]d
wsrep_cluster_address=gcomm://%[7]s
wsrep_provider_options="gmcast.listen_addr=tcp://127.0.0.1:%[8]d;ist.recv_addr=127.0.0.1:%[9]d;gcache.size=64M;evs.suspect_timeout=PT3S;evs.inactive_timeout=PT5S;evs.install_timeout=PT5S"
wsrep_node_address=127.0.0.1:%[8]d
wsrep_node_incoming_address=127.0.0.1:%[2]d
wsrep_sst_receive_address=127.0.0.1:%[10]d
wsrep_sst_method=rsync
`, nd.data(), nd.port, nd.socket(), nd.dir, galeraLib, nd.n, strings.Join(addrs, ","), nd.gcomm, nd.ist, nd.sst)
	if c.uid >= 0 {
		cnf += "user=mysql\n"
	}
	if err := os.WriteFile(nd.cnf(), []byte(cnf), 0o644); err != nil {
		return err
	}
	args := []string{"--no-defaults", "--datadir=" + nd.data(), "--auth-root-authentication-method=normal",
		"--skip-test-db", "--tmpdir=" + tmp}
	if c.uid >= 0 {
		args = append(args, "--user=mysql")
	}
	out, err := exec.Command(installDBBin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("node %d: %s: %v\n%s", nd.n, installDBBin, err, out)
	}
	return nil
}

// start starts the node's server; bootstrap makes it a new cluster.
func (c *cluster) start(nd *node, bootstrap bool) error {
	args := []string{"--defaults-file=" + nd.cnf()}
	if bootstrap {
		args = append(args, "--wsrep-new-cluster")
	}
	cmd := exec.Command(mariadbdBin, args...)
	// A group of its own, so that the rsync daemons of a state transfer
	// go with the server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("node %d: start: %w", nd.n, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	nd.mu.Lock()
	nd.cmd, nd.exited = cmd, exited
	nd.mu.Unlock()
	if nd.admin == nil {
		cfg := driver.NewConfig()
		cfg.User, cfg.Net, cfg.Addr = "root", "unix", nd.socket()
		cfg.Timeout = 2 * time.Second
		conn, err := driver.NewConnector(cfg)
		if err != nil {
			return err
		}
		nd.admin = sql.OpenDB(conn)
		nd.admin.SetMaxOpenConns(2)
	}
	return nil
}

// running reports whether the node's process is alive.
func (nd *node) running() bool {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd == nil {
		return false
	}
	select {
	case <-nd.exited:
		return false
	default:
		return true
	}
}

// waitSynced waits until the node is a synced, ready member of the
// primary component.
func (nd *node) waitSynced(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if !nd.running() {
			return errors.New("mariadbd exited")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		vals, err := nd.statusMap(ctx, "wsrep_ready", "wsrep_local_state_comment", "wsrep_cluster_status")
		cancel()
		switch {
		case err != nil:
			last = err
		case vals["wsrep_ready"] == "ON" && vals["wsrep_local_state_comment"] == "Synced" &&
			vals["wsrep_cluster_status"] == "Primary":
			return nil
		default:
			last = fmt.Errorf("%v", vals)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("not synced after %v: %v", timeout, last)
}

func (nd *node) statusMap(ctx context.Context, names ...string) (map[string]string, error) {
	rows, err := nd.admin.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ('"+strings.Join(names, "','")+"')")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	vals := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, err
		}
		vals[strings.ToLower(k)] = v
	}
	return vals, rows.Err()
}

// status reads one global status variable.
func (nd *node) status(t *testing.T, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	vals, err := nd.statusMap(ctx, name)
	if err != nil {
		t.Fatalf("node %d: status %s: %v", nd.n, name, err)
	}
	return vals[strings.ToLower(name)]
}

// statusInt reads one numeric global status variable.
func (nd *node) statusInt(t *testing.T, name string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(nd.status(t, name), 10, 64)
	if err != nil {
		t.Fatalf("node %d: status %s: %v", nd.n, name, err)
	}
	return n
}

func (nd *node) errorLog() string {
	b, _ := os.ReadFile(filepath.Join(nd.dir, "error.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// kill ends the node's server, and its process group, with SIGKILL.
func (nd *node) kill() {
	nd.mu.Lock()
	cmd, exited := nd.cmd, nd.exited
	nd.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
}

// stop shuts the node's server down by its PID: SIGTERM, then SIGKILL of
// its process group when it takes too long.
func (nd *node) stop() {
	nd.mu.Lock()
	cmd, exited := nd.cmd, nd.exited
	nd.mu.Unlock()
	if nd.admin != nil {
		_ = nd.admin.Close()
	}
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
	}
	// Whatever is left of the group (a state transfer's rsync daemon).
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
}

func (c *cluster) stopAll(t *testing.T) {
	var wg sync.WaitGroup
	for _, nd := range c.nodes {
		wg.Go(nd.stop)
	}
	wg.Wait()
	t.Logf("galera: all nodes stopped")
}

// dsn is the TCP DSN of node n (1-based) for the tests' account, with
// extra parameters appended (such as "wsrep_sync_wait=1", which the driver
// sends as SET on every new connection).
func (c *cluster) dsn(n int, params ...string) string {
	p := append([]string{"parseTime=true", "timeout=3s", "readTimeout=30s", "writeTimeout=30s"}, params...)
	return fmt.Sprintf("inbox@tcp(127.0.0.1:%d)/inboxmill?%s", c.nodes[n-1].port, strings.Join(p, "&"))
}

// open opens a pool on node n, closed when t ends.
func (c *cluster) open(t testing.TB, n int, params ...string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", c.dsn(n, params...))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(10)
	db.SetMaxIdleConns(10)
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("node %d: %v", n, err)
	}
	return db
}
