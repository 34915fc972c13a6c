//go:build unix

package protocol

import "syscall"

// rawReads turns connReader's one-read frame heads on (tests compare).
var rawReads = true

func rawRead(fd uintptr, b []byte) (int, error) { return syscall.Read(int(fd), b) }
