package integration

// endpointShim makes a one-broker kfake look like a broker that sends
// KIP-951 node endpoints, which kfake does not: a listener in front of it
// that forwards every request as it is and adds, to every Fetch v16+ and
// Produce v10+ response, NodeEndpoints naming itself under a host longer
// than the proxy's advertised one. Metadata, FindCoordinator and
// DescribeCluster responses name it under the same host, so that the
// proxy knows the broker by that host and streams large Fetch responses,
// rewriting their endpoints in place with padding (protocol/stream.go).
//
// The host is "::ffff:127.0.0.1": an IPv4-mapped IPv6 literal, which Go
// dials as 127.0.0.1 without any name to resolve, and which encodes 7
// bytes longer than the proxy's "127.0.0.1".

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

type endpointShim struct {
	Addr     string // 127.0.0.1:PORT, the proxy's --upstream
	host     string // advertised in every response that names a broker
	port     int32
	upstream string
	node     atomic.Int32 // kfake's one broker, as its metadata names it

	ln net.Listener
	mu struct {
		sync.Mutex
		versions map[int16]map[int16]int // API key → version → requests
		added    map[int16]int           // API key → responses given endpoints
		errs     []error
	}
	wg sync.WaitGroup
}

// startEndpointShim listens on a free loopback port in front of upstream
// (one kfake broker) and serves until the test ends.
func startEndpointShim(t *testing.T, upstream, host string) *endpointShim {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &endpointShim{Addr: ln.Addr().String(), host: host, port: int32(ln.Addr().(*net.TCPAddr).Port), upstream: upstream, ln: ln}
	s.reset()
	var conns sync.Map
	t.Cleanup(func() {
		ln.Close()
		conns.Range(func(c, _ any) bool { c.(net.Conn).Close(); return true })
		s.wg.Wait()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, err := range s.mu.errs {
			t.Errorf("endpoint shim: %v", err)
		}
	})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				s.fail(fmt.Errorf("dial kfake: %w", err))
				continue
			}
			conns.Store(c, true)
			conns.Store(u, true)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.serve(c, u)
				conns.Delete(c)
				conns.Delete(u)
			}()
		}
	}()
	return s
}

// reset forgets the versions and counts seen so far (one client's phase).
func (s *endpointShim) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.versions = map[int16]map[int16]int{}
	s.mu.added = map[int16]int{}
}

// versions returns the versions of key requested since the last reset.
func (s *endpointShim) versions(key kmsg.Key) map[int16]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int16]int{}
	for v, n := range s.mu.versions[int16(key)] {
		out[v] = n
	}
	return out
}

// added returns how many responses of key were given endpoints since the
// last reset.
func (s *endpointShim) added(key kmsg.Key) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.added[int16(key)]
}

func (s *endpointShim) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.errs = append(s.mu.errs, err)
}

type shimRequest struct {
	key, version int16
	corr         int32
}

// serve forwards one client connection's requests to u and u's responses
// back, rewritten. Requests that get no response (Produce with acks=0)
// are not queued.
func (s *endpointShim) serve(c, u net.Conn) {
	defer c.Close()
	defer u.Close()
	inflight := make(chan shimRequest, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer u.Close()
		for {
			frame, err := readShimFrame(c)
			if err != nil {
				return
			}
			req, hasResponse, err := parseShimRequest(frame)
			if err != nil {
				s.fail(err)
				return
			}
			s.mu.Lock()
			if s.mu.versions[req.key] == nil {
				s.mu.versions[req.key] = map[int16]int{}
			}
			s.mu.versions[req.key][req.version]++
			s.mu.Unlock()
			if hasResponse {
				inflight <- req
			}
			if _, err := u.Write(frame); err != nil {
				return
			}
		}
	}()
	for {
		frame, err := readShimFrame(u)
		if err != nil {
			break
		}
		var req shimRequest
		select {
		case req = <-inflight:
		case <-done:
			return
		}
		out, err := s.rewrite(req, frame)
		if err != nil {
			s.fail(fmt.Errorf("%s v%d: %w", kmsg.NameForKey(req.key), req.version, err))
			return
		}
		if _, err := c.Write(out); err != nil {
			break
		}
	}
	<-done
}

