package protocol

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
)

// Streaming a large Fetch response (v16+, KIP-951).
//
// A Fetch response from v16 on may carry, in its top-level tag 0, the
// endpoints of new partition leaders, and those come after every record
// batch: the last bytes of a frame whose length travels first. Rewriting
// them used to mean holding the whole response before its first byte
// (about fetch.max.bytes per consumer). Instead the response streams to
// the client as it arrives, walked on the way, and its endpoints are
// rewritten in place at the same length: the proxy's host is written in
// the broker's host's place, and the bytes saved are filled with an
// unknown tagged field in the endpoint, which the protocol requires every
// client to skip. Node ids and racks are kept.
//
// The length can be kept when the proxy's host encodes no longer than the
// broker's, and the difference is 0 or at least 2 bytes (a tagged field
// takes two at least). That is decided before the first byte, from the
// brokers the proxy knows (streamable); otherwise the response is held
// whole as before. A response naming a broker the proxy did not know,
// whose host does not allow it, cannot be finished: the connection is
// closed, and the client fetches again through fresh metadata.

// padTags are the tag ids of the padding fields, unknown to every client
// (NodeEndpoint defines no tagged field).
const padTagA, padTagB = 126, 127

var (
	errStreamLength = errors.New("endpoint rewrite cannot keep the frame length")
	errStreamShape  = errors.New("fetch response does not walk")
)

// encLen is the length of s as a compact string.
func encLen(s string) int { return uvarintLen(uint64(len(s)+1)) + len(s) }

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// padding returns tagged fields (ids padTagA, padTagB) that encode to
// exactly d bytes, and how many fields they are; ok is false when no such
// fields exist (d is 1, or negative).
func padding(d int) (b []byte, fields int, ok bool) {
	one := func(id byte, n int) ([]byte, bool) {
		for size := 0; size <= n; size++ {
			if 1+uvarintLen(uint64(size))+size == n {
				f := append([]byte{id}, binary.AppendUvarint(nil, uint64(size))...)
				return append(f, make([]byte, size)...), true
			}
		}
		return nil, false
	}
	switch {
	case d == 0:
		return nil, 0, true
	case d < 2:
		return nil, 0, false
	}
	if f, ok := one(padTagA, d); ok {
		return f, 1, true
	}
	for first := 2; first <= d-2; first++ {
		a, okA := one(padTagA, first)
		b, okB := one(padTagB, d-first)
		if okA && okB {
			return append(a, b...), 2, true
		}
	}
	return nil, 0, false
}

// hostFits reports whether an endpoint naming upstream host can be
// rewritten to advertise at the same length.
func hostFits(upstream, advertise string) bool {
	_, _, ok := padding(encLen(upstream) - encLen(advertise))
	return ok
}

// streamable reports whether every broker the proxy knows has a host that
// an endpoint rewrite can replace at the same length.
func (p *Proxy) streamable() bool {
	if p.holdFetches {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.mu.brokers) == 0 {
		return false
	}
	for _, e := range p.mu.brokers {
		host, _, err := net.SplitHostPort(e.upstream)
		if err != nil || !hostFits(host, p.cfg.AdvertiseHost) {
			return false
		}
	}
	return true
}

// streamState is what one streamed response needs besides its bytes,
// pooled whole: a response costs no allocation of its own (the readers,
// the tee and its buffers are reused), whatever its partitions.
type streamState struct {
	br   *bufio.Reader // 32 KiB
	bw   *bufio.Writer // 64 KiB
	hr   sliceReader
	lr   io.LimitedReader
	in   headThenRest
	t    tee
	tail [256]byte // the top-level tags, when they fit (they usually are 1 byte)
}

var streamStates = sync.Pool{New: func() any {
	return &streamState{br: bufio.NewReaderSize(nil, 32<<10), bw: bufio.NewWriterSize(nil, 64<<10)}
}}

// headThenRest reads the head already read, then the rest from the socket
// (io.MultiReader without its allocations).
type headThenRest struct {
	head *sliceReader
	rest *io.LimitedReader
}

func (h *headThenRest) Read(p []byte) (int, error) {
	if len(h.head.b) > 0 {
		return h.head.Read(p)
	}
	return h.rest.Read(p)
}

