package protocol

import (
	"net"
	"syscall"
)

// cork holds back partial TCP segments on c (TCP_CORK) until uncork: a
// streamed response's small writes (the fields between record batches)
// then leave with the spliced bytes after them, in full segments, rather
// than each as a packet of its own that wakes the client. Errors are
// ignored: corking only changes how bytes are packed, never which.
func cork(c net.Conn, on bool) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return
	}
	v := 0
	if on {
		v = 1
	}
	rc.Control(func(fd uintptr) {
		syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_CORK, v)
	})
}
