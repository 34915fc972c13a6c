package integration

// Fault tests for the proxy binary (issue 2, "Bad input and faults"):
// upstream down and back on the same data, many idle connections, a slow
// consumer, malformed frames, and SIGTERM during traffic. They need the
// proxy, so they skip in direct mode.

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func needProxy(t *testing.T) {
	t.Helper()
	if DirectMode() {
		t.Skip("fault tests exercise the proxy; RTPROXY_IT_DIRECT=1 runs without it")
	}
}

// rawConn speaks just enough Kafka to send requests and read frames.
type rawConn struct {
	net.Conn
	r    *bufio.Reader
	f    *kmsg.RequestFormatter
	corr int32
}

func dialRaw(t testing.TB, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{Conn: c, r: bufio.NewReaderSize(c, 64<<10), f: kmsg.NewRequestFormatter(kmsg.FormatterClientID("rtproxy-it-raw"))}
}

// send writes one request and returns its correlation id.
func (c *rawConn) send(req kmsg.Request) (int32, error) {
	c.corr++
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Write(c.f.AppendRequest(nil, req, c.corr))
	return c.corr, err
}

// readFrame reads one response frame (without its size prefix).
func (c *rawConn) readFrame(timeout time.Duration) ([]byte, error) {
	c.SetReadDeadline(time.Now().Add(timeout))
	var size [4]byte
	if _, err := io.ReadFull(c.r, size[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(size[:])
	if n > 256<<20 {
		return nil, fmt.Errorf("response frame of %d bytes", n)
	}
	b := make([]byte, n)
	_, err := io.ReadFull(c.r, b)
	return b, err
}

// apiVersions does one ApiVersions round trip and returns how many API keys
// the answer lists.
func (c *rawConn) apiVersions() (int, error) {
	req := kmsg.NewPtrApiVersionsRequest()
	req.Version = 3
	req.ClientSoftwareName = "rtproxy-it"
	req.ClientSoftwareVersion = "1"
	corr, err := c.send(req)
	if err != nil {
		return 0, err
	}
	b, err := c.readFrame(10 * time.Second)
	if err != nil {
		return 0, err
	}
	if len(b) < 4 || int32(binary.BigEndian.Uint32(b)) != corr {
		return 0, fmt.Errorf("ApiVersions response with wrong correlation id (frame %d bytes)", len(b))
	}
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = 3
	if err := resp.ReadFrom(b[4:]); err != nil {
		return 0, fmt.Errorf("decode ApiVersions response: %w", err)
	}
	if resp.ErrorCode != 0 {
		return 0, fmt.Errorf("ApiVersions error code %d", resp.ErrorCode)
	}
	return len(resp.ApiKeys), nil
}

// expectClosed fails unless the peer closes c within timeout (EOF or reset,
// not a read timeout). It returns how long the close took.
func expectClosed(t *testing.T, c net.Conn, timeout time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	c.SetReadDeadline(start.Add(timeout))
	buf := make([]byte, 64<<10)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue // drain whatever was in flight
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%s: connection still open after %v", what, timeout)
		}
		if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
			t.Logf("%s: closed with %v", what, err)
		}
		return time.Since(start)
	}
}

