package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// tcpPair is two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() { c, _ := ln.Accept(); acc <- c }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-acc
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

func testFrame(n int, seed byte) []byte {
	f := binary.BigEndian.AppendUint32(nil, uint32(n))
	for i := range n {
		f = append(f, seed+byte(i*13))
	}
	return f
}

// Frames written back to back, small and large, come out of a connReader
// as they went in: small ones whole, a large one as its head and a body
// spliced on (with whatever was read ahead of it handed on first), and
// the reader holds no buffer once a frame is consumed.
func TestConnReaderFrames(t *testing.T) {
	w, r := tcpPair(t)
	cr := newConnReader(r)
	if !rawReads {
		t.Skip("raw reads are off on this platform")
	}
	small1, small2 := testFrame(100, 1), testFrame(3000, 2)
	big := testFrame(streamAbove+50000, 3)
	small3 := testFrame(10, 4)
	var all []byte
	for _, f := range [][]byte{small1, small2, big, small3} {
		all = append(all, f...)
	}
	go w.Write(all)

	var sz [4]byte
	for _, want := range [][]byte{small1, small2} {
		f, rest, err := readFrameHead(cr, &sz, 1<<20, true)
		if err != nil || rest != 0 || !bytes.Equal(f, want) {
			t.Fatalf("frame of %d: got %d bytes, rest %d, err %v", len(want)-4, len(f), rest, err)
		}
		ReleaseFrame(f)
	}
	head, rest, err := readFrameHead(cr, &sz, 1<<20, false)
	if err != nil || len(head) != 4+headBytes || rest != len(big)-4-headBytes {
		t.Fatalf("big frame head %d, rest %d, err %v", len(head), rest, err)
	}
	// The body spliced to another socket arrives whole.
	out, in := tcpPair(t)
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, rest)
		io.ReadFull(in, b)
		got <- b
	}()
	if err := copyBody(out, cr, rest); err != nil {
		t.Fatal(err)
	}
	if b := <-got; !bytes.Equal(append(head, b...), big) {
		t.Fatal("big frame: head + spliced body differ from what was sent")
	}
	f, rest, err := readFrameHead(cr, &sz, 1<<20, false)
	if err != nil || rest != 0 || !bytes.Equal(f, small3) {
		t.Fatalf("frame after the big one: %v %d %v", f, rest, err)
	}
	if cr.buf != nil || cr.buffered() != 0 {
		t.Fatalf("reader holds %d bytes (buffer %v) after every frame was read", cr.buffered(), cr.buf != nil)
	}

	// Bytes read ahead of a body are handed on before the splice.
	body := testFrame(20000, 5)
	go w.Write(body)
	if err := cr.fill(); err != nil {
		t.Fatal(err)
	}
	if cr.buffered() == 0 {
		t.Fatal("fill read nothing")
	}
	if _, err := io.ReadFull(cr, sz[:]); err != nil {
		t.Fatal(err)
	}
	go func() {
		b := make([]byte, 20000)
		io.ReadFull(in, b)
		got <- b
	}()
	if err := copyBody(out, cr, 20000); err != nil {
		t.Fatal(err)
	}
	if b := <-got; !bytes.Equal(b, body[4:]) {
		t.Fatal("read-ahead then spliced body differ from what was sent")
	}

	// A deadline, a close by the peer and a local close read as they do
	// on net.Conn.
	r.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	var ne net.Error
	if _, _, err := readFrameHead(cr, &sz, 1<<20, false); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("past the deadline: err %v, want a timeout", err)
	}
	r.SetReadDeadline(time.Time{})
	w.Close()
	if _, _, err := readFrameHead(cr, &sz, 1<<20, false); !errors.Is(err, io.EOF) {
		t.Fatalf("peer closed: err %v, want io.EOF", err)
	}
	r.Close()
	if _, _, err := readFrameHead(cr, &sz, 1<<20, false); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("closed: err %v, want net.ErrClosed", err)
	}
}

// A frame's size and a small frame arrive in one read(2), not two: the
// frame is in one buffer before its first byte is asked for.
func TestConnReaderOneReadPerSmallFrame(t *testing.T) {
	w, r := tcpPair(t)
	cr := newConnReader(r)
	if !rawReads {
		t.Skip("raw reads are off on this platform")
	}
	f := testFrame(1000, 9)
	if _, err := w.Write(f); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // all of it in the socket
	if err := cr.fill(); err != nil {
		t.Fatal(err)
	}
	if cr.buffered() != len(f) {
		t.Fatalf("one read took %d bytes, want the whole %d-byte frame", cr.buffered(), len(f))
	}
	// Nothing more is read from the socket for this frame: closing the
	// socket's read side before readFrameHead changes nothing.
	r.CloseRead()
	var sz [4]byte
	got, rest, err := readFrameHead(cr, &sz, 1<<20, false)
	if err != nil || rest != 0 || !bytes.Equal(got, f) {
		t.Fatalf("frame: %d bytes, rest %d, err %v", len(got), rest, err)
	}
}

