//go:build !linux

package driver

import "os/exec"

// dieWithParent relies on the children's -lifeline: they stop when their
// stdin, a pipe from the driver, closes.
func dieWithParent(*exec.Cmd) {}
