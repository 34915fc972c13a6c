// Command exactlyonce is `make bench-eo`: what `sink.delivery:
// exactly_once` costs against at_least_once, measured in one run against
// kfake (test/kfakebroker, its own process) with the load of the pipeline
// benchmark — 1 KiB JSON records over 8 source partitions — through the
// same stateless route (filter + map):
//
//   - latency at -rate: producer send → a read_committed consumer of the
//     sink receiving the output, p50/p99/p999/max, for at_least_once and
//     exactly_once at checkpoint_interval 100ms and 1s. The variants run one
//     after another, each the only route of the pipeline, so that
//   - the CPU of this process (getrusage, user+system) over each measured
//     window, per record produced, can be set side by side; kfake's CPU
//     (/proc/PID/stat) over the same window is shown next to it;
//   - drain throughput: a backlog of -bulk records is written to a fresh
//     topic, then a route is started on it and timed from owning all its
//     partitions until a read_committed consumer of its sink has read every
//     output.
//
// The pipeline runs in this process (pipeline.Manager, routes compiled by
// rules.LoadFile from YAML), as it does inside rtproxy; so do the
// benchmark's producer and consumer, whose CPU is in every variant's
// figure alike.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/config"
	"github.com/rtproxy/rtproxy/internal/benchkit"
	"github.com/rtproxy/rtproxy/pipeline"
	"github.com/rtproxy/rtproxy/rules"
)

var (
	rate         = flag.Int("rate", 10000, "records per second for the latency runs")
	duration     = flag.Duration("duration", 10*time.Second, "measured time per latency run (after warmup)")
	warmup       = flag.Duration("warmup", 2*time.Second, "unmeasured time before each latency run")
	size         = flag.Int("size", 1024, "bytes per source record")
	partitions   = flag.Int("partitions", 8, "source and sink partitions")
	bulk         = flag.Int("bulk", 200000, "backlog size of the drain runs (0: skip them)")
	drainRounds  = flag.Int("drain-rounds", 3, "rounds of the drain runs (each round runs every variant once)")
	latencies    = flag.Bool("latency", true, "run the latency runs")
	cpuprofile   = flag.String("cpuprofile", "", "write a CPU profile of the whole run here")
	drainProfile = flag.String("drain-profile", "", "write a CPU profile of each drain run (its route's start to its last output read) into this directory")
)

// variant is one route configuration under test.
type variant struct {
	delivery string // rules.DeliveryAtLeastOnce or rules.DeliveryExactlyOnce
	interval time.Duration
}

func (v variant) String() string { return fmt.Sprintf("%s %v", v.delivery, v.interval) }

// slug names the variant's route and topics.
func (v variant) slug() string {
	d := "alo"
	if v.delivery == rules.DeliveryExactlyOnce {
		d = "eo"
	}
	return d + "-" + v.interval.String()
}

// variants pair each exactly_once configuration with the at_least_once one
// of the same interval, run next to each other.
var variants = []variant{
	{rules.DeliveryAtLeastOnce, 100 * time.Millisecond},
	{rules.DeliveryExactlyOnce, 100 * time.Millisecond},
	{rules.DeliveryAtLeastOnce, time.Second},
	{rules.DeliveryExactlyOnce, time.Second},
}

const steps = `  - filter: value.amount >= 0
  - map: { id: value.id, user: value.user, amount: value.amount * 100, send_ns: value.send_ns }`

