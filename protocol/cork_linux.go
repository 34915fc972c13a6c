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
	corkRaw(rc, on)
}

// corkRaw is cork on a socket's RawConn, which a pair keeps (connReader):
// no RawConn and no closure are made per response.
func corkRaw(rc syscall.RawConn, on bool) {
	if on {
		rc.Control(corkOn)
	} else {
		rc.Control(corkOff)
	}
}

func corkOn(fd uintptr)  { syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_CORK, 1) }
func corkOff(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_CORK, 0) }
