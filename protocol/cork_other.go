//go:build !linux

package protocol

import (
	"net"
	"syscall"
)

// cork does nothing where TCP_CORK does not exist.
func cork(net.Conn, bool) {}

func corkRaw(syscall.RawConn, bool) {}