func main() {
	flag.Parse()
	log.SetFlags(0)
	if *cpuprofile != "" && *drainProfile != "" {
		log.Fatal("-cpuprofile and -drain-profile cannot be used together (one CPU profile at a time)")
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		check(err)
		check(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	if *drainProfile != "" {
		check(os.MkdirAll(*drainProfile, 0o755))
	}
	loadStart := loadAvg()
	root := benchkit.ModuleRoot()
	tmp, err := os.MkdirTemp("", "bench-eo-")
	check(err)
	defer os.RemoveAll(tmp)

	bin := filepath.Join(tmp, "kfakebroker")
	out, err := exec.Command("go", "build", "-o", bin, filepath.Join(root, "test", "kfakebroker")).CombinedOutput()
	if err != nil {
		log.Fatalf("build kfakebroker: %v\n%s", err, out)
	}
	addrs, kfakePID, stopBroker := startBroker(bin)
	defer stopBroker()

	reg := prometheus.NewRegistry()
	b := &bench{addrs: addrs, dir: tmp, kfake: kfakePID, reg: reg}
	b.adm = kadm.NewClient(b.client())
	// The proxy's defaults of what rtproxy run sets from its config.
	d := config.Default()
	mgr, err := pipeline.New(pipeline.Config{Seeds: addrs, StateDir: filepath.Join(tmp, "state"), Registerer: reg,
		SessionTimeout: d.GroupSessionTimeout, GroupProtocol: d.GroupProtocol, StopTimeout: d.ShutdownGrace,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	check(err)
	b.mgr = mgr
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- mgr.Run(ctx) }()

	var lats []latResult
	if *latencies {
		for _, v := range variants {
			r := b.latency(v)
			log.Printf("%s", r.line())
			lats = append(lats, r)
		}
	}
	var drains []drainResult
	for round := 1; *bulk > 0 && round <= *drainRounds; round++ {
		for _, v := range variants {
			r := b.drain(v, round)
			log.Printf("%s", r.line())
			drains = append(drains, r)
		}
	}
	cancel()
	check(<-runDone)

	fmt.Printf("\nrtproxy exactly-once benchmark — %s, GOMAXPROCS=%d, %d partitions, %d B records; load average at start %s, at the end %s\n",
		runtime.Version(), runtime.GOMAXPROCS(0), *partitions, *size, loadStart, loadAvg())
	if len(lats) > 0 {
		printLatency(lats)
	}
	if len(drains) > 0 {
		printDrain(drains)
	}
}

type bench struct {
	addrs []string
	dir   string
	kfake int
	adm   *kadm.Client
	mgr   *pipeline.Manager
	reg   *prometheus.Registry
}

func (b *bench) client(opts ...kgo.Opt) *kgo.Client {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.addrs...), kgo.ProducerLinger(0)}, opts...)...)
	check(err)
	return cl
}

// sinkConsumer reads topic read_committed, from its start or its end.
func (b *bench) sinkConsumer(topic string, from kgo.Offset) *kgo.Client {
	return b.client(kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(from),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(10*time.Millisecond), kgo.FetchMinBytes(1))
}

// createTopics creates topics up front: kfake runs with -auto-create=false.
func (b *bench) createTopics(names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := b.adm.CreateTopics(ctx, int32(*partitions), -1, nil, names...)
	check(err)
	check(resp.Error())
}

func (b *bench) deleteTopics(names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.adm.DeleteTopics(ctx, names...); err != nil {
		log.Printf("delete %v: %v", names, err)
	}
}

// route writes v's rule file and compiles it with rules, as rtproxy does.
func (b *bench) route(name, src, sink string, v variant) *rules.Route {
	y := fmt.Sprintf(`route: %s
source: { topic: %s, format: json, start: earliest }
sink: { topic: %s, delivery: %s }
checkpoint_interval: %s
steps:
%s
`, name, src, sink, v.delivery, v.interval, steps)
	path := filepath.Join(b.dir, name+".yaml")
	check(os.WriteFile(path, []byte(y), 0o644))
	r, err := rules.LoadFile(path)
	if err != nil {
		log.Fatalf("rule %s: %v", name, err)
	}
	return r
}

func (b *bench) status(name string) (pipeline.RouteStatus, bool) {
	for _, s := range b.mgr.Routes() {
		if s.Name == name {
			return s, true
		}
	}
	return pipeline.RouteStatus{}, false
}

// waitOwned waits until route name runs and owns every source partition,
// and returns when it saw that.
func (b *bench) waitOwned(name string) time.Time {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if s, ok := b.status(name); ok && s.State == "running" && len(s.Partitions) == *partitions {
			return time.Now()
		}
		time.Sleep(time.Millisecond)
	}
	log.Fatalf("route %s not running on %d partitions after 30s: %+v", name, *partitions, b.mgr.Routes())
	return time.Time{}
}

// cpStats are a route's checkpoint figures from the pipeline's metrics and
// /routes, over the route's whole run.
type cpStats struct {
	checkpoints    uint64
	cpMean         time.Duration // rtproxy_checkpoint_duration_seconds
	txnCommits     uint64
	txnMean        time.Duration // rtproxy_route_txn_commit_seconds
	aborts         int64
	maxPause, last float64 // checkpoint pause, ms
}

func (b *bench) cpStats(name string) cpStats {
	var c cpStats
	c.checkpoints, c.cpMean = histMean(b.reg, "rtproxy_checkpoint_duration_seconds", name)
	c.txnCommits, c.txnMean = histMean(b.reg, "rtproxy_route_txn_commit_seconds", name)
	if s, ok := b.status(name); ok {
		c.maxPause, c.last = s.MaxCheckpointPauseMs, s.CheckpointPauseMs
		if s.Transaction != nil {
			c.aborts = s.Transaction.Aborts
		}
	}
	return c
}

