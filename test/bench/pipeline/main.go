// Command pipeline is `make bench-pipeline`: it measures rtproxy's
// long-running pipelines against kfake (test/kfakebroker, its own process)
// under the load of issue 4 — 10k records/s of 1 KiB JSON over 8 source
// partitions — and prints one table:
//
//   - end-to-end latency (producer send → consumer receive from the sink),
//     p50/p99/p999, for (a) filter+map, (b) broadcast join, (c) tumbling
//     window emitting on_update, against (d) the floor (produce → consume,
//     no processing) and (e) a minimal hand-written franz-go
//     consume → transform → produce loop;
//   - what checkpoints cost: (a) and (c) again with checkpoints every 1h
//     instead of every 1s;
//   - maximum sustainable throughput of (a)-(c) and (e): records/s to drain
//     a backlog, next to the plain consume rate of the same backlog.
//
// The pipeline runs in this process (pipeline.Manager, routes compiled by
// rules.LoadFile from YAML), as it does inside rtproxy.
//
// With -only live (live.go) it measures instead what issue 13 asked about:
// route (a) and loop (e) each in a process of their own, at -live-rates,
// with that process's CPU per record and the produce and fetch requests
// its clients wrote, then the drain of a backlog by each.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/config"
	"github.com/rtproxy/rtproxy/internal/benchkit"
	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/pipeline"
	"github.com/rtproxy/rtproxy/rules"
)

var (
	rate       = flag.Int("rate", 10000, "records per second for the latency runs")
	duration   = flag.Duration("duration", 10*time.Second, "measured time per latency run (after warmup)")
	warmup     = flag.Duration("warmup", 2*time.Second, "unmeasured time before each latency run")
	size       = flag.Int("size", 1024, "bytes per source record")
	partitions = flag.Int("partitions", 8, "source partitions")
	bulk       = flag.Int("bulk", 100000, "backlog size of the throughput runs (0: skip them)")
	latencies  = flag.Bool("latency", true, "run the latency scenarios")
	pad        = flag.String("pad", "x", "padding of the source records: x (a run of 'x', as every figure before 2026-12-02) or text (words, compressing as text does)")
	cpuprofile = flag.String("cpuprofile", "", "write a CPU profile of the whole run here")
	only       = flag.String("only", "", "live: only the live rates of issue 13 (route and loop in processes of their own, at -live-rates, and their drains)")
	liveRates  = flag.String("live-rates", "10000,2000", "with -only live: the rates, records/s (empty: the drains alone)")
	liveKinds  = flag.String("live-kinds", "route,loop", "with -only live: the measured processes: route, loop (jsoncodec) and/or stdloop (encoding/json)")
	liveWindow = flag.Duration("batch-window", 0, "with -only live: the route's batch_window (0: off, the default)")

	// The measured process of -only live (live.go).
	childKind    = flag.String("child", "", "internal: run as the measured process of -only live (route, loop or stdloop)")
	childBrokers = flag.String("child-brokers", "", "internal")
	childSrc     = flag.String("child-src", "", "internal")
	childSink    = flag.String("child-sink", "", "internal")
	childRule    = flag.String("child-rule", "", "internal")
	childStart   = flag.String("child-start", "latest", "internal")
	childState   = flag.String("child-state", "", "internal")
	childProfile = flag.String("child-profile", "", "internal")
	childWindow  = flag.Duration("child-batch-window", 0, "internal")
	// childProfileDir is where -only live's measured processes write CPU
	// profiles, one per run (KIND-TOPIC.pprof).
	childProfileDir = flag.String("live-profile", "", "with -only live: write a CPU profile of each measured process into this directory")
)

