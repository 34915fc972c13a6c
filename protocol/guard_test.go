package protocol

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// testGuards guard every topic starting with "g": a record whose value
// contains "bad" fails.
type testGuards struct {
	mu      sync.Mutex
	refused []Refusal
}

func (g *testGuards) For(topic string) Guard {
	if strings.HasPrefix(topic, "g") {
		return g
	}
	return nil
}

func (g *testGuards) Check(_ string, _ int32, r *ProducedRecord) (string, string, bool) {
	if bytes.Contains(r.Value, []byte("bad")) {
		return "no-bad", "the value says bad", false
	}
	return "", "", true
}

func (g *testGuards) Refused(r Refusal) {
	g.mu.Lock()
	g.refused = append(g.refused, r)
	g.mu.Unlock()
}

// A guarded topic's partition with a failing record is refused whole with
// INVALID_RECORD and the guard's message; its other partitions, and
// unguarded topics in the same request, reach the broker; an idempotent
// producer goes on producing to the refused partition afterwards; every
// codec is checked after franz-go's decompressor.
func TestGuardRefusesPartitionWithFailingRecord(t *testing.T) {
	upstream := startKfake(t, "-topics", "guarded:2,plain:1")
	tp := startProxy(t, upstream, nil)
	gs := &testGuards{}
	tp.SetGuards(gs)
	for _, codec := range []kgo.CompressionCodec{kgo.NoCompression(), kgo.GzipCompression(), kgo.SnappyCompression(), kgo.Lz4Compression(), kgo.ZstdCompression()} {
		cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ProducerLinger(0),
			kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchCompression(codec))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		rec := func(topic string, p int32, v string) *kgo.Record {
			return &kgo.Record{Topic: topic, Partition: p, Value: []byte(v)}
		}
		// One produce request: partition 0 carries a bad record, partition
		// 1 and the unguarded topic do not.
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i, r := range []*kgo.Record{rec("guarded", 0, "ok-1"), rec("guarded", 0, "bad-2"), rec("guarded", 1, "ok-3"), rec("plain", 0, "bad-but-unguarded")} {
			wg.Add(1)
			cl.Produce(ctx, r, func(_ *kgo.Record, err error) { errs[i] = err; wg.Done() })
		}
		wg.Wait()
		for i, want := range []bool{true, true, false, false} {
			if got := errs[i] != nil; got != want {
				t.Errorf("%v: record %d: err %v, want refused %v", codec, i, errs[i], want)
			}
		}
		if !errors.Is(errs[1], kerr.InvalidRecord) {
			t.Errorf("%v: refusal is %v, want INVALID_RECORD", codec, errs[1])
		}
		// The idempotent producer continues on the refused partition.
		if err := cl.ProduceSync(ctx, rec("guarded", 0, "ok-after")).FirstErr(); err != nil {
			t.Errorf("%v: produce after a refusal: %v", codec, err)
		}
		cancel()
		cl.Close()
	}
	// What reached the brokers: only records that passed, and the
	// unguarded topic's.
	cons, err := kgo.NewClient(kgo.SeedBrokers(upstream...), kgo.ConsumeTopics("guarded", "plain"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	got := map[string]int{}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for n := 0; n < 5*3; {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of 15 records: %v", n, got)
		}
		fs.EachRecord(func(r *kgo.Record) { got[r.Topic+"/"+string(r.Value)]++; n++ })
	}
	want := map[string]int{"guarded/ok-3": 5, "guarded/ok-after": 5, "plain/bad-but-unguarded": 5}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("brokers hold %v, want %v", got, want)
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if len(gs.refused) != 5 {
		t.Fatalf("%d refusals, want 5 (one per codec)", len(gs.refused))
	}
	for _, r := range gs.refused {
		if r.Topic != "guarded" || r.Partition != 0 || len(r.Records) != 2 || len(r.Failures) != 1 || r.Failures[0].Index != 1 || r.Failures[0].Check != "no-bad" {
			t.Errorf("refusal %+v", r)
		}
	}
}

