package main

// -only live: the live rates of issue 13, with the pipeline in a process of
// its own. The benchmark runs itself again as the measured process (-child
// route: a pipeline.Manager with route (a), as rtproxy runs it; -child
// loop: the hand-written loop (e)), so the CPU counted is that process's
// alone (/proc/PID/stat), not the load generator's or the measuring
// consumer's. The measured process counts the requests its clients write
// (a kgo hook on every client): produce and fetch requests, and the
// records and batches the sink's produce requests carried.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/benchkit"
	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/pipeline"
	"github.com/rtproxy/rtproxy/rules"
)

// reqCounter is the hook the measured process puts on every client.
type reqCounter struct {
	sink                      string
	produce, fetch            atomic.Int64 // requests written
	sinkBatches, sinkRecords  atomic.Int64 // batches (one per partition and request) and records written to sink
	fetchBatches, fetchedRecs atomic.Int64
}

func (c *reqCounter) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if err != nil {
		return
	}
	switch key {
	case 0:
		c.produce.Add(1)
	case 1:
		c.fetch.Add(1)
	}
}

func (c *reqCounter) OnProduceBatchWritten(_ kgo.BrokerMetadata, topic string, _ int32, m kgo.ProduceBatchMetrics) {
	if topic == c.sink {
		c.sinkBatches.Add(1)
		c.sinkRecords.Add(int64(m.NumRecords))
	}
}

func (c *reqCounter) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	c.fetchBatches.Add(1)
	c.fetchedRecs.Add(int64(m.NumRecords))
}

func (c *reqCounter) line() string {
	return fmt.Sprintf("counts %d %d %d %d %d %d", c.produce.Load(), c.fetch.Load(),
		c.sinkBatches.Load(), c.sinkRecords.Load(), c.fetchBatches.Load(), c.fetchedRecs.Load())
}

type counts struct{ produce, fetch, sinkBatches, sinkRecords, fetchBatches, fetchedRecs int64 }

func (c counts) minus(o counts) counts {
	return counts{c.produce - o.produce, c.fetch - o.fetch, c.sinkBatches - o.sinkBatches,
		c.sinkRecords - o.sinkRecords, c.fetchBatches - o.fetchBatches, c.fetchedRecs - o.fetchedRecs}
}

// runChild is the measured process: it prints "ready", starts on a "go"
// line on stdin, answers every "counts" line with its counters, and exits
// when stdin closes.
func runChild(kind, brokers, src, sink, ruleFile, start, stateDir, profile string) {
	addrs := strings.Split(brokers, ",")
	c := &reqCounter{sink: sink}
	in := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	var stop func()
	for in.Scan() {
		switch in.Text() {
		case "counts":
			fmt.Println(c.line())
		case "go":
			if stop != nil {
				continue
			}
			if profile != "" {
				f, err := os.Create(profile)
				check(err)
				check(pprof.StartCPUProfile(f))
			}
			stop = startChild(kind, addrs, src, sink, ruleFile, start, stateDir, c)
		}
	}
	if stop != nil {
		stop()
	}
	if profile != "" {
		pprof.StopCPUProfile()
	}
}

func startChild(kind string, addrs []string, src, sink, ruleFile, start, stateDir string, c *reqCounter) func() {
	from := kgo.NewOffset().AtEnd() // where the hand loops start
	if start == "earliest" {
		from = kgo.NewOffset().AtStart()
	}
	switch kind {
	case "route":
		r, err := rules.LoadFile(ruleFile)
		check(err)
		r.Source.Start = start
		mgr, err := pipeline.New(proxyDefaults(pipeline.Config{Seeds: addrs, StateDir: stateDir, BatchWindow: *childWindow,
			ClientOpts: []kgo.Opt{kgo.WithHooks(c)},
			Logger:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}))
		check(err)
		mgr.Apply([]*rules.Route{r})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- mgr.Run(ctx) }()
		return func() { cancel(); check(<-done) }
	case "loop":
		decode := func(b []byte) (map[string]any, bool) {
			v, err := jsoncodecDecode(b)
			m, ok := v.(map[string]any)
			return m, err == nil && ok
		}
		return startLoopOpts(addrs, src, sink, from, decode, jsoncodecAppend, kgo.WithHooks(c))
	case "stdloop":
		// Baseline (e2) in a process of its own: the loop with
		// encoding/json, the yardstick for the drain.
		decode := func(b []byte) (map[string]any, bool) {
			var m map[string]any
			return m, json.Unmarshal(b, &m) == nil
		}
		return startLoopOpts(addrs, src, sink, from, decode, json.Marshal, kgo.WithHooks(c))
	}
	log.Fatalf("unknown -child %q", kind)
	return nil
}

