// Package benchkit holds what the JSON and operator benchmarks share: the
// 1 KiB payment record they all measure, and their rec/s and CPU-time
// metrics.
package benchkit

import (
	"fmt"
	"syscall"
	"testing"
	"time"
)

// Payment is a payment-like JSON object of exactly 1024 bytes, the record
// of every JSON and operator benchmark (docs/BENCHMARKS.md). Its txn id
// sits at a fixed offset, so benchmarks can stamp distinct ids into a copy.
func Payment(i int) []byte {
	s := fmt.Sprintf(`{"txn_id":"txn-%08d","user_id":"user-%05d","merchant_id":"m-%05d","amount":%d.%02d,"currency":"EUR","status":"settled","ts":%d,"card":{"bin":"424242","last4":"%04d","brand":"visa","country":"DE","expiry":"12/29"},"device":{"id":"dev-%08x","os":"android","version":"14.2.1","ip":"10.%d.%d.%d","user_agent":"Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Mobile Safari/537.36"},"shipping":{"name":"Erika Mustermann","street":"Heidestrasse 17","city":"Koeln","zip":"51147","country":"DE"},"items":[{"sku":"sku-1001","qty":1,"price":19.99},{"sku":"sku-2002","qty":2,"price":5.5},{"sku":"sku-3003","qty":1,"price":42}],"risk":{"score":0.137,"rules":["velocity","geo","bin"],"reviewed":false},"tags":["online","recurring","eu"],"note":"`,
		i%100000000, i%10000, i%100000, i%500, i%100, 1700000000000+int64(i)*7, i%10000, i, i%256, (i/256)%256, i%200)
	b := []byte(s)
	for len(b) < 1022 {
		b = append(b, 'x')
	}
	return append(b, '"', '}')
}

// UniquePayment is Payment(i) with every string and number distinct for
// each i < 1e6: the worst case for the decoder's intern caches
// (intern.go), whose hits Payment's repeated values (currency, status,
// country, items...) show at their best.
func UniquePayment(i int) []byte {
	u := fmt.Sprintf("%06d", i%1000000)
	s := fmt.Sprintf(`{"txn_id":"txn-%[1]s","user_id":"user-%[1]s","merchant_id":"m-%[1]s","amount":%[2]d.%[3]s,"currency":"C%[1]s","status":"s%[1]s","ts":%[4]d,"card":{"bin":"b%[1]s","last4":"l%[1]s","brand":"v%[1]s","country":"c%[1]s","expiry":"e%[1]s"},"device":{"id":"dev-%[1]s","os":"os%[1]s","version":"v%[1]s","ip":"10.%[1]s","user_agent":"Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 %[1]s"},"shipping":{"name":"n%[1]s","street":"s%[1]s","city":"c%[1]s","zip":"z%[1]s","country":"c%[1]s"},"items":[{"sku":"a%[1]s","qty":1%[1]s,"price":1.%[1]s},{"sku":"b%[1]s","qty":2%[1]s,"price":2.%[1]s},{"sku":"c%[1]s","qty":3%[1]s,"price":3.%[1]s}],"risk":{"score":0.%[1]s,"rules":["r%[1]s","g%[1]s","b%[1]s"],"reviewed":false},"tags":["t%[1]s","u%[1]s","v%[1]s"],"note":"`,
		u, i%500, u, 1700000000000+int64(i)*7)
	b := []byte(s)
	for len(b) < 1022 {
		b = append(b, 'x')
	}
	return append(b, '"', '}')
}

// CPUNow is the CPU time this process has used. On a shared machine the
// wall clock of a benchmark includes the time the scheduler gave other
// processes; with -cpu 1 the process CPU time (GC included) is the honest
// per-core cost, so benchmarks report both.
func CPUNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// RecPerSec reports records per second of wall clock (rec/s) and of CPU
// time (cpu-rec/s, and cpu-ns/op); cpu0 is CPUNow() taken after setup.
func RecPerSec(b *testing.B, cpu0 time.Duration) {
	cpu := CPUNow() - cpu0
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rec/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(b.N)/cpu.Seconds(), "cpu-rec/s")
}

// Inputs are distinct payment payloads the benchmarks cycle through.
func Inputs(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = Payment(i)
	}
	return out
}