// histMean is the count and mean of the histogram name's series of route.
func histMean(reg *prometheus.Registry, name, route string) (uint64, time.Duration) {
	mfs, err := reg.Gather()
	check(err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "route" && l.GetValue() == route {
					h := m.GetHistogram()
					if h.GetSampleCount() == 0 {
						return 0, 0
					}
					return h.GetSampleCount(), time.Duration(h.GetSampleSum() / float64(h.GetSampleCount()) * float64(time.Second))
				}
			}
		}
	}
	return 0, 0
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// percentiles of sorted latencies.
type percentiles struct {
	n                    int
	p50, p99, p999, pmax time.Duration
}

func percentilesOf(lats []time.Duration) percentiles {
	slices.Sort(lats)
	p := percentiles{n: len(lats)}
	if len(lats) == 0 {
		return p
	}
	q := func(f float64) time.Duration { return lats[min(int(f*float64(len(lats))), len(lats)-1)] }
	p.p50, p.p99, p.p999, p.pmax = q(0.50), q(0.99), q(0.999), lats[len(lats)-1]
	return p
}

type latResult struct {
	v        variant
	sent     int // records produced in the measured window
	lat      percentiles
	cpu      time.Duration // this process over the measured window
	kfakeCPU time.Duration // kfake over the same window
	cp       cpStats
}

func (r latResult) cpuPerRecord() time.Duration   { return perRecord(r.cpu, r.sent) }
func (r latResult) kfakePerRecord() time.Duration { return perRecord(r.kfakeCPU, r.sent) }

func perRecord(d time.Duration, n int) time.Duration {
	if n == 0 {
		return 0
	}
	return d / time.Duration(n)
}

func (r latResult) line() string {
	return fmt.Sprintf("latency %-22s sent=%d received=%d p50=%v p99=%v p999=%v max=%v cpu/rec=%v kfake/rec=%v",
		r.v, r.sent, r.lat.n, r.lat.p50, r.lat.p99, r.lat.p999, r.lat.pmax, r.cpuPerRecord(), r.kfakePerRecord())
}

// latency runs v's route alone: it produces at *rate to the route's source
// for warmup+duration and measures, at a read_committed consumer of the
// sink, now − send_ns of every output sent after the warmup, and the CPU
// spent while those were sent.
func (b *bench) latency(v variant) latResult {
	name := "lat-" + v.slug()
	src, sink := name+".in", name+".out"
	b.createTopics(src, sink)
	r := b.route(name, src, sink, v)
	b.mgr.Apply([]*rules.Route{r})
	b.waitOwned(name)

	cons := b.sinkConsumer(sink, kgo.NewOffset().AtEnd())
	// Let the consumer take its partitions at their ends.
	ctx0, cancel0 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	cons.PollFetches(ctx0)
	cancel0()
	prod := b.client(kgo.MaxBufferedRecords(1 << 16))
	runtime.GC()
	var cpu0, kf0 time.Duration
	lats, sent := benchkit.Latency{Prod: prod, Cons: cons, Topic: src, Rate: *rate, Size: *size,
		Warmup: *warmup, Duration: *duration, Tail: v.interval + 3*time.Second,
		OnMeasure: func() { cpu0, kf0 = benchkit.CPUNow(), benchkit.ProcCPU(b.kfake) }}.Run()
	res := latResult{v: v, sent: sent, cpu: benchkit.CPUNow() - cpu0, kfakeCPU: benchkit.ProcCPU(b.kfake) - kf0}
	prod.Close()
	cons.Close()
	res.lat = percentilesOf(lats)
	res.cp = b.cpStats(name)
	b.mgr.Apply(nil)
	b.deleteTopics(src, sink)
	return res
}

type drainResult struct {
	v       variant
	round   int
	n       int           // outputs read
	setup   time.Duration // Apply → every partition owned
	elapsed time.Duration // every partition owned → last output read
	cpu     time.Duration // this process, Apply → last output read
	cp      cpStats
}

func (r drainResult) rate() float64 { return float64(r.n) / r.elapsed.Seconds() }

func (r drainResult) line() string {
	return fmt.Sprintf("drain   %-22s round %d: %d outputs in %v (setup %v) = %.0f rec/s, cpu/rec=%v, checkpoints=%d aborts=%d",
		r.v, r.round, r.n, r.elapsed.Round(time.Millisecond), r.setup.Round(time.Millisecond), r.rate(),
		perRecord(r.cpu, r.n), r.cp.checkpoints, r.cp.aborts)
}

