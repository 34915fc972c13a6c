package protocol

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// freePorts reserves n loopback ports and releases them for kfake to take.
func freePorts(t *testing.T, n int) []string {
	var ports []string
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports = append(ports, fmt.Sprint(ln.Addr().(*net.TCPAddr).Port))
	}
	for _, ln := range lns {
		ln.Close()
	}
	return ports
}

func TestUpstreamDownAndBack(t *testing.T) {
	ports := strings.Join(freePorts(t, 3), ",")
	dataDir := t.TempDir()
	args := []string{"-ports", ports, "-data-dir", dataDir, "-topics", "durable:3"}
	upstream, kf := startKfakeProc(t, args...)
	tp := startProxy(t, upstream, nil)

	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ProducerLinger(0),
		kgo.RecordRetries(100), kgo.RetryTimeout(60*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	produce := func(from, to int) {
		for i := from; i < to; i++ {
			r := &kgo.Record{Topic: "durable", Key: []byte(fmt.Sprint(i)), Value: []byte(fmt.Sprintf("v%d", i))}
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatalf("produce %d: %v", i, err)
			}
		}
	}
	produce(0, 50)

	kf.Process.Signal(syscall.SIGKILL)
	kf.Wait()

	// A new client connection is closed promptly at its first request
	// (the upstream is dialed then), with a log line.
	start := time.Now()
	c, err := net.Dial("tcp", tp.Addr())
	if err != nil {
		t.Fatalf("proxy stopped accepting: %v", err)
	}
	c.Write(rawRequest(kmsg.NewPtrApiVersionsRequest(), 1))
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("client connection not closed while upstream is down: %v", err)
	}
	c.Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("closing took %v", d)
	}
	tp.waitLog(t, "upstream unreachable", c.LocalAddr().String())

	// Same ports, same data: the client resumes and nothing acknowledged is lost.
	upstream2, _ := startKfakeProc(t, args...)
	if strings.Join(upstream2, ",") != strings.Join(upstream, ",") {
		t.Fatalf("kfake came back on %v, want %v", upstream2, upstream)
	}
	produce(50, 100)

	cc, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ConsumeTopics("durable"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	got := map[string]string{}
	for len(got) < 100 && ctx.Err() == nil {
		cc.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got[string(r.Key)] = string(r.Value) })
	}
	for i := range 100 {
		if got[fmt.Sprint(i)] != fmt.Sprintf("v%d", i) {
			t.Fatalf("record %d = %q after restart (have %d records)", i, got[fmt.Sprint(i)], len(got))
		}
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// selfSigned returns a CA-less self-signed certificate for 127.0.0.1.
func selfSigned(t *testing.T, cn string) (tls.Certificate, *x509.CertPool) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

func TestClientTLS(t *testing.T) {
	upstream := startKfake(t, "-topics", "secure:1")
	serverCert, serverPool := selfSigned(t, "proxy")
	clientCert, clientPool := selfSigned(t, "client")
	tp := startProxy(t, upstream, func(c *Config) {
		c.ClientTLS = &tls.Config{
			Certificates: []tls.Certificate{serverCert},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    clientPool,
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ProducerLinger(0),
		kgo.DialTLSConfig(&tls.Config{RootCAs: serverPool, Certificates: []tls.Certificate{clientCert}}),
		kgo.ConsumeTopics("secure"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	big := "tls-big-" + strings.Repeat("z", 300<<10) // streamed from a TLS conn
	for i := range 10 {
		v := fmt.Sprint("tls-", i)
		if i == 5 {
			v = big
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "secure", Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("produce over TLS: %v", err)
		}
	}
	var got []string
	for len(got) < 10 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	if len(got) != 10 || got[0] != "tls-0" || got[9] != "tls-9" || got[5] != big {
		t.Fatalf("consumed over TLS: %v", got)
	}

	// Plaintext to the TLS port: closed, and the log line says why.
	c, err := net.Dial("tcp", tp.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c.Write(rawRequest(kmsg.NewPtrApiVersionsRequest(), 1))
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if n, err := c.Read(make([]byte, 64)); err == nil {
		t.Fatalf("plaintext client got %d bytes from a TLS port", n)
	}
	tp.waitLog(t, c.LocalAddr().String(), "plaintext (non-TLS) bytes sent to a TLS listener")
	c.Close()

	// No client certificate: refused.
	nc, err := tls.Dial("tcp", tp.Addr(), &tls.Config{RootCAs: serverPool})
	if err == nil {
		nc.SetDeadline(time.Now().Add(3 * time.Second))
		nc.Write(rawRequest(kmsg.NewPtrApiVersionsRequest(), 1))
		_, err = nc.Read(make([]byte, 64))
		nc.Close()
	}
	if err == nil {
		t.Fatal("client without a certificate was served")
	}
}

func TestShutdownDrainsInFlight(t *testing.T) {
	upstream := startKfake(t, "-topics", "quiet:1")
	// The fetch below parks at the broker for 8s, within the grace: long
	// enough that even a loaded machine (CI runs the pipeline and
	// integration packages beside this one) closes the listeners first.
	tp := startProxy(t, upstream, func(c *Config) { c.ShutdownGrace = 20 * time.Second })
	c, err := net.Dial("tcp", tp.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Find the partition leader's proxy port so the fetch long-polls.
	md := kmsg.NewPtrMetadataRequest()
	md.SetVersion(4)
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr("quiet")
	md.Topics = append(md.Topics, mt)
	c.Write(rawRequest(md, 1))
	_, payload := readResponse(t, c)
	var mr kmsg.MetadataResponse
	mr.SetVersion(4)
	if err := mr.ReadFrom(payload[4:]); err != nil {
		t.Fatal(err)
	}
	var leader string
	for _, b := range mr.Brokers {
		if b.NodeID == mr.Topics[0].Partitions[0].Leader {
			leader = net.JoinHostPort(b.Host, fmt.Sprint(b.Port))
		}
	}
	lc, err := net.Dial("tcp", leader)
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	f := kmsg.NewPtrFetchRequest()
	f.SetVersion(11)
	f.MaxWaitMillis, f.MinBytes, f.MaxBytes = 8000, 1, 1<<20
	ft := kmsg.NewFetchRequestTopic()
	ft.Topic = "quiet"
	fp := kmsg.NewFetchRequestTopicPartition()
	fp.PartitionMaxBytes = 1 << 20
	ft.Partitions = append(ft.Partitions, fp)
	f.Topics = append(f.Topics, ft)
	if _, err := lc.Write(rawRequest(f, 42)); err != nil {
		t.Fatal(err)
	}
	// Wait until the proxy has read the fetch and queued it (it is then
	// parked at the broker for MaxWaitMillis, within the 20s ShutdownGrace),
	// rather than sleeping a fixed time that a loaded machine may not honour.
	fetches := tp.m.api(int16(kmsg.Fetch)).requests
	for deadline := time.Now().Add(10 * time.Second); metricValue(t, fetches) < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the proxy did not read the fetch within 10s")
		}
	}
	parked := time.Now()

	stopped := make(chan struct{})
	go func() { tp.stop(); close(stopped) }()
	// While the fetch is still parked, a new connection must not be served:
	// either the dial is refused, or the connection is closed without an
	// answer to a request sent on it. (Reading without sending anything
	// could never succeed, so a request is sent.) Poll, since stop may take
	// a moment to close the listener; give up well before the fetch returns.
	served := false
	tries := 0
	for end := parked.Add(6 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		tries++
		c2, err := net.DialTimeout("tcp", tp.Addr(), 200*time.Millisecond)
		if err != nil {
			// Refused: not served (an earlier try may have been, before
			// stop closed the listener).
			served = false
			break
		}
		c2.SetDeadline(time.Now().Add(300 * time.Millisecond))
		c2.Write(rawRequest(kmsg.NewPtrApiVersionsRequest(), 7))
		_, rerr := c2.Read(make([]byte, 4))
		c2.Close()
		served = rerr == nil
		if !served || time.Now().After(end) {
			break
		}
	}
	if served {
		t.Fatalf("proxy still serving new connections during shutdown (%d tries over %v); logs:\n%s",
			tries, time.Since(parked), tp.logs.String())
	}
	// The fetch answers when its 8s wait ends, after readResponse's usual
	// 5s deadline, so read it here.
	lc.SetReadDeadline(time.Now().Add(20 * time.Second))
	var size [4]byte
	frame, err := ReadFrame(lc, &size, 1<<26, false)
	if err != nil {
		t.Fatalf("in-flight fetch: %v", err)
	}
	if corr := int32(binary.BigEndian.Uint32(frame[4:])); corr != 42 {
		t.Fatalf("in-flight fetch answered with correlation id %d", corr)
	}
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after the in-flight request finished")
	}
	tp.waitLog(t, "proxy stopped")
}

func TestIdleConnectionsMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 1,000 connections")
	}
	upstream := startKfake(t)
	tp := startProxy(t, upstream, nil)
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse + ms.StackInuse
	}
	before := heap()
	const n = 1000
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := net.Dial("tcp", tp.Addr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	deadline := time.Now().Add(20 * time.Second)
	for metricValue(t, tp.m.connsOpen) < n && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if v := metricValue(t, tp.m.connsOpen); v != n {
		t.Fatalf("connections open = %v, want %d", v, n)
	}
	after := heap()
	// Signed: an idle connection dials no upstream, so the heap after can
	// be below the heap before (the garbage the GC found in between).
	perHundred := float64(int64(after)-int64(before)) / (n / 100) / (1 << 20)
	t.Logf("%d idle connections: %.2f MiB per hundred (heap+stacks, proxy and test clients together)", n, perHundred)
	if perHundred > 2 {
		t.Fatalf("idle connections cost %.2f MiB per hundred, want <= 2", perHundred)
	}
	// They all still work: one request on the last.
	c := conns[n-1]
	c.Write(rawRequest(kmsg.NewPtrApiVersionsRequest(), 9))
	if corr, _ := readResponse(t, c); corr != 9 {
		t.Fatalf("corr %d", corr)
	}
}

func TestSlowConsumerBackpressure(t *testing.T) {
	upstream := startKfake(t, "-topics", "big:1")
	tp := startProxy(t, upstream, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pc, err := kgo.NewClient(kgo.SeedBrokers(upstream...), kgo.ProducerLinger(0), kgo.DefaultProduceTopic("big"))
	if err != nil {
		t.Fatal(err)
	}
	value := make([]byte, 16<<10)
	rand.Read(value)
	for range 1000 { // 16 MB
		pc.Produce(ctx, &kgo.Record{Value: value}, nil)
	}
	if err := pc.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	pc.Close()

	leader := leaderAddr(t, tp.Addr(), "big")
	c, err := net.Dial("tcp", leader)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(64 << 10)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.HeapInuse

	// 40 pipelined fetches of 1 MiB each (40 MiB of responses), none read.
	const n = 40
	for i := range n {
		f := kmsg.NewPtrFetchRequest()
		f.SetVersion(4)
		f.MaxWaitMillis, f.MinBytes, f.MaxBytes = 100, 1, 1<<20
		ft := kmsg.NewFetchRequestTopic()
		ft.Topic = "big"
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.FetchOffset = int64(i * 10)
		fp.PartitionMaxBytes = 1 << 20
		ft.Partitions = append(ft.Partitions, fp)
		f.Topics = append(f.Topics, ft)
		if _, err := c.Write(rawRequest(f, int32(i))); err != nil {
			t.Fatal(err)
		}
	}
	// Wait on the counters, not the clock: every fetch forwarded, then
	// what the proxy passes on to the client stops growing (its writes
	// block on the full socket, and it reads no more from the broker).
	fetches := tp.m.api(int16(kmsg.Fetch)).requests
	for deadline := time.Now().Add(10 * time.Second); metricValue(t, fetches) < n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%v of %d fetches forwarded", metricValue(t, fetches), n)
		}
	}
	for last, still, deadline := -1.0, 0, time.Now().Add(10*time.Second); still < 5; time.Sleep(20 * time.Millisecond) {
		if v := metricValue(t, tp.m.bytesB2C); v != last {
			last, still = v, 0
		} else {
			still++
		}
		if time.Now().After(deadline) {
			t.Fatal("the bytes passed to the client never settled")
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	grew := int64(ms.HeapInuse) - int64(before)
	t.Logf("heap grew %.1f MiB with %d MiB of unread responses", float64(grew)/(1<<20), n)
	if grew > 8<<20 {
		t.Fatalf("proxy buffered %.1f MiB for a client that reads nothing", float64(grew)/(1<<20))
	}
	// The proxy stopped taking responses from the broker: what it passed
	// on is what the socket buffers hold plus the frame it is writing.
	if sent := metricValue(t, tp.m.bytesB2C); sent > 20<<20 {
		t.Fatalf("proxy forwarded %.1f MiB to a client that reads nothing", sent/(1<<20))
	} else {
		t.Logf("forwarded %.1f MiB before backpressure held it", sent/(1<<20))
	}
	// Nothing was lost: all responses arrive, in order, once the client reads.
	for i := range n {
		if corr, _ := readResponse(t, c); corr != int32(i) {
			t.Fatalf("response %d has correlation id %d", i, corr)
		}
	}
}

// leaderAddr asks the proxy for partition 0's leader of topic and returns
// its proxy address.
func leaderAddr(t *testing.T, bootstrap, topic string) string {
	t.Helper()
	c, err := net.Dial("tcp", bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	md := kmsg.NewPtrMetadataRequest()
	md.SetVersion(4)
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	md.Topics = append(md.Topics, mt)
	c.Write(rawRequest(md, 1))
	_, payload := readResponse(t, c)
	var mr kmsg.MetadataResponse
	mr.SetVersion(4)
	if err := mr.ReadFrom(payload[4:]); err != nil {
		t.Fatal(err)
	}
	for _, b := range mr.Brokers {
		if b.NodeID == mr.Topics[0].Partitions[0].Leader {
			return net.JoinHostPort(b.Host, fmt.Sprint(b.Port))
		}
	}
	t.Fatalf("no leader for %s", topic)
	return ""
}

func TestUpstreamTLS(t *testing.T) {
	cert, pool := selfSigned(t, "kfake")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)
	upstream := startKfake(t, "-tls-cert", certFile, "-tls-key", keyFile, "-topics", "tlsup:1")
	// Ready proves the proxy's own metadata connection speaks TLS too.
	tp := startProxy(t, upstream, func(c *Config) { c.UpstreamTLS = &tls.Config{RootCAs: pool} })

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ProducerLinger(0),
		kgo.ConsumeTopics("tlsup"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "tlsup", Value: []byte("over tls upstream")}).FirstErr(); err != nil {
		t.Fatalf("plaintext client, TLS upstream: %v", err)
	}
	var got string
	for got == "" && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = string(r.Value) })
	}
	if got != "over tls upstream" {
		t.Fatalf("consumed %q", got)
	}
	// Without the CA the proxy refuses the upstream and says why.
	tp2 := startProxyNoWait(t, upstream, func(c *Config) { c.UpstreamTLS = &tls.Config{} })
	c, err := net.Dial("tcp", tp2.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(rawRequest(kmsg.NewPtrApiVersionsRequest(), 1))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("untrusted upstream: client connection not closed (%v)", err)
	}
	tp2.waitLog(t, "upstream unreachable", "certificate")
}

