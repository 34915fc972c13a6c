// Command proxy is the proxy benchmark (make bench-proxy): it runs the same
// franz-go load (linger 0, 1 KiB records) against kfake directly and
// through the rtproxy proxy in one run, and prints one table: produce
// records/s and MB/s, fetch records/s, request latency p50/p99/p999, the
// proxy's CPU seconds per GB moved, and the proxy/direct ratios.
//
// kfake (test/kfakebroker) and the proxy (./proxyproc, the protocol package
// in a tiny main) each run as their own process, so the proxy's CPU is read
// from its own /proc/PID/stat and shares nothing with the load client.
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/benchkit"
)

const recordSize = 1024

type result struct {
	produceRPS, produceMBps, fetchRPS float64
	lat                               []time.Duration // sorted
}

func main() {
	var (
		records    = flag.Int("records", 100000, "records per throughput phase")
		samples    = flag.Int("latency-samples", 5000, "sequential produce requests per target for latency")
		rounds     = flag.Int("rounds", 8, "throughput rounds per target (best is reported)")
		portFirst  = flag.Int("broker-ports", 29100, "first per-broker port of the proxy")
		cpuProfile = flag.String("cpuprofile", "", "write the proxy process's CPU profile here")
	)
	flag.Parse()
	log.SetFlags(0)

	dir, err := os.MkdirTemp("", "bench-proxy")
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

	var topics []string
	for r := range *rounds {
		topics = append(topics, fmt.Sprintf("direct-%d:3", r), fmt.Sprintf("proxy-%d:3", r))
	}
	topics = append(topics, "lat:1")
	kfake, brokers := benchkit.StartProc(kfakeBin, "-brokers", "3", "-topics", strings.Join(topics, ","))
	defer benchkit.StopProc(kfake)
	proxyArgs := []string{"-upstream", brokers, "-broker-ports", strconv.Itoa(*portFirst)}
	if *cpuProfile != "" {
		abs, _ := filepath.Abs(*cpuProfile)
		proxyArgs = append(proxyArgs, "-cpuprofile", abs)
	}
	proxy, proxyAddr := benchkit.StartProc(proxyBin, proxyArgs...)
	defer benchkit.StopProc(proxy)

	var direct, via result
	var proxyCPU time.Duration
	var prodRatios, fetchRatios []float64
	for r := range *rounds {
		// Alternate which target goes first so that warm-up and
		// background load do not always favour the same one.
		var d, p result
		var cpu time.Duration
		viaProxy := func() {
			cpu0 := benchkit.ProcCPU(proxy.Process.Pid)
			p = throughput(proxyAddr, fmt.Sprintf("proxy-%d", r), *records)
			cpu = benchkit.ProcCPU(proxy.Process.Pid) - cpu0
		}
		if r%2 == 0 {
			d = throughput(brokers, fmt.Sprintf("direct-%d", r), *records)
			viaProxy()
		} else {
			viaProxy()
			d = throughput(brokers, fmt.Sprintf("direct-%d", r), *records)
		}
		log.Printf("round %d: direct produce %.0f rec/s fetch %.0f rec/s; proxy produce %.0f rec/s fetch %.0f rec/s, proxy cpu %v",
			r, d.produceRPS, d.fetchRPS, p.produceRPS, p.fetchRPS, cpu)
		direct.produceRPS, direct.produceMBps = max(direct.produceRPS, d.produceRPS), max(direct.produceMBps, d.produceMBps)
		direct.fetchRPS = max(direct.fetchRPS, d.fetchRPS)
		via.produceRPS, via.produceMBps = max(via.produceRPS, p.produceRPS), max(via.produceMBps, p.produceMBps)
		via.fetchRPS = max(via.fetchRPS, p.fetchRPS)
		prodRatios = append(prodRatios, p.produceRPS/d.produceRPS)
		fetchRatios = append(fetchRatios, p.fetchRPS/d.fetchRPS)
		proxyCPU += cpu
	}
	// Every record crossed the proxy twice: produced in, fetched out.
	gbMoved := float64(*rounds) * float64(*records) * recordSize * 2 / 1e9
	cpuPerGB := proxyCPU.Seconds() / gbMoved

	direct.lat, via.lat = latency(brokers, proxyAddr, *samples)

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "measure (best of %d rounds)\tdirect\tproxy\tproxy vs direct\tmedian round ratio\ttarget\t\n", *rounds)
	fmt.Fprintf(w, "produce records/s\t%.0f\t%.0f\t%.3fx\t%.3fx\t>= 0.95x\t\n", direct.produceRPS, via.produceRPS, via.produceRPS/direct.produceRPS, benchkit.Median(prodRatios))
	fmt.Fprintf(w, "produce MB/s\t%.1f\t%.1f\t%.3fx\t%.3fx\t>= 0.95x\t\n", direct.produceMBps, via.produceMBps, via.produceMBps/direct.produceMBps, benchkit.Median(prodRatios))
	fmt.Fprintf(w, "fetch records/s\t%.0f\t%.0f\t%.3fx\t%.3fx\t>= 0.95x\t\n", direct.fetchRPS, via.fetchRPS, via.fetchRPS/direct.fetchRPS, benchkit.Median(fetchRatios))
	for _, q := range []struct {
		name   string
		q      float64
		target string
	}{{"latency p50", 0.50, "<= +50µs"}, {"latency p99", 0.99, "<= +150µs"}, {"latency p999", 0.999, ""}} {
		d, p := quantile(direct.lat, q.q), quantile(via.lat, q.q)
		fmt.Fprintf(w, "%s\t%dµs\t%dµs\t%+dµs\t\t%s\t\n", q.name, d.Microseconds(), p.Microseconds(), (p - d).Microseconds(), q.target)
	}
	fmt.Fprintf(w, "proxy CPU-s per GB moved\t-\t%.2f\t(%.2f CPU-s / %.2f GB)\t\t<= 2\t\n", cpuPerGB, proxyCPU.Seconds(), gbMoved)
	w.Flush()

	runViewPhase(kfakeBin, proxyBin, *portFirst+300)
}