// The refused partition's response carries the guard's message and the
// failing record's index (Produce v8+), read with a raw request.
func TestGuardResponseNamesTheCheck(t *testing.T) {
	upstream := startKfake(t, "-topics", "guarded:1")
	tp := startProxy(t, upstream, nil)
	tp.SetGuards(&testGuards{})
	// Produce v12: topics by name (v13 names them by id; the first test
	// covers it).
	vs := kversion.Stable()
	vs.SetMaxKeyVersion(int16(kmsg.Produce), 12)
	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ProducerLinger(0), kgo.DisableIdempotentWrite(),
		kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.MaxVersions(vs))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = cl.ProduceSync(ctx, &kgo.Record{Topic: "guarded", Value: []byte("ok")}, &kgo.Record{Topic: "guarded", Value: []byte("bad")}).FirstErr()
	if !errors.Is(err, kerr.InvalidRecord) {
		t.Fatalf("produce: %v, want INVALID_RECORD", err)
	}
	// The same batch, raw, to read the response's fields.
	var batch []byte
	{
		rb := kmsg.RecordBatch{Magic: 2, NumRecords: 2, FirstTimestamp: time.Now().UnixMilli(), MaxTimestamp: time.Now().UnixMilli(),
			ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, LastOffsetDelta: 1}
		var recs []byte
		for i, v := range []string{"ok", "bad"} {
			r := kmsg.Record{OffsetDelta: int32(i), Value: []byte(v)}
			r.Length = int32(len(r.AppendTo(nil)) - 1) // small: a one-byte varint
			recs = r.AppendTo(recs)
		}
		rb.Records = recs
		batch = rb.AppendTo(nil)
		batch = fixBatch(batch)
	}
	req := kmsg.NewPtrProduceRequest()
	req.Acks, req.TimeoutMillis = -1, 5000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = "guarded"
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = batch
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Version < 8 || len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		t.Fatalf("response v%d %+v", resp.Version, resp)
	}
	p := resp.Topics[0].Partitions[0]
	if p.ErrorCode != kerr.InvalidRecord.Code || p.ErrorMessage == nil || !strings.Contains(*p.ErrorMessage, "check no-bad: the value says bad") {
		t.Errorf("partition answer: code %d message %q", p.ErrorCode, deref(p.ErrorMessage))
	}
	if len(p.ErrorRecords) != 1 || p.ErrorRecords[0].RelativeOffset != 1 {
		t.Errorf("record errors %+v, want record 1", p.ErrorRecords)
	}
}

// fixBatch sets a v2 batch's length and CRC after AppendTo.
func fixBatch(b []byte) []byte {
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-12))
	crc := crc32c(b[21:])
	b[17], b[18], b[19], b[20] = byte(crc>>24), byte(crc>>16), byte(crc>>8), byte(crc)
	return b
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// FuzzDecodeBatches: the guard's batch decoder never panics, and what it
// decodes re-encodes to records franz-go reads back the same (seeds in
// testdata/fuzz/FuzzDecodeBatches: plain and compressed batches).
func FuzzDecodeBatches(f *testing.F) {
	for _, codec := range []kgo.CompressionCodec{kgo.NoCompression(), kgo.GzipCompression(), kgo.SnappyCompression(), kgo.ZstdCompression()} {
		f.Add(seedBatch(f, codec))
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m := testMeter(1<<20, 1000)
		recs, _, err := decodeBatches(b, m)
		if m.cost > m.maxCost || m.recs > m.maxRecs {
			t.Fatalf("the decode cost %d bytes and %d records, over its bounds", m.cost, m.recs)
		}
		if err != nil {
			return
		}
		for _, r := range recs {
			_ = len(r.Key) + len(r.Value) + len(r.Headers)
		}
	})
}

// seedBatch is a two-record batch with a header, compressed with codec.
func seedBatch(tb testing.TB, codec kgo.CompressionCodec) []byte {
	var recs []byte
	for i, v := range []string{`{"amount":12}`, "not json"} {
		r := kmsg.Record{OffsetDelta: int32(i), Key: []byte("k"), Value: []byte(v), Headers: []kmsg.Header{{Key: "h", Value: []byte("v")}}}
		r.Length = int32(len(r.AppendTo(nil)) - 1)
		recs = r.AppendTo(recs)
	}
	comp, err := kgo.DefaultCompressor(codec)
	if err != nil {
		tb.Fatal(err)
	}
	attrs := int16(0)
	if comp != nil {
		out, got := comp.Compress(bytes.NewBuffer(nil), recs)
		recs, attrs = append([]byte(nil), out...), int16(got)
	}
	rb := kmsg.RecordBatch{Magic: 2, Attributes: attrs, NumRecords: 2, LastOffsetDelta: 1, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, Records: recs}
	return fixBatch(rb.AppendTo(nil))
}