func TestBrokerPortRangeExhausted(t *testing.T) {
	upstream := startKfake(t)
	tp := startProxyNoWait(t, upstream, func(c *Config) { c.BrokerPortCount = 2 })
	c, err := net.Dial("tcp", tp.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(rawRequest(kmsg.NewPtrMetadataRequest(), 1))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	// The third broker cannot get a port: rather than hand out its
	// upstream address, the proxy closes the connection and says why.
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("connection not closed (%v)", err)
	}
	tp.waitLog(t, "refusing broker", "per-broker port range exhausted")
	tp.waitLog(t, c.LocalAddr().String(), "cannot rewrite response")
	if tp.Ready() {
		t.Fatal("Ready with a broker that has no listener")
	}
}

// A broker that shows up later (here: a large KRaft-style id) gets its own
// listener on demand, inside the range, stable across refreshes.
func TestNewBrokerListenerOnDemand(t *testing.T) {
	upstream := startKfake(t)
	tp := startProxy(t, upstream, nil)
	host, port, _ := net.SplitHostPort(upstream[1])
	var p int32
	fmt.Sscan(port, &p)
	h, lp, err := tp.MapBroker(1001, host, p)
	if err != nil {
		t.Fatal(err)
	}
	// Its preferred slot (1001 mod 100 = 1) belongs to node 1: it gets
	// another port in the range, shared with no one.
	if !tp.isProxyAddr(h, lp) {
		t.Fatalf("node 1001 advertised at %s:%d", h, lp)
	}
	for n := int32(0); n < 3; n++ {
		if op, _ := tp.ports.Lookup(n); op == int(lp) {
			t.Fatalf("node 1001 shares port %d with node %d", lp, n)
		}
	}
	if h2, lp2, _ := tp.MapBroker(1001, host, p); h2 != h || lp2 != lp {
		t.Fatalf("node 1001 moved from %d to %d on refresh", lp, lp2)
	}
	c, err := net.Dial("tcp", net.JoinHostPort(h, fmt.Sprint(lp)))
	if err != nil {
		t.Fatalf("listener for node 1001 not open: %v", err)
	}
	defer c.Close()
	c.Write(rawRequest(kmsg.NewPtrApiVersionsRequest(), 5))
	if corr, payload := readResponse(t, c); corr != 5 || len(payload) < 10 {
		t.Fatalf("through the new listener: corr %d, %d bytes", corr, len(payload))
	}
}

