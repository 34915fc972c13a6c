// Command guard is `make bench-guard`: produce throughput through the
// proxy with a guard (two checks on a 1 KiB JSON record) against the same
// proxy without one, in one run. kfake (test/kfakebroker) and two proxies
// (test/bench/proxy/proxyproc, one with -guard) run as their own
// processes; rounds alternate which goes first, and the proxies' CPU comes
// from /proc/PID/stat.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/benchkit"
)

const guardYAML = `guard: bench
topic: "gb-*"
checks:
  - check: value.amount > 0
    message: amount must be positive
  - check: size <= 2048
    message: record larger than 2 KiB
`

func main() {
	var (
		records = flag.Int("records", 100000, "records per round and proxy")
		rounds  = flag.Int("rounds", 6, "rounds (the median ratio is reported)")
		profile = flag.String("cpuprofile", "", "write the guarded proxy's CPU profile here")
	)
	flag.Parse()
	log.SetFlags(0)
	dir, err := os.MkdirTemp("", "bench-guard")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	kfakeBin, proxyBin := filepath.Join(dir, "kfakebroker"), filepath.Join(dir, "proxyproc")
	for bin, pkg := range map[string]string{kfakeBin: "./test/kfakebroker", proxyBin: "./test/bench/proxy/proxyproc"} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			log.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	guardPath := filepath.Join(dir, "bench.yaml")
	if err := os.WriteFile(guardPath, []byte(guardYAML), 0o644); err != nil {
		log.Fatal(err)
	}
	var topics []string
	for r := range *rounds {
		topics = append(topics, fmt.Sprintf("gb-plain-%d:3", r), fmt.Sprintf("gb-guard-%d:3", r))
	}
	kfake, brokers := benchkit.StartProc(kfakeBin, "-brokers", "3", "-topics", strings.Join(topics, ","))
	defer benchkit.StopProc(kfake)
	plain, plainAddr := benchkit.StartProc(proxyBin, "-upstream", brokers, "-broker-ports", "29300")
	defer benchkit.StopProc(plain)
	gargs := []string{"-upstream", brokers, "-broker-ports", "29400", "-guard", guardPath}
	if *profile != "" {
		abs, _ := filepath.Abs(*profile)
		gargs = append(gargs, "-cpuprofile", abs)
	}
	guarded, guardAddr := benchkit.StartProc(proxyBin, gargs...)
	defer benchkit.StopProc(guarded)

	var ratios, plainRPS, guardRPS []float64
	var plainCPU, guardCPU time.Duration
	for r := range *rounds {
		run := func(addr, topic string, pid int) (float64, time.Duration) {
			c0 := benchkit.ProcCPU(pid)
			rps := produce(addr, topic, *records)
			return rps, benchkit.ProcCPU(pid) - c0
		}
		var p, g float64
		var pc, gc time.Duration
		if r%2 == 0 {
			p, pc = run(plainAddr, fmt.Sprintf("gb-plain-%d", r), plain.Process.Pid)
			g, gc = run(guardAddr, fmt.Sprintf("gb-guard-%d", r), guarded.Process.Pid)
		} else {
			g, gc = run(guardAddr, fmt.Sprintf("gb-guard-%d", r), guarded.Process.Pid)
			p, pc = run(plainAddr, fmt.Sprintf("gb-plain-%d", r), plain.Process.Pid)
		}
		log.Printf("round %d: pass-through %.0f rec/s (proxy CPU %v), guarded %.0f rec/s (proxy CPU %v), ratio %.3f", r, p, pc, g, gc, g/p)
		ratios, plainRPS, guardRPS = append(ratios, g/p), append(plainRPS, p), append(guardRPS, g)
		plainCPU += pc
		guardCPU += gc
	}
	n := float64(*rounds * *records)
	fmt.Printf("\nguard benchmark: %d rounds of %d records of 1 KiB JSON, 3 partitions, franz-go linger 0\n\n", *rounds, *records)
	fmt.Println("| proxy | median records/s | best records/s | proxy CPU per record |")
	fmt.Println("|---|---:|---:|---:|")
	fmt.Printf("| pass-through (no guard) | %.0f | %.0f | %.2f µs |\n", benchkit.Median(plainRPS), slices.Max(plainRPS), float64(plainCPU.Microseconds())/n)
	fmt.Printf("| one guard, two checks | %.0f | %.0f | %.2f µs |\n", benchkit.Median(guardRPS), slices.Max(guardRPS), float64(guardCPU.Microseconds())/n)
	fmt.Printf("\nguarded / pass-through: median of round ratios %.3fx (target >= 0.9x); rounds %v\n", benchkit.Median(ratios), fmtRatios(ratios))
}

// produce writes n records of 1 KiB JSON to topic through addr and returns
// records/s (every record acknowledged).
func produce(addr, topic string, n int) float64 {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(0),
		kgo.MaxBufferedRecords(1<<16))
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	value := jsonValue()
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr(); err != nil {
		log.Fatalf("warmup via %s: %v", addr, err)
	}
	var failed atomic.Int64
	start := time.Now()
	for range n {
		cl.Produce(ctx, &kgo.Record{Value: value}, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.Add(1)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		log.Fatal(err)
	}
	if f := failed.Load(); f > 0 {
		log.Fatalf("%d records refused via %s", f, addr)
	}
	return float64(n) / time.Since(start).Seconds()
}

// jsonValue is a 1 KiB JSON payment that passes both checks. Its padding
// is random hex, so that it compresses about as much as real JSON does
// (a run of one letter would shrink the pass-through's bytes 20-fold).
func jsonValue() []byte {
	v := []byte(`{"id":"p-1","user":"u7","amount":125.5,"currency":"EUR","pad":"`)
	const hexdigits = "0123456789abcdef"
	for len(v) < 1022 {
		v = append(v, hexdigits[rand.IntN(16)])
	}
	return append(v, '"', '}')
}

func fmtRatios(xs []float64) string {
	var parts []string
	for _, x := range xs {
		parts = append(parts, fmt.Sprintf("%.3f", x))
	}
	return strings.Join(parts, ", ")
}
