package serde

// Decode and encode cost per record of the 1 KiB payment of the operators'
// benchmarks (internal/benchkit), the same record in Avro and in Protobuf
// (testdata/bench-payment.*), against the JSON path (jsoncodec.Decode,
// what Record.SetJSON runs). Run:
//
//	go test -run '^$' -bench . -benchmem -cpu 1 ./internal/serde/
//
// The schema is cached, as it is after a route's first record of an id.

import (
	"context"
	"os"
	"reflect"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/rtproxy/rtproxy/internal/benchkit"
	"github.com/rtproxy/rtproxy/internal/jsoncodec"
)

// cachedDecoder is a Decoder whose registry holds s under id 1 and asks no
// server.
func cachedDecoder(f Format, s *Schema) *Decoder {
	done := make(chan struct{})
	close(done)
	s.ID = 1
	return NewDecoder(&Registry{byID: map[int]*entry{1: {done: done, s: s}}}, f)
}

func benchSchemas(tb testing.TB) (avroS, protoS *Schema) {
	avsc, err := os.ReadFile("testdata/bench-payment.avsc")
	if err != nil {
		tb.Fatal(err)
	}
	proto, err := os.ReadFile("testdata/bench-payment.proto")
	if err != nil {
		tb.Fatal(err)
	}
	return fuzzSchema(tb, sr.TypeAvro, string(avsc)), fuzzSchema(tb, sr.TypeProtobuf, string(proto))
}

// benchInputs are the 4096 payments of the chain benchmark in JSON, Avro
// and Protobuf.
func benchInputs(tb testing.TB) (js, av, pb [][]byte, avroS, protoS *Schema) {
	avroS, protoS = benchSchemas(tb)
	ae := &Encoder{format: Avro, s: avroS}
	md, _ := pickMessage(protoS.proto, "")
	pe := &Encoder{format: Protobuf, s: protoS, md: md, index: protoIndexOf(md)}
	js = benchkit.Inputs(4096)
	for _, j := range js {
		v, err := jsoncodec.Decode(j)
		if err != nil {
			tb.Fatal(err)
		}
		a, err := ae.Encode(v)
		if err != nil {
			tb.Fatal(err)
		}
		p, err := pe.Encode(v)
		if err != nil {
			tb.Fatal(err)
		}
		av, pb = append(av, a), append(pb, p)
	}
	return js, av, pb, avroS, protoS
}

// TestBenchPaymentsDecodeAlike: the three forms of a benchmark payment
// decode to the same value tree.
func TestBenchPaymentsDecodeAlike(t *testing.T) {
	js, av, pb, as, ps := benchInputs(t)
	ad, pd := cachedDecoder(Avro, as), cachedDecoder(Protobuf, ps)
	for _, i := range []int{0, 7, 4095} {
		want, _ := jsoncodec.Decode(js[i])
		a, err := ad.Decode(context.Background(), av[i])
		if err != nil || !reflect.DeepEqual(a, want) {
			t.Fatalf("avro payment %d: %v\n%#v\nwant\n%#v", i, err, a, want)
		}
		p, err := pd.Decode(context.Background(), pb[i])
		if err != nil || !reflect.DeepEqual(p, want) {
			t.Fatalf("protobuf payment %d: %v\n%#v\nwant\n%#v", i, err, p, want)
		}
	}
}

func BenchmarkDecodePayment(b *testing.B) {
	js, av, pb, as, ps := benchInputs(b)
	run := func(b *testing.B, in [][]byte, decode func([]byte) (any, error)) {
		n := 0
		for _, x := range in {
			n += len(x)
		}
		b.SetBytes(int64(n / len(in)))
		b.ReportAllocs()
		i := 0
		cpu0 := benchkit.CPUNow()
		for b.Loop() {
			if _, err := decode(in[i%len(in)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
		benchkit.RecPerSec(b, cpu0)
	}
	ctx := context.Background()
	ad, pd := cachedDecoder(Avro, as), cachedDecoder(Protobuf, ps)
	b.Run("json", func(b *testing.B) { run(b, js, jsoncodec.Decode) })
	b.Run("avro", func(b *testing.B) { run(b, av, func(x []byte) (any, error) { return ad.Decode(ctx, x) }) })
	b.Run("protobuf", func(b *testing.B) { run(b, pb, func(x []byte) (any, error) { return pd.Decode(ctx, x) }) })
}

// BenchmarkEncodePayment is the other direction, side by side with
// BenchmarkDecodePayment: the value tree of each payment (as the JSON
// path decodes it) written as compact JSON (jsoncodec.Append, what a JSON
// sink writes for a value built by map), Avro and Protobuf (Encoder.Encode,
// what sink.format avro | protobuf runs), the output schema resolved.
func BenchmarkEncodePayment(b *testing.B) {
	js, _, _, as, ps := benchInputs(b)
	trees := make([]any, len(js))
	for i, j := range js {
		v, err := jsoncodec.Decode(j)
		if err != nil {
			b.Fatal(err)
		}
		trees[i] = v
	}
	md, _ := pickMessage(ps.proto, "")
	ae := &Encoder{format: Avro, s: as}
	pe := &Encoder{format: Protobuf, s: ps, md: md, index: protoIndexOf(md)}
	run := func(b *testing.B, encode func(any) ([]byte, error)) {
		n := 0
		for _, v := range trees[:256] {
			out, err := encode(v)
			if err != nil {
				b.Fatal(err)
			}
			n += len(out)
		}
		b.SetBytes(int64(n / 256))
		b.ReportAllocs()
		i := 0
		cpu0 := benchkit.CPUNow()
		for b.Loop() {
			if _, err := encode(trees[i%len(trees)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
		benchkit.RecPerSec(b, cpu0)
	}
	b.Run("json", func(b *testing.B) { run(b, func(v any) ([]byte, error) { return jsoncodec.Append(nil, v) }) })
	b.Run("avro", func(b *testing.B) { run(b, ae.Encode) })
	b.Run("protobuf", func(b *testing.B) { run(b, pe.Encode) })
}