// A client that announces a huge frame whose header does not parse is
// closed after at most maxHeaderBytes of it are read: the proxy never
// reads (or buffers) the rest of the announced frame (issue 10).
func TestHugeFrameWithBadHeaderClosesAtOnce(t *testing.T) {
	upstream := startKfake(t)
	tp := startProxy(t, upstream, nil)
	for _, tc := range []struct {
		name   string
		header []byte
	}{
		{"negative api key", []byte{0xff, 0xff, 0, 0, 0, 0, 0, 1, 0, 0}},
		// A flexible header (ApiVersions v3) whose one tagged field claims
		// 1 MiB: longer than any header may be.
		{"tagged field overruns the header bound", []byte{0, 18, 0, 3, 0, 0, 0, 1, 0, 0, 1, 0, 0x80, 0x80, 0x40}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", tp.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			const announced = 100 << 20
			frame := binary.BigEndian.AppendUint32(nil, announced)
			frame = append(frame, tc.header...)
			// Far more than the header bound, far less than the frame.
			frame = append(frame, make([]byte, maxHeaderBytes+(64<<10))...)
			go c.Write(frame)
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			n, err := c.Read(make([]byte, 16))
			if isTimeout(err) {
				t.Fatalf("the connection is still open 10s after a frame whose header does not parse: the proxy waits for the rest of the %d bytes", announced)
			}
			if err == nil {
				t.Fatalf("read %d bytes of a response to a malformed frame", n)
			}
		})
	}
	tp.waitLog(t, "closing client connection: malformed frame")
}