// testMeter is a decode meter with no global budget.
func testMeter(maxCost, maxRecs int64) *decodeMeter {
	return &decodeMeter{maxCost: maxCost, maxRecs: maxRecs, bufs: &decompressBufs{}}
}

// A batch that decompresses to more than the bound is an error, not
// gigabytes in the proxy, with every codec; under the bound it decodes to
// what was compressed.
func TestBoundedDecompress(t *testing.T) {
	big := make([]byte, 4<<20)
	for i := range big {
		big[i] = byte(i / 4096)
	}
	for _, codec := range []kgo.CompressionCodec{kgo.GzipCompression(), kgo.SnappyCompression(), kgo.Lz4Compression(), kgo.ZstdCompression()} {
		comp, err := kgo.DefaultCompressor(codec)
		if err != nil {
			t.Fatal(err)
		}
		packed, c := comp.Compress(bytes.NewBuffer(nil), big)
		packed = append([]byte(nil), packed...)
		m := testMeter(1<<20, 10)
		if _, err := m.decompress(packed, int16(c)); !errors.Is(err, ErrDecodeLimit) {
			t.Errorf("codec %d: %d compressed bytes of 4 MiB under a 1 MiB bound: %v", c, len(packed), err)
		}
		if m.cost > 1<<20 {
			t.Errorf("codec %d: charged %d bytes past the 1 MiB bound", c, m.cost)
		}
		m = testMeter(8<<20, 10)
		if out, err := m.decompress(packed, int16(c)); err != nil || !bytes.Equal(out, big) {
			t.Errorf("codec %d under an 8 MiB bound: %d bytes, %v", c, len(out), err)
		}
	}
	// A streamed zstd frame does not declare its size: decompression
	// itself stops at the bound.
	var buf bytes.Buffer
	zw, _ := zstd.NewWriter(&buf)
	zw.Write(big)
	zw.Close()
	var h zstd.Header
	if err := h.Decode(buf.Bytes()); err != nil || h.HasFCS {
		t.Fatalf("the streamed frame declares its size (%v)", err)
	}
	m := testMeter(1<<20, 10)
	if _, err := m.decompress(buf.Bytes(), 4); !errors.Is(err, ErrDecodeLimit) || m.cost > 1<<20 {
		t.Errorf("streamed zstd under a 1 MiB bound: %v, charged %d", err, m.cost)
	}
}

// testTap records what the proxy hands it.
type testTap struct {
	mu    sync.Mutex
	acked map[int64]string // offset → value
	calls int
}

func (tt *testTap) Wants(topic string) bool { return topic == "tapped" }

func (tt *testTap) Acked(_ string, _ int32, base int64, recs []ProducedRecord) {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	tt.calls++
	for i, r := range recs {
		tt.acked[base+int64(i)] = string(r.Value)
	}
}

// The tap gets acks=all records with the offsets the brokers gave them;
// acks=1, transactional producers and unwanted topics are not tapped.
func TestTapHandsAcknowledgedRecords(t *testing.T) {
	upstream := startKfake(t, "-topics", "tapped:1,other:1")
	tp := startProxy(t, upstream, nil)
	tt := &testTap{acked: map[int64]string{}}
	tp.SetTap(tt)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	produce := func(txn bool, opts ...kgo.Opt) []*kgo.Record {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(tp.Addr()), kgo.ProducerLinger(0)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		var rs []*kgo.Record
		for i := range 5 {
			rs = append(rs, &kgo.Record{Topic: "tapped", Value: []byte(fmt.Sprintf("v%d", i))}, &kgo.Record{Topic: "other", Value: []byte("o")})
		}
		if txn {
			if err := cl.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if txn {
			if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
				t.Fatal(err)
			}
		}
		return rs
	}
	all := produce(false) // acks=all, idempotent: franz-go's default
	produce(false, kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite())
	produce(true, kgo.TransactionalID("tap-txn"))
	tt.mu.Lock()
	defer tt.mu.Unlock()
	want := map[int64]string{}
	for _, r := range all {
		if r.Topic == "tapped" {
			want[r.Offset] = string(r.Value)
		}
	}
	if fmt.Sprint(tt.acked) != fmt.Sprint(want) {
		t.Errorf("tapped %v, want the acks=all records at their offsets %v", tt.acked, want)
	}
}