// child is the parent's handle on a measured process.
type child struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func (b *bench) startChild(kind, src, sink, ruleFile, start string) *child {
	self, err := os.Executable()
	check(err)
	stateDir, err := os.MkdirTemp(b.dir, "child-state-")
	check(err)
	cmd := exec.Command(self, "-child", kind, "-child-brokers", strings.Join(b.addrs, ","),
		"-child-src", src, "-child-sink", sink, "-child-rule", ruleFile, "-child-start", start, "-child-state", stateDir,
		"-child-batch-window", liveWindow.String())
	if *childProfileDir != "" {
		cmd.Args = append(cmd.Args, "-child-profile", filepath.Join(*childProfileDir, fmt.Sprintf("%s-%s.pprof", kind, strings.TrimSuffix(src, ".in"))))
	}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	check(err)
	out, err := cmd.StdoutPipe()
	check(err)
	check(cmd.Start())
	ch := &child{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	if !ch.out.Scan() || ch.out.Text() != "ready" {
		log.Fatalf("child %s did not start", kind)
	}
	return ch
}

func (ch *child) send(line string) {
	_, err := fmt.Fprintln(ch.in, line)
	check(err)
}

func (ch *child) counts() counts {
	ch.send("counts")
	if !ch.out.Scan() {
		log.Fatal("child: no counts")
	}
	var c counts
	_, err := fmt.Sscanf(ch.out.Text(), "counts %d %d %d %d %d %d", &c.produce, &c.fetch, &c.sinkBatches, &c.sinkRecords, &c.fetchBatches, &c.fetchedRecs)
	check(err)
	return c
}

func (ch *child) cpu() time.Duration { return benchkit.ProcCPU(ch.cmd.Process.Pid) }

func (ch *child) stop() {
	ch.in.Close()
	done := make(chan struct{})
	go func() { ch.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		ch.cmd.Process.Kill()
		<-done
	}
}

type liveRow struct {
	name             string
	rate             int
	n                int
	p50, p99, p999   time.Duration
	cpuPerRec        float64 // µs of the measured process per record sent
	secs             float64
	c                counts
	drainRecsPerSec  float64
	drainCPUPerRec   float64
	load0, load1     string
	measuredRecsSent int
}

func (r liveRow) md() string {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/1e6) }
	perReq := 0.0
	if r.c.produce > 0 {
		perReq = float64(r.c.sinkRecords) / float64(r.c.produce)
	}
	return fmt.Sprintf("| %s | %d | %d | %s / %s / %s ms | %.1f µs | %.0f | %.0f | %.1f | %.1f |",
		r.name, r.rate, r.n, ms(r.p50), ms(r.p99), ms(r.p999), r.cpuPerRec,
		float64(r.c.produce)/r.secs, float64(r.c.fetch)/r.secs, perReq,
		float64(r.c.fetchedRecs)/float64(max(r.c.fetch, 1)))
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}

// liveRun is one latency run at rate of kind ("route" or "loop") in a
// process of its own, on fresh topics.
func (b *bench) liveRun(kind string, rate int) liveRow {
	b.nbulk++
	src := fmt.Sprintf("live%d.in", b.nbulk)
	sink := fmt.Sprintf("live%d.out", b.nbulk)
	b.createTopics(src, sink)
	rule := b.liveRule(src, sink)
	ch := b.startChild(kind, src, sink, rule, "latest")
	defer ch.stop()
	ch.send("go")

	cons, prod := b.latencyClients(sink)
	defer cons.Close()
	defer prod.Close()

	var cpu0 time.Duration
	var c0 counts
	var t0 time.Time
	row := liveRow{name: kind, rate: rate, load0: loadavg()}
	lats, sent := benchkit.Latency{Prod: prod, Cons: cons, Topic: src, Rate: rate, Size: *size,
		Warmup: *warmup, Duration: *duration, Tail: time.Second,
		OnMeasure: func() { cpu0, c0, t0 = ch.cpu(), ch.counts(), time.Now() }}.Run()
	row.secs = time.Since(t0).Seconds()
	row.c = ch.counts().minus(c0)
	cpu := ch.cpu() - cpu0
	row.load1 = loadavg()
	row.n = len(lats)
	row.measuredRecsSent = sent
	row.cpuPerRec = float64(cpu.Microseconds()) / float64(max(sent, 1))
	if len(lats) > 0 {
		q := func(p float64) time.Duration { return benchkit.Quantile(lats, p) }
		row.p50, row.p99, row.p999 = q(0.50), q(0.99), q(0.999)
	}
	log.Printf("live %s %d rec/s: n=%d/%d p50=%v p99=%v p999=%v cpu/rec=%.1fµs produce=%d fetch=%d sink records=%d batches=%d load %s → %s",
		kind, rate, row.n, sent, row.p50, row.p99, row.p999, row.cpuPerRec, row.c.produce, row.c.fetch,
		row.c.sinkRecords, row.c.sinkBatches, row.load0, row.load1)
	return row
}

