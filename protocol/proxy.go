// Package protocol is rtproxy's transparent Kafka proxy core: it owns the
// Kafka wire (frames, request/response headers), the connection pairs
// between clients and brokers, the broker address map (one local listener
// per upstream broker), ApiVersions capping and the rewriting of every
// response that carries a broker address, plus TLS on either side and
// SASL pass-through.
//
// Only headers are parsed on the hot path; everything that needs no rewrite
// is forwarded as raw bytes. It imports kmsg for the responses it must
// rewrite, and must never import rules/, pipeline/ or operators/: the proxy
// knows nothing of routes.
package protocol

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Config configures a Proxy. Zero values take the defaults listed.
//
// The proxy keeps no defaults of its own: they live in config.Default, and
// New refuses a Config that lacks a value it needs.
type Config struct {
	Listen          string        // bootstrap listener, e.g. "127.0.0.1:9092" (required)
	AdvertiseHost   string        // host clients are told (required)
	BrokerPortFirst int           // first per-broker port (required)
	BrokerPortCount int           // size of the per-broker port range (required)
	Upstream        []string      // seed brokers host:port (required)
	MaxFrameBytes   int32         // at least 64 (required)
	ClientTLS       *tls.Config   // nil: plaintext toward clients
	UpstreamTLS     *tls.Config   // nil: plaintext toward brokers
	ShutdownGrace   time.Duration // positive (required)
	// MaxConnections caps the client connections open at once (all
	// listeners together); one over it is closed at accept and counted in
	// rtproxy_proxy_connections_refused_total. 0: no cap but the one the
	// descriptor limit sets. Either way the cap in force is at most what
	// the process's RLIMIT_NOFILE allows (effectiveMaxConns): a busy
	// connection holds two descriptors.
	MaxConnections int
	// ClientIdleTimeout closes a client connection that sends nothing for
	// this long while none of its requests is in flight. 0: never.
	ClientIdleTimeout time.Duration
	// RequestReadTimeout closes a client connection whose request has not
	// fully arrived this long after its first byte (a slow or stalled
	// sender holding a frame buffer). 0: never.
	RequestReadTimeout time.Duration
	// MaxHeldBytes bounds the bytes of frames held whole in memory (to be
	// rewritten) across every connection; a frame waits while they are
	// used up. 0: no bound.
	MaxHeldBytes int64
	// MaxDecodedBytes bounds what one guarded or tapped Produce request's
	// records may cost once decompressed and decoded (decode.go); a
	// partition over it is refused with MESSAGE_TOO_LARGE. Positive
	// (required).
	MaxDecodedBytes int64
	// MaxRecordsPerRequest bounds the records one guarded or tapped
	// Produce request may hold. Positive (required).
	MaxRecordsPerRequest int
	// MaxDecodedBytesTotal bounds what the decodes in progress hold, all
	// connections together; a decode waits for room. At least
	// MaxDecodedBytes (required).
	MaxDecodedBytesTotal int64
	Logger               *slog.Logger // default: discard
	Registerer           prometheus.Registerer
	// FetchMetadata, when set, is how the proxy reads cluster metadata on
	// its own (at start, for readiness, and at every refresh) instead of
	// dialing a seed itself. cmd/rtproxy sets it to a franz-go client that
	// carries the proxy's own upstream SASL identity, which the raw
	// connection here does not speak. nil: dial a seed (UpstreamTLS
	// applies, no SASL).
	FetchMetadata func(ctx context.Context) (*kmsg.MetadataResponse, error)
}

const (
	// dialTimeout bounds how long a client waits before its connection is
	// closed because the upstream broker is unreachable.
	dialTimeout = 5 * time.Second
	// metadataRefresh is how often the proxy re-reads cluster metadata on
	// its own, so brokers that appear get a listener even if no client
	// asked; on failure it retries after metadataRetry.
	metadataRefresh = 30 * time.Second
	metadataRetry   = time.Second
)

// plumb gives the logger and the registry their stand-ins: a discarding
// logger, a private registry. (These are not settings; every setting is
// required, see validate.)
func (c *Config) plumb() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
}

