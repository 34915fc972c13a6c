package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// oddView keeps records whose value has an even length, upper-casing
// them (in ViewRecord.Scratch), filters the others, and fails records whose value starts with
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
		// Built in the caller's scratch buffer, as the rules adapter
		// does: the caller must encode it before the next record.
		out := append(r.Scratch[:0], bytes.ToUpper(r.Value)...)
		if out == nil {
			out = []byte{} // an empty value stays one, not a null
		}
		r.Value, r.Scratch = out, out
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
		// The workers (view_par.go) write the same bytes.
		var cw viewCounts
		par, err := viewPartitionOn(3, oddView{}, in, func() *decodeMeter { return testMeter(1<<20, 1000) }, &viewScratch{}, &cw)
		if err != nil || !bytes.Equal(par, out) || cw != c {
			t.Fatalf("with workers: %x %+v %v; in line: %x %+v", par, cw, err, out, c)
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
		checkViewOutput(t, want, got)
	})
}

// checkViewOutput checks the batches oddView wrote (got) for the input
// batches (want): the records are those the view makes of the input's,
// in order, each inside its batch's offsets; every input batch's offsets
// are inside one output batch (filtered ones folded into a neighbour);
// control batches pass as they are; a client's next offset after the
// output is the input's; only a run of filtered batches that nothing can
// absorb is an empty batch, uncompressed.
func checkViewOutput(t *testing.T, want, got []refBatch) {
	t.Helper()
	var exp, out []refRecord
	for _, w := range want {
		if w.attrs&0x20 != 0 {
			continue
		}
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
	}
	// Offsets are checked for inputs a broker could send: batches in
	// order, each after the one before, records inside their batch.
	ordered := true
	for i, w := range want {
		ordered = ordered && w.lastDelta >= 0 && w.base >= 0 && w.base < math.MaxInt64-math.MaxInt32 &&
			(i == 0 || w.base > want[i-1].base+int64(want[i-1].lastDelta))
		for _, r := range w.recs {
			ordered = ordered && r.offset >= w.base && r.offset <= w.base+int64(w.lastDelta)
		}
	}
	var controls []refBatch
	for i, g := range got {
		end := g.base + int64(g.lastDelta)
		if !ordered {
			if g.attrs&0x20 != 0 {
				controls = append(controls, g)
			} else {
				out = append(out, g.recs...)
			}
			continue
		}
		if i > 0 && g.base <= got[i-1].base+int64(got[i-1].lastDelta) {
			t.Fatalf("batch %d starts at %d, inside the batch before", i, g.base)
		}
		if g.attrs&0x20 != 0 {
			controls = append(controls, g)
			continue
		}
		if len(g.recs) == 0 && g.attrs&7 != 0 {
			t.Fatalf("batch %d: an empty batch is compressed", i)
		}
		for _, r := range g.recs {
			if r.offset < g.base || r.offset > end {
				t.Fatalf("batch %d [%d, %d] holds a record at %d", i, g.base, end, r.offset)
			}
		}
		out = append(out, g.recs...)
	}
	if fmt.Sprint(out) != fmt.Sprint(exp) {
		t.Fatalf("records:\n got %v\nwant %v", out, exp)
	}
	var wantControls []refBatch
	for _, w := range want {
		if w.attrs&0x20 != 0 {
			wantControls = append(wantControls, w)
		}
		if !ordered {
			continue
		}
		covered := false
		for _, g := range got {
			covered = covered || (g.base <= w.base && w.base+int64(w.lastDelta) <= g.base+int64(g.lastDelta))
		}
		if !covered && w.lastDelta >= 0 {
			t.Fatalf("input batch [%d, +%d] is not inside an output batch: %+v", w.base, w.lastDelta, got)
		}
	}
	if fmt.Sprint(controls) != fmt.Sprint(wantControls) {
		t.Fatalf("control batches %v, want %v", controls, wantControls)
	}
	if len(want) > 0 && ordered {
		lw, lg := want[len(want)-1], got[len(got)-1]
		if lw.base+int64(lw.lastDelta) != lg.base+int64(lg.lastDelta) {
			t.Fatalf("the output ends at %d, the input at %d", lg.base+int64(lg.lastDelta), lw.base+int64(lw.lastDelta))
		}
	}
}