// drain fills a fresh topic with *bulk records, then starts v's route on
// it and measures how fast its outputs reach a read_committed consumer.
func (b *bench) drain(v variant, round int) drainResult {
	name := fmt.Sprintf("drain%d-%s", round, v.slug())
	src, sink := name+".in", name+".out"
	b.createTopics(src, sink)
	prod := b.client(kgo.MaxBufferedRecords(1<<16), kgo.ProducerBatchMaxBytes(1<<20))
	check(benchkit.ProduceBacklog(prod, src, *bulk, *size))
	prod.Close()

	r := b.route(name, src, sink, v)
	cons := b.sinkConsumer(sink, kgo.NewOffset().AtStart())
	runtime.GC()
	if *drainProfile != "" {
		f, err := os.Create(filepath.Join(*drainProfile, "drain-"+v.slug()+fmt.Sprintf("-r%d.pprof", round)))
		check(err)
		defer f.Close()
		check(pprof.StartCPUProfile(f))
	}
	cpu0 := benchkit.CPUNow()
	applied := time.Now()
	b.mgr.Apply([]*rules.Route{r})
	ownedC := make(chan time.Time, 1)
	go func() { ownedC <- b.waitOwned(name) }()

	n := 0
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	for n < *bulk && ctx.Err() == nil {
		n += len(cons.PollFetches(ctx).Records())
	}
	done := time.Now()
	cancel()
	cpu := benchkit.CPUNow() - cpu0
	if *drainProfile != "" {
		pprof.StopCPUProfile()
	}
	owned := <-ownedC
	cons.Close()
	res := drainResult{v: v, round: round, n: n, setup: owned.Sub(applied), elapsed: done.Sub(owned), cpu: cpu, cp: b.cpStats(name)}
	b.mgr.Apply(nil)
	b.deleteTopics(src, sink)
	if n < *bulk {
		log.Printf("%s: only %d of %d outputs read in 3 minutes", name, n, *bulk)
	}
	return res
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }
func us(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d)/1e3) }

