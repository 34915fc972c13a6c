package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"unsafe"
)

// A Kafka frame on the wire is
//
//	bytes 0..3  int32 big-endian size N of what follows (the header and body)
//	bytes 4..   N bytes: request or response header, then the body
//
// The proxy keeps the four size bytes in front of the payload in the same
// buffer, so that a frame read from one side is written to the other with a
// single Write call and no copy.

// ErrFrameTooLarge is returned when a frame announces more bytes than the
// configured cap; the reason in the log line says whether the bytes looked
// like a TLS handshake instead.
var ErrFrameTooLarge = errors.New("frame exceeds max_frame_bytes")

// ErrTLSOnPlaintext is returned when the first bytes of a connection to a
// plaintext listener are a TLS handshake record (0x16 0x03 ..).
var ErrTLSOnPlaintext = errors.New("TLS handshake (ClientHello) sent to a plaintext listener")

// ErrFrameTruncated is returned when the peer closes in the middle of a frame.
var ErrFrameTruncated = errors.New("frame truncated: connection closed mid-frame")

// ErrFrameNegative is returned for a negative or too-short size prefix.
var ErrFrameNegative = errors.New("frame size is negative or smaller than a header")

// minFrame is the smallest payload that can hold anything we parse: a
// response correlation id (4 bytes). Requests are checked against their
// own 8-byte minimum by ParseRequestHeader.
const minFrame = 4

// Buffers come from size-classed pools: an idle connection owns no frame
// buffer at all, and a busy one reuses the buffer of its previous frame
// instead of allocating per request (the 1,000-idle-connections budget).
var bufClasses = [...]int{4 << 10, 64 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20}

var bufPools [len(bufClasses)]sync.Pool

func getBuf(n int) []byte {
	for i, c := range bufClasses {
		if n <= c {
			if p, ok := bufPools[i].Get().(unsafe.Pointer); ok {
				return unsafe.Slice((*byte)(p), c)[:n]
			}
			b := make([]byte, c)
			return b[:n]
		}
	}
	// Frames beyond the largest class are rare (big fetches); they are not
	// pooled so that one huge frame does not pin its memory forever.
	return make([]byte, n)
}

func putBuf(b []byte) {
	c := cap(b)
	for i, cl := range bufClasses {
		if c == cl {
			// Pooling the data pointer rather than a *[]byte keeps Put
			// from allocating a slice header per frame; the class gives
			// the capacity back on Get.
			bufPools[i].Put(unsafe.Pointer(unsafe.SliceData(b[:c])))
			return
		}
	}
}

// looksLikeTLS reports whether the first bytes are a TLS handshake record
// header: content type 22 and a 3.x record version.
func looksLikeTLS(b []byte) bool {
	return len(b) >= 2 && b[0] == 0x16 && b[1] == 0x03
}

// ReadFrame reads one size-prefixed frame from r. The returned buffer holds
// the four size bytes followed by the payload; release it with ReleaseFrame.
// sizeBuf is scratch space owned by the caller (so the size read does not
// allocate). first says whether this is the first frame of the connection,
// which is where a misdirected TLS handshake is recognised.
func ReadFrame(r io.Reader, sizeBuf *[4]byte, maxBytes int32, first bool) ([]byte, error) {
	if _, err := io.ReadFull(r, sizeBuf[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, ErrFrameTruncated
		}
		return nil, err
	}
	if first && looksLikeTLS(sizeBuf[:]) {
		return nil, ErrTLSOnPlaintext
	}
	n := int32(binary.BigEndian.Uint32(sizeBuf[:]))
	if n < minFrame {
		return nil, fmt.Errorf("%w (%d)", ErrFrameNegative, n)
	}
	if n > maxBytes {
		return nil, fmt.Errorf("%w: %d > %d bytes", ErrFrameTooLarge, n, maxBytes)
	}
	buf := getBuf(int(n) + 4)
	copy(buf, sizeBuf[:])
	if _, err := io.ReadFull(r, buf[4:]); err != nil {
		putBuf(buf)
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return nil, ErrFrameTruncated
		}
		return nil, err
	}
	return buf, nil
}

// ReleaseFrame returns a frame buffer from ReadFrame to its pool.
func ReleaseFrame(b []byte) { putBuf(b) }

// frameReason maps a read error to the short label used in
// rtproxy_proxy_frame_errors_total{reason}; "" means not a frame error.
func frameReason(err error) string {
	switch {
	case errors.Is(err, ErrTLSOnPlaintext):
		return "tls_on_plaintext"
	case errors.Is(err, ErrFrameTooLarge):
		return "too_large"
	case errors.Is(err, ErrFrameTruncated):
		return "truncated"
	case errors.Is(err, ErrFrameNegative):
		return "bad_size"
	case errors.Is(err, ErrBadHeader):
		return "bad_header"
	}
	return ""
}

// Frames above streamAbove bytes that need no rewrite are not held whole:
// the proxy reads their first headBytes (enough for any header it parses),
// forwards those, and copies the rest through as it arrives — with
// splice(2) between two plain TCP sockets. A 100 MiB produce then costs a
// 4 KiB buffer instead of 100 MiB, and the receiver starts reading while
// the sender is still writing.
const (
	streamAbove = 64 << 10
	headBytes   = 4 << 10
)