func (c *Config) validate() error {
	if c.Listen == "" {
		return errors.New("protocol: Listen is required")
	}
	if c.AdvertiseHost == "" {
		return errors.New("protocol: AdvertiseHost is required")
	}
	if len(c.Upstream) == 0 {
		return errors.New("protocol: at least one Upstream seed broker is required")
	}
	for _, u := range c.Upstream {
		if _, _, err := net.SplitHostPort(u); err != nil {
			return fmt.Errorf("protocol: upstream %q: %w", u, err)
		}
	}
	if c.BrokerPortFirst < 1 || c.BrokerPortCount < 1 || c.BrokerPortFirst+c.BrokerPortCount-1 > 65535 {
		return fmt.Errorf("protocol: broker port range [%d, %d) is not inside 1..65535",
			c.BrokerPortFirst, c.BrokerPortFirst+c.BrokerPortCount)
	}
	if c.MaxFrameBytes < 64 {
		return fmt.Errorf("protocol: MaxFrameBytes %d is too small (at least 64)", c.MaxFrameBytes)
	}
	if c.ShutdownGrace <= 0 {
		return fmt.Errorf("protocol: ShutdownGrace %v must be positive", c.ShutdownGrace)
	}
	if c.MaxDecodedBytes <= 0 || c.MaxRecordsPerRequest <= 0 || c.MaxDecodedBytesTotal < c.MaxDecodedBytes {
		return fmt.Errorf("protocol: decode budgets: MaxDecodedBytes %d and MaxRecordsPerRequest %d must be positive, MaxDecodedBytesTotal %d at least MaxDecodedBytes",
			c.MaxDecodedBytes, c.MaxRecordsPerRequest, c.MaxDecodedBytesTotal)
	}
	return nil
}

// Proxy is a running transparent Kafka proxy.
type Proxy struct {
	// guards are the produce guards in force (guard.go); nil: none.
	guards atomic.Pointer[Guards]
	// tap receives acknowledged produced records (guard.go); nil: none.
	tap atomic.Pointer[Tap]
	// views are the views in force on the fetch path (view_wire.go);
	// nil: none. vm counts what they do.
	views atomic.Pointer[Views]
	vm    *viewMetrics
	// guardBufs are the buffers guarded and tapped batches are
	// decompressed into; decoded bounds what the decodes in progress
	// hold (MaxDecodedBytesTotal).
	guardBufs  *decompressBufs
	decoded    *heldBudget
	cfg        Config
	log        *slog.Logger
	m          *metrics
	bootstrap  net.Listener
	listenHost string
	ports      *PortMap
	ready      atomic.Bool
	seedNext   atomic.Uint32
	// active counts client connections accepted and not yet finished
	// (maxConns, the MaxConnections in force); refusedLogAt rate-limits
	// the refusal log line, acceptLog the accept-error one.
	active       atomic.Int64
	maxConns     int64
	fdLimit      uint64
	refusedLogAt atomic.Int64
	acceptLog    rateLog
	// held bounds the bytes of frames read whole (MaxHeldBytes).
	held *heldBudget
	// holdFetches turns streaming of large Fetch responses off (tests of
	// the held path).
	holdFetches bool

	// stopCtx ends accept loops and the metadata refresher.
	stopCtx context.Context
	stop    context.CancelFunc
	loops   sync.WaitGroup // accept loops and refresher
	pairs   sync.WaitGroup // connection pairs

	topics struct {
		sync.RWMutex
		byID   map[[16]byte]string
		byName map[string][16]byte
	}

	mu struct {
		sync.Mutex
		closed  bool
		brokers map[int32]*brokerEntry
		conns   map[*pair]struct{}
	}
}

// brokerEntry is one upstream broker and its local listener.
type brokerEntry struct {
	node     int32
	port     int
	upstream string // host:port, updated when metadata says it moved
	ln       net.Listener
}

// New validates cfg and opens the bootstrap listener, so port errors
// surface here rather than in Run.
func New(cfg Config) (*Proxy, error) {
	cfg.plumb()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("protocol: listen %q: %w", cfg.Listen, err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("protocol: register metrics: %w", err)
	}
	vm, err := newViewMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("protocol: register metrics: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("protocol: bootstrap listener: %w", err)
	}
	p := &Proxy{
		cfg:        cfg,
		log:        cfg.Logger,
		m:          m,
		vm:         vm,
		bootstrap:  ln,
		listenHost: host,
		ports:      NewPortMap(cfg.BrokerPortFirst, cfg.BrokerPortCount),
		held:       &heldBudget{max: cfg.MaxHeldBytes, gauge: m.heldBytes, waits: m.heldWaits},
	}
	p.fdLimit = fdLimit()
	p.maxConns = effectiveMaxConns(cfg.MaxConnections, p.fdLimit)
	p.stopCtx, p.stop = context.WithCancel(context.Background())
	p.guardBufs = &decompressBufs{}
	p.decoded = &heldBudget{max: cfg.MaxDecodedBytesTotal, gauge: m.decodedBytes, waits: m.decodedWaits}
	p.topics.byID = make(map[[16]byte]string)
	p.topics.byName = make(map[string][16]byte)
	p.mu.brokers = make(map[int32]*brokerEntry)
	p.mu.conns = make(map[*pair]struct{})
	return p, nil
}

