// Command proxy is the proxy benchmark (make bench-proxy): it runs the same
// franz-go load (linger 0, 1 KiB records) against kfake directly and
// through the rtproxy proxy in one run, and prints one table: produce
// records/s and MB/s, fetch records/s, request latency p50/p99/p999, the
// proxy's CPU seconds per GB moved, and the proxy/direct ratios.
//
// kfake (test/kfakebroker) and the proxy (./proxyproc, the protocol package
// in a tiny main) each run as their own process, so the proxy's CPU is read
// from its own /proc/PID/stat and shares nothing with the load client.
//
// With -base REV (repeatable) the proxyproc of each older revision is built
// from `git archive REV` and measured in the same run, round by round in
// rotating order, against the same kfake; a last table puts every proxy
// side by side:
//
//	make bench-proxy ARGS='-rounds 5 -base e6708da -base 52fd4ca^'
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

// target is one proxy under test: the working tree's, or a base
// revision's (-base), each its own process against the same kfake.
type target struct {
	name        string
	bin         string
	proc        *exec.Cmd
	addr        string
	best        result
	cpu         time.Duration
	prod, fetch []float64 // proxy/direct ratios, one per round
	lat         []time.Duration
	perReq      perRequest // latency phase
}

// wakes are a process's counts of read and write system calls, context
// switches (all threads) and CPU time so far.
type wakes struct {
	rw, ctx int64
	cpu     time.Duration
}

type perRequest struct{ rw, ctx, cpuMicros float64 }

func (w wakes) since(b wakes, n float64) perRequest {
	return perRequest{float64(w.rw-b.rw) / n, float64(w.ctx-b.ctx) / n, float64((w.cpu - b.cpu).Microseconds()) / n}
}

func readWakes(pid int) wakes {
	var w wakes
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ": "); ok && (k == "syscr" || k == "syscw") {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				w.rw += n
			}
		}
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // a thread that just exited
		}
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && (k == "voluntary_ctxt_switches" || k == "nonvoluntary_ctxt_switches") {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				w.ctx += n
			}
		}
	}
	w.cpu = benchkit.ProcCPU(pid)
	return w
}

// revs is the repeatable -base flag (a comma list works too).
type revs []string

func (r *revs) String() string { return strings.Join(*r, ",") }
func (r *revs) Set(s string) error {
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*r = append(*r, v)
		}
	}
	return nil
}