// Batches whose records are all filtered out are folded into the batch
// before (or, at the start, the one after) rather than sent empty; only
// a partition with nothing kept gets an empty batch; a control batch
// stops the folding.
func TestViewFilteredBatchesFolded(t *testing.T) {
	none := kgo.NoCompression()
	keep, drop := "ab", "abc" // oddView keeps even lengths
	for _, tc := range []struct {
		name    string
		in      [][]byte
		batches int // in the output
		empty   int // of them with no record
	}{
		{"after a kept one", [][]byte{viewBatchSeed(t, 0, none, keep), viewBatchSeed(t, 2, kgo.ZstdCompression(), drop, drop)}, 1, 0},
		{"before a kept one", [][]byte{viewBatchSeed(t, 0, none, drop), viewBatchSeed(t, 2, none, drop), viewBatchSeed(t, 4, kgo.GzipCompression(), keep, drop)}, 1, 0},
		{"nothing kept", [][]byte{viewBatchSeed(t, 0, kgo.ZstdCompression(), drop), viewBatchSeed(t, 2, none, drop)}, 1, 1},
		{"around a control batch", [][]byte{viewBatchSeed(t, 0, none, drop), controlBatch(t, 2), viewBatchSeed(t, 3, none, keep)}, 3, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := bytes.Join(tc.in, nil)
			// A client that cannot read an empty batch gets none: the
			// run is left out instead.
			sc := &viewScratch{noEmpty: true}
			out, err := viewPartition(nil, oddView{}, 0, in, testMeter(1<<20, 1000), sc, &viewCounts{})
			if err != nil {
				t.Fatal(err)
			}
			lean, _ := refDecode(out)
			for _, g := range lean {
				if len(g.recs) == 0 && g.attrs&0x20 == 0 {
					t.Errorf("an empty batch for a client that cannot read one: %+v", lean)
				}
			}
			if len(lean) != tc.batches-tc.empty || sc.dropped != tc.empty {
				t.Errorf("without empty batches: %d batches, %d runs left out; want %d, %d", len(lean), sc.dropped, tc.batches-tc.empty, tc.empty)
			}

			out, err = viewPartition(nil, oddView{}, 0, in, testMeter(1<<20, 1000), &viewScratch{}, &viewCounts{})
			if err != nil {
				t.Fatal(err)
			}
			got, ok := refDecode(out)
			want, _ := refDecode(in)
			if !ok {
				t.Fatalf("output does not decode")
			}
			checkViewOutput(t, want, got)
			empty := 0
			for _, g := range got {
				if len(g.recs) == 0 && g.attrs&0x20 == 0 {
					empty++
				}
			}
			if len(got) != tc.batches || empty != tc.empty {
				t.Errorf("%d batches, %d empty; want %d, %d: %+v", len(got), empty, tc.batches, tc.empty, got)
			}
		})
	}
}

// controlBatch is a commit marker at offset.
func controlBatch(tb testing.TB, offset int64) []byte {
	r := kmsg.Record{Key: []byte{0, 0, 0, 1}, Value: []byte{0, 0, 0, 0, 0, 0}}
	r.Length = int32(len(r.AppendTo(nil)) - 1)
	rb := kmsg.RecordBatch{FirstOffset: offset, Magic: 2, Attributes: 0x30, NumRecords: 1, ProducerID: 7, ProducerEpoch: 0, FirstSequence: -1, Records: r.AppendTo(nil)}
	return fixBatch(rb.AppendTo(nil))
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
