package protocol

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// connRecorder records every broker address a franz-go client dials.
type connRecorder struct {
	mu    sync.Mutex
	addrs []string
}

func (r *connRecorder) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addrs = append(r.addrs, net.JoinHostPort(meta.Host, fmt.Sprint(meta.Port)))
}

func (r *connRecorder) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.addrs)
}

func TestEndToEndProduceConsume(t *testing.T) {
	upstream := startKfake(t, "-topics", "e2e:3")
	tp := startProxy(t, upstream, nil)
	rec := &connRecorder{}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(tp.Addr()),
		kgo.ProducerLinger(0),
		kgo.WithHooks(rec),
		kgo.ConsumerGroup("e2e-group"),
		kgo.ConsumeTopics("e2e"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.RequiredAcks(kgo.AllISRAcks()),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const n = 200
	want := make(map[string]string, n)
	for i := range n {
		k, v := fmt.Sprintf("k%03d", i), fmt.Sprintf("value-%d-%s", i, strings.Repeat("x", i))
		if i%50 == 7 {
			// Past streamAbove: the request is streamed, not held whole.
			v = fmt.Sprintf("big-%d-%s", i, strings.Repeat("y", 300<<10))
		}
		want[k] = v
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "e2e", Key: []byte(k), Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("produce %d: %v", i, err)
		}
	}
	got := make(map[string]string, n)
	for len(got) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d: %v", len(got), n, err)
		}
		fs.EachError(func(tp string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", tp, p, err) })
		fs.EachRecord(func(r *kgo.Record) { got[string(r.Key)] = string(r.Value) })
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("record %s: got %q, want %q", k, got[k], v)
		}
	}

	// Metadata and DescribeCluster, asked explicitly: only proxy addresses.
	md := kmsg.NewPtrMetadataRequest()
	mdResp, err := md.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(mdResp.Brokers) != 3 {
		t.Fatalf("metadata brokers = %d, want 3", len(mdResp.Brokers))
	}
	for _, b := range mdResp.Brokers {
		if !tp.isProxyAddr(b.Host, b.Port) {
			t.Errorf("metadata broker %d at %s:%d is not a proxy address", b.NodeID, b.Host, b.Port)
		}
	}
	var topicID [16]byte
	for _, tt := range mdResp.Topics {
		if tt.Topic != nil && *tt.Topic == "e2e" {
			topicID = tt.TopicID
		}
	}
	if name, ok := tp.TopicName(topicID); !ok || name != "e2e" {
		t.Errorf("TopicName(%x) = %q, %v; want e2e", topicID, name, ok)
	}
	dc := kmsg.NewPtrDescribeClusterRequest()
	dcResp, err := dc.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(dcResp.Brokers) != 3 {
		t.Fatalf("describe cluster brokers = %d, want 3", len(dcResp.Brokers))
	}
	for _, b := range dcResp.Brokers {
		if !tp.isProxyAddr(b.Host, b.Port) {
			t.Errorf("describe cluster broker %d at %s:%d is not a proxy address", b.NodeID, b.Host, b.Port)
		}
	}
	fc := kmsg.NewPtrFindCoordinatorRequest()
	fc.CoordinatorKeys = []string{"e2e-group", "other-group"}
	fcResp, err := fc.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range fcResp.Coordinators {
		if c.ErrorCode == 0 && !tp.isProxyAddr(c.Host, c.Port) {
			t.Errorf("coordinator for %s at %s:%d is not a proxy address", c.Key, c.Host, c.Port)
		}
	}

	addrs := rec.list()
	if len(addrs) < 2 {
		t.Fatalf("client dialed only %v", addrs)
	}
	for _, a := range addrs {
		host, port, _ := net.SplitHostPort(a)
		var p int32
		fmt.Sscan(port, &p)
		if !tp.isProxyAddr(host, p) || slices.Contains(upstream, a) {
			t.Errorf("client dialed %s, which is not a proxy address (upstream %v)", a, upstream)
		}
	}
	if v := metricValue(t, tp.m.api(int16(kmsg.Produce)).requests); v < n {
		t.Errorf("rtproxy_proxy_requests_total{api=Produce} = %v, want >= %d", v, n)
	}
	if v := metricValue(t, tp.m.bytesB2C); v < float64(n*10) {
		t.Errorf("broker_to_client bytes = %v, too few", v)
	}
}