func main() {
	var (
		records    = flag.Int("records", 100000, "records per throughput phase")
		samples    = flag.Int("latency-samples", 5000, "sequential produce requests per target for latency")
		rounds     = flag.Int("rounds", 8, "throughput rounds per target (best is reported)")
		portFirst  = flag.Int("broker-ports", 29100, "first per-broker port of the proxy (each further proxy 10 above)")
		proxyTable = flag.Bool("proxy-table", true, "run the proxy table (produce, fetch and latency without views); false: the view phase only")
		cpuProfile = flag.String("cpuprofile", "", "write the working tree proxy's CPU profile here (each -base's to FILE.baseN, N counting the -base flags from 0)")
		bases      revs
	)
	flag.Var(&bases, "base", "also measure the proxy of this git `revision` (its own test/bench/proxy/proxyproc, built from git archive), side by side; repeatable")
	flag.Parse()
	log.SetFlags(0)

	dir, err := os.MkdirTemp("", "bench-proxy")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	root := benchkit.ModuleRoot()
	kfakeBin := filepath.Join(dir, "kfakebroker")
	build(root, kfakeBin, "./test/kfakebroker")
	var targets []*target
	for i, rev := range bases {
		src := filepath.Join(dir, fmt.Sprintf("base-%d", i))
		if err := os.MkdirAll(src, 0o755); err != nil {
			log.Fatal(err)
		}
		cmd := exec.Command("sh", "-c", fmt.Sprintf("git archive %q | tar -x -C %q", rev, src))
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			log.Fatalf("git archive %s: %v\n%s", rev, err, out)
		}
		t := &target{name: rev, bin: filepath.Join(dir, fmt.Sprintf("proxyproc-base-%d", i))}
		build(src, t.bin, "./test/bench/proxy/proxyproc")
		targets = append(targets, t)
	}
	now := &target{name: "now", bin: filepath.Join(dir, "proxyproc")}
	build(root, now.bin, "./test/bench/proxy/proxyproc")
	targets = append(targets, now)
	if !*proxyTable {
		runViewPhase(kfakeBin, targets, *portFirst+300)
		return
	}

	var topics []string
	for r := range *rounds {
		topics = append(topics, fmt.Sprintf("direct-%d:3", r))
		for i := range targets {
			topics = append(topics, fmt.Sprintf("proxy%d-%d:3", i, r))
		}
	}
	topics = append(topics, "lat:1")
	kfake, brokers := benchkit.StartProc(kfakeBin, "-brokers", "3", "-topics", strings.Join(topics, ","))
	defer benchkit.StopProc(kfake)
	for i, t := range targets {
		args := []string{"-upstream", brokers, "-broker-ports", strconv.Itoa(*portFirst + 10*i)}
		if *cpuProfile != "" {
			abs, _ := filepath.Abs(*cpuProfile)
			if t != now {
				abs += fmt.Sprintf(".base%d", i)
			}
			args = append(args, "-cpuprofile", abs)
		}
		t.proc, t.addr = benchkit.StartProc(t.bin, args...)
		defer benchkit.StopProc(t.proc)
	}

	var direct result
	for r := range *rounds {
		// Rotate which target goes first so that warm-up and background
		// load do not always favour the same one. Index len(targets) is
		// the direct run.
		var d result
		got := make([]result, len(targets))
		cpu := make([]time.Duration, len(targets))
		n := len(targets) + 1
		for k := range n {
			i := (k + r) % n
			if i == len(targets) {
				d = throughput(brokers, fmt.Sprintf("direct-%d", r), *records)
				continue
			}
			t := targets[i]
			cpu0 := benchkit.ProcCPU(t.proc.Process.Pid)
			got[i] = throughput(t.addr, fmt.Sprintf("proxy%d-%d", i, r), *records)
			cpu[i] = benchkit.ProcCPU(t.proc.Process.Pid) - cpu0
		}
		line := fmt.Sprintf("round %d: direct produce %.0f rec/s fetch %.0f rec/s", r, d.produceRPS, d.fetchRPS)
		direct.produceRPS, direct.produceMBps = max(direct.produceRPS, d.produceRPS), max(direct.produceMBps, d.produceMBps)
		direct.fetchRPS = max(direct.fetchRPS, d.fetchRPS)
		for i, t := range targets {
			p := got[i]
			line += fmt.Sprintf("; %s produce %.0f fetch %.0f cpu %v", t.name, p.produceRPS, p.fetchRPS, cpu[i])
			t.best.produceRPS, t.best.produceMBps = max(t.best.produceRPS, p.produceRPS), max(t.best.produceMBps, p.produceMBps)
			t.best.fetchRPS = max(t.best.fetchRPS, p.fetchRPS)
			t.prod = append(t.prod, p.produceRPS/d.produceRPS)
			t.fetch = append(t.fetch, p.fetchRPS/d.fetchRPS)
			t.cpu += cpu[i]
		}
		log.Print(line)
	}
	// Every record crossed the proxy twice: produced in, fetched out.
	gbMoved := float64(*rounds) * float64(*records) * recordSize * 2 / 1e9

	addrs := []string{brokers}
	for _, t := range targets {
		addrs = append(addrs, t.addr)
	}
	before := make([]wakes, len(targets))
	for i, t := range targets {
		before[i] = readWakes(t.proc.Process.Pid)
	}
	lats := latency(addrs, *samples)
	direct.lat = lats[0]
	for i, t := range targets {
		t.lat = lats[i+1]
		// Each proxy served its own warm-up and samples, one request
		// at a time: what it did per request.
		t.perReq = readWakes(t.proc.Process.Pid).since(before[i], float64(*samples+latencyWarmup))
	}

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "measure (best of %d rounds)\tdirect\tproxy\tproxy vs direct\tmedian round ratio\ttarget\t\n", *rounds)
	fmt.Fprintf(w, "produce records/s\t%.0f\t%.0f\t%.3fx\t%.3fx\t>= 0.95x\t\n", direct.produceRPS, now.best.produceRPS, now.best.produceRPS/direct.produceRPS, benchkit.Median(now.prod))
	fmt.Fprintf(w, "produce MB/s\t%.1f\t%.1f\t%.3fx\t%.3fx\t>= 0.95x\t\n", direct.produceMBps, now.best.produceMBps, now.best.produceMBps/direct.produceMBps, benchkit.Median(now.prod))
	fmt.Fprintf(w, "fetch records/s\t%.0f\t%.0f\t%.3fx\t%.3fx\t>= 0.95x\t\n", direct.fetchRPS, now.best.fetchRPS, now.best.fetchRPS/direct.fetchRPS, benchkit.Median(now.fetch))
	for _, q := range []struct {
		name   string
		q      float64
		target string
	}{{"latency p50", 0.50, "<= +50µs"}, {"latency p99", 0.99, "<= +150µs"}, {"latency p999", 0.999, ""}} {
		d, p := quantile(direct.lat, q.q), quantile(now.lat, q.q)
		fmt.Fprintf(w, "%s\t%dµs\t%dµs\t%+dµs\t\t%s\t\n", q.name, d.Microseconds(), p.Microseconds(), (p - d).Microseconds(), q.target)
	}
	fmt.Fprintf(w, "proxy CPU-s per GB moved\t-\t%.2f\t(%.2f CPU-s / %.2f GB)\t\t<= 2\t\n", now.cpu.Seconds()/gbMoved, now.cpu.Seconds(), gbMoved)
	w.Flush()

	// Side by side, one row per proxy (median round ratios; latency added
	// over direct from the interleaved samples).
	// The last three columns are per request of the latency phase (one
	// small produce and its response): read and write system calls
	// (/proc/PID/io syscr+syscw; splice is not among them), context
	// switches of all the proxy's threads (its wake-ups), and its CPU.
	fmt.Printf("\n| proxy | produce × direct | fetch × direct | added p50 | added p99 | CPU-s per GB | reads+writes / req | ctx switches / req | CPU µs / req |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, t := range targets {
		fmt.Printf("| %s | %.2f | %.2f | %+dµs | %+dµs | %.2f | %.2f | %.2f | %.1f |\n", t.name, benchkit.Median(t.prod), benchkit.Median(t.fetch),
			(quantile(t.lat, 0.5) - quantile(direct.lat, 0.5)).Microseconds(),
			(quantile(t.lat, 0.99) - quantile(direct.lat, 0.99)).Microseconds(),
			t.cpu.Seconds()/gbMoved, t.perReq.rw, t.perReq.ctx, t.perReq.cpuMicros)
	}

	runViewPhase(kfakeBin, targets, *portFirst+300)
}

func build(dir, out, pkg string) {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		log.Fatalf("go build %s in %s: %v\n%s", pkg, dir, err, b)
	}
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
// one request in flight) against each address, alternating between the
// targets request by request so that machine noise lands on all alike.
func latency(addrs []string, samples int) [][]time.Duration {
	ctx := context.Background()
	value := randomValue()
	var cls []*kgo.Client
	for _, a := range addrs {
		cl := newClient(a, kgo.DefaultProduceTopic("lat"))
		defer cl.Close()
		cls = append(cls, cl)
	}
	once := func(cl *kgo.Client) time.Duration {
		t := time.Now()
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr(); err != nil {
			log.Fatal(err)
		}
		return time.Since(t)
	}
	for range latencyWarmup {
		for _, cl := range cls {
			once(cl)
		}
	}
	out := make([][]time.Duration, len(cls))
	for i := range out {
		out[i] = make([]time.Duration, 0, samples)
	}
	for range samples {
		for i, cl := range cls {
			out[i] = append(out[i], once(cl))
		}
	}
	for _, s := range out {
		slices.Sort(s)
	}
	return out
}

// latencyWarmup is how many requests per target precede the samples.
const latencyWarmup = 200

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
