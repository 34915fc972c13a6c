//go:build !linux

package testkit

import "syscall"

// ChildAttr is a no-op off Linux, which has no parent-death signal.
func ChildAttr() *syscall.SysProcAttr { return nil }
