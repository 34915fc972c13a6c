package protocol

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// maxInFlight bounds the requests one connection may have outstanding at
// the broker. Past it the proxy stops reading the client until a response
// returns, which bounds the FIFO without dropping anything (Kafka brokers
// answer one request per connection at a time anyway).
const maxInFlight = 64

// inflight is one request awaiting its response.
type inflight struct {
	key, version int16
	corr         int32
	sent         time.Time
	// refused are the partitions of a Produce that guards refused: the
	// proxy adds them to the brokers' response (guard.go).
	refused []refusedPart
	// taps are its partitions to hand to the tap once acknowledged; they
	// alias keep, the request's buffer, released after.
	taps []tapPart
	keep []byte
	// view is set when the request named a view (view_wire.go);
	// saslUser is the username a SaslAuthenticate claims.
	view     *viewReq
	saslUser string
}

// pair is one client connection and its upstream connection. Two
// goroutines serve it: clientLoop reads requests and writes them upstream,
// brokerLoop reads responses and writes them to the client. Each blocks on
// its write when the other side is slow, which is the backpressure: at
// most one frame per direction is buffered in the proxy.
type pair struct {
	p      *Proxy
	client net.Conn
	// upstream is dialed at the client's first request (connectUpstream),
	// not at accept: an idle client holds one descriptor, not two. Set
	// once by clientLoop, under upMu, which close also takes.
	upstream net.Conn
	upMu     sync.Mutex
	// clientR and upR read client and upstream (connread.go), each
	// used by one loop only: clientLoop and brokerLoop.
	clientR    *connReader
	upR        *connReader
	node       int32           // the broker this listener stands for; -1: bootstrap
	loops      *sync.WaitGroup // brokerLoop, once started
	clientAddr string

	queue    chan inflight // FIFO of requests awaiting responses
	done     chan struct{} // closed by close()
	reqsDone chan struct{} // closed when clientLoop stops reading requests
	once     sync.Once
	draining atomic.Bool
	reported atomic.Bool // one log line per connection
	// lastActive is when the last request was read or response written
	// (unix nanos), for ClientIdleTimeout.
	lastActive atomic.Int64
	// Who is fetching, for views (view_wire.go): the TLS client
	// certificate's subject, the SASL principal the broker accepted, and
	// clientLoop's view state.
	tlsSubject string
	principal  atomic.Pointer[string]
	vs         viewConn
}

// serve runs one accepted client connection; node is -1 for the bootstrap
// listener.
func (p *Proxy) serve(c net.Conn, node int32) {
	defer p.pairs.Done()
	addr := c.RemoteAddr().String()
	tlsSubject := ""
	if p.cfg.ClientTLS != nil {
		tc := tls.Server(c, p.cfg.ClientTLS)
		c.SetDeadline(time.Now().Add(dialTimeout))
		if err := tc.Handshake(); err != nil {
			reason := "TLS handshake failed: " + err.Error()
			var rh tls.RecordHeaderError
			if errors.As(err, &rh) {
				reason = "plaintext (non-TLS) bytes sent to a TLS listener"
				p.m.frameErrors.WithLabelValues("plaintext_on_tls").Inc()
			} else {
				p.m.frameErrors.WithLabelValues("tls_handshake").Inc()
			}
			p.log.Warn("closing client connection", "client", addr, "reason", reason)
			c.Close()
			return
		}
		c.SetDeadline(time.Time{})
		if cs := tc.ConnectionState(); len(cs.PeerCertificates) > 0 {
			tlsSubject = cs.PeerCertificates[0].Subject.String()
		}
		c = tc
	}
	pr := &pair{
		p:          p,
		client:     c,
		node:       node,
		clientAddr: addr,
		tlsSubject: tlsSubject,
		clientR:    newConnReader(c),
		queue:      make(chan inflight, maxInFlight),
		done:       make(chan struct{}),
		reqsDone:   make(chan struct{}),
	}
	p.mu.Lock()
	if p.mu.closed {
		p.mu.Unlock()
		c.Close()
		return
	}
	pr.lastActive.Store(time.Now().UnixNano())
	p.mu.conns[pr] = struct{}{}
	p.mu.Unlock()
	p.m.connsOpen.Inc()
	p.m.connsTotal.Inc()

	var wg sync.WaitGroup
	pr.loops = &wg
	pr.survive("client", pr.clientLoop)
	wg.Wait()
}

