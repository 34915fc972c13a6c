//go:build linux

package state

import "syscall"

// childAttr makes a child process (the crash child) die with the test binary:
// when `go test -timeout` kills a hung run, nothing may outlive it and hold
// its ports.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
