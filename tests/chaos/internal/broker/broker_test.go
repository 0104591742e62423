package broker

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childEnv makes the test binary run Main with its arguments.
const childEnv = "INBOXMILL_CHAOS_BROKER_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestStopsCleanlyOnSIGTERMRightAfterListen: the driver restarts the
// broker with SIGTERM as soon as it has printed LISTEN when two restarts
// are due at once; the broker must then stop cleanly (exit 0, its state
// written to the data directory), not die of the signal, which leaves the
// next broker without the records.
func TestStopsCleanlyOnSIGTERMRightAfterListen(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		dir := filepath.Join(t.TempDir(), "data")
		cmd := exec.Command(exe, "-topics", "t:2", "-data-dir", dir)
		// Under -race a process sleeps a second at exit, for reports to
		// come in (GORACE's atexit_sleep_ms): sixteen of them add up.
		cmd.Env = append(os.Environ(), childEnv+"=1", strings.TrimSpace("GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0"))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		listening := false
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "LISTEN ") {
				listening = true
				break
			}
		}
		if !listening {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("start %d: no LISTEN line", i)
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err = <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatalf("start %d: not stopped 30 s after SIGTERM", i)
		}
		if err != nil {
			t.Fatalf("start %d: SIGTERM right after LISTEN: %v (%s), want a clean exit", i, err, cmd.ProcessState)
		}
		if entries, err := os.ReadDir(dir); err != nil || len(entries) == 0 {
			t.Fatalf("start %d: data directory after a clean stop: %d entries, %v", i, len(entries), err)
		}
	}
}