// Addr is the bootstrap listener's actual address.
func (p *Proxy) Addr() string { return p.bootstrap.Addr().String() }

// Ready reports whether upstream metadata has been fetched at least once.
func (p *Proxy) Ready() bool { return p.ready.Load() }

// TopicName returns the topic name for a topic id seen in Metadata.
func (p *Proxy) TopicName(id [16]byte) (string, bool) {
	p.topics.RLock()
	defer p.topics.RUnlock()
	n, ok := p.topics.byID[id]
	return n, ok
}

// LearnTopic implements Mapper.
func (p *Proxy) LearnTopic(id [16]byte, name string) {
	p.topics.RLock()
	cur, ok := p.topics.byID[id]
	p.topics.RUnlock()
	if ok && cur == name {
		return
	}
	p.topics.Lock()
	p.topics.byID[id] = name
	p.topics.byName[name] = id
	p.topics.Unlock()
}

// topicID returns the id of a topic seen in Metadata.
func (p *Proxy) topicID(name string) ([16]byte, bool) {
	p.topics.RLock()
	defer p.topics.RUnlock()
	id, ok := p.topics.byName[name]
	return id, ok
}

// MapBroker implements Mapper: it records node's upstream address, opens
// its listener on first sight, and returns the address clients must use.
func (p *Proxy) MapBroker(node int32, host string, port int32) (string, int32, error) {
	upstream := net.JoinHostPort(host, strconv.Itoa(int(port)))
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.mu.brokers[node]; ok {
		if e.upstream != upstream && host != "" {
			p.log.Info("upstream broker moved", "node", node, "from", e.upstream, "to", upstream)
			e.upstream = upstream
		}
		return p.cfg.AdvertiseHost, int32(e.port), nil
	}
	e := &brokerEntry{node: node, upstream: upstream}
	lport, _, err := p.ports.Assign(node)
	for err == nil {
		ln, lerr := net.Listen("tcp", net.JoinHostPort(p.listenHost, strconv.Itoa(lport)))
		if lerr == nil {
			e.ln, e.port = ln, lport
			break
		}
		p.log.Warn("broker port busy, trying the next one", "node", node, "port", lport, "err", lerr)
		lport, err = p.ports.Reassign(node, lport)
	}
	if err != nil {
		p.log.Error("refusing broker: no local port for it", "node", node, "upstream", upstream, "err", err)
		return "", 0, fmt.Errorf("node %d: %w", node, err)
	}
	p.mu.brokers[node] = e
	p.log.Info("broker listener open", "node", node, "listen", e.ln.Addr().String(), "upstream", upstream)
	if p.mu.closed {
		e.ln.Close()
	} else {
		p.loops.Add(1)
		go p.acceptLoop(e.ln, node)
	}
	return p.cfg.AdvertiseHost, int32(e.port), nil
}

// Run serves until ctx is cancelled, then stops accepting, lets in-flight
// requests finish within ShutdownGrace, and returns nil.
func (p *Proxy) Run(ctx context.Context) error {
	p.log.Info("proxy listening", "bootstrap", p.Addr(), "advertise_host", p.cfg.AdvertiseHost,
		"broker_ports", fmt.Sprintf("%d-%d", p.cfg.BrokerPortFirst, p.cfg.BrokerPortFirst+p.cfg.BrokerPortCount-1),
		"upstream", p.cfg.Upstream)
	if p.cfg.MaxConnections > 0 && p.maxConns < int64(p.cfg.MaxConnections) {
		p.log.Warn("max_connections lowered to fit the open-file limit: a busy client connection holds two descriptors",
			"max_connections", p.cfg.MaxConnections, "in_force", p.maxConns, "rlimit_nofile", p.fdLimit,
			"reserved", fdReserve(p.fdLimit))
	} else {
		p.log.Info("client connections capped", "max_connections", p.maxConns, "rlimit_nofile", p.fdLimit)
	}
	p.loops.Add(3)
	go p.acceptLoop(p.bootstrap, -1)
	go p.refreshLoop()
	go p.idleLoop()

	<-ctx.Done()
	p.log.Info("proxy shutting down", "grace", p.cfg.ShutdownGrace)
	p.stop()
	p.mu.Lock()
	p.mu.closed = true
	p.bootstrap.Close()
	for _, e := range p.mu.brokers {
		e.ln.Close()
	}
	conns := make([]*pair, 0, len(p.mu.conns))
	for c := range p.mu.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	p.loops.Wait()

	for _, c := range conns {
		c.drain()
	}
	done := make(chan struct{})
	go func() { p.pairs.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(p.cfg.ShutdownGrace):
		p.mu.Lock()
		n := len(p.mu.conns)
		for c := range p.mu.conns {
			go c.close()
		}
		p.mu.Unlock()
		p.log.Warn("shutdown grace expired, closing connections with requests in flight", "connections", n)
		<-done
	}
	p.log.Info("proxy stopped")
	return nil
}

