package protocol

import (
	"bytes"
	"context"
	"encoding/binary"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// refuseAll guards every topic starting with "g" and refuses every record:
// the worst case for the response (one record error per record).
type refuseAll struct{ testGuards }

func (g *refuseAll) For(topic string) Guard {
	if strings.HasPrefix(topic, "g") {
		return g
	}
	return nil
}

func (g *refuseAll) Check(string, int32, *ProducedRecord) (string, string, bool) {
	return "never", "no record passes", false
}

// bombRecords is n records of 7 bytes each (null key, null value, no
// header) at offset deltas 0..n-1: what a "5 M tiny records in 3 KB"
// request holds once decompressed.
func bombRecords(n int) []byte {
	out := make([]byte, 0, n*8)
	var rec []byte
	for i := range n {
		rec = rec[:0]
		rec = append(rec, 0)              // attributes
		rec = binary.AppendVarint(rec, 0) // timestamp delta
		rec = binary.AppendVarint(rec, int64(i))
		rec = binary.AppendVarint(rec, -1) // key
		rec = binary.AppendVarint(rec, -1) // value
		rec = binary.AppendVarint(rec, 0)  // headers
		out = binary.AppendVarint(out, int64(len(rec)))
		out = append(out, rec...)
	}
	return out
}

// bombBatch is a v2 batch of n tiny records compressed with codec.
func bombBatch(tb testing.TB, n int, codec kgo.CompressionCodec) []byte {
	tb.Helper()
	recs := bombRecords(n)
	comp, err := kgo.DefaultCompressor(codec)
	if err != nil {
		tb.Fatal(err)
	}
	attrs := int16(0)
	if comp != nil {
		out, got := comp.Compress(bytes.NewBuffer(nil), recs)
		recs, attrs = append([]byte(nil), out...), int16(got)
	}
	now := time.Now().UnixMilli()
	rb := kmsg.RecordBatch{Magic: 2, Attributes: attrs, NumRecords: int32(n), LastOffsetDelta: int32(n - 1),
		FirstTimestamp: now, MaxTimestamp: now, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, Records: recs}
	return fixBatch(rb.AppendTo(nil))
}

func bombRequest(topic string, batches ...[]byte) *kmsg.ProduceRequest {
	req := kmsg.NewPtrProduceRequest()
	req.Acks, req.TimeoutMillis = -1, 5000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	for i, b := range batches {
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Partition = int32(i)
		rp.Records = b
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	return req
}

// TestDecodeBombRefused is finding 3 of issue 25: with a guard loaded, one
// small zstd Produce request holding a million tiny records must not grow
// the proxy by hundreds of megabytes nor build a response with a million
// record errors. The partition is refused with MESSAGE_TOO_LARGE and a
// message naming the bound; the response stays small; what the proxy
// allocates for it stays under the bound.
func TestDecodeBombRefused(t *testing.T) {
	upstream := startKfake(t, "-topics", "gbomb:2,plain:1")
	tp := startProxy(t, upstream, func(c *Config) {
		c.MaxDecodedBytes = 8 << 20
		c.MaxRecordsPerRequest = 100_000
	})
	tp.SetGuards(&refuseAll{})
	vs := kversion.Stable()
	vs.SetMaxKeyVersion(int16(kmsg.Produce), 12)
	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.MaxVersions(vs))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 1_000_000
	bomb := bombBatch(t, n, kgo.ZstdCompression())
	t.Logf("a batch of %d records: %d bytes compressed", n, len(bomb))
	req := bombRequest("gbomb", bomb)

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	resp, err := req.RequestWith(ctx, cl)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("allocated %d MiB while the proxy handled it", alloc>>20)
	if alloc > 48<<20 {
		t.Errorf("the proxy allocated %d MiB for one %d-byte request; the bound is 8 MiB decoded", alloc>>20, len(bomb))
	}
	p := resp.Topics[0].Partitions[0]
	if p.ErrorCode != kerr.MessageTooLarge.Code {
		t.Errorf("partition answer: %v, want MESSAGE_TOO_LARGE", kerr.ErrorForCode(p.ErrorCode))
	}
	if p.ErrorMessage == nil || !strings.Contains(*p.ErrorMessage, "max_records_per_request") {
		t.Errorf("message %q does not name the bound", deref(p.ErrorMessage))
	}
	if len(p.ErrorRecords) > maxRecordErrors {
		t.Errorf("%d record errors in the response, want at most %d", len(p.ErrorRecords), maxRecordErrors)
	}
	if size := len(resp.AppendTo(nil)); size > 64<<10 {
		t.Errorf("response of %d bytes", size)
	}
	if v := metricValue(t, tp.m.decodeLimited.WithLabelValues("guard", "records")); v != 1 {
		t.Errorf("rtproxy_proxy_decode_limited_total{path=guard,bound=records} = %v, want 1", v)
	}

	// Under the bound, a batch whose records all fail gets at most
	// maxRecordErrors record errors, and the message counts the rest.
	resp, err = bombRequest("gbomb", bombBatch(t, 5000, kgo.ZstdCompression())).RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	p = resp.Topics[0].Partitions[0]
	if p.ErrorCode != kerr.InvalidRecord.Code || len(p.ErrorRecords) != maxRecordErrors ||
		!strings.Contains(deref(p.ErrorMessage), "and 4999 more records") {
		t.Errorf("5000 refused records: %v, %d record errors, %q", kerr.ErrorForCode(p.ErrorCode), len(p.ErrorRecords), deref(p.ErrorMessage))
	}

	// Decompression stops at the bound: 64 MiB of zeros in one zstd
	// batch is refused for its bytes, not decoded.
	zeros := make([]byte, 64<<20)
	comp, _ := kgo.DefaultCompressor(kgo.ZstdCompression())
	packed, _ := comp.Compress(bytes.NewBuffer(nil), zeros)
	zeros = nil
	rb := kmsg.RecordBatch{Magic: 2, Attributes: 4, NumRecords: 1, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1,
		Records: append([]byte(nil), packed...)}
	runtime.GC()
	runtime.ReadMemStats(&before)
	resp, err = bombRequest("gbomb", fixBatch(rb.AppendTo(nil))).RequestWith(ctx, cl)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 40<<20 {
		t.Errorf("a 64 MiB zstd bomb cost %d MiB", alloc>>20)
	}
	p = resp.Topics[0].Partitions[0]
	if p.ErrorCode != kerr.MessageTooLarge.Code || !strings.Contains(deref(p.ErrorMessage), "max_decoded_bytes") {
		t.Errorf("64 MiB bomb: %v %q", kerr.ErrorForCode(p.ErrorCode), deref(p.ErrorMessage))
	}

	// The connection and the proxy go on: a normal produce passes.
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "plain", Value: []byte("after")}).FirstErr(); err != nil {
		t.Fatalf("produce after the bombs: %v", err)
	}
}