// connectUpstream dials the pair's upstream and starts brokerLoop; false
// (the pair closed) when the upstream is unreachable or the pair closed
// meanwhile.
func (pr *pair) connectUpstream() bool {
	up, target, err := pr.p.dialFor(pr.node)
	if err != nil {
		pr.p.log.Warn("closing client connection: upstream unreachable", "client", pr.clientAddr, "upstream", target, "err", err)
		pr.close()
		return false
	}
	pr.upMu.Lock()
	select {
	case <-pr.done:
		pr.upMu.Unlock()
		up.Close()
		return false
	default:
	}
	pr.upstream = up
	pr.upR = newConnReader(up)
	pr.upMu.Unlock()
	pr.loops.Add(1)
	go func() { defer pr.loops.Done(); pr.survive("broker", pr.brokerLoop) }()
	return true
}

// survive runs one of the pair's loops. A panic in it is a bug in the
// proxy, never the client's doing, and it costs this connection only: it
// is logged with its stack, counted (rtproxy_proxy_panics_total), and
// the connection closed; the client reconnects as after any broken
// connection, and every other connection goes on.
func (pr *pair) survive(loop string, run func()) {
	defer func() {
		if v := recover(); v != nil {
			pr.p.m.panics.Inc()
			pr.p.log.Error("closing client connection: internal error", "client", pr.clientAddr, "loop", loop,
				"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			pr.close()
		}
	}()
	run()
}

// dialFor connects to the upstream for node, or to any reachable seed (and
// then any known broker) for the bootstrap listener.
func (p *Proxy) dialFor(node int32) (net.Conn, string, error) {
	if node >= 0 {
		p.mu.Lock()
		e := p.mu.brokers[node]
		target := ""
		if e != nil {
			target = e.upstream
		}
		p.mu.Unlock()
		if target == "" {
			return nil, fmt.Sprintf("node %d", node), fmt.Errorf("no upstream address known for node %d", node)
		}
		c, err := p.dial(target)
		return c, target, err
	}
	cands := p.bootstrapCandidates()
	var firstErr error
	for _, t := range cands {
		c, err := p.dial(t)
		if err == nil {
			return c, t, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return nil, fmt.Sprint(cands), firstErr
}

// bootstrapCandidates lists the seeds, rotated so load spreads, followed by
// brokers learned from metadata (a seed list may name only some brokers).
func (p *Proxy) bootstrapCandidates() []string {
	seeds := p.cfg.Upstream
	start := int(p.seedNext.Add(1)) % len(seeds)
	out := make([]string, 0, len(seeds)+4)
	out = append(out, seeds[start:]...)
	out = append(out, seeds[:start]...)
	p.mu.Lock()
	for _, e := range p.mu.brokers {
		out = append(out, e.upstream)
	}
	p.mu.Unlock()
	return out
}

func (p *Proxy) dial(target string) (net.Conn, error) {
	d := net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	c, err := d.DialContext(p.stopCtx, "tcp", target)
	if err != nil {
		return nil, err
	}
	if p.cfg.UpstreamTLS == nil {
		return c, nil
	}
	cfg := p.cfg.UpstreamTLS.Clone()
	if cfg.ServerName == "" {
		host, _, _ := net.SplitHostPort(target)
		cfg.ServerName = host
	}
	tc := tls.Client(c, cfg)
	ctx, cancel := context.WithTimeout(p.stopCtx, dialTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("TLS handshake with %s: %w", target, err)
	}
	return tc, nil
}

// report logs the single line a connection gets when it is closed for a
// reason worth an operator's attention.
func (pr *pair) report(msg string, args ...any) {
	if pr.reported.CompareAndSwap(false, true) {
		pr.p.log.Warn(msg, append([]any{"client", pr.clientAddr}, args...)...)
	}
}

func (pr *pair) close() {
	pr.once.Do(func() {
		pr.upMu.Lock()
		close(pr.done)
		up := pr.upstream
		pr.upMu.Unlock()
		pr.client.Close()
		if up != nil {
			up.Close()
		}
		// Whatever is still queued will never be answered.
	drained:
		for {
			select {
			case r := <-pr.queue:
				pr.p.m.api(r.key).errors.Inc()
			default:
				break drained
			}
		}
		pr.p.mu.Lock()
		delete(pr.p.mu.conns, pr)
		pr.p.mu.Unlock()
		pr.p.m.connsOpen.Dec()
	})
}

// armRead sets the client's read deadline to now+d (none when d is 0),
// unless the pair is draining: drain's deadline stands.
func (pr *pair) armRead(d time.Duration) {
	if pr.p.cfg.RequestReadTimeout <= 0 {
		return // no deadlines configured: never touch drain's
	}
	var at time.Time
	if d > 0 {
		at = time.Now().Add(d)
	}
	pr.client.SetReadDeadline(at)
	if pr.draining.Load() {
		pr.client.SetReadDeadline(time.Now())
	}
}

// drain stops reading new requests; the pair closes once the requests in
// flight are answered (or Run's grace period ends).
func (pr *pair) drain() {
	pr.draining.Store(true)
	pr.client.SetReadDeadline(time.Now())
}

// finishIfIdle closes the pair when the client stopped sending and nothing
// is left in flight. Both loops call it; close is idempotent.
func (pr *pair) finishIfIdle() {
	select {
	case <-pr.reqsDone:
		if len(pr.queue) == 0 {
			pr.close()
		}
	default:
	}
}

// errDrainedAhead is a drain's timeout for a request already read ahead.
var errDrainedAhead net.Error = &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}

func isClosedErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)
}