// streamFetch copies one Fetch response (v16+) from src to dst as it
// arrives: head is what was read of the frame (its size prefix included),
// rest what is still to come from src. The frame keeps its length; node
// endpoints are rewritten through m in place. padded is how many of them
// were padded (rtproxy_proxy_endpoints_padded_total).
func streamFetch(dst io.Writer, src io.Reader, head []byte, rest int, m Mapper) (padded int, err error) {
	var raw syscall.RawConn
	if tc, ok := dst.(*net.TCPConn); ok && corkStreamed {
		raw, _ = tc.SyscallConn()
	}
	return streamFetchTo(dst, raw, src, head, rest, m)
}

// streamFetchTo is streamFetch with dst's RawConn for corking given (nil:
// no cork), as the pair keeps it.
func streamFetchTo(dst io.Writer, dstRaw syscall.RawConn, src io.Reader, head []byte, rest int, m Mapper) (padded int, err error) {
	st := streamStates.Get().(*streamState)
	st.hr = sliceReader{b: head[4:]}
	st.lr = io.LimitedReader{R: src, N: int64(rest)}
	st.in = headThenRest{head: &st.hr, rest: &st.lr}
	br, bw := st.br, st.bw
	br.Reset(&st.in)
	bw.Reset(dst)
	st.t = tee{r: br, w: bw, left: int64(len(head)-4) + int64(rest), head: &st.hr, lr: &st.lr, dst: dst, src: src}
	w := &st.t
	defer func() {
		br.Reset(nil)
		bw.Reset(nil)
		st.hr, st.lr, st.in, st.t = sliceReader{}, io.LimitedReader{}, headThenRest{}, tee{}
		streamStates.Put(st)
	}()
	if dstRaw != nil && corkStreamed {
		corkRaw(dstRaw, true)
		defer corkRaw(dstRaw, false)
	}
	if _, err := bw.Write(head[:4]); err != nil {
		return 0, err
	}
	w.take(4) // correlation id
	w.tags()  // response header tags (flexible)
	w.take(4 + 2 + 4)
	for t := w.compactLen(); t > 0 && w.err == nil; t-- {
		w.take(16) // topic id
		for p := w.compactLen(); p > 0 && w.err == nil; p-- {
			w.take(4 + 2 + 8 + 8 + 8)
			for a := w.compactLen(); a > 0 && w.err == nil; a-- {
				w.take(16)
				w.tags()
			}
			w.take(4)
			if n := w.compactLen(); n > 0 {
				w.copy(int64(n))
			}
			w.tags()
		}
		w.tags()
	}
	if w.err != nil {
		return 0, w.err
	}
	// What is left is the top-level tags: small, read whole, rewritten in
	// place, then sent.
	if w.left > 1<<20 {
		return 0, fmt.Errorf("%w: %d bytes after the topics", errStreamShape, w.left)
	}
	var tail []byte
	if w.left <= int64(len(st.tail)) {
		tail = st.tail[:w.left]
	} else {
		tail = make([]byte, w.left)
	}
	if _, err := io.ReadFull(br, tail); err != nil {
		return 0, fmt.Errorf("%w: %v", errStreamShape, err)
	}
	padded, err = rewriteTopTags(tail, m)
	if err != nil {
		return 0, err
	}
	if _, err := bw.Write(tail); err != nil {
		return 0, err
	}
	return padded, bw.Flush()
}

// sliceReader reads a byte slice without the bytes.Reader allocation.
type sliceReader struct{ b []byte }

func (s *sliceReader) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.b)
	s.b = s.b[n:]
	return n, nil
}

// tee reads the fields of a response from r and writes every byte it read
// to w. It keeps its first error; left is what the frame has still to give.
type tee struct {
	r    *bufio.Reader
	w    *bufio.Writer
	left int64
	err  error
	buf  [64]byte

	// For copying record batches socket to socket (splice), past the
	// buffers: head and lr are what r reads from, dst and src the sockets.
	head *sliceReader
	lr   *io.LimitedReader
	dst  io.Writer
	src  io.Reader
}

// spliceAbove is the record bytes from which copy goes socket to socket.
const spliceAbove = 64 << 10