func healthz(t *testing.T, p *Proxy) int {
	t.Helper()
	resp, err := http.Get(p.AdminURL + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestProxyUpstreamDownAndBack(t *testing.T) {
	needProxy(t)
	const topic = "durable"
	s := StartStack(t, KfakeOpts{DataDir: t.TempDir(), Topics: map[string]int{topic: 3}}, ProxyOpts{})

	cl := NewClient(t, s.Bootstrap, kgo.RecordDeliveryTimeout(60*time.Second), kgo.ProducerBatchCompression(kgo.NoCompression()))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	before := MakeRecords(topic, "before", 100)
	if err := cl.ProduceSync(ctx, before...).FirstErr(); err != nil {
		t.Fatalf("produce before: %v", err)
	}

	brokers := MetadataBrokers(t, cl)
	s.AssertOnlyProxyAddrs(t, brokers)
	held := dialRaw(t, brokers[0])
	if _, err := held.apiVersions(); err != nil {
		t.Fatalf("ApiVersions through broker listener %s: %v", brokers[0], err)
	}

	s.Kfake.Kill()
	took := expectClosed(t, held, 5*time.Second, "client connection to "+brokers[0]+" after its upstream died")
	t.Logf("proxy closed the client connection %v after the upstream was killed", took)

	// While the broker is down, a new connection to its listener is also
	// closed promptly rather than hanging.
	fresh := dialRaw(t, brokers[0])
	if _, err := fresh.apiVersions(); err == nil {
		t.Errorf("ApiVersions succeeded through %s while every broker was down", brokers[0])
	}
	expectClosed(t, fresh, 5*time.Second, "new connection while upstream down")

	if !s.Proxy.Running() {
		t.Fatalf("proxy exited when its upstream went down; logs:\n%s", s.Proxy.Logs())
	}
	if code := healthz(t, s.Proxy); code != http.StatusOK {
		t.Errorf("/healthz = %d while upstream down, want 200 (the process is alive)", code)
	}

	s.Kfake.Restart()
	after := MakeRecords(topic, "after", 100)
	if err := cl.ProduceSync(ctx, after...).FirstErr(); err != nil {
		t.Fatalf("produce after restart through the same client: %v", err)
	}
	want := append(Values(before), Values(after)...)
	got := ConsumeQuiet(t, s.Bootstrap, topic, len(want), time.Second, 30*time.Second)
	AssertSameSet(t, "acknowledged records after the broker came back", Values(got), want)
	if _, err := dialRaw(t, brokers[0]).apiVersions(); err != nil {
		t.Errorf("broker listener %s does not work after recovery: %v", brokers[0], err)
	}
}

// metricValue finds an unlabelled sample in Prometheus text output.
func metricValue(text, name string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

func TestProxyThousandIdleConnections(t *testing.T) {
	needProxy(t)
	const conns = 1000
	s := StartStack(t, KfakeOpts{Topics: map[string]int{"idle": 3}}, ProxyOpts{})
	// Warm up: a real client round trip so that steady-state allocations
	// (metadata, listeners, pools) are in the baseline.
	Produce(t, s.Bootstrap, "idle", "warm", 10)
	time.Sleep(300 * time.Millisecond)
	base := s.Proxy.RSSKiB(t)

	open := make([]*rawConn, conns)
	var wg sync.WaitGroup
	var failed atomic.Int32
	var firstErr atomic.Value
	sem := make(chan struct{}, 32)
	for i := range conns {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := net.DialTimeout("tcp", s.Proxy.Addr, 5*time.Second)
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
				return
			}
			rc := &rawConn{Conn: c, r: bufio.NewReaderSize(c, 512), f: kmsg.NewRequestFormatter()}
			// One round trip so the proxy has paired it with an upstream.
			if _, err := rc.apiVersions(); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
			}
			open[i] = rc
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range open {
			if c != nil {
				c.Close()
			}
		}
	})
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d connections failed; first error: %v", n, conns, firstErr.Load())
	}
	time.Sleep(500 * time.Millisecond)
	held := s.Proxy.RSSKiB(t)
	growth := held - base
	perHundred := float64(growth) / 1024 / (conns / 100)
	t.Logf("proxy RSS %d KiB → %d KiB with %d idle connections: +%.1f MiB, %.2f MiB per 100 connections",
		base, held, conns, float64(growth)/1024, perHundred)
	if perHundred > 3 {
		t.Errorf("proxy RSS grew %.2f MiB per 100 idle connections, want under 3", perHundred)
	}
	if v, ok := metricValue(s.Proxy.Metrics(t), "rtproxy_proxy_connections_open"); !ok || v < conns {
		t.Errorf("rtproxy_proxy_connections_open = %v (found %v), want at least %d", v, ok, conns)
	}

	// The proxy still serves a real client, and every held connection is live.
	got := Consume(t, s.Bootstrap, "idle", 10, 20*time.Second)
	AssertSameSet(t, "records read with 1000 idle connections held", Values(got), expectedValues("warm", 10))
	for _, i := range []int{0, conns / 2, conns - 1} {
		if _, err := open[i].apiVersions(); err != nil {
			t.Errorf("held connection %d no longer works: %v", i, err)
		}
	}
}