func (pr *pair) clientLoop() {
	p := pr.p
	var size [4]byte
	first := true
	var lastKey, lastVersion int16 = -1, -1
	// held is the request's reservation of max_held_bytes, given back
	// here too if the loop panics (a guard's bug): a reservation that
	// stayed would keep its bytes, and its need would weigh on every
	// later grant (held.go). release is idempotent.
	var held *hold
	defer func() {
		if held != nil {
			held.release()
		}
		pr.clientR.release()
	}()
	for {
		pr.armRead(0) // between requests: idleLoop watches
		var frame []byte
		var rest int
		var err error
		if pr.clientR.buffered() > 0 && pr.draining.Load() {
			// A request read ahead is not served once draining, as
			// the socket's read would have timed out (drain).
			err = errDrainedAhead
		} else {
			frame, rest, err = readFrameHead(pr.clientR, &size, p.cfg.MaxFrameBytes, first)
		}
		if err != nil {
			var ne net.Error
			if pr.draining.Load() && errors.As(err, &ne) && ne.Timeout() {
				close(pr.reqsDone)
				pr.finishIfIdle()
				return
			}

			if reason := frameReason(err); reason != "" {
				p.m.frameErrors.WithLabelValues(reason).Inc()
				pr.report("closing client connection: malformed frame", "reason", err.Error())
			} else if !isClosedErr(err) {
				p.log.Debug("client connection closed", "client", pr.clientAddr, "err", err)
			}
			pr.close()
			return
		}
		first = false
		pr.lastActive.Store(time.Now().UnixNano())
		// The rest of this request must arrive within RequestReadTimeout.
		pr.armRead(p.cfg.RequestReadTimeout)
		h, err := ParseRequestHeader(frame[4:])
		if err == nil && h.APIKey == int16(kmsg.Produce) && rest > 0 {
			if _, aerr := produceAcks(frame[4:], h); aerr != nil {
				err = aerr // a transactional id longer than the head
			}
		}
		if err != nil && rest > 0 {
			// The header may just be longer than the head: read more, but
			// never more than a header can be (maxHeaderBytes).
			if frame, rest, err = extendFrame(pr.clientR, frame, rest, maxHeaderBytes-len(frame)); err != nil {
				if reason := frameReason(err); reason != "" {
					p.m.frameErrors.WithLabelValues(reason).Inc()
				}
				pr.report("closing client connection: malformed frame", "reason", err.Error())
				pr.close()
				return
			}
			h, err = ParseRequestHeader(frame[4:])
		}
		expectResponse := true
		var acks int16
		if err == nil && h.APIKey == int16(kmsg.Produce) {
			acks, err = produceAcks(frame[4:], h)
			if err != nil {
				err = fmt.Errorf("%w: produce request truncated before acks", ErrBadHeader)
			}
			expectResponse = acks != 0
		}
		if err != nil {
			ReleaseFrame(frame)
			p.m.frameErrors.WithLabelValues("bad_header").Inc()
			reason := err.Error()
			if lastKey == int16(kmsg.SASLHandshake) && lastVersion == 0 {
				reason = "SaslHandshake v0 sends unframed SASL tokens, which the proxy cannot forward; use a client that speaks SaslHandshake v1+ (" + reason + ")"
			}
			pr.report("closing client connection: malformed frame", "reason", reason)
			pr.close()
			return
		}
		lastKey, lastVersion = h.APIKey, h.APIVersion
		var vreq *viewReq
		var saslUser string
		vs := p.views.Load()
		if h.APIKey == int16(kmsg.SASLHandshake) || h.APIKey == int16(kmsg.SASLAuthenticate) || h.APIKey == int16(kmsg.ApiVersions) {
			saslUser = pr.noteSASL(h, frame, rest)
		} else if vs != nil || pr.vs.sess != nil {
			if frame, rest, vreq, err = pr.viewRequest(vs, h, frame, rest); err != nil {
				if errors.Is(err, ErrBadHeader) {
					p.m.frameErrors.WithLabelValues("bad_request").Inc()
				}
				pr.report("closing client connection: request not read", "reason", err.Error())
				pr.close()
				return
			}
		}
		var refused []refusedPart
		var taps []tapPart
		var keep []byte // the request buffer taps alias, released with the response
		held = nil      // a produce read whole (max_held_bytes)
		if h.APIKey == int16(kmsg.Produce) {
			var gs Guards
			if g := p.guards.Load(); g != nil {
				gs = *g
			}
			var tap Tap
			if t := p.tap.Load(); t != nil && acks == -1 {
				tap = *t
			}
			if vs != nil {
				pr.viewClient(vs, h) // produce to a virtual topic is refused (inspectProduce)
			} else {
				pr.vs.set, pr.vs.virt = nil, nil
			}
			if (gs != nil || tap != nil || vs != nil) && !pr.unguardedSoleTopic(gs, tap, frame[4:], h) {
				// Read whole, checked and its tapped partitions picked
				// (guard.go); its bytes count against max_held_bytes
				// while held.
				// The reservation grows as the bytes arrive (held.go).
				held = p.held.begin(int64(len(frame) + rest))
				if !held.grow(int64(len(frame)), pr.done) {
					ReleaseFrame(frame)
					held.release()
					return
				}
				frame, refused, taps, keep, err = pr.inspectProduce(gs, tap, acks, h, frame, rest, held)
				rest = 0
				if err != nil {
					held.release()
					if errors.Is(err, net.ErrClosed) { // closed while it waited for a budget
						pr.close()
						return
					}
					reason := "truncated"
					if errors.Is(err, ErrBadHeader) {
						reason = "bad_produce"
					}
					p.m.frameErrors.WithLabelValues(reason).Inc()
					pr.report("closing client connection: produce request refused", "reason", err.Error())
					pr.close()
					return
				}
			}
		}
		if pr.upstream == nil && !pr.connectUpstream() {
			ReleaseFrame(frame)
			if keep != nil && &keep[0] != &frame[0] {
				ReleaseFrame(keep)
			}
			if held != nil {
				held.release()
			}
			return
		}
		am := p.m.api(h.APIKey)
		am.requests.Inc()
		p.m.bytesC2B.Add(float64(len(frame) + rest))
		if expectResponse {
			// Queue before writing: the response can come back before
			// Write returns.
			select {
			case pr.queue <- inflight{key: h.APIKey, version: h.APIVersion, corr: h.CorrelationID, sent: time.Now(), refused: refused, taps: taps, keep: keep,
				view: vreq, saslUser: saslUser}:
			case <-pr.done:
				ReleaseFrame(frame)
				if held != nil {
					held.release()
				}
				return
			}
		}
		_, err = pr.upstream.Write(frame)
		if keep == nil || &frame[0] != &keep[0] {
			ReleaseFrame(frame) // else released with the response (brokerLoop)
		}
		if held != nil {
			held.release()
		}
		if err == nil && rest > 0 {
			err = copyBody(pr.upstream, pr.clientR, rest)
		}
		if err != nil {
			if !expectResponse {
				am.errors.Inc()
			}
			select {
			case <-pr.done:
			default:
				if errors.Is(err, ErrFrameTruncated) { // the client stopped mid-body
					p.m.frameErrors.WithLabelValues("truncated").Inc()
				}
				pr.report("closing client connection: forwarding request failed", "upstream", pr.upstream.RemoteAddr().String(), "err", err)
			}
			pr.close()
			return
		}
	}
}