// spliceRecords turns the socket-to-socket copy on (BenchmarkFetchResponse
// measures both).
var spliceRecords = true

// corkStreamed corks the client's socket while a response streams (cork).
var corkStreamed = true

func (t *tee) fail(err error) {
	if t.err == nil {
		t.err = err
	}
}

func (t *tee) take(n int) {
	if t.err != nil {
		return
	}
	if int64(n) > t.left {
		t.fail(fmt.Errorf("%w: field past the frame's end", errStreamShape))
		return
	}
	b := t.buf[:n]
	if _, err := io.ReadFull(t.r, b); err != nil {
		t.fail(fmt.Errorf("%w: %v", errStreamShape, err))
		return
	}
	t.left -= int64(n)
	if _, err := t.w.Write(b); err != nil {
		t.fail(err)
	}
}

// copy passes n bytes through unread (record batches). Large ones go
// socket to socket once the buffers are drained: between two TCP
// connections the kernel splices them (copyBody).
func (t *tee) copy(n int64) {
	if t.err != nil {
		return
	}
	if n > t.left {
		t.fail(fmt.Errorf("%w: %d bytes past the frame's end", errStreamShape, n))
		return
	}
	t.left -= n
	_, dstTCP := t.dst.(*net.TCPConn)
	srcTCP, _ := tcpSource(t.src)
	if n < spliceAbove || !dstTCP || srcTCP == nil || len(t.head.b) > 0 || !spliceRecords {
		if err := t.pass(n); err != nil {
			t.fail(fmt.Errorf("%w: %v", errStreamShape, err))
		}
		return
	}
	buffered := min(int64(t.r.Buffered()), n)
	if err := t.pass(buffered); err != nil {
		t.fail(fmt.Errorf("%w: %v", errStreamShape, err))
		return
	}
	if err := t.w.Flush(); err != nil {
		t.fail(err)
		return
	}
	direct := n - buffered
	if direct > t.lr.N {
		t.fail(fmt.Errorf("%w: %d bytes past the frame's end", errStreamShape, direct))
		return
	}
	t.lr.N -= direct
	if err := copyBody(t.dst, t.src, int(direct)); err != nil {
		t.fail(fmt.Errorf("%w: %v", errStreamShape, err))
	}
}

// pass copies n bytes from r to w through r's buffer (io.CopyN without
// its LimitedReader, and never through a socket's ReadFrom: w's buffer
// is written out as it fills).
func (t *tee) pass(n int64) error {
	for n > 0 {
		if t.r.Buffered() == 0 {
			if _, err := t.r.Peek(1); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return err
			}
		}
		b, _ := t.r.Peek(int(min(int64(t.r.Buffered()), n)))
		if _, err := t.w.Write(b); err != nil {
			return err
		}
		t.r.Discard(len(b))
		n -= int64(len(b))
	}
	return nil
}

func (t *tee) uvarint() uint64 {
	var v uint64
	for i := 0; i < binary.MaxVarintLen64 && t.err == nil; i++ {
		if t.left < 1 {
			t.fail(fmt.Errorf("%w: varint past the frame's end", errStreamShape))
			return 0
		}
		c, err := t.r.ReadByte()
		if err != nil {
			t.fail(fmt.Errorf("%w: %v", errStreamShape, err))
			return 0
		}
		t.left--
		if err := t.w.WriteByte(c); err != nil {
			t.fail(err)
			return 0
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return v
		}
	}
	t.fail(fmt.Errorf("%w: varint too long", errStreamShape))
	return 0
}

// compactLen reads a compact length (stored +1; 0 is null, read as 0).
func (t *tee) compactLen() int {
	v := t.uvarint()
	if v == 0 || t.err != nil {
		return 0
	}
	if v-1 > uint64(t.left) {
		t.fail(fmt.Errorf("%w: length %d past the frame's end", errStreamShape, v-1))
		return 0
	}
	return int(v - 1)
}

func (t *tee) tags() {
	for n := t.uvarint(); n > 0 && t.err == nil; n-- {
		t.uvarint()
		size := t.uvarint()
		if size > uint64(t.left) {
			t.fail(fmt.Errorf("%w: tag past the frame's end", errStreamShape))
			return
		}
		t.copy(int64(size))
	}
}