func newClient(seeds string, opts ...kgo.Opt) *kgo.Client {
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(strings.Split(seeds, ",")...),
		kgo.ProducerLinger(0),
		// Uncompressed random values: every byte counted is a byte moved.
		kgo.ProducerBatchCompression(kgo.NoCompression()),
	}, opts...)...)
	if err != nil {
		log.Fatal(err)
	}
	return cl
}

func throughput(seeds, topic string, n int) result {
	value := randomValue()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	pc := newClient(seeds, kgo.DefaultProduceTopic(topic))
	// Warm the connections and metadata outside the timed section.
	if err := pc.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr(); err != nil {
		log.Fatalf("produce warmup to %s: %v", seeds, err)
	}
	var failed atomic.Int64
	start := time.Now()
	for range n - 1 {
		pc.Produce(ctx, &kgo.Record{Value: value}, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.Add(1)
			}
		})
	}
	if err := pc.Flush(ctx); err != nil {
		log.Fatal(err)
	}
	prodDur := time.Since(start)
	pc.Close()
	if failed.Load() > 0 {
		log.Fatalf("%d produce errors via %s", failed.Load(), seeds)
	}

	cc := newClient(seeds, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer cc.Close()
	got := 0
	start = time.Now()
	for got < n {
		fs := cc.PollFetches(ctx)
		if ctx.Err() != nil {
			log.Fatalf("fetch via %s: %d of %d records", seeds, got, n)
		}
		fs.EachError(func(t string, p int32, err error) { log.Fatalf("fetch %s/%d: %v", t, p, err) })
		got += fs.NumRecords()
	}
	fetchDur := time.Since(start)
	return result{
		produceRPS:  float64(n-1) / prodDur.Seconds(),
		produceMBps: float64(n-1) * recordSize / 1e6 / prodDur.Seconds(),
		fetchRPS:    float64(n) / fetchDur.Seconds(),
	}
}

// latency measures sequential single-record produce round trips (acks=all,
// one request in flight), alternating between the two targets request by
// request so that machine noise lands on both alike.
func latency(direct, proxied string, samples int) ([]time.Duration, []time.Duration) {
	ctx := context.Background()
	value := randomValue()
	dc := newClient(direct, kgo.DefaultProduceTopic("lat"))
	defer dc.Close()
	pc := newClient(proxied, kgo.DefaultProduceTopic("lat"))
	defer pc.Close()
	once := func(cl *kgo.Client) time.Duration {
		t := time.Now()
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr(); err != nil {
			log.Fatal(err)
		}
		return time.Since(t)
	}
	for range 200 { // warm-up
		once(dc)
		once(pc)
	}
	d := make([]time.Duration, 0, samples)
	p := make([]time.Duration, 0, samples)
	for range samples {
		d = append(d, once(dc))
		p = append(p, once(pc))
	}
	slices.Sort(d)
	slices.Sort(p)
	return d, p
}

func quantile(s []time.Duration, q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	i := int(q * float64(len(s)-1))
	return s[i]
}

// randomValue is an incompressible 1 KiB record value.
func randomValue() []byte {
	v := make([]byte, recordSize)
	rand.Read(v)
	return v
}