// readFrameHead is ReadFrame for frames that may be streamed: a frame of
// more than streamAbove payload bytes comes back with only its first
// headBytes payload bytes, and rest says how many are still unread on r.
func readFrameHead(r io.Reader, sizeBuf *[4]byte, maxBytes int32, first bool) (buf []byte, rest int, err error) {
	if cr, ok := r.(*connReader); ok {
		// The size and what has arrived of the frame in one read
		// (connread.go); what follows is served from it.
		if err := cr.fill(); err != nil {
			return nil, 0, err
		}
	}
	if _, err := io.ReadFull(r, sizeBuf[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, 0, ErrFrameTruncated
		}
		return nil, 0, err
	}
	if first && looksLikeTLS(sizeBuf[:]) {
		return nil, 0, ErrTLSOnPlaintext
	}
	n := int32(binary.BigEndian.Uint32(sizeBuf[:]))
	if n < minFrame {
		return nil, 0, fmt.Errorf("%w (%d)", ErrFrameNegative, n)
	}
	if n > maxBytes {
		return nil, 0, fmt.Errorf("%w: %d > %d bytes", ErrFrameTooLarge, n, maxBytes)
	}
	read := int(n)
	if read > streamAbove {
		read = headBytes
	}
	buf = getBuf(read + 4)
	copy(buf, sizeBuf[:])
	if _, err := io.ReadFull(r, buf[4:]); err != nil {
		putBuf(buf)
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return nil, 0, ErrFrameTruncated
		}
		return nil, 0, err
	}
	return buf, int(n) - read, nil
}

// maxHeaderBytes bounds how much of a request is read to find its header
// (and a produce request's acks) when they do not fit the head: a client
// id and a transactional id are at most 32767 bytes each, plus tagged
// fields. A header that does not parse within this is malformed, and the
// rest of the frame is never read: a client announcing a 100 MiB frame
// with a header that does not parse costs this much, not 100 MiB.
const maxHeaderBytes = 128 << 10

// extendFrame reads up to want more bytes of a frame whose head
// readFrameHead returned (rest bytes still unread), returning the longer
// head and what is still unread.
func extendFrame(r io.Reader, head []byte, rest, want int) ([]byte, int, error) {
	n := min(rest, want)
	longer := getBuf(len(head) + n)
	copy(longer, head)
	putBuf(head)
	if _, err := io.ReadFull(r, longer[len(head):]); err != nil {
		putBuf(longer)
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return nil, 0, ErrFrameTruncated
		}
		return nil, 0, err
	}
	return longer, rest - n, nil
}

// completeFrame reads the rest of a frame whose head readFrameHead
// returned, for the rare frame that must be seen whole after all (a
// response to rewrite, a header longer than headBytes).
func completeFrame(r io.Reader, head []byte, rest int) ([]byte, error) {
	full, _, err := extendFrame(r, head, rest, rest)
	return full, err
}

// readHeld reads the rest of a frame whose head readFrameHead returned,
// growing h as the bytes arrive: ahead of them, it reserves at most the
// larger of 64 KiB and what arrived so far, so a client that announces a
// large frame and sends little holds little (held.go).
func readHeld(r io.Reader, head []byte, rest int, h *hold, done <-chan struct{}) ([]byte, error) {
	buf := head
	for rest > 0 {
		chunk := min(rest, max(len(buf), streamAbove))
		if !h.grow(int64(chunk), done) {
			putBuf(buf)
			return nil, net.ErrClosed
		}
		nb := getBuf(len(buf) + chunk)
		copy(nb, buf)
		putBuf(buf)
		if _, err := io.ReadFull(r, nb[len(buf):]); err != nil {
			putBuf(nb)
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
				return nil, ErrFrameTruncated
			}
			return nil, err
		}
		buf = nb
		rest -= chunk
	}
	return buf, nil
}

// writerOnly hides a destination's ReadFrom so that io.CopyBuffer uses
// the pooled buffer it is given.
type writerOnly struct{ io.Writer }

// copyBody copies exactly n bytes of a frame body from src to dst.
func copyBody(dst io.Writer, src io.Reader, n int) error {
	_, dstTCP := dst.(*net.TCPConn)
	tcp, cr := tcpSource(src)
	if dstTCP && tcp != nil {
		if cr != nil && cr.buffered() > 0 {
			// What was read ahead goes first, from the buffer.
			k := min(cr.buffered(), n)
			if _, err := dst.Write(cr.pend[:k]); err != nil {
				return err
			}
			cr.consume(k)
			n -= k
		}
		// TCPConn.ReadFrom with a LimitedReader over a TCPConn splices.
		var w int64
		var err error
		if cr != nil { // io.CopyN, with the reader's LimitedReader
			cr.lim = io.LimitedReader{R: tcp, N: int64(n)}
			w, err = io.Copy(dst, &cr.lim)
			cr.lim.R = nil
			if w < int64(n) && err == nil {
				err = io.EOF
			}
		} else {
			w, err = io.CopyN(dst, tcp, int64(n))
		}
		if err != nil && w < int64(n) && errors.Is(err, io.EOF) {
			return ErrFrameTruncated
		}
		return err
	}
	buf := getBuf(streamAbove)
	defer putBuf(buf)
	w, err := io.CopyBuffer(writerOnly{dst}, io.LimitReader(src, int64(n)), buf)
	if err == nil && w < int64(n) {
		return ErrFrameTruncated
	}
	return err
}