// rawRequest encodes req as a frame with a v1/v2 request header.
func rawRequest(req kmsg.Request, corr int32) []byte {
	buf := make([]byte, 4, 128)
	buf = binary.BigEndian.AppendUint16(buf, uint16(req.Key()))
	buf = binary.BigEndian.AppendUint16(buf, uint16(req.GetVersion()))
	buf = binary.BigEndian.AppendUint32(buf, uint32(corr))
	buf = binary.BigEndian.AppendUint16(buf, 4)
	buf = append(buf, "test"...)
	if req.IsFlexible() {
		buf = append(buf, 0)
	}
	buf = req.AppendTo(buf)
	binary.BigEndian.PutUint32(buf, uint32(len(buf)-4))
	return buf
}

// readResponse reads one response frame and returns its correlation id and
// payload.
func readResponse(t *testing.T, c net.Conn) (int32, []byte) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var size [4]byte
	f, err := ReadFrame(c, &size, 1<<26, false)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	return int32(binary.BigEndian.Uint32(f[4:])), f[4:]
}

func TestPipelinedRequestsInOrderAndAcksZero(t *testing.T) {
	upstream := startKfake(t, "-topics", "fifo:1")
	tp := startProxy(t, upstream, nil)
	c, err := net.Dial("tcp", tp.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// Find the leader of fifo/0 and connect to it through the proxy: a
	// produce must go to the leader.
	md := kmsg.NewPtrMetadataRequest()
	md.SetVersion(9)
	topic := kmsg.NewMetadataRequestTopic()
	topic.Topic = kmsg.StringPtr("fifo")
	md.Topics = append(md.Topics, topic)
	c.Write(rawRequest(md, 1))
	_, body := readResponse(t, c)
	var mresp kmsg.MetadataResponse
	mresp.SetVersion(9)
	if err := mresp.ReadFrom(body[5:]); err != nil { // corr id + empty header tags
		t.Fatal(err)
	}
	leader := mresp.Topics[0].Partitions[0].Leader
	var leaderAddr string
	for _, b := range mresp.Brokers {
		if b.NodeID == leader {
			leaderAddr = net.JoinHostPort(b.Host, fmt.Sprint(b.Port))
		}
	}
	lc, err := net.Dial("tcp", leaderAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()

	produce := func(acks int16, value string) kmsg.Request {
		r := kmsg.NewPtrProduceRequest()
		r.SetVersion(7)
		r.Acks = acks
		r.TimeoutMillis = 5000
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic = "fifo"
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Records = recordBatch(value)
		rt.Partitions = append(rt.Partitions, rp)
		r.Topics = append(r.Topics, rt)
		return r
	}
	av := kmsg.NewPtrApiVersionsRequest()
	av.SetVersion(3)
	av.ClientSoftwareName, av.ClientSoftwareVersion = "test", "1"
	md2 := kmsg.NewPtrMetadataRequest()
	md2.SetVersion(12)
	var batch []byte
	batch = append(batch, rawRequest(produce(-1, "one"), 10)...)
	batch = append(batch, rawRequest(produce(0, "two"), 11)...) // acks=0: no response
	batch = append(batch, rawRequest(av, 12)...)
	batch = append(batch, rawRequest(md2, 13)...)
	batch = append(batch, rawRequest(produce(1, "three"), 14)...)
	batch = append(batch, rawRequest(produce(0, "four"), 15)...)
	batch = append(batch, rawRequest(av, 16)...)
	if _, err := lc.Write(batch); err != nil {
		t.Fatal(err)
	}
	var got []int32
	for range 5 {
		corr, payload := readResponse(t, lc)
		got = append(got, corr)
		if corr == 10 || corr == 14 {
			var r kmsg.ProduceResponse
			r.SetVersion(7)
			if err := r.ReadFrom(payload[4:]); err != nil {
				t.Fatalf("Produce decode: %v", err)
			}
			if ec := r.Topics[0].Partitions[0].ErrorCode; ec != 0 {
				t.Fatalf("produce corr %d: error code %d", corr, ec)
			}
		}
		if corr == 12 || corr == 16 {
			// ApiVersions v3 answers with header v0 and capped ranges.
			var r kmsg.ApiVersionsResponse
			r.SetVersion(3)
			if err := r.ReadFrom(payload[4:]); err != nil {
				t.Fatalf("ApiVersions decode: %v", err)
			}
			for _, k := range r.ApiKeys {
				if k.MaxVersion > kmsgMax[k.ApiKey] {
					t.Errorf("ApiVersions key %d max %d above kmsg's %d", k.ApiKey, k.MaxVersion, kmsgMax[k.ApiKey])
				}
			}
		}
	}
	if want := []int32{10, 12, 13, 14, 16}; !slices.Equal(got, want) {
		t.Fatalf("correlation ids %v, want %v", got, want)
	}
	// Nothing else may arrive: the acks=0 produces have no response.
	lc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := lc.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("unexpected extra bytes after the last response (n=%d err=%v)", n, err)
	}
	// All four records, acks=0 ones included, reached the broker.
	cl, err := kgo.NewClient(kgo.SeedBrokers(upstream...), kgo.ConsumeTopics("fifo"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var values []string
	for len(values) < 4 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { values = append(values, string(r.Value)) })
	}
	if want := []string{"one", "two", "three", "four"}; !slices.Equal(values, want) {
		t.Fatalf("records at the broker %v, want %v", values, want)
	}
}

// recordBatch builds a one-record v2 batch (uncompressed) with a valid CRC.
func recordBatch(value string) []byte {
	rec := kmsg.NewRecord()
	rec.Value = []byte(value)
	rec.Length = int32(len(rec.AppendTo(nil)) - 1) // the zero length took one varint byte
	recBytes := rec.AppendTo(nil)
	b := kmsg.NewRecordBatch()
	b.Magic = 2
	b.ProducerID, b.ProducerEpoch, b.FirstSequence = -1, -1, -1
	b.FirstTimestamp = time.Now().UnixMilli()
	b.MaxTimestamp = b.FirstTimestamp
	b.NumRecords = 1
	b.Records = recBytes
	raw := b.AppendTo(nil)
	b.Length = int32(len(raw) - 12)
	raw = b.AppendTo(nil)
	// CRC-32C over everything after the crc field (attributes onward).
	binary.BigEndian.PutUint32(raw[17:], crc32c(raw[21:]))
	return raw
}

func TestMalformedFramesCloseOnlyThatConnection(t *testing.T) {
	upstream := startKfake(t)
	tp := startProxy(t, upstream, func(c *Config) { c.MaxFrameBytes = 1 << 20 })
	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stillWorks := func() {
		t.Helper()
		r, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
		if err != nil || len(r.Brokers) != 3 {
			t.Fatalf("healthy client broken: %v", err)
		}
	}
	stillWorks()

	cases := []struct {
		name   string
		send   func(c net.Conn)
		reason string
	}{
		{"oversize", func(c net.Conn) { c.Write([]byte{0x00, 0x20, 0x00, 0x00, 0, 18, 0, 0}) }, "exceeds max_frame_bytes"},
		{"truncated", func(c net.Conn) {
			c.Write([]byte{0, 0, 0, 100, 0, 18, 0, 0, 0, 0})
			c.(*net.TCPConn).CloseWrite()
		}, "truncated"},
		{"bad header", func(c net.Conn) { c.Write([]byte{0, 0, 0, 10, 0xff, 0xff, 0, 0, 0, 0, 0, 1, 0, 0}) }, "negative api key"},
		{"tls hello", func(c net.Conn) {
			tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true})
			tc.SetDeadline(time.Now().Add(3 * time.Second))
			tc.Handshake()
		}, "TLS handshake (ClientHello) sent to a plaintext listener"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", tp.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			tc.send(c)
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			if n, err := c.Read(make([]byte, 64)); err == nil {
				t.Fatalf("connection still open: read %d bytes", n)
			} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("connection not closed by the proxy")
			}
			line := tp.waitLog(t, c.LocalAddr().String(), tc.reason)
			if strings.Count(tp.logs.String(), c.LocalAddr().String()) != 1 {
				t.Errorf("want exactly one log line naming %s, logs:\n%s", c.LocalAddr(), tp.logs.String())
			}
			t.Log(line)
			stillWorks()
		})
	}
	if v := metricValue(t, tp.m.frameErrors.WithLabelValues("tls_on_plaintext")); v != 1 {
		t.Errorf("frame_errors_total{reason=tls_on_plaintext} = %v, want 1", v)
	}
}