func main() {
	flag.Parse()
	switch *pad {
	case "x":
	case "text":
		benchkit.PadText = true
	default:
		log.Fatalf("-pad: x or text, not %q", *pad)
	}
	log.SetFlags(0)
	if *childKind != "" {
		runChild(*childKind, *childBrokers, *childSrc, *childSink, *childRule, *childStart, *childState, *childProfile)
		return
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		check(err)
		check(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	root := benchkit.ModuleRoot()
	tmp, err := os.MkdirTemp("", "bench-pipeline-")
	check(err)
	defer os.RemoveAll(tmp)

	bin := filepath.Join(tmp, "kfakebroker")
	out, err := exec.Command("go", "build", "-o", bin, filepath.Join(root, "test", "kfakebroker")).CombinedOutput()
	if err != nil {
		log.Fatalf("build kfakebroker: %v\n%s", err, out)
	}
	addrs, stopBroker := startBroker(bin)
	defer stopBroker()

	b := &bench{addrs: addrs, dir: tmp}
	b.adm = kadm.NewClient(b.client())
	if *only == "live" {
		var rates []int
		for _, f := range strings.Split(*liveRates, ",") {
			if strings.TrimSpace(f) == "" {
				continue // -live-rates= : the drains alone
			}
			n, err := strconv.Atoi(strings.TrimSpace(f))
			check(err)
			rates = append(rates, n)
		}
		b.runLive(rates)
		return
	}
	b.createTopics("a.in", "aw.in", "b.in", "c.in", "a2.in", "c2.in", "d.in", "e.in", "e.out", "merchants")
	b.loadMerchants()

	routes := []*rules.Route{
		b.route("a", "a.in", "a.out", "1s", `  - filter: value.amount >= 0
  - map: { id: value.id, user: value.user, amount: value.amount * 100, send_ns: value.send_ns }`),
		b.route("b", "b.in", "b.out", "1s", `  - join: { table: merchants, on: value.merchant, as: m, missing: keep }
  - map: { id: value.id, merchant: 'm?.name', risk: 'value.amount / (m?.avg ?? 1)', send_ns: value.send_ns }`),
		b.route("c", "c.in", "c.out", "1s", `  - window: { kind: tumbling, size: 1s, key: value.user, aggregate: { n: count(), total: sum(value.amount), send_ns: max(value.send_ns) }, emit: on_update }`),
		b.route("a2", "a2.in", "a2.out", "1h", `  - filter: value.amount >= 0
  - map: { id: value.id, user: value.user, amount: value.amount * 100, send_ns: value.send_ns }`),
		b.route("c2", "c2.in", "c2.out", "1h", `  - window: { kind: tumbling, size: 1s, key: value.user, aggregate: { n: count(), total: sum(value.amount), send_ns: max(value.send_ns) }, emit: on_update }`),
		b.route("aw", "aw.in", "aw.out", "1s", `  - filter: value.amount >= 0
  - map: { id: value.id, user: value.user, amount: value.amount * 100, send_ns: value.send_ns }`),
	}
	// aw is (a) decoding every value whole, as before routes decoded only
	// the members they read: the two side by side.
	routes[len(routes)-1].Source.DecodeMembers = false
	mgr, err := pipeline.New(proxyDefaults(pipeline.Config{Seeds: addrs, StateDir: filepath.Join(tmp, "state"),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}))
	check(err)
	b.mgr = mgr
	b.routes = routes
	mgr.Apply(routes)
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- mgr.Run(ctx) }()
	waitRunning(mgr, len(routes))

	stopLoop := startHandLoop(addrs, "e.in", "e.out")
	var rows []row
	for _, s := range []struct{ name, src, sink string }{
		{"(d) floor: produce → consume", "d.in", "d.in"},
		{"(e) hand-written franz-go loop (filter+map)", "e.in", "e.out"},
		{"(a) filter + map", "a.in", "a.out"},
		{"(a) filter + map, every value decoded whole", "aw.in", "aw.out"},
		{"(b) broadcast join (topic table, 100 rows)", "b.in", "b.out"},
		{"(c) tumbling window 1s, on_update", "c.in", "c.out"},
		{"(a) filter + map, checkpoints every 1h", "a2.in", "a2.out"},
		{"(c) window on_update, checkpoints every 1h", "c2.in", "c2.out"},
	} {
		if !*latencies {
			break
		}
		r := b.latency(s.name, s.src, s.sink)
		log.Printf("%s", r.line())
		rows = append(rows, r)
	}
	stopLoop()
	var pauses []string
	for _, st := range mgr.Routes() {
		if st.Name == "a" || st.Name == "c" {
			pauses = append(pauses, fmt.Sprintf("route %s: longest dispatch pause for a checkpoint %.2f ms (last %.2f ms)",
				st.Name, st.MaxCheckpointPauseMs, st.CheckpointPauseMs))
		}
	}

	var tput []string
	if *bulk > 0 {
		floor := b.drainRate("floor: plain consume of the backlog", "", "", false)
		tput = append(tput, floor)
		tput = append(tput, b.drainRate("(e) hand-written loop (filter+map, jsoncodec)", "e", "", false))
		tput = append(tput, b.drainRate("(e2) hand-written loop (filter+map, encoding/json)", "e2", "", false))
		filterOnly := filepath.Join(b.dir, "f.yaml")
		check(os.WriteFile(filterOnly, []byte("route: f\nsource: { topic: f.in }\nsink: { topic: f.out }\nsteps:\n  - filter: value.amount >= 0 && value.user != \"nobody\"\n"), 0o644))
		for _, s := range []struct {
			name, steps string
			whole       bool
		}{
			{"(a) filter + map", routes[0].File, false},
			{"(a) filter + map, every value decoded whole", routes[0].File, true},
			{"(f) filter only (values forwarded)", filterOnly, false},
			{"(f) filter only, every value decoded whole", filterOnly, true},
			{"(b) broadcast join", routes[1].File, false},
			{"(c) tumbling window on_update", routes[2].File, false},
		} {
			tput = append(tput, b.drainRate(s.name, "route", s.steps, s.whole))
		}
	}
	cancel()
	check(<-runDone)

	fmt.Printf("\nrtproxy pipeline benchmark — %s, GOMAXPROCS=%d, %d partitions, %d B records, %d rec/s, %v measured per run\n\n",
		runtime.Version(), runtime.GOMAXPROCS(0), *partitions, *size, *rate, *duration)
	fmt.Println("| scenario | records | p50 | p99 | p999 | max | CPU per record |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Println(r.md())
	}
	fmt.Println()
	for _, p := range pauses {
		fmt.Println(p)
	}
	if len(tput) > 0 {
		fmt.Printf("\nMaximum sustainable throughput (drain a backlog of %d records, 8 partitions, to an 8-partition sink):\n\n", *bulk)
		fmt.Println("| pipeline | records/s | MiB/s in | CPU per record |")
		fmt.Println("|---|---:|---:|---:|")
		for _, l := range tput {
			fmt.Println(l)
		}
	}
}

type bench struct {
	addrs  []string
	dir    string
	adm    *kadm.Client
	mgr    *pipeline.Manager
	routes []*rules.Route
	nbulk  int
}

func (b *bench) client(opts ...kgo.Opt) *kgo.Client {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.addrs...), kgo.ProducerLinger(0)}, opts...)...)
	check(err)
	return cl
}

