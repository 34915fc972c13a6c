package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// oddView keeps records whose value has an even length, upper-casing
// them, filters the others, and fails records whose value starts with
// "!"; its headers get one more.
type oddView struct{}

func (oddView) Name() string  { return "odd" }
func (oddView) Topic() string { return "t" }
func (oddView) Apply(r *ViewRecord) (bool, error) {
	if bytes.HasPrefix(r.Value, []byte("!")) {
		return false, errors.New("bang")
	}
	if len(r.Value)%2 != 0 {
		return false, nil
	}
	if r.Value != nil {
		r.Value = bytes.ToUpper(r.Value)
	}
	r.Headers = append(slices.Clone(r.Headers), kmsg.Header{Key: "seen", Value: []byte("1")})
	return true, nil
}

type refRecord struct {
	offset  int64
	key     string
	value   []byte
	headers []kmsg.Header
}

type refBatch struct {
	base      int64
	lastDelta int32
	attrs     int16
	producer  int64
	recs      []refRecord
}

// refDecode decodes record batches independently of the proxy's
// decoder: kmsg for the framing, franz-go's decompressor; ok false when
// b is not a sequence of whole, valid v2 batches.
func refDecode(b []byte) ([]refBatch, bool) {
	var out []refBatch
	dec := kgo.DefaultDecompressor()
	for len(b) > 0 {
		if len(b) < 61 {
			return nil, false
		}
		size := int(int32(binary.BigEndian.Uint32(b[8:12])))
		if size < 49 || 12+size > len(b) || b[16] != 2 {
			return nil, false
		}
		var rb kmsg.RecordBatch
		if rb.ReadFrom(b[:12+size]) != nil || uint32(rb.CRC) != crc32.Checksum(b[21:12+size], crc32.MakeTable(crc32.Castagnoli)) {
			return nil, false
		}
		b = b[12+size:]
		bt := refBatch{base: rb.FirstOffset, lastDelta: rb.LastOffsetDelta, attrs: rb.Attributes, producer: rb.ProducerID}
		if rb.Attributes&0x20 != 0 {
			out = append(out, bt)
			continue
		}
		data := rb.Records
		if c := rb.Attributes & 7; c != 0 {
			d, err := dec.Decompress(data, kgo.CompressionCodecType(c))
			if err != nil {
				return nil, false
			}
			data = d
		}
		for range rb.NumRecords {
			l, n := binary.Varint(data)
			if n <= 0 || l < 0 || int(l) > len(data)-n {
				return nil, false
			}
			var r kmsg.Record
			if r.ReadFrom(data[:n+int(l)]) != nil {
				return nil, false
			}
			data = data[n+int(l):]
			bt.recs = append(bt.recs, refRecord{offset: rb.FirstOffset + int64(r.OffsetDelta), key: string(r.Key), value: r.Value, headers: r.Headers})
		}
		if len(data) != 0 || rb.NumRecords < 0 {
			return nil, false
		}
		out = append(out, bt)
	}
	return out, true
}