func (p *Proxy) acceptLoop(ln net.Listener, node int32) {
	defer p.loops.Done()
	backoff := time.Duration(0)
	for {
		c, err := ln.Accept()
		if err != nil {
			if p.stopCtx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			// Out of descriptors (EMFILE, ENFILE) or another resource:
			// counted, logged at most every 10 s with how many since,
			// and retried after a backoff that doubles up to a second,
			// so that a full table is not a busy loop of log lines.
			reason := "other"
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				reason = "out_of_descriptors"
			}
			p.m.acceptErrors.WithLabelValues(reason).Inc()
			if n, ok := p.acceptLog.allow(10 * time.Second); ok {
				p.log.Error("accept failed; retrying", "listen", ln.Addr().String(), "err", err,
					"failures_since_last_log", n, "open_connections", p.active.Load(), "max_connections", p.maxConns)
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			select {
			case <-p.stopCtx.Done():
				return
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		if max := p.maxConns; max > 0 && p.active.Load() >= max {
			p.m.connsRefused.Inc()
			if now := time.Now().UnixNano(); now-p.refusedLogAt.Load() > int64(10*time.Second) {
				p.refusedLogAt.Store(now)
				p.log.Warn("refusing client connections: max_connections reached", "max_connections", max,
					"client", c.RemoteAddr().String())
			}
			c.Close()
			continue
		}
		p.active.Add(1)
		p.pairs.Add(1)
		go func() {
			defer p.active.Add(-1)
			p.serve(c, node)
		}()
	}
}

// fdReserve is how many descriptors are kept for everything but client
// connections: listeners, the pipelines' broker connections, state files,
// the admin listener, logs.
func fdReserve(limit uint64) uint64 { return max(128, limit/8) }

// effectiveMaxConns is the cap on client connections in force: the
// configured one (0: none), at most half of what the descriptor limit
// leaves after fdReserve, since a busy connection holds its client's
// descriptor and its upstream's.
func effectiveMaxConns(configured int, limit uint64) int64 {
	if limit == 0 || limit >= 1<<40 {
		return int64(configured)
	}
	fit := int64(0)
	if r := fdReserve(limit); limit > r {
		fit = int64((limit - r) / 2)
	}
	fit = max(fit, 1)
	if configured > 0 {
		return min(int64(configured), fit)
	}
	return fit
}

// rateLog lets a log line through at most once per interval, counting the
// ones held back.
type rateLog struct {
	mu   sync.Mutex
	last time.Time
	held int
}

// allow reports whether to log now, and how many were held back since
// the last line.
func (r *rateLog) allow(every time.Duration) (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.last) >= every {
		n := r.held
		r.last, r.held = now, 0
		return n, true
	}
	r.held++
	return 0, false
}

// idleLoop closes client connections that have had no request and no
// response for ClientIdleTimeout while nothing is in flight.
func (p *Proxy) idleLoop() {
	defer p.loops.Done()
	d := p.cfg.ClientIdleTimeout
	if d <= 0 {
		return
	}
	tick := time.NewTicker(min(max(d/4, 10*time.Millisecond), time.Second))
	defer tick.Stop()
	for {
		select {
		case <-p.stopCtx.Done():
			return
		case now := <-tick.C:
			var idle []*pair
			p.mu.Lock()
			for pr := range p.mu.conns {
				if len(pr.queue) == 0 && now.Sub(time.Unix(0, pr.lastActive.Load())) >= d {
					idle = append(idle, pr)
				}
			}
			p.mu.Unlock()
			for _, pr := range idle {
				p.log.Debug("closing idle client connection", "client", pr.clientAddr, "client_idle_timeout", d)
				pr.close()
			}
		}
	}
}