// A request read ahead is not served once the connection drains: it is
// left unanswered, as it was when the drain's deadline failed the socket
// read (the client retries it on a fresh connection).
func TestDrainDoesNotServeARequestReadAhead(t *testing.T) {
	if !rawReads {
		t.Skip("raw reads are off on this platform")
	}
	upstream := startKfake(t)
	tp := startProxy(t, upstream, nil)
	cl, srv := tcpPair(t)
	var wg sync.WaitGroup
	pr := &pair{
		p:          tp.Proxy,
		client:     srv,
		node:       -1,
		loops:      &wg,
		clientAddr: cl.LocalAddr().String(),
		clientR:    newConnReader(srv),
		queue:      make(chan inflight, maxInFlight),
		done:       make(chan struct{}),
		reqsDone:   make(chan struct{}),
	}
	tp.m.connsOpen.Inc() // close counts it down
	if _, err := cl.Write(rawRequest(kmsg.NewPtrApiVersionsRequest(), 3)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if err := pr.clientR.fill(); err != nil || pr.clientR.buffered() == 0 {
		t.Fatalf("nothing read ahead: %v", err)
	}
	pr.drain()
	pr.clientLoop()
	wg.Wait()
	select {
	case <-pr.reqsDone:
	default:
		t.Fatal("the loop returned without ending its requests as a drain does")
	}
	if pr.upstream != nil {
		t.Fatal("a request read ahead was forwarded after the drain")
	}
}

// FuzzConnReaderFrames: any byte stream, written to a socket in chunks of
// any size, reads through a connReader (frame heads, bodies completed)
// as ReadFrame reads it from memory, frame for frame, down to the error
// that ends it.
func FuzzConnReaderFrames(f *testing.F) {
	cat := func(fs ...[]byte) []byte { return bytes.Join(fs, nil) }
	f.Add(cat(testFrame(10, 1), testFrame(5000, 2), testFrame(4, 3)), uint16(7))
	f.Add(cat(testFrame(100, 1), testFrame(streamAbove+100, 2), testFrame(8, 3)), uint16(4096))
	f.Add(cat(testFrame(4092, 1), testFrame(4093, 2))[:6000], uint16(1)) // cut mid-frame
	f.Add([]byte{0x16, 0x03, 0x01, 0x00, 0x10}, uint16(3))               // a TLS ClientHello
	f.Add(cat(testFrame(6, 1), []byte{0x7f, 0, 0, 0}), uint16(2))        // then a frame too large
	f.Add(cat(testFrame(6, 1), []byte{0, 0, 0, 1, 9}), uint16(9))        // then a size too small
	f.Fuzz(connReaderMatchesReadFrame)
}

func connReaderMatchesReadFrame(t *testing.T, data []byte, chunk uint16) {
	{
		if !rawReads {
			t.Skip("raw reads are off on this platform")
		}
		if len(data) > 1<<18 {
			return
		}
		const maxFrame = 1 << 17
		type result struct {
			frames [][]byte
			reason string
			eof    bool
		}
		collect := func(next func(first bool) ([]byte, error)) result {
			var res result
			for first := true; ; first = false {
				fr, err := next(first)
				if err != nil {
					res.reason, res.eof = frameReason(err), errors.Is(err, io.EOF)
					return res
				}
				res.frames = append(res.frames, bytes.Clone(fr))
				ReleaseFrame(fr)
			}
		}
		var sz [4]byte
		br := bytes.NewReader(data)
		want := collect(func(first bool) ([]byte, error) { return ReadFrame(br, &sz, maxFrame, first) })

		w, r := tcpPair(t)
		wrote := make(chan struct{})
		// The writer is done before the input is given back (the fuzzing
		// engine reuses its memory).
		defer func() { w.Close(); <-wrote }()
		go func() {
			defer close(wrote)
			// At most about 256 writes, so that an input stays fast.
			step := max(int(chunk)%8192+1, len(data)/256)
			for i := 0; i < len(data); i += step {
				if _, err := w.Write(data[i:min(i+step, len(data))]); err != nil {
					return
				}
			}
			w.CloseWrite()
		}()
		r.SetReadDeadline(time.Now().Add(10 * time.Second))
		cr := newConnReader(r)
		got := collect(func(first bool) ([]byte, error) {
			head, rest, err := readFrameHead(cr, &sz, maxFrame, first)
			if err == nil && rest > 0 {
				head, err = completeFrame(cr, head, rest)
			}
			return head, err
		})
		cr.release()
		if len(got.frames) != len(want.frames) || got.reason != want.reason || got.eof != want.eof {
			t.Fatalf("connReader: %d frames, ending %q (EOF %v); ReadFrame: %d frames, ending %q (EOF %v)",
				len(got.frames), got.reason, got.eof, len(want.frames), want.reason, want.eof)
		}
		for i := range want.frames {
			if !bytes.Equal(got.frames[i], want.frames[i]) {
				t.Fatalf("frame %d differs", i)
			}
		}
	}
}
