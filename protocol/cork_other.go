//go:build !linux

package protocol

import "net"

// cork does nothing where TCP_CORK does not exist.
func cork(net.Conn, bool) {}