// readShimFrame reads one size-prefixed frame, the prefix included.
func readShimFrame(r io.Reader) ([]byte, error) {
	var size [4]byte
	if _, err := io.ReadFull(r, size[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(size[:])
	if n > 256<<20 {
		return nil, fmt.Errorf("frame of %d bytes", n)
	}
	frame := make([]byte, 4+n)
	copy(frame, size[:])
	_, err := io.ReadFull(r, frame[4:])
	return frame, err
}

// parseShimRequest reads a request's header and reports whether a
// response will come (not for Produce with acks=0).
func parseShimRequest(frame []byte) (shimRequest, bool, error) {
	b := frame[4:]
	if len(b) < 10 {
		return shimRequest{}, false, errors.New("short request")
	}
	req := shimRequest{
		key:     int16(binary.BigEndian.Uint16(b)),
		version: int16(binary.BigEndian.Uint16(b[2:])),
		corr:    int32(binary.BigEndian.Uint32(b[4:])),
	}
	if req.key != int16(kmsg.Produce) {
		return req, true, nil
	}
	off := 8
	if l := int16(binary.BigEndian.Uint16(b[off:])); l > 0 {
		off += int(l)
	}
	off += 2
	pr := kmsg.NewPtrProduceRequest()
	pr.SetVersion(req.version)
	if pr.IsFlexible() {
		n, err := skipShimTags(b[off:])
		if err != nil {
			return req, false, err
		}
		off += n
	}
	if err := pr.ReadFrom(b[off:]); err != nil {
		return req, false, fmt.Errorf("produce request v%d: %w", req.version, err)
	}
	return req, pr.Acks != 0, nil
}

// skipShimTags returns the length of the tagged fields at the start of b.
func skipShimTags(b []byte) (int, error) {
	count, off := binary.Uvarint(b)
	if off <= 0 {
		return 0, errors.New("bad tag count")
	}
	for range count {
		_, n := binary.Uvarint(b[off:])
		if n <= 0 {
			return 0, errors.New("bad tag id")
		}
		off += n
		size, n := binary.Uvarint(b[off:])
		if n <= 0 || uint64(len(b)-off-n) < size {
			return 0, errors.New("bad tag size")
		}
		off += n + int(size)
	}
	return off, nil
}

// rewrite returns the response frame as the client should see it.
func (s *endpointShim) rewrite(req shimRequest, frame []byte) ([]byte, error) {
	if got := int32(binary.BigEndian.Uint32(frame[4:])); got != req.corr {
		return nil, fmt.Errorf("correlation id %d, want %d", got, req.corr)
	}
	switch kmsg.Key(req.key) {
	case kmsg.Metadata, kmsg.FindCoordinator, kmsg.DescribeCluster:
	case kmsg.Fetch:
		if req.version < 16 {
			return frame, nil
		}
	case kmsg.Produce:
		if req.version < 10 {
			return frame, nil
		}
	default:
		return frame, nil
	}
	resp := kmsg.ResponseForKey(req.key)
	resp.SetVersion(req.version)
	hdr := 8 // size, correlation id
	if resp.IsFlexible() {
		n, err := skipShimTags(frame[hdr:])
		if err != nil {
			return nil, err
		}
		hdr += n
	}
	if err := resp.ReadFrom(frame[hdr:]); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	switch r := resp.(type) {
	case *kmsg.MetadataResponse:
		for i := range r.Brokers {
			r.Brokers[i].Host, r.Brokers[i].Port = s.host, s.port
			s.node.Store(r.Brokers[i].NodeID)
		}
	case *kmsg.FindCoordinatorResponse:
		if r.NodeID >= 0 {
			r.Host, r.Port = s.host, s.port
		}
		for i := range r.Coordinators {
			if r.Coordinators[i].NodeID >= 0 {
				r.Coordinators[i].Host, r.Coordinators[i].Port = s.host, s.port
			}
		}
	case *kmsg.DescribeClusterResponse:
		for i := range r.Brokers {
			r.Brokers[i].Host, r.Brokers[i].Port = s.host, s.port
		}
	case *kmsg.FetchResponse:
		b := kmsg.NewFetchResponseBroker()
		b.NodeID, b.Host, b.Port = s.node.Load(), s.host, s.port
		r.Brokers = append(r.Brokers[:0], b)
		s.count(req.key)
	case *kmsg.ProduceResponse:
		b := kmsg.NewProduceResponseBroker()
		b.NodeID, b.Host, b.Port = s.node.Load(), s.host, s.port
		r.Brokers = append(r.Brokers[:0], b)
		s.count(req.key)
	}
	out := append([]byte(nil), frame[:hdr]...)
	out = resp.AppendTo(out)
	binary.BigEndian.PutUint32(out, uint32(len(out)-4))
	return out, nil
}

func (s *endpointShim) count(key int16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.added[key]++
}

// hostPort is the shim as its responses name it.
func (s *endpointShim) hostPort() string {
	return net.JoinHostPort(s.host, strconv.Itoa(int(s.port)))
}
