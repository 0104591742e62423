package transporttest

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel SIGKILL the consumer when the test process
// dies, however it dies; the consumer also stops when its stdin closes.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