func (pr *pair) brokerLoop() {
	p := pr.p
	var size [4]byte
	defer pr.upR.release()
	for {
		frame, rest, err := readFrameHead(pr.upR, &size, p.cfg.MaxFrameBytes, false)
		if err != nil {
			select {
			case <-pr.done:
			default:
				if len(pr.queue) > 0 || !isClosedErr(err) {
					pr.report("closing client connection: upstream connection failed",
						"upstream", pr.upstream.RemoteAddr().String(), "err", err, "in_flight", len(pr.queue))
				}
			}
			pr.close()
			return
		}
		pr.lastActive.Store(time.Now().UnixNano())
		var req inflight
		select {
		case req = <-pr.queue:
		default:
			ReleaseFrame(frame)
			pr.report("closing client connection: broker sent a response with no request in flight",
				"upstream", pr.upstream.RemoteAddr().String())
			pr.close()
			return
		}
		am := p.m.api(req.key)
		am.latency.Observe(time.Since(req.sent).Seconds())
		if corr := int32(binary.BigEndian.Uint32(frame[4:])); corr != req.corr {
			ReleaseFrame(frame)
			am.errors.Inc()
			pr.report("closing client connection: response out of order",
				"want_correlation_id", req.corr, "got_correlation_id", corr, "api", kmsg.NameForKey(req.key))
			pr.close()
			return
		}
		if rest > 0 && req.key == int16(kmsg.Fetch) && req.view == nil && needsBody(req.key, req.version) && p.streamable() {
			// Streamed, its endpoints rewritten at the same length
			// (stream.go): no frame is held whole.
			p.m.bytesB2C.Add(float64(len(frame) + rest))
			padded, err := streamFetchTo(pr.client, pr.clientR.raw, pr.upR, frame, rest, p)
			p.m.endpointsPadded.Add(float64(padded))
			ReleaseFrame(frame)
			if err != nil {
				select {
				case <-pr.done:
				default:
					am.errors.Inc()
					pr.report("closing client connection: fetch response not streamed", "err", err)
				}
				pr.close()
				return
			}
			pr.finishIfIdle()
			continue
		}
		var held int64
		if rest > 0 && (needsBody(req.key, req.version) || req.refused != nil || req.taps != nil || req.view != nil) {
			var ok bool
			n := int64(len(frame) + rest)
			if req.view != nil {
				n *= 2 // and its rewrite (view_fetch.go)
			}
			if held, ok = p.held.acquire(n, pr.done); !ok {
				ReleaseFrame(frame)
				return
			}
			if frame, err = completeFrame(pr.upR, frame, rest); err != nil {
				p.held.release(held)
				am.errors.Inc()
				pr.report("closing client connection: upstream connection failed",
					"upstream", pr.upstream.RemoteAddr().String(), "err", err)
				pr.close()
				return
			}
			rest = 0
		}
		if req.taps != nil {
			if t := p.tap.Load(); t != nil {
				if off, err := responseBodyOffset(frame[4:], req.key, req.version); err == nil {
					p.deliverTaps(*t, req.version, frame[4+off:], req.taps)
				}
			}
			ReleaseFrame(req.keep)
			req.keep = nil
		}
		out := frame
		if req.refused != nil {
			merged, err := pr.mergeRefused(req, frame)
			if err != nil {
				ReleaseFrame(frame)
				p.held.release(held)
				am.errors.Inc()
				pr.report("closing client connection: cannot add the refused partitions to the produce response",
					"version", req.version, "err", err)
				pr.close()
				return
			}
			ReleaseFrame(frame)
			out = merged
		} else if rw := rewriterFor(req.key); rw != nil && rest == 0 {
			rewritten, err := pr.rewrite(rw, req, frame)
			if err != nil {
				ReleaseFrame(frame)
				p.held.release(held)
				am.errors.Inc()
				pr.report("closing client connection: cannot rewrite response",
					"api", kmsg.NameForKey(req.key), "version", req.version, "err", err)
				pr.close()
				return
			}
			if rewritten != nil {
				ReleaseFrame(frame)
				out = rewritten
			}
		}
		if req.view != nil {
			vout, err := pr.viewResponse(req, out)
			if err != nil {
				ReleaseFrame(out)
				p.held.release(held)
				am.errors.Inc()
				pr.report("closing client connection: cannot rewrite response through a view",
					"api", kmsg.NameForKey(req.key), "version", req.version, "err", err)
				pr.close()
				return
			}
			ReleaseFrame(out)
			out = vout
			if d := req.view.delay; d > 0 {
				select { // an empty answer, held as a broker holds one (view_fetch.go)
				case <-time.After(d):
				case <-pr.done:
				}
			}
		} else if req.saslUser != "" && rest == 0 {
			pr.adoptPrincipal(req, out)
		}
		p.m.bytesB2C.Add(float64(len(out) + rest))
		_, err = pr.client.Write(out)
		ReleaseFrame(out)
		p.held.release(held)
		if err == nil && rest > 0 {
			err = copyBody(pr.client, pr.upR, rest)
		}
		if err != nil {
			pr.close()
			return
		}
		pr.finishIfIdle()
	}
}