// pair finds the at_least_once and exactly_once entries of interval.
func pair[T any](xs []T, v func(T) variant, interval time.Duration) (alo, eo T, ok bool) {
	var haveA, haveE bool
	for _, x := range xs {
		switch vv := v(x); {
		case vv.interval != interval:
		case vv.delivery == rules.DeliveryAtLeastOnce:
			alo, haveA = x, true
		case vv.delivery == rules.DeliveryExactlyOnce:
			eo, haveE = x, true
		}
	}
	return alo, eo, haveA && haveE
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func printLatency(rs []latResult) {
	fmt.Printf("\nLatency: %d rec/s for %v warmup + %v measured per variant, one route at a time; producer send → read_committed consumer of the sink.\n"+
		"CPU: this process (pipeline + the benchmark's own producer and consumer, alike in every variant), getrusage user+sys over the measured window / records sent in it; kfake (its own process) from /proc over the same window.\n\n",
		*rate, *warmup, *duration)
	fmt.Println("| variant | sent | received | p50 | p99 | p999 | max | CPU/record (this process) | CPU/record (kfake) |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		fmt.Printf("| %s | %d | %d | %s | %s | %s | %s | %s | %s |\n", r.v, r.sent, r.lat.n,
			ms(r.lat.p50), ms(r.lat.p99), ms(r.lat.p999), ms(r.lat.pmax), us(r.cpuPerRecord()), us(r.kfakePerRecord()))
	}
	fmt.Println("\nCheckpoints over each route's run (start to stop, warmup and tail included):")
	fmt.Println()
	fmt.Println("| variant | checkpoints | mean checkpoint (cut → durable) | txn commits | mean txn commit (cut → committed) | max / last pause | aborts |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		fmt.Printf("| %s | %d | %s | %d | %s | %.2f / %.2f ms | %d |\n", r.v, r.cp.checkpoints, ms(r.cp.cpMean),
			r.cp.txnCommits, ms(r.cp.txnMean), r.cp.maxPause, r.cp.last, r.cp.aborts)
	}
	fmt.Println("\nexactly_once against at_least_once at the same interval:")
	fmt.Println()
	fmt.Println("| interval | p50 | p99 | p999 | CPU/record (this process) | CPU/record (kfake) |")
	fmt.Println("|---|---:|---:|---:|---:|---:|")
	for _, iv := range []time.Duration{100 * time.Millisecond, time.Second} {
		a, e, ok := pair(rs, func(r latResult) variant { return r.v }, iv)
		if !ok {
			continue
		}
		diff := func(x, y time.Duration) string { return fmt.Sprintf("%+.2f ms", float64(x-y)/1e6) }
		fmt.Printf("| %v | %s | %s | %s | %.2f× | %.2f× |\n", iv, diff(e.lat.p50, a.lat.p50), diff(e.lat.p99, a.lat.p99),
			diff(e.lat.p999, a.lat.p999), ratio(e.cpuPerRecord(), a.cpuPerRecord()), ratio(e.kfakePerRecord(), a.kfakePerRecord()))
	}
	if a, e, ok := pair(rs, func(r latResult) variant { return r.v }, 100*time.Millisecond); ok {
		limit := a.lat.p99 + 100*time.Millisecond + 2*time.Millisecond
		fmt.Printf("\ntarget: exactly_once p99 at 100ms ≤ at_least_once p99 + 100 ms + 2 ms = %s: %s (%s)\n",
			ms(limit), ms(e.lat.p99), verdict(e.lat.p99 <= limit))
	}
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func printDrain(rs []drainResult) {
	fmt.Printf("\nDrain: a backlog of %d records (%d partitions) into a %d-partition sink; timed from the route owning every partition to the last output read by a read_committed consumer. CPU/record: this process from Apply to the last output (route setup included).\n\n",
		*bulk, *partitions, *partitions)
	fmt.Println("| variant | round | outputs | setup | drain time | records/s | MiB/s in | CPU/record | checkpoints | aborts |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		fmt.Printf("| %s | %d | %d | %v | %v | %.0f | %.1f | %s | %d | %d |\n", r.v, r.round, r.n, r.setup.Round(time.Millisecond),
			r.elapsed.Round(time.Millisecond), r.rate(), r.rate()*float64(*size)/(1<<20), us(perRecord(r.cpu, r.n)), r.cp.checkpoints, r.cp.aborts)
	}
	fmt.Println("\nMedians over the rounds; ratio: exactly_once / at_least_once at the same interval, the median of the per-round ratios.")
	fmt.Println()
	fmt.Println("| variant | records/s (median) | CPU/record (median) | exactly_once / at_least_once | per round |")
	fmt.Println("|---|---:|---:|---:|---|")
	for _, v := range variants {
		var rates, cpus, ratios []float64
		for round := 1; round <= *drainRounds; round++ {
			var in []drainResult
			for _, r := range rs {
				if r.round == round {
					in = append(in, r)
				}
			}
			for _, r := range in {
				if r.v == v {
					rates = append(rates, r.rate())
					cpus = append(cpus, float64(perRecord(r.cpu, r.n)))
				}
			}
			if a, e, ok := pair(in, func(r drainResult) variant { return r.v }, v.interval); ok && v.delivery == rules.DeliveryExactlyOnce {
				ratios = append(ratios, e.rate()/a.rate())
			}
		}
		if len(rates) == 0 {
			continue
		}
		ratioCol, rounds := "", ""
		if len(ratios) > 0 {
			ratioCol = fmt.Sprintf("%.2f×", benchkit.Median(ratios))
			strs := make([]string, len(ratios))
			for i, r := range ratios {
				strs[i] = fmt.Sprintf("%.2f×", r)
			}
			rounds = strings.Join(strs, ", ")
			if v.interval == 100*time.Millisecond {
				ratioCol += fmt.Sprintf(" (target ≥ 0.80×: %s)", verdict(benchkit.Median(ratios) >= 0.8))
			}
		}
		fmt.Printf("| %s | %.0f | %s | %s | %s |\n", v, benchkit.Median(rates), us(time.Duration(benchkit.Median(cpus))), ratioCol, rounds)
	}
}

// startBroker starts kfake (3 brokers, topics only as created) and returns
// its addresses, its process id and how to stop it.
func startBroker(bin string) ([]string, int, func()) {
	cmd := exec.Command(bin, "-brokers", "3", "-auto-create=false")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	check(err)
	check(cmd.Start())
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "ready ") {
			go func() {
				for sc.Scan() {
				}
			}()
			return strings.Split(strings.TrimPrefix(l, "ready "), ","), cmd.Process.Pid, func() { cmd.Process.Kill(); cmd.Wait() }
		}
	}
	log.Fatalf("kfake exited before ready")
	return nil, 0, nil
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