func (b *bench) createTopics(names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := b.adm.CreateTopics(ctx, int32(*partitions), -1, nil, names...)
	check(err)
	check(resp.Error())
}

func (b *bench) loadMerchants() {
	cl := b.client()
	defer cl.Close()
	var rs []*kgo.Record
	for i := 0; i < 100; i++ {
		rs = append(rs, &kgo.Record{Topic: "merchants", Key: fmt.Appendf(nil, "m%d", i), Value: fmt.Appendf(nil, `{"name":"merchant-%d","avg":%d}`, i, i+1)})
	}
	check(cl.ProduceSync(context.Background(), rs...).FirstErr())
}

// route writes a rule file and compiles it with rules, as rtproxy does.
func (b *bench) route(name, src, sink, cp, steps string) *rules.Route {
	y := fmt.Sprintf(`route: %s
source: { topic: %s, format: json }
sink: { topic: %s }
checkpoint_interval: %s
tables:
  merchants: { topic: merchants }
steps:
%s
`, name, src, sink, cp, steps)
	path := filepath.Join(b.dir, name+".yaml")
	check(os.WriteFile(path, []byte(y), 0o644))
	r, err := rules.LoadFile(path)
	if err != nil {
		log.Fatalf("rule %s: %v", name, err)
	}
	return r
}

func waitRunning(m *pipeline.Manager, n int) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		running := 0
		for _, r := range m.Routes() {
			if r.State == "running" {
				running++
			}
		}
		if running == n {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	log.Fatalf("routes not running after 30s: %+v", m.Routes())
}

type row struct {
	name                 string
	n                    int
	p50, p99, p999, pmax time.Duration
	lost                 int
	cpuPerRec            float64 // µs of this process's CPU per record sent in the measured window
}

func (r row) line() string {
	return fmt.Sprintf("%-48s n=%d p50=%v p99=%v p999=%v max=%v", r.name, r.n, r.p50, r.p99, r.p999, r.pmax)
}

