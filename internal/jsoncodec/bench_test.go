package jsoncodec

// Benchmarks of the codec on 1 KiB payment-like records, the ones the
// operators' benchmarks use (docs/BENCHMARKS.md). Run:
//
//	go test -run '^$' -bench . -benchmem -cpu 1 ./internal/jsoncodec/
//
// rec/s is records per second of wall clock, cpu-rec/s per second of the
// process's CPU time (GC included), which with -cpu 1 is the cost on one
// core.

import (
	"testing"

	"github.com/rtproxy/rtproxy/internal/benchkit"
)

func BenchmarkJSON(b *testing.B) {
	raw := benchkit.Payment(7)
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		cpu0 := benchkit.CPUNow()
		for b.Loop() {
			if _, err := Decode(raw); err != nil {
				b.Fatal(err)
			}
		}
		benchkit.RecPerSec(b, cpu0)
	})
	decodeEach := func(b *testing.B, in [][]byte) {
		b.SetBytes(1024)
		b.ReportAllocs()
		i := 0
		cpu0 := benchkit.CPUNow()
		for b.Loop() {
			if _, err := Decode(in[i%len(in)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
		benchkit.RecPerSec(b, cpu0)
	}
	// The 4096 payments of the chain benchmark (ids, amounts, times differ).
	b.Run("decode-4096", func(b *testing.B) { decodeEach(b, benchkit.Inputs(4096)) })
	// 4096 payments with no value in common.
	b.Run("decode-unique", func(b *testing.B) {
		in := make([][]byte, 4096)
		for i := range in {
			in[i] = benchkit.UniquePayment(i)
		}
		decodeEach(b, in)
	})
	b.Run("encode", func(b *testing.B) {
		v, _ := Decode(raw)
		var buf []byte
		b.ReportAllocs()
		cpu0 := benchkit.CPUNow()
		for b.Loop() {
			buf, _ = Append(buf[:0], v)
		}
		benchkit.RecPerSec(b, cpu0)
	})
}

func TestPaymentIs1KiB(t *testing.T) {
	for _, i := range []int{0, 7, 99_999_999} {
		if u := benchkit.UniquePayment(i); len(u) != 1024 {
			t.Fatalf("benchkit.UniquePayment(%d) is %d bytes", i, len(u))
		} else if _, err := Decode(u); err != nil {
			t.Fatalf("benchkit.UniquePayment(%d): %v", i, err)
		}
		if p := benchkit.Payment(i); len(p) != 1024 {
			t.Fatalf("benchkit.Payment(%d) is %d bytes", i, len(p))
		} else if _, err := Decode(p); err != nil {
			t.Fatalf("benchkit.Payment(%d): %v", i, err)
		}
	}
}

// BenchmarkSkip is the scanner DecodeMembers skips unread members with:
// the whole payment checked, nothing kept.
func BenchmarkSkip(b *testing.B) {
	raw := benchkit.Payment(7)
	none := Fields{}
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	cpu0 := benchkit.CPUNow()
	for b.Loop() {
		if _, _, err := DecodeMembers(raw, none); err != nil {
			b.Fatal(err)
		}
	}
	benchkit.RecPerSec(b, cpu0)
}