func TestProxySlowConsumerBounded(t *testing.T) {
	needProxy(t)
	const topic = "big"
	const recSize, recs = 256 << 10, 48 // 12 MiB in one partition
	s := StartStack(t, KfakeOpts{Topics: map[string]int{topic: 1}}, ProxyOpts{})

	cl := NewClient(t, s.Kfake.Addrs, kgo.ProducerBatchCompression(kgo.NoCompression()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rs []*kgo.Record
	for i := range recs {
		v := make([]byte, recSize)
		for j := range v {
			v[j] = byte('a' + (i+j)%26)
		}
		rs = append(rs, &kgo.Record{Topic: topic, Value: v})
	}
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}

	// Find the partition leader's proxy listener.
	pcl := NewClient(t, s.Bootstrap)
	mreq := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	mreq.Topics = append(mreq.Topics, mt)
	mresp, err := mreq.RequestWith(ctx, pcl)
	if err != nil || len(mresp.Topics) != 1 || len(mresp.Topics[0].Partitions) != 1 {
		t.Fatalf("metadata for %s: %v", topic, err)
	}
	leader := mresp.Topics[0].Partitions[0].Leader
	var leaderAddr string
	for _, b := range mresp.Brokers {
		if b.NodeID == leader {
			leaderAddr = net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port)))
		}
	}
	s.AssertOnlyProxyAddrs(t, []string{leaderAddr})
	base := s.Proxy.RSSKiB(t)

	// Pipeline many whole-partition fetches and do not read: a proxy that
	// buffered responses would hold pipelined × 12 MiB.
	const pipelined = 30
	c := dialRaw(t, leaderAddr)
	for range pipelined {
		req := kmsg.NewPtrFetchRequest()
		req.Version = 11
		req.ReplicaID = -1
		req.MaxWaitMillis = 0
		req.MinBytes = 1
		req.MaxBytes = 64 << 20
		ft := kmsg.NewFetchRequestTopic()
		ft.Topic = topic
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.Partition = 0
		fp.FetchOffset = 0
		fp.PartitionMaxBytes = 32 << 20
		fp.LogStartOffset = -1
		fp.CurrentLeaderEpoch = -1
		ft.Partitions = append(ft.Partitions, fp)
		req.Topics = append(req.Topics, ft)
		if _, err := c.send(req); err != nil {
			t.Fatalf("send fetch: %v", err)
		}
	}
	peak := base
	sample := func() {
		if r := s.Proxy.RSSKiB(t); r > peak {
			peak = r
		}
	}
	for range 15 { // 3s without reading
		time.Sleep(200 * time.Millisecond)
		sample()
	}
	// Now read slowly: 256 KiB every 20 ms.
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	var size [4]byte
	if _, err := io.ReadFull(c.r, size[:]); err != nil {
		t.Fatalf("read first fetch response size: %v", err)
	}
	first := make([]byte, binary.BigEndian.Uint32(size[:]))
	for off := 0; off < len(first); {
		end := min(off+256<<10, len(first))
		if _, err := io.ReadFull(c.r, first[off:end]); err != nil {
			t.Fatalf("slow read of first response: %v", err)
		}
		off = end
		time.Sleep(20 * time.Millisecond)
		sample()
	}
	resp := kmsg.NewPtrFetchResponse()
	resp.Version = 11
	if err := resp.ReadFrom(first[4:]); err != nil {
		t.Fatalf("decode first fetch response: %v", err)
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		t.Fatalf("fetch response has %d topics", len(resp.Topics))
	}
	p := resp.Topics[0].Partitions[0]
	if p.ErrorCode != 0 || p.HighWatermark != recs || len(p.RecordBatches) < recSize {
		t.Fatalf("fetch response: error %d, high watermark %d (want %d), %d bytes of batches", p.ErrorCode, p.HighWatermark, recs, len(p.RecordBatches))
	}
	growth := float64(peak-base) / 1024
	t.Logf("slow consumer with %d pipelined fetches of ~%d MiB each: proxy RSS %d KiB, peak +%.1f MiB; first response carried %d bytes of batches",
		pipelined, recSize*recs>>20, base, growth, len(p.RecordBatches))
	if growth > 64 {
		t.Errorf("proxy RSS grew %.1f MiB under a slow consumer (would hold %d MiB if it buffered every response); want under 64 MiB",
			growth, pipelined*recSize*recs>>20)
	}
	if !s.Proxy.Running() {
		t.Fatalf("proxy died under a slow consumer")
	}
}