func (r row) md() string {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }
	return fmt.Sprintf("| %s | %d | %s | %s | %s | %s | %.1f µs |", r.name, r.n, ms(r.p50), ms(r.p99), ms(r.p999), ms(r.pmax), r.cpuPerRec)
}

// backlog creates fresh topics PREFIX<n>.in and PREFIX<n>.out and writes
// *bulk records of *size bytes to the first.
func (b *bench) backlog(prefix string) (src, sink string) {
	b.nbulk++
	src, sink = fmt.Sprintf("%s%d.in", prefix, b.nbulk), fmt.Sprintf("%s%d.out", prefix, b.nbulk)
	b.createTopics(src, sink)
	prod := b.client(kgo.MaxBufferedRecords(1<<16), kgo.ProducerBatchMaxBytes(1<<20))
	check(benchkit.ProduceBacklog(prod, src, *bulk, *size))
	prod.Close()
	return src, sink
}

// latencyClients are a consumer of sink that holds its partitions at
// their ends, and a producer, for a latency run.
func (b *bench) latencyClients(sink string) (cons, prod *kgo.Client) {
	cons = b.client(kgo.ConsumeTopics(sink), kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()),
		kgo.FetchMaxWait(10*time.Millisecond), kgo.FetchMinBytes(1))
	ctx0, cancel0 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	cons.PollFetches(ctx0)
	cancel0()
	return cons, b.client(kgo.MaxBufferedRecords(1 << 16))
}

// latency produces at *rate to src for warmup+duration and measures, at a
// consumer of sink, now − send_ns of every output sent after the warmup.
func (b *bench) latency(name, src, sink string) row {
	cons, prod := b.latencyClients(sink)
	defer cons.Close()
	defer prod.Close()
	var cpu0 time.Duration
	lats, sent := benchkit.Latency{Prod: prod, Cons: cons, Topic: src, Rate: *rate, Size: *size,
		Warmup: *warmup, Duration: *duration, Tail: time.Second,
		OnMeasure: func() { cpu0 = benchkit.CPUNow() }}.Run()
	// The window is the measured duration plus the tail's wait; CPU is
	// counted over all of it, records over the measured window.
	cpu := benchkit.CPUNow() - cpu0
	q := func(p float64) time.Duration { return benchkit.Quantile(lats, p) }
	r := row{name: name, n: len(lats), cpuPerRec: float64(cpu.Microseconds()) / float64(max(sent, 1))}
	if len(lats) > 0 {
		r.p50, r.p99, r.p999, r.pmax = q(0.50), q(0.99), q(0.999), lats[len(lats)-1]
	}
	return r
}

// drainRate fills a fresh topic with *bulk records, then measures how fast
// kind drains it into a sink: "" a plain consumer (no sink), "e" the
// hand-written loop, "route" a pipeline route compiled from ruleFile.
//
// CPU per record is this process's CPU time (user + system) over the drain,
// divided by the records: the route or loop, plus the counting consumer,
// which every row pays alike. whole makes a route decode every value whole
// (rules.Source.DecodeMembers off), for the side-by-side row.
func (b *bench) drainRate(name, kind, ruleFile string, whole bool) string {
	src, sink := b.backlog("bulk")

	counted := sink
	var stop func()
	start := time.Now()
	cpu0 := benchkit.CPUNow()
	switch kind {
	case "":
		counted = src
	case "e":
		stop = startHandLoopFrom(b.addrs, src, sink, kgo.NewOffset().AtStart())
	case "e2":
		stop = startStdlibLoop(b.addrs, src, sink)
	case "route":
		y, err := os.ReadFile(ruleFile)
		check(err)
		s := string(y)
		lines := strings.Split(s, "\n")
		for i, l := range lines {
			switch {
			case strings.HasPrefix(l, "route: "):
				lines[i] = "route: " + strings.TrimSuffix(src, ".in")
			case strings.HasPrefix(l, "source: "):
				lines[i] = fmt.Sprintf("source: { topic: %s, format: json }", src)
			case strings.HasPrefix(l, "sink: "):
				lines[i] = fmt.Sprintf("sink: { topic: %s }", sink)
			}
		}
		path := filepath.Join(b.dir, src+".yaml")
		check(os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644))
		r, err := rules.LoadFile(path)
		check(err)
		r.Source.Start = "earliest"
		if whole {
			r.Source.DecodeMembers = false
		}
		start, cpu0 = time.Now(), benchkit.CPUNow()
		b.mgr.Apply(append(append([]*rules.Route(nil), b.routes...), r))
		stop = func() { b.mgr.Apply(b.routes) }
	}
	cons := b.client(kgo.ConsumeTopics(counted), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(10*time.Millisecond))
	n := 0
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	for n < *bulk && ctx.Err() == nil {
		n += len(cons.PollFetches(ctx).Records())
	}
	el := time.Since(start)
	cpu := benchkit.CPUNow() - cpu0
	cancel()
	cons.Close()
	if stop != nil {
		stop()
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	b.adm.DeleteTopics(dctx, src, sink)
	dcancel()
	rps := float64(n) / el.Seconds()
	perRec := float64(cpu.Microseconds()) / float64(max(n, 1))
	log.Printf("throughput %s: %d records in %v = %.0f rec/s, %.2f µs CPU per record", name, n, el.Round(time.Millisecond), rps, perRec)
	return fmt.Sprintf("| %s | %.0f | %.1f | %.2f µs |", name, rps, rps*float64(*size)/(1<<20), perRec)
}