// rewriteTopTags rewrites, in place and at the same length, the node
// endpoints (tag 0) among a response's top-level tags; other tags are kept
// as they are. padded is how many endpoints were padded.
func rewriteTopTags(tail []byte, m Mapper) (padded int, err error) {
	s := skipper{p: tail}
	n := s.uvarint()
	for i := uint64(0); i < n && !s.bad; i++ {
		id := s.uvarint()
		size := s.uvarint()
		if s.bad || size > uint64(len(tail)-s.off) {
			return 0, fmt.Errorf("%w: top-level tags", errStreamShape)
		}
		payload := tail[s.off : s.off+int(size)]
		if id == 0 {
			out, n, err := rewriteEndpoints(payload, m)
			if err != nil {
				return 0, err
			}
			copy(payload, out)
			padded += n
		}
		s.skip(int(size))
	}
	if s.bad || s.off != len(tail) {
		return 0, fmt.Errorf("%w: top-level tags do not end the frame", errStreamShape)
	}
	return padded, nil
}

// rewriteEndpoints re-encodes a NodeEndpoints array (node id, host, port,
// rack, tags each) with every host and port mapped, each endpoint padded
// to its original length. The result has the length of payload; padded is
// how many endpoints needed padding fields (a host that encodes shorter).
func rewriteEndpoints(payload []byte, m Mapper) (out []byte, padded int, err error) {
	s := skipper{p: payload}
	out = make([]byte, 0, len(payload))
	count := s.uvarint()
	out = binary.AppendUvarint(out, count)
	for i := uint64(1); i < count && !s.bad; i++ {
		start := s.off
		s.skip(4)
		if s.bad {
			break
		}
		node := int32(binary.BigEndian.Uint32(payload[start:]))
		hl := s.compactLen()
		hostAt := s.off
		s.skip(max(hl, 0))
		s.skip(4)
		if s.bad {
			break
		}
		host := ""
		if hl > 0 {
			host = string(payload[hostAt : hostAt+hl])
		}
		port := int32(binary.BigEndian.Uint32(payload[s.off-4:]))
		rackAt := s.off
		if rl := s.compactLen(); rl > 0 {
			s.skip(rl)
		}
		rack := payload[rackAt:s.off]
		tagCount := s.uvarint()
		tagFieldsAt := s.off
		for j := uint64(0); j < tagCount && !s.bad; j++ {
			s.uvarint()
			s.skip(int(s.uvarint()))
		}
		if s.bad {
			break
		}
		oldLen := s.off - start
		mh, mp, err := m.MapBroker(node, host, port)
		if err != nil {
			return nil, 0, err
		}
		e := binary.BigEndian.AppendUint32(nil, uint32(node))
		e = binary.AppendUvarint(e, uint64(len(mh)+1))
		e = append(e, mh...)
		e = binary.BigEndian.AppendUint32(e, uint32(mp))
		e = append(e, rack...)
		fields := payload[tagFieldsAt:s.off]
		// The tag count may grow by one or two; its varint length is
		// part of what padding has to make up.
		var pad []byte
		var ok bool
		for extra := 0; extra <= 2; extra++ {
			base := len(e) + uvarintLen(tagCount+uint64(extra)) + len(fields)
			var k int
			if pad, k, ok = padding(oldLen - base); ok && k == extra {
				e = binary.AppendUvarint(e, tagCount+uint64(k))
				if k > 0 {
					padded++
				}
				break
			}
			ok = false
		}
		if !ok {
			return nil, 0, fmt.Errorf("%w: node %d host %q in place of %q", errStreamLength, node, mh, host)
		}
		e = append(e, fields...)
		e = append(e, pad...)
		if len(e) != oldLen {
			return nil, 0, fmt.Errorf("%w: node %d", errStreamLength, node)
		}
		out = append(out, e...)
	}
	if s.bad {
		return nil, 0, fmt.Errorf("%w: node endpoints", errStreamShape)
	}
	out = append(out, payload[s.off:]...) // the array's own tags, if any follow
	if len(out) != len(payload) {
		return nil, 0, fmt.Errorf("%w: endpoints", errStreamLength)
	}
	return out, padded, nil
}