// rewrite returns a new frame when rw changed the response, nil when the
// original can be forwarded.
func (pr *pair) rewrite(rw rewriteFunc, req inflight, frame []byte) ([]byte, error) {
	off, err := responseBodyOffset(frame[4:], req.key, req.version)
	if err != nil {
		return nil, fmt.Errorf("response header: %w", err)
	}
	hdrEnd := 4 + off
	// A full slice expression with no spare capacity: the first append
	// in the rewriter copies the header into a new buffer, so Produce and
	// Fetch responses that are forwarded raw cost no allocation at all,
	// and frame is never written to.
	dst := frame[:hdrEnd:hdrEnd]
	out, changed, err := rw(pr.p, req.version, frame[hdrEnd:], dst)
	if err != nil || !changed {
		return nil, err
	}
	binary.BigEndian.PutUint32(out, uint32(len(out)-4))
	if req.key == int16(kmsg.Metadata) {
		pr.p.markReady("client metadata response")
	}
	return out, nil
}

// mergeRefused returns the Produce response frame with the refused
// partitions of req added (guard.go).
func (pr *pair) mergeRefused(req inflight, frame []byte) ([]byte, error) {
	off, err := responseBodyOffset(frame[4:], req.key, req.version)
	if err != nil {
		return nil, fmt.Errorf("response header: %w", err)
	}
	hdrEnd := 4 + off
	out, err := mergeRefused(pr.p, req.version, frame[hdrEnd:], frame[:hdrEnd:hdrEnd], req.refused)
	if err != nil {
		return nil, err
	}
	binary.BigEndian.PutUint32(out, uint32(len(out)-4))
	return out, nil
}

