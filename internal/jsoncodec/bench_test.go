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
	"fmt"
	"syscall"
	"testing"
	"time"
)

// payment is a payment-like JSON object of exactly 1024 bytes: a copy of
// payment in operators/bench_test.go, kept the same so the decode figures
// here and the operators' json figures there are of one record.
func payment(i int) []byte {
	s := fmt.Sprintf(`{"txn_id":"txn-%08d","user_id":"user-%05d","merchant_id":"m-%05d","amount":%d.%02d,"currency":"EUR","status":"settled","ts":%d,"card":{"bin":"424242","last4":"%04d","brand":"visa","country":"DE","expiry":"12/29"},"device":{"id":"dev-%08x","os":"android","version":"14.2.1","ip":"10.%d.%d.%d","user_agent":"Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Mobile Safari/537.36"},"shipping":{"name":"Erika Mustermann","street":"Heidestrasse 17","city":"Koeln","zip":"51147","country":"DE"},"items":[{"sku":"sku-1001","qty":1,"price":19.99},{"sku":"sku-2002","qty":2,"price":5.5},{"sku":"sku-3003","qty":1,"price":42}],"risk":{"score":0.137,"rules":["velocity","geo","bin"],"reviewed":false},"tags":["online","recurring","eu"],"note":"`,
		i%100000000, i%10000, i%100000, i%500, i%100, 1700000000000+int64(i)*7, i%10000, i, i%256, (i/256)%256, i%200)
	b := []byte(s)
	for len(b) < 1022 {
		b = append(b, 'x')
	}
	return append(b, '"', '}')
}

// uniquePayment is payment(i) with every string and number distinct for
// each i < 1e6: the worst case for the decoder's intern caches
// (intern.go), whose hits payment's repeated values (currency, status,
// country, items...) show at their best.
func uniquePayment(i int) []byte {
	u := fmt.Sprintf("%06d", i%1000000)
	s := fmt.Sprintf(`{"txn_id":"txn-%[1]s","user_id":"user-%[1]s","merchant_id":"m-%[1]s","amount":%[2]d.%[3]s,"currency":"C%[1]s","status":"s%[1]s","ts":%[4]d,"card":{"bin":"b%[1]s","last4":"l%[1]s","brand":"v%[1]s","country":"c%[1]s","expiry":"e%[1]s"},"device":{"id":"dev-%[1]s","os":"os%[1]s","version":"v%[1]s","ip":"10.%[1]s","user_agent":"Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 %[1]s"},"shipping":{"name":"n%[1]s","street":"s%[1]s","city":"c%[1]s","zip":"z%[1]s","country":"c%[1]s"},"items":[{"sku":"a%[1]s","qty":1%[1]s,"price":1.%[1]s},{"sku":"b%[1]s","qty":2%[1]s,"price":2.%[1]s},{"sku":"c%[1]s","qty":3%[1]s,"price":3.%[1]s}],"risk":{"score":0.%[1]s,"rules":["r%[1]s","g%[1]s","b%[1]s"],"reviewed":false},"tags":["t%[1]s","u%[1]s","v%[1]s"],"note":"`,
		u, i%500, u, 1700000000000+int64(i)*7)
	b := []byte(s)
	for len(b) < 1022 {
		b = append(b, 'x')
	}
	return append(b, '"', '}')
}

// cpuNow is the CPU time this process has used. On a shared machine the
// wall clock of a benchmark includes the time the scheduler gave other
// processes; with -cpu 1 the process CPU time (GC included) is the honest
// per-core cost, so benchmarks report both.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// recPerSec reports records per second of wall clock (rec/s) and of CPU
// time (cpu-rec/s, and cpu-ns/op); cpu0 is cpuNow() taken after setup.
func recPerSec(b *testing.B, cpu0 time.Duration) {
	cpu := cpuNow() - cpu0
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rec/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(b.N)/cpu.Seconds(), "cpu-rec/s")
}

// inputs are distinct payment payloads the benchmarks cycle through.
func inputs(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = payment(i)
	}
	return out
}

func BenchmarkJSON(b *testing.B) {
	raw := payment(7)
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		cpu0 := cpuNow()
		for b.Loop() {
			if _, err := Decode(raw); err != nil {
				b.Fatal(err)
			}
		}
		recPerSec(b, cpu0)
	})
	decodeEach := func(b *testing.B, in [][]byte) {
		b.SetBytes(1024)
		b.ReportAllocs()
		i := 0
		cpu0 := cpuNow()
		for b.Loop() {
			if _, err := Decode(in[i%len(in)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
		recPerSec(b, cpu0)
	}
	// The 4096 payments of the chain benchmark (ids, amounts, times differ).
	b.Run("decode-4096", func(b *testing.B) { decodeEach(b, inputs(4096)) })
	// 4096 payments with no value in common.
	b.Run("decode-unique", func(b *testing.B) {
		in := make([][]byte, 4096)
		for i := range in {
			in[i] = uniquePayment(i)
		}
		decodeEach(b, in)
	})
	b.Run("encode", func(b *testing.B) {
		v, _ := Decode(raw)
		var buf []byte
		b.ReportAllocs()
		cpu0 := cpuNow()
		for b.Loop() {
			buf, _ = Append(buf[:0], v)
		}
		recPerSec(b, cpu0)
	})
}

func TestPaymentIs1KiB(t *testing.T) {
	for _, i := range []int{0, 7, 99_999_999} {
		if u := uniquePayment(i); len(u) != 1024 {
			t.Fatalf("uniquePayment(%d) is %d bytes", i, len(u))
		} else if _, err := Decode(u); err != nil {
			t.Fatalf("uniquePayment(%d): %v", i, err)
		}
		if p := payment(i); len(p) != 1024 {
			t.Fatalf("payment(%d) is %d bytes", i, len(p))
		} else if _, err := Decode(p); err != nil {
			t.Fatalf("payment(%d): %v", i, err)
		}
	}
}
