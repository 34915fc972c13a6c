package protocol

import (
	"io"
	"net"
	"os"
	"syscall"
)

// connReader is how the proxy reads one side of a connection. On a plain
// TCP socket a frame's four size bytes and as much of the frame as has
// arrived (up to readAhead bytes) come in one read(2), where reading the
// size and then the rest took two: a small request or response — most of
// them — crosses the proxy with one read per side instead of two, and
// pipelined small frames share one read.
//
// It holds no buffer while it waits: the read is attempted in the socket's
// raw callback (syscall.RawConn), and a pooled buffer is taken only for
// bytes that are there and given back as soon as they are consumed, so an
// idle connection costs what it did (the 1,000-idle-connections budget).
// Deadlines and a concurrent Close act on it as on net.Conn.Read: the
// runtime's poller waits, not this code.
//
// Everything that reads a pair's sockets reads through it (frames, bodies,
// held produces, streamed fetches); copyBody hands what is buffered on
// before splicing the rest socket to socket. Anything but a *net.TCPConn
// (TLS, a pipe) reads as before, size first.
type connReader struct {
	c   net.Conn
	raw syscall.RawConn // nil: not plain TCP
	// ahead: frame heads are read with raw reads (rawReads).
	ahead bool
	// lim is copyBody's limit on the socket, reused.
	lim io.LimitedReader
	// pend is what was read and not yet consumed, a part of buf, a
	// pooled buffer held only while pend is not empty.
	pend []byte
	buf  []byte

	// The raw read's callback, made once (a closure per read would be an
	// allocation per frame), and what it read.
	readFn func(fd uintptr) bool
	n      int
	rerr   error
}

// readAhead is how much one raw read takes: a 4 KiB pool class, which
// holds any frame of up to 4092 payload bytes whole.
const readAhead = 4 << 10

func newConnReader(c net.Conn) *connReader {
	r := &connReader{c: c}
	if tc, ok := c.(*net.TCPConn); ok {
		if raw, err := tc.SyscallConn(); err == nil {
			r.raw, r.ahead = raw, rawReads
			r.readFn = r.rawFill
		}
	}
	return r
}

// Read reads what is buffered, else from the socket.
func (r *connReader) Read(p []byte) (int, error) {
	if len(r.pend) == 0 {
		return r.c.Read(p)
	}
	n := copy(p, r.pend)
	r.consume(n)
	return n, nil
}

func (r *connReader) consume(n int) {
	r.pend = r.pend[n:]
	if len(r.pend) == 0 {
		putBuf(r.buf)
		r.buf, r.pend = nil, nil
	}
}

// buffered is how many bytes were read ahead and not consumed.
func (r *connReader) buffered() int { return len(r.pend) }

// fill reads what has arrived, up to readAhead bytes, when nothing is
// buffered, waiting until something has: the start of a frame. Errors are
// those of net.Conn.Read (io.EOF, a deadline's timeout, net.ErrClosed).
func (r *connReader) fill() error {
	if !r.ahead || len(r.pend) > 0 {
		return nil
	}
	err := r.raw.Read(r.readFn)
	n, rerr := r.n, r.rerr
	r.rerr = nil
	switch {
	case err != nil:
		return err
	case rerr != nil:
		return &net.OpError{Op: "read", Net: "tcp", Source: r.c.LocalAddr(), Addr: r.c.RemoteAddr(), Err: os.NewSyscallError("read", rerr)}
	case n == 0:
		return io.EOF
	}
	return nil
}

// rawFill is the raw read's callback: false (wait for the poller) when
// nothing has arrived, with no buffer kept meanwhile.
func (r *connReader) rawFill(fd uintptr) bool {
	b := getBuf(readAhead)
	var n int
	var err error
	for {
		if n, err = rawRead(fd, b); err != syscall.EINTR {
			break
		}
	}
	if err == syscall.EAGAIN {
		putBuf(b)
		return false
	}
	r.n, r.rerr = n, err
	if n > 0 {
		r.buf, r.pend = b, b[:n]
	} else {
		putBuf(b)
	}
	return true
}

// release gives back a buffer still held (the pair is closing).
func (r *connReader) release() {
	if r.buf != nil {
		putBuf(r.buf)
		r.buf, r.pend = nil, nil
	}
}

// tcpSource is the TCP socket under src for copying socket to socket,
// with what src has buffered ahead of it (to be copied first); nil when
// src is not a TCP socket.
func tcpSource(src io.Reader) (*net.TCPConn, *connReader) {
	switch s := src.(type) {
	case *net.TCPConn:
		return s, nil
	case *connReader:
		if tc, ok := s.c.(*net.TCPConn); ok {
			return tc, s
		}
	}
	return nil, nil
}