// viewBatchSeed is a batch of values at base, compressed with codec.
func viewBatchSeed(tb testing.TB, base int64, codec kgo.CompressionCodec, values ...string) []byte {
	var recs []byte
	for i, v := range values {
		r := kmsg.Record{OffsetDelta: int32(2 * i), TimestampDelta64: int64(i), Key: []byte(fmt.Sprint("k", i)), Value: []byte(v),
			Headers: []kmsg.Header{{Key: "h", Value: []byte("v")}}}
		if v == "<nil>" {
			r.Value = nil
		}
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
	rb := kmsg.RecordBatch{FirstOffset: base, Magic: 2, Attributes: attrs, NumRecords: int32(len(values)), LastOffsetDelta: int32(2*len(values) - 1),
		FirstTimestamp: 1000, MaxTimestamp: 1000 + int64(len(values)), ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, Records: recs}
	return fixBatch(rb.AppendTo(nil))
}

// FuzzViewBatch: decode → apply → re-encode → decode gives what the view
// makes of the input, decoded independently (kmsg and franz-go's
// decompressors): each batch keeps its base offset, last offset delta and
// producer, each kept record its offset and key; a filtered record is a
// gap; a record the view fails has a null value and the error header. An
// input that is not valid batches never panics, and what comes out still
// decodes and holds no record the view did not see.
func FuzzViewBatch(f *testing.F) {
	vals := []string{"ab", "abc", "!x", "", "<nil>", "abcd"}
	for i, codec := range []kgo.CompressionCodec{kgo.NoCompression(), kgo.GzipCompression(), kgo.SnappyCompression(), kgo.Lz4Compression(), kgo.ZstdCompression()} {
		f.Add(viewBatchSeed(f, int64(10*i), codec, vals...))
	}
	two := append(viewBatchSeed(f, 0, kgo.ZstdCompression(), "abc", "a"), viewBatchSeed(f, 4, kgo.NoCompression(), "ab")...)
	f.Add(two)
	f.Add(append(viewBatchSeed(f, 0, kgo.NoCompression(), "ab"), 0, 0, 0))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 0 && in[len(in)-1]&1 == 0 {
			// Half the inputs get their batches' CRCs fixed, so that the
			// fuzzer reaches the records and not only the CRC check.
			fixCRCs(in)
		}
		m := testMeter(1<<20, 1000)
		var c viewCounts
		out, err := viewPartition(nil, oddView{}, 0, in, m, &viewScratch{}, &c)
		if err != nil {
			t.Fatal(err) // only a closed connection errs
		}
		got, ok := refDecode(out)
		if !ok {
			t.Fatalf("the output does not decode: %x", out)
		}
		want, ok := refDecode(in)
		if !ok {
			for _, b := range got {
				for _, r := range b.recs {
					if r.value != nil && !bytes.Equal(bytes.ToUpper(r.value), r.value) {
						t.Fatalf("a record the view did not make: %q", r.value)
					}
				}
			}
			return
		}
		if len(got) != len(want) {
			t.Fatalf("%d batches out of %d", len(got), len(want))
		}
		for i, w := range want {
			g := got[i]
			if g.base != w.base || g.lastDelta != w.lastDelta || g.producer != w.producer || g.attrs&0x30 != w.attrs&0x30 {
				t.Fatalf("batch %d: %+v, want %+v", i, g, w)
			}
			if w.attrs&0x20 != 0 {
				continue
			}
			var exp []refRecord
			for _, r := range w.recs {
				switch {
				case bytes.HasPrefix(r.value, []byte("!")):
					exp = append(exp, refRecord{offset: r.offset, key: r.key, headers: []kmsg.Header{{Key: ViewErrorHeader, Value: []byte("bang")}}})
				case len(r.value)%2 != 0:
				default:
					v := r.value
					if v != nil {
						v = bytes.ToUpper(v)
					}
					exp = append(exp, refRecord{offset: r.offset, key: r.key, value: v, headers: append(slices.Clone(r.headers), kmsg.Header{Key: "seen", Value: []byte("1")})})
				}
			}
			if len(exp) == 0 && g.attrs&7 != 0 {
				t.Fatalf("batch %d: an empty batch is compressed", i)
			}
			if len(exp) > 0 && g.attrs&7 != w.attrs&7 {
				t.Fatalf("batch %d: codec %d, want %d", i, g.attrs&7, w.attrs&7)
			}
			if fmt.Sprint(g.recs) != fmt.Sprint(exp) {
				t.Fatalf("batch %d:\n got %v\nwant %v", i, g.recs, exp)
			}
		}
	})
}

// A batch that does not decode (bad CRC, unknown codec, over the decode
// budget, an old message format) comes out as one record at its last
// offset with a null value and a header saying why — never the original.
func TestViewBatchUndecodable(t *testing.T) {
	good := viewBatchSeed(t, 5, kgo.NoCompression(), "secret-ab", "secret-cd")
	badCRC := slices.Clone(good)
	badCRC[len(badCRC)-1] ^= 1
	big := viewBatchSeed(t, 5, kgo.GzipCompression(), strings.Repeat("s", 4<<10))
	legacy := make([]byte, 12+14+4)
	binary.BigEndian.PutUint64(legacy, 42)
	binary.BigEndian.PutUint32(legacy[8:], uint32(len(legacy)-12))
	legacy[16] = 1
	for _, tc := range []struct {
		name   string
		in     []byte
		off    int64
		reason string
	}{
		{"crc", badCRC, 5 + 3, "CRC"},
		{"budget", big, 5 + 1, "max_decoded_bytes"},
		{"legacy", legacy, 42, "older than Kafka 0.11"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c viewCounts
			out, err := viewPartition(nil, oddView{}, 0, tc.in, testMeter(1<<10, 100), &viewScratch{}, &c)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := refDecode(out)
			if !ok || len(got) != 1 || len(got[0].recs) != 1 {
				t.Fatalf("output %v (ok %v)", got, ok)
			}
			r := got[0].recs[0]
			if r.offset != tc.off || r.value != nil || len(r.headers) != 1 || r.headers[0].Key != ViewErrorHeader ||
				!strings.Contains(string(r.headers[0].Value), tc.reason) {
				t.Errorf("record %+v, want offset %d and a header naming %q", r, tc.off, tc.reason)
			}
			if bytes.Contains(out, []byte("secret")) || bytes.Contains(out, []byte("sss")) {
				t.Errorf("the original passed through")
			}
			if c.errors != 1 {
				t.Errorf("errors counted %d", c.errors)
			}
		})
	}
}

// fixCRCs sets the CRC of every v2 batch in b that frames.
func fixCRCs(b []byte) {
	for len(b) >= 61 {
		size := int(int32(binary.BigEndian.Uint32(b[8:12])))
		if size < 49 || 12+size > len(b) || b[16] != 2 {
			return
		}
		binary.BigEndian.PutUint32(b[17:21], crc32.Checksum(b[21:12+size], crc32.MakeTable(crc32.Castagnoli)))
		b = b[12+size:]
	}
}
