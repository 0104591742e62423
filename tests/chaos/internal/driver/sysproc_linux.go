package driver

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel SIGKILL the child when the driver dies,
// however it dies, and puts the child in a process group of its own, so
// that a Ctrl-C reaches the driver alone, which then stops its children in
// order. Children also watch stdin (-lifeline) in case the first fails.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
