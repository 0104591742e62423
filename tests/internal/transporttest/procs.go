package transporttest

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stretchr/testify/require"
)

// Proc is one consumer process.
type Proc struct {
	Name  string
	log   string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	ready chan struct{}
	done  chan struct{} // closed once the process is reaped

	mu    sync.Mutex
	state *os.ProcessState
	bye   bool
	die   *Line
	once  sync.Once
}

// Start starts a consumer process running s and waits until its router
// runs. The process is killed when the test ends, if it still runs.
func (e *Env) Start(s Spec) *Proc {
	t := e.T
	t.Helper()
	raw, err := json.Marshal(s)
	require.NoError(t, err)
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), specEnv+"="+string(raw))
	p := &Proc{Name: s.Consumer, cmd: cmd, ready: make(chan struct{}), done: make(chan struct{}),
		log: filepath.Join(e.logDir, s.Consumer+".log")}
	logFile, err := os.Create(p.log)
	require.NoError(t, err)
	cmd.Stderr = logFile
	p.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	dieWithParent(cmd)
	require.NoError(t, cmd.Start())
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	go func() {
		defer close(p.done)
		defer logFile.Close()
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var l Line
			if json.Unmarshal(sc.Bytes(), &l) != nil {
				continue
			}
			switch l.Word {
			case WordReady:
				p.once.Do(func() { close(p.ready) })
			case WordBye:
				p.mu.Lock()
				p.bye = true
				p.mu.Unlock()
			case WordDie:
				p.mu.Lock()
				p.die = &l
				p.mu.Unlock()
			}
			e.record(l)
		}
		_ = cmd.Wait() // every line is read before Wait closes the pipe
		p.mu.Lock()
		p.state = cmd.ProcessState
		p.mu.Unlock()
		_ = p.stdin.Close()
	}()
	select {
	case <-p.ready:
	case <-p.done:
		t.Fatalf("consumer %s exited before it was ready; log:\n%s", p.Name, tail(p.log))
	case <-time.After(waitLimit):
		t.Fatalf("consumer %s was not ready within %v; log:\n%s", p.Name, waitLimit, tail(p.log))
	}
	return p
}

// WaitKilled waits until p has killed itself and returns its DIE line.
func (e *Env) WaitKilled(p *Proc) Line {
	t := e.T
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(waitLimit):
		t.Fatalf("consumer %s did not reach its kill point within %v", p.Name, waitLimit)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ws, _ := p.state.Sys().(syscall.WaitStatus)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "consumer %s ended with %v, not SIGKILL; log:\n%s",
		p.Name, p.state, tail(p.log))
	require.NotNil(t, p.die, "consumer %s died without its DIE line", p.Name)
	return *p.die
}

// Stop sends SIGTERM to every process and requires each to close its router
// and exit 0.
func (e *Env) Stop(ps ...*Proc) {
	t := e.T
	t.Helper()
	for _, p := range ps {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range ps {
		select {
		case <-p.done:
		case <-time.After(waitLimit):
			t.Fatalf("consumer %s did not stop within %v after SIGTERM", p.Name, waitLimit)
		}
		p.mu.Lock()
		require.True(t, p.state.Success() && p.bye, "consumer %s ended with %v (BYE: %v); log:\n%s", p.Name, p.state,
			p.bye, tail(p.log))
		p.mu.Unlock()
	}
}

// killAll kills every process still running and waits until they are reaped.
func (e *Env) killAll() {
	e.mu.Lock()
	ps := append([]*Proc(nil), e.procs...)
	e.mu.Unlock()
	for _, p := range ps {
		select {
		case <-p.done:
			continue
		default:
		}
		_ = p.cmd.Process.Kill()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
	}
}

// dumpLogs shows the end of every process's log.
func (e *Env) dumpLogs() {
	e.mu.Lock()
	ps := append([]*Proc(nil), e.procs...)
	e.mu.Unlock()
	for _, p := range ps {
		e.T.Logf("%s:\n%s", p.Name, tail(p.log))
	}
}

// tail returns the last 150 lines of the file at path.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 150 {
		lines = lines[len(lines)-150:]
	}
	return strings.Join(lines, "\n")
}