// waitLogLine waits up to timeout for a log line containing addr and one of
// the reason words (case-insensitive), and returns the matching lines.
func waitLogLine(p *Proxy, addr string, reasons []string, timeout time.Duration) []string {
	deadline := time.Now().Add(timeout)
	for {
		var match []string
		for _, line := range strings.Split(p.Logs(), "\n") {
			if !strings.Contains(line, addr) {
				continue
			}
			low := strings.ToLower(line)
			for _, r := range reasons {
				if strings.Contains(low, r) {
					match = append(match, line)
					break
				}
			}
		}
		if len(match) > 0 || time.Now().After(deadline) {
			return match
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestProxyMalformedFrames(t *testing.T) {
	needProxy(t)
	s := StartStack(t, KfakeOpts{Topics: map[string]int{"ok": 3}}, ProxyOpts{})
	// A good client connected before, during and after the bad ones.
	good := dialRaw(t, s.Proxy.Addr)
	if _, err := good.apiVersions(); err != nil {
		t.Fatalf("good client: %v", err)
	}
	Produce(t, s.Bootstrap, "ok", "before", 20)

	frame := func(size uint32, rest []byte) []byte {
		return append(binary.BigEndian.AppendUint32(nil, size), rest...)
	}
	cases := []struct {
		name    string
		send    func(c net.Conn) error
		reasons []string
	}{
		{"oversized length", func(c net.Conn) error {
			_, err := c.Write(frame(0x7ffffff0, []byte{0, 18, 0, 3, 0, 0, 0, 1}))
			return err
		}, []string{"size", "large", "exceed", "max"}},
		{"negative length", func(c net.Conn) error {
			_, err := c.Write(frame(0xffffffff, []byte{0, 18, 0, 3}))
			return err
		}, []string{"size", "negative", "invalid", "length", "malformed"}},
		{"garbage header", func(c net.Conn) error {
			// A 6-byte frame cannot hold api key, version and correlation id.
			_, err := c.Write(frame(6, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}))
			return err
		}, []string{"header", "malformed", "short", "truncated", "invalid"}},
		{"tls clienthello to plaintext port", func(c net.Conn) error {
			tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, ServerName: "rtproxy"})
			tc.SetDeadline(time.Now().Add(5 * time.Second))
			if err := tc.Handshake(); err == nil {
				return errors.New("TLS handshake succeeded against the plaintext port")
			}
			return nil
		}, []string{"tls"}},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			c, err := net.DialTimeout("tcp", s.Proxy.Addr, 5*time.Second)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer c.Close()
			client := c.LocalAddr().String()
			if err := tc.send(c); err != nil {
				t.Fatalf("send: %v", err)
			}
			took := expectClosed(t, c, 5*time.Second, tc.name)
			lines := waitLogLine(s.Proxy, client, tc.reasons, 10*time.Second) // returns as soon as the line is there
			if len(lines) != 1 {
				t.Errorf("want exactly one log line naming client %s and a reason (%v); got %d:\n%s\nfull log:\n%s",
					client, tc.reasons, len(lines), strings.Join(lines, "\n"), s.Proxy.Logs())
			} else {
				t.Logf("closed after %v; log: %s", took, lines[0])
			}
			if _, err := good.apiVersions(); err != nil {
				t.Errorf("the good client broke after %s: %v", tc.name, err)
			}
		})
	}
	if !s.Proxy.Running() {
		t.Fatalf("proxy exited after malformed frames")
	}
	got := Consume(t, s.Bootstrap, "ok", 20, 20*time.Second)
	AssertSameSet(t, "records through the proxy after malformed frames", Values(got), expectedValues("before", 20))
}

func TestProxySIGTERMDuringTraffic(t *testing.T) {
	needProxy(t)
	const topic = "busy"
	s := StartStack(t, KfakeOpts{Topics: map[string]int{topic: 3}}, ProxyOpts{})
	cl := NewClient(t, s.Bootstrap, kgo.RecordRetries(1), kgo.RecordDeliveryTimeout(5*time.Second))

	var mu sync.Mutex
	var acked []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			r := &kgo.Record{Topic: topic, Value: fmt.Appendf(nil, "busy-%d", i)}
			err := cl.ProduceSync(ctx, r).FirstErr()
			cancel()
			if err == nil {
				mu.Lock()
				acked = append(acked, string(r.Value))
				mu.Unlock()
			} else {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	// A reader on the same proxy, so fetches are in flight too.
	reader := NewClient(t, s.Bootstrap, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	rctx, rcancel := context.WithCancel(context.Background())
	wg.Add(1)
	go func() {
		defer wg.Done()
		for rctx.Err() == nil {
			reader.PollFetches(rctx)
		}
	}()

	// Let traffic run for at least 1.5s, and until some records are
	// acknowledged (a loaded machine can take longer than 1.5s for a fresh
	// client's first round trips), but not forever.
	ackedCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	busySince := time.Now()
	for deadline := busySince.Add(30 * time.Second); time.Since(busySince) < 1500*time.Millisecond || ackedCount() < 10; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			break
		}
	}
	n := ackedCount()
	if n == 0 {
		t.Fatalf("no records acknowledged through the proxy before SIGTERM")
	}
	start := time.Now()
	code := s.Proxy.Stop()
	t.Logf("proxy exited with %d, %v after SIGTERM, %d records acknowledged before", code, time.Since(start), n)
	close(stop)
	rcancel()
	// kgo honours the produce context only while buffering; closing the
	// clients fails whatever is still buffered towards the dead proxy.
	cl.Close()
	reader.Close()
	wg.Wait()
	if code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0; logs:\n%s", code, s.Proxy.Logs())
	}
	// Every record the proxy acknowledged is at the broker.
	mu.Lock()
	want := append([]string(nil), acked...)
	mu.Unlock()
	got := ConsumeQuiet(t, s.Kfake.Addrs, topic, len(want), time.Second, 20*time.Second)
	have := map[string]bool{}
	for _, v := range Values(got) {
		have[v] = true
	}
	for _, v := range want {
		if !have[v] {
			t.Errorf("acknowledged record %q is not at the broker", v)
		}
	}
}