// liveDrain drains a backlog of *bulk records through kind in a process
// of its own: records/s and that process's CPU per record, from "go"
// until the last output is read.
func (b *bench) liveDrain(kind string) liveRow {
	src, sink := b.backlog("livedrain")
	rule := b.liveRule(src, sink)
	ch := b.startChild(kind, src, sink, rule, "earliest")
	defer ch.stop()
	cons := b.client(kgo.ConsumeTopics(sink), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(10*time.Millisecond))
	defer cons.Close()
	row := liveRow{name: kind, load0: loadavg()}
	c0, cpu0, t0 := ch.counts(), ch.cpu(), time.Now()
	ch.send("go")
	n := 0
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for n < *bulk && ctx.Err() == nil {
		n += len(cons.PollFetches(ctx).Records())
	}
	el := time.Since(t0)
	cpu := ch.cpu() - cpu0
	row.c = ch.counts().minus(c0)
	row.secs = el.Seconds()
	row.load1 = loadavg()
	row.n = n
	row.drainRecsPerSec = float64(n) / el.Seconds()
	row.drainCPUPerRec = float64(cpu.Microseconds()) / float64(max(n, 1))
	log.Printf("live drain %s: %d records in %v = %.0f rec/s, %.2f µs CPU per record, produce=%d fetch=%d load %s → %s",
		kind, n, el.Round(time.Millisecond), row.drainRecsPerSec, row.drainCPUPerRec, row.c.produce, row.c.fetch, row.load0, row.load1)
	return row
}

// liveRule writes route (a), filter + map, from src to sink.
func (b *bench) liveRule(src, sink string) string {
	y := fmt.Sprintf(`route: %s
source: { topic: %s, format: json }
sink: { topic: %s }
checkpoint_interval: 1s
steps:
  - filter: value.amount >= 0
  - map: { id: value.id, user: value.user, amount: value.amount * 100, send_ns: value.send_ns }
`, strings.TrimSuffix(src, ".in"), src, sink)
	path := filepath.Join(b.dir, src+".yaml")
	check(os.WriteFile(path, []byte(y), 0o644))
	return path
}

// runLive is -only live: for each rate, the route and the loop, then the
// drain of each.
func (b *bench) runLive(rates []int) {
	var rows, drains []liveRow
	for _, rate := range rates {
		for _, kind := range strings.Split(*liveKinds, ",") {
			rows = append(rows, b.liveRun(kind, rate))
		}
	}
	if *bulk > 0 {
		for _, kind := range strings.Split(*liveKinds, ",") {
			drains = append(drains, b.liveDrain(kind))
		}
	}
	fmt.Printf("\nlive rates, the measured process alone (%d partitions, %d B records, %v measured)\n\n", *partitions, *size, *duration)
	fmt.Println("| process | rec/s | outputs | p50 / p99 / p999 | CPU per record | produce req/s | fetch req/s | records per produce req | records per fetch req |")
	fmt.Println("|---|---:|---:|---|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Println(r.md())
	}
	for _, r := range rows {
		fmt.Printf("load average %s: %s → %s\n", r.name, r.load0, r.load1)
	}
	if len(drains) > 0 {
		fmt.Printf("\ndrain of %d records, the measured process alone\n\n", *bulk)
		fmt.Println("| process | records/s | CPU per record | produce requests | fetch requests | records per produce req |")
		fmt.Println("|---|---:|---:|---:|---:|---:|")
		for _, r := range drains {
			fmt.Printf("| %s | %.0f | %.2f µs | %d | %d | %.1f |\n", r.name, r.drainRecsPerSec, r.drainCPUPerRec,
				r.c.produce, r.c.fetch, float64(r.c.sinkRecords)/float64(max(r.c.produce, 1)))
		}
	}
}

func jsoncodecDecode(b []byte) (any, error) { return jsoncodec.Decode(b) }

func jsoncodecAppend(v any) ([]byte, error) { return jsoncodec.Append(nil, v) }