// Concurrent guarded requests share proxy.max_decoded_bytes_total: six
// connections each produce batches that decode to about 1.5 MiB under a
// 4 MiB total; decodes wait for each other (the held total never passes
// 4 MiB), and every record passes.
func TestDecodeTotalShared(t *testing.T) {
	upstream := startKfake(t, "-topics", "gshare:1")
	tp := startProxy(t, upstream, func(c *Config) {
		c.MaxDecodedBytes = 2 << 20
		c.MaxDecodedBytesTotal = 4 << 20
	})
	tp.SetGuards(&testGuards{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	value := bytes.Repeat([]byte("v"), 100<<10)
	var wg sync.WaitGroup
	for c := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ProducerLinger(50*time.Millisecond),
				kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.DefaultProduceTopic("gshare"))
			if err != nil {
				t.Error(err)
				return
			}
			defer cl.Close()
			for range 5 {
				var rs []*kgo.Record
				for range 15 {
					rs = append(rs, &kgo.Record{Value: value})
				}
				if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
					t.Errorf("client %d: %v", c, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if peak := tp.decoded.peakBytes(); peak > 4<<20 || peak == 0 {
		t.Errorf("decodes held %d bytes at once, want (0, 4 MiB]", peak)
	}
	t.Logf("peak %d KiB decoded at once, %v waits", tp.decoded.peakBytes()>>10, metricValue(t, tp.m.decodedWaits))
	if v := metricValue(t, tp.m.decodedBytes); v != 0 {
		t.Errorf("rtproxy_proxy_decoded_bytes = %v after every request, want 0", v)
	}
}

// FuzzRecordHeaderCount: the pre-scan that charges a record's headers
// before they are decoded agrees with franz-go's record decoder (the
// reference) on every record that decodes, and never panics.
func FuzzRecordHeaderCount(f *testing.F) {
	for _, r := range []kmsg.Record{
		{},
		{Key: []byte("k"), Value: []byte("v")},
		{OffsetDelta: 300, TimestampDelta64: -5, Headers: []kmsg.Header{{Key: "a", Value: []byte("1")}, {Key: "", Value: nil}}},
	} {
		b := r.AppendTo(nil)
		_, n := binary.Varint(b)
		f.Add(b[n:])
	}
	f.Add([]byte{0, 0, 0, 1, 1, 0x80})
	f.Fuzz(func(t *testing.T, body []byte) {
		got, ok := recordHeaderCount(body)
		// As readBatch hands it: the length, then the record's bytes.
		rec := binary.AppendVarint(nil, int64(len(body)))
		rec = append(rec, body...)
		var r kmsg.Record
		if r.ReadFrom(rec) != nil {
			return
		}
		if !ok || got != int64(len(r.Headers)) {
			t.Fatalf("pre-scan: %d headers (ok %v), franz-go decodes %d", got, ok, len(r.Headers))
		}
	})
}

// FuzzDecodeMeterBounds: whatever a batch holds, decoding it charges no
// more than the bounds allow, and the records it returns are as many as
// were charged.
func FuzzDecodeMeterBounds(f *testing.F) {
	f.Add(bombBatch(f, 1000, kgo.ZstdCompression()), int64(4096), int64(100))
	f.Add(bombBatch(f, 50, kgo.GzipCompression()), int64(1<<20), int64(1000))
	f.Add(bombBatch(f, 50, kgo.SnappyCompression()), int64(1<<20), int64(10))
	f.Add(bombBatch(f, 50, kgo.Lz4Compression()), int64(2000), int64(1000))
	f.Fuzz(func(t *testing.T, b []byte, maxCost, maxRecs int64) {
		if maxCost <= 0 || maxRecs <= 0 || maxCost > 8<<20 {
			return
		}
		m := &decodeMeter{maxCost: maxCost, maxRecs: maxRecs, bufs: &decompressBufs{}}
		recs, _, err := decodeBatches(b, m)
		if m.cost > maxCost || m.recs > maxRecs {
			t.Fatalf("charged %d bytes and %d records over %d and %d", m.cost, m.recs, maxCost, maxRecs)
		}
		if err == nil && int64(len(recs)) > m.recs {
			t.Fatalf("%d records decoded, %d charged", len(recs), m.recs)
		}
	})
}