// max_connections: a connection over the cap is closed at accept and
// counted; the ones already open keep working, and once one closes a new
// one is accepted again (issue 10).
func TestMaxConnections(t *testing.T) {
	upstream := startKfake(t)
	tp := startProxy(t, upstream, func(c *Config) { c.MaxConnections = 3 })
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for range 3 {
		c, err := net.Dial("tcp", tp.Addr())
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
	}
	deadline := time.Now().Add(10 * time.Second)
	for metricValue(t, tp.m.connsOpen) < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	over, err := net.Dial("tcp", tp.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	over.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := over.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("the fourth connection was not closed at accept: %v", err)
	}
	if v := metricValue(t, tp.m.connsRefused); v != 1 {
		t.Errorf("rtproxy_proxy_connections_refused_total = %v, want 1", v)
	}
	c := open[2]
	c.Write(rawRequest(kmsg.NewPtrApiVersionsRequest(), 7))
	if corr, _ := readResponse(t, c); corr != 7 {
		t.Fatalf("an open connection stopped working: corr %d", corr)
	}
	open[0].Close()
	open = open[1:]
	deadline = time.Now().Add(10 * time.Second)
	for metricValue(t, tp.m.connsOpen) > 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	again, err := net.Dial("tcp", tp.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	again.Write(rawRequest(kmsg.NewPtrApiVersionsRequest(), 8))
	if corr, _ := readResponse(t, again); corr != 8 {
		t.Fatalf("a connection under the cap again: corr %d", corr)
	}
}

// client_idle_timeout closes a connection that sends nothing; a request
// that stalls after its first bytes is closed after request_read_timeout
// (issue 10).
func TestClientDeadlines(t *testing.T) {
	upstream := startKfake(t)
	tp := startProxy(t, upstream, func(c *Config) {
		c.ClientIdleTimeout = 500 * time.Millisecond
		c.RequestReadTimeout = 300 * time.Millisecond
	})
	closedWithin := func(c net.Conn, d time.Duration) bool {
		c.SetReadDeadline(time.Now().Add(d))
		_, err := c.Read(make([]byte, 1))
		return err != nil && !isTimeout(err)
	}
	idle, err := net.Dial("tcp", tp.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	// A request first: the connection works, then goes idle.
	idle.Write(rawRequest(kmsg.NewPtrApiVersionsRequest(), 1))
	if corr, _ := readResponse(t, idle); corr != 1 {
		t.Fatalf("corr %d", corr)
	}
	if !closedWithin(idle, 5*time.Second) {
		t.Fatal("an idle connection was not closed after client_idle_timeout")
	}
	slow, err := net.Dial("tcp", tp.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	// A 1 MiB frame of which only the head ever arrives.
	frame := binary.BigEndian.AppendUint32(nil, 1<<20)
	frame = append(frame, 0, 0, 0, 9, 0, 0, 0, 2, 0, 0)
	frame = append(frame, make([]byte, 8<<10)...)
	slow.Write(frame)
	if !closedWithin(slow, 5*time.Second) {
		t.Fatal("a stalled request was not closed after request_read_timeout")
	}
}