// Guarded batches decompress into pooled buffers that go back after each
// check: batches of every codec, decoded one after another through the
// pool, give exactly the records an unpooled decode gives, while a
// buffer handed back is reused by the next batch.
func TestGuardDecompressBuffersReused(t *testing.T) {
	bufs := &decompressBufs{}
	var seeds [][]byte
	for _, codec := range []kgo.CompressionCodec{kgo.GzipCompression(), kgo.SnappyCompression(), kgo.Lz4Compression(), kgo.ZstdCompression(), kgo.NoCompression()} {
		seeds = append(seeds, seedBatch(t, codec))
	}
	reused := 0
	var last []byte
	for round := range 20 {
		for _, b := range seeds {
			want, _, err := decodeBatches(b, testMeter(1<<20, 10))
			if err != nil {
				t.Fatal(err)
			}
			pooled := testMeter(1<<20, 10)
			pooled.bufs = bufs
			got, used, err := decodeBatches(b, pooled)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("round %d: %d records, want %d", round, len(got), len(want))
			}
			for i := range got {
				if !bytes.Equal(got[i].Key, want[i].Key) || !bytes.Equal(got[i].Value, want[i].Value) || got[i].Timestamp != want[i].Timestamp ||
					len(got[i].Headers) != len(want[i].Headers) || !bytes.Equal(got[i].Headers[0].Value, want[i].Headers[0].Value) {
					t.Fatalf("round %d record %d: %+v, want %+v", round, i, got[i], want[i])
				}
			}
			for _, u := range used {
				if last != nil && &u[:1][0] == &last[:1][0] {
					reused++
				}
				last = u
			}
			bufs.putAll(used)
		}
	}
	if reused == 0 {
		t.Fatal("no decompression buffer was reused")
	}
}

// panickyGuards panic while checking a record whose value is "boom".
type panickyGuards struct{ testGuards }

func (g *panickyGuards) For(topic string) Guard {
	if topic == "guarded" {
		return g
	}
	return nil
}

func (g *panickyGuards) Check(topic string, p int32, r *ProducedRecord) (string, string, bool) {
	if string(r.Value) == "boom" {
		panic("test: a guard bug")
	}
	return g.testGuards.Check(topic, p, r)
}

// A panic in the proxy's own code while serving a connection (here a
// guard's) closes that connection only: it is logged with its stack and
// counted, and the process and the other connections go on.
func TestPanicClosesOnlyItsConnection(t *testing.T) {
	upstream := startKfake(t, "-topics", "guarded:1,plain:1")
	tp := startProxy(t, upstream, func(c *Config) { c.MaxHeldBytes = 64 << 20 })
	tp.SetGuards(&panickyGuards{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Not idempotent: an idempotent producer never gives up a batch that
	// may have been written, and would send this one again for good.
	bad, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ProducerLinger(0), kgo.DisableIdempotentWrite(),
		kgo.RecordRetries(2), kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond }), kgo.MetadataMinAge(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if err := bad.ProduceSync(ctx, &kgo.Record{Topic: "guarded", Value: []byte("boom")}).FirstErr(); err == nil {
		t.Fatal("the record whose check panicked was acknowledged")
	}
	tp.waitLog(t, "closing client connection: internal error", "test: a guard bug", "stack=")
	if v := metricValue(t, tp.m.panics); v < 1 {
		t.Fatalf("rtproxy_proxy_panics_total = %v, want >= 1", v)
	}

	// Another client, and the same client's next records, go on.
	good, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	for _, r := range []*kgo.Record{{Topic: "plain", Value: []byte("boom")}, {Topic: "guarded", Value: []byte("fine")}} {
		if err := good.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("produce %s/%s after the panic: %v", r.Topic, r.Value, err)
		}
	}
	if err := bad.ProduceSync(ctx, &kgo.Record{Topic: "guarded", Value: []byte("fine")}).FirstErr(); err != nil {
		t.Fatalf("the panicked connection's client, once reconnected: %v", err)
	}
	// The panicked request's reservations went back: nothing is held, and
	// no reservation still arriving weighs on later grants. (The last
	// request's own goes back just after it is written upstream, which
	// can be after its response arrived: wait a little.)
	var h, d float64
	var n int
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		h, d = metricValue(t, tp.m.heldBytes), metricValue(t, tp.m.decodedBytes)
		tp.held.mu.Lock()
		n = len(tp.held.growing)
		tp.held.mu.Unlock()
		if h == 0 && d == 0 && n == 0 {
			break
		}
	}
	if h != 0 || d != 0 || n != 0 {
		t.Errorf("after the panic: held_bytes %v, decoded_bytes %v, %d growing reservations; want none", h, d, n)
	}
}