// unguardedSoleTopic reports whether a Produce request names a single
// topic that no guard checks and the tap does not want: it then streams
// as without guards, never read whole, so guarded traffic (and its
// reservations of max_held_bytes) cannot keep it waiting. A request that
// names several topics, or one the proxy must look up by an id it does
// not know, is read whole and checked.
func (pr *pair) unguardedSoleTopic(gs Guards, tap Tap, payload []byte, h RequestHeader) bool {
	name, id, ok := produceSoleTopic(payload, h)
	if !ok {
		return false
	}
	if h.APIVersion >= 13 {
		if name, ok = pr.p.TopicName(id); !ok {
			return false
		}
	}
	if _, refuse := pr.viewRefuses(name, id, h.APIVersion >= 13); refuse {
		return false
	}
	return (gs == nil || gs.For(name) == nil) && (tap == nil || !tap.Wants(name))
}

// needsBody reports whether a response must be held whole because it may
// be rewritten: everything with a rewriter except the non-flexible
// Produce and Fetch versions, which cannot carry node endpoints.
func needsBody(key, version int16) bool {
	switch {
	case rewriterFor(key) == nil:
		return false
	case key == int16(kmsg.Produce):
		return version >= 10 // KIP-951 endpoints (00_produce.go)
	case key == int16(kmsg.Fetch):
		return version >= 16 // KIP-951 endpoints (01_fetch.go)
	}
	return true
}