// startHandLoop is baseline (e): the least code that consumes, filters and
// maps with the same JSON library and produces with linger 0.
func startHandLoop(addrs []string, src, sink string) func() {
	return startHandLoopFrom(addrs, src, sink, kgo.NewOffset().AtEnd())
}

func startHandLoopFrom(addrs []string, src, sink string, from kgo.Offset) func() {
	decode := func(b []byte) (map[string]any, bool) {
		v, err := jsoncodec.Decode(b)
		m, ok := v.(map[string]any)
		return m, err == nil && ok
	}
	return startLoop(addrs, src, sink, from, decode, func(v any) ([]byte, error) { return jsoncodec.Append(nil, v) })
}

// startStdlibLoop is baseline (e2): loop (e) with encoding/json, the
// decoder a hand-written consumer would most likely use.
func startStdlibLoop(addrs []string, src, sink string) func() {
	decode := func(b []byte) (map[string]any, bool) {
		var m map[string]any
		return m, json.Unmarshal(b, &m) == nil
	}
	return startLoop(addrs, src, sink, kgo.NewOffset().AtStart(), decode, json.Marshal)
}

// startLoop runs a hand-written consume, filter + map, produce loop with
// the given JSON decoder and encoder.
func startLoop(addrs []string, src, sink string, from kgo.Offset,
	decode func([]byte) (map[string]any, bool), encode func(any) ([]byte, error)) func() {
	return startLoopOpts(addrs, src, sink, from, decode, encode)
}

// startLoopOpts is startLoop with more client options (live.go's hook).
func startLoopOpts(addrs []string, src, sink string, from kgo.Offset,
	decode func([]byte) (map[string]any, bool), encode func(any) ([]byte, error), opts ...kgo.Opt) func() {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ProducerLinger(0),
		kgo.ConsumeTopics(src), kgo.ConsumeResetOffset(from), kgo.FetchMaxWait(10 * time.Millisecond), kgo.FetchMinBytes(1)}, opts...)...)
	check(err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			fs.EachRecord(func(r *kgo.Record) {
				m, ok := decode(r.Value)
				if !ok {
					return
				}
				amount, _ := m["amount"].(float64)
				if amount < 0 {
					return
				}
				out, err := encode(map[string]any{"id": m["id"], "user": m["user"], "amount": amount * 100, "send_ns": m["send_ns"]})
				if err != nil {
					return
				}
				cl.Produce(ctx, &kgo.Record{Topic: sink, Key: r.Key, Value: out}, nil)
			})
		}
	}()
	return func() { cancel(); <-done; cl.Close() }
}

func startBroker(bin string) ([]string, func()) {
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
			return strings.Split(strings.TrimPrefix(l, "ready "), ","), func() { cmd.Process.Kill(); cmd.Wait() }
		}
	}
	log.Fatalf("kfake exited before ready")
	return nil, nil
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// proxyDefaults gives c the proxy's defaults (config.Default) of what
// rtproxy run sets from its config: the pipeline keeps none of its own.
func proxyDefaults(c pipeline.Config) pipeline.Config {
	d := config.Default()
	c.SessionTimeout, c.GroupProtocol, c.StopTimeout = d.GroupSessionTimeout, d.GroupProtocol, d.ShutdownGrace
	return c
}
