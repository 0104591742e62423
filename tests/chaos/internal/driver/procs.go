package driver

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// proc is one child process: the broker or a consumer. Its stdout is read
// line by line; its stderr goes to a log file; its stdin is a pipe that
// closes when the driver dies, which children started with -lifeline watch.
type proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	done    chan struct{} // closed once the process is reaped
	ready   chan struct{} // closed at the READY (or LISTEN) line
	armed   string        // "point/after" when told to kill itself

	mu        sync.Mutex
	died      string // the point of a DIE line
	stats     wire.Stats
	bye       bool
	listen    string
	conns     []int64 // database connection IDs the consumer reported
	sigkilled bool    // SIGKILL sent by the driver
	termed    bool    // SIGTERM sent by the driver
	state     *os.ProcessState
	readyOnce sync.Once
}

// procSet is every child still running, so that nothing outlives the
// driver, whatever way it ends.
type procSet struct {
	mu    sync.Mutex
	procs map[*proc]bool
}

func newProcSet() *procSet { return &procSet{procs: map[*proc]bool{}} }

func (s *procSet) add(p *proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.procs[p] = true
}

func (s *procSet) remove(p *proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.procs, p)
}

func (s *procSet) live() []*proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*proc, 0, len(s.procs))
	for p := range s.procs {
		out = append(out, p)
	}
	return out
}

// killAll SIGKILLs every child still running and waits (bounded) until
// they are reaped.
func (s *procSet) killAll() {
	for _, p := range s.live() {
		p.kill()
	}
	for _, p := range s.live() {
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
	}
}

// start starts a child. command builds the exec.Cmd; the lines the child
// prints are recorded on the proc.
func (s *procSet) start(command func(role string, args ...string) *exec.Cmd, role, name, logDir string,
	args []string) (*proc, error) {
	cmd := command(role, args...)
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), ready: make(chan struct{})}
	p.logPath = filepath.Join(logDir, strings.NewReplacer("/", "_", "#", "_").Replace(name)+".log")
	logFile, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logFile
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		logFile.Close()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	s.add(p)
	go func() {
		defer close(p.done)
		defer s.remove(p)
		defer logFile.Close()
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.line(sc.Text())
		}
		// Every line is read before Wait closes the pipe.
		_ = cmd.Wait()
		p.mu.Lock()
		p.state = cmd.ProcessState
		p.mu.Unlock()
		_ = p.stdin.Close()
	}()
	return p, nil
}

func (p *proc) line(l string) {
	word, rest, _ := strings.Cut(l, " ")
	p.mu.Lock()
	defer p.mu.Unlock()
	switch word {
	case wire.LineReady:
		p.readyOnce.Do(func() { close(p.ready) })
	case "LISTEN":
		p.listen = rest
		p.readyOnce.Do(func() { close(p.ready) })
	case wire.LineDie:
		p.died = rest
	case wire.LineStats:
		if st, err := wire.ParseStats(rest); err == nil {
			p.stats = st
		}
	case wire.LineBye:
		p.bye = true
	case wire.LineConn:
		var id int64
		if _, err := fmt.Sscan(rest, &id); err == nil {
			p.conns = append(p.conns, id)
		}
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// listenAddr is the address of a broker's LISTEN line.
func (p *proc) listenAddr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.listen
}

// exitState is the reaped process's state, nil while it runs.
func (p *proc) exitState() *os.ProcessState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

// connIDs returns the database connection IDs the consumer reported.
func (p *proc) connIDs() []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int64(nil), p.conns...)
}

// kill sends SIGKILL, remembering that the driver did.
func (p *proc) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != nil {
		return
	}
	p.sigkilled = true
	_ = p.cmd.Process.Kill()
}

// isReady reports whether the child printed its READY (or LISTEN) line.
func (p *proc) isReady() bool {
	select {
	case <-p.ready:
		return true
	default:
		return false
	}
}

// termedNow reports whether the driver has sent SIGTERM.
func (p *proc) termedNow() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.termed
}

// terminate sends SIGTERM: the child closes its router and exits 0.
func (p *proc) terminate() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != nil {
		return
	}
	p.termed = true
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
}

func (p *proc) snapshot() (died string, stats wire.Stats, bye, sigkilled, termed bool, state *os.ProcessState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.died, p.stats, p.bye, p.sigkilled, p.termed, p.state
}

// exitKind classifies how a reaped consumer ended.
type exitKind int

const (
	exitClean      exitKind = iota // exit 0 after the driver's SIGTERM
	exitSelfKill                   // SIGKILL after a DIE line
	exitDriverKill                 // SIGKILL sent by the driver
	exitBad                        // anything else: a failure of the run
)

// classify tells how p ended and, for exitBad, why that is wrong.
func (p *proc) classify() (exitKind, string) {
	died, _, bye, sigkilled, termed, state := p.snapshot()
	ws, _ := state.Sys().(syscall.WaitStatus)
	switch {
	case ws.Signaled() && ws.Signal() == syscall.SIGKILL && died != "":
		return exitSelfKill, ""
	case ws.Signaled() && ws.Signal() == syscall.SIGKILL && sigkilled:
		return exitDriverKill, ""
	case termed && state.Success() && bye:
		return exitClean, ""
	case termed:
		return exitBad, fmt.Sprintf("%s did not exit cleanly on SIGTERM (%v); log: %s", p.name, state, p.logPath)
	default:
		return exitBad, fmt.Sprintf("%s exited unexpectedly (%v); log: %s", p.name, state, p.logPath)
	}
}
