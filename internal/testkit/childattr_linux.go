//go:build linux

package testkit

import "syscall"

// ChildAttr makes a child process (broker, proxy) die with the test binary:
// when `go test -timeout` kills a hung run, nothing may outlive it and hold
// its ports.
func ChildAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
