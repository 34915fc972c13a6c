package main

// The view phase of make bench-proxy: fetch through a view (a filter and
// one masked field on 1 KiB JSON records, zstd-compressed as stored)
// against fetch of the same topic without a view, through one proxy
// process that has the view in force, side by side in one run, with the
// broker itself as a third column. Throughput is input records per second
// (the view reads every record, and about a tenth are filtered out);
// latency is end to end (produce to the broker at 2,000 records/s,
// consumed through the proxy under both names at once), from the record's
// timestamp to the consumer having it.

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
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/benchkit"
)

var (
	viewPhase   = flag.Bool("views", true, "also run the view phase (fetch through a view against without)")
	viewRecords = flag.Int("view-records", 100000, "records of the view phase's topic")
	viewRounds  = flag.Int("view-rounds", 4, "fetch rounds per target in the view phase (best is reported)")
	viewLatSecs = flag.Int("view-latency-seconds", 10, "seconds of the view phase's 2,000 records/s latency run")
	viewProfile = flag.String("view-cpuprofile", "", "write the view phase's proxy CPU profile here")
)

const benchViewFile = `view: vb.view
topic: vb
steps:
  - filter: value.status != "test"
  - set:
      card: mask(value.card, 4)
`

// viewValue is a ~1 KiB JSON record: one in ten has status "test".
func viewValue(r *rand.Rand, i int) []byte {
	status := "ok"
	if i%10 == 0 {
		status = "test"
	}
	words := []string{"payment", "settled", "refund", "merchant", "card", "present", "online", "batch", "retry", "fee",
		"currency", "EUR", "USD", "approved", "declined", "terminal", "region", "north", "south", "customer"}
	var note strings.Builder
	for note.Len() < 820 {
		note.WriteString(words[r.IntN(len(words))])
		note.WriteByte(' ')
	}
	return fmt.Appendf(nil, `{"id":%d,"status":%q,"card":"4111-1111-1111-%04d","email":"user%d@example.com","amount":%d.%02d,"note":%q}`,
		i, status, r.IntN(10000), i, r.IntN(100000), r.IntN(100), note.String())
}

// viewTarget is one proxy process of the view phase (the working tree's
// or a -base revision's), with the view in force.
type viewTarget struct {
	name        string
	proc        *exec.Cmd
	addr        string
	plain, view float64   // best input records/s
	ratios      []float64 // view / no view, one per round
	views       []float64 // through the view, records/s, one per round
	// CPU of the proxy and of the consumer (this process) over the
	// rounds without and through the view.
	proxyPlain, proxyView   time.Duration
	clientPlain, clientView time.Duration
	plainLat                []time.Duration
	viewLat                 []time.Duration
}

// runViewPhase runs the view phase with its own broker and one proxy
// process per target (the working tree's is the last).
func runViewPhase(kfakeBin string, targets []*target, portFirst int) {
	if !*viewPhase {
		return
	}
	dir, err := os.MkdirTemp("", "bench-proxy-view")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	vf := filepath.Join(dir, "vb.yaml")
	if err := os.WriteFile(vf, []byte(benchViewFile), 0o644); err != nil {
		log.Fatal(err)
	}
	kfake, brokers := benchkit.StartProc(kfakeBin, "-brokers", "3", "-topics", "vb:3")
	defer benchkit.StopProc(kfake)
	var vts []*viewTarget
	for i, t := range targets {
		args := []string{"-upstream", brokers, "-broker-ports", strconv.Itoa(portFirst + 10*i), "-view", vf}
		if *viewProfile != "" {
			abs, _ := filepath.Abs(*viewProfile)
			if i != len(targets)-1 {
				abs += fmt.Sprintf(".base%d", i)
			}
			args = append(args, "-cpuprofile", abs)
		}
		vt := &viewTarget{name: t.name}
		vt.proc, vt.addr = benchkit.StartProc(t.bin, args...)
		defer benchkit.StopProc(vt.proc)
		vts = append(vts, vt)
	}

	n := *viewRecords
	rng := rand.New(rand.NewPCG(1, 2))
	pc := newClient(brokers, kgo.DefaultProduceTopic("vb"), kgo.ProducerBatchCompression(kgo.ZstdCompression()),
		kgo.ProducerLinger(5*time.Millisecond))
	ctx := context.Background()
	var stored int64
	for i := range n {
		v := viewValue(rng, i)
		stored += int64(len(v))
		pc.Produce(ctx, &kgo.Record{Value: v}, func(_ *kgo.Record, err error) {
			if err != nil {
				log.Fatalf("view phase produce: %v", err)
			}
		})
	}
	if err := pc.Flush(ctx); err != nil {
		log.Fatal(err)
	}
	pc.Close()
	kept := n - (n+9)/10

	// Throughput: every round reads the whole topic from the start, from
	// the broker and through each proxy under both names, in an order
	// that rotates from round to round.
	var direct float64
	for r := range *viewRounds {
		var d float64
		plain := make([]float64, len(vts))
		view := make([]float64, len(vts))
		order := []func(){func() { d = fetchAll(brokers, "vb", n, n) }}
		for i, vt := range vts {
			// measured runs f and adds the proxy's and this process's
			// CPU over it.
			measured := func(proxy, client *time.Duration, f func()) {
				p0, c0 := benchkit.ProcCPU(vt.proc.Process.Pid), benchkit.ProcCPU(os.Getpid())
				f()
				*proxy += benchkit.ProcCPU(vt.proc.Process.Pid) - p0
				*client += benchkit.ProcCPU(os.Getpid()) - c0
			}
			order = append(order,
				func() {
					measured(&vt.proxyPlain, &vt.clientPlain, func() { plain[i] = fetchAll(vt.addr, "vb", n, n) })
				},
				func() {
					measured(&vt.proxyView, &vt.clientView, func() { view[i] = fetchAll(vt.addr, "vb.view", kept, n) })
				})
		}
		k := r % len(order)
		order = append(order[k:], order[:k]...)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, f := range order {
			f()
		}
		line := fmt.Sprintf("view round %d: direct %.0f rec/s", r, d)
		direct = max(direct, d)
		for i, vt := range vts {
			line += fmt.Sprintf("; %s: without view %.0f, through the view %.0f (%.3fx)", vt.name, plain[i], view[i], view[i]/plain[i])
			vt.plain, vt.view = max(vt.plain, plain[i]), max(vt.view, view[i])
			vt.ratios = append(vt.ratios, view[i]/plain[i])
			vt.views = append(vt.views, view[i])
		}
		log.Print(line)
	}

	// Latency at 2,000 records/s, both names through every proxy at once.
	viewLatency(brokers, vts)

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	now := vts[len(vts)-1]
	fmt.Fprintf(w, "view phase: %d records of ~1 KiB JSON (%.0f MB, zstd as stored), best of %d\tdirect\tproxy, no view\tproxy, through the view\tview vs no view\tmedian round ratio\ttarget\t\n",
		n, float64(stored)/1e6, *viewRounds)
	fmt.Fprintf(w, "fetch input records/s\t%.0f\t%.0f\t%.0f\t%.3fx\t%.3fx\t>= 0.6x\t\n", direct, now.plain, now.view, now.view/now.plain, benchkit.Median(now.ratios))
	for _, q := range []struct {
		name   string
		q      float64
		target string
	}{{"end-to-end latency p50 at 2k rec/s", 0.5, ""}, {"end-to-end latency p99 at 2k rec/s", 0.99, "<= +1 ms"}} {
		p, v := quantile(now.plainLat, q.q), quantile(now.viewLat, q.q)
		fmt.Fprintf(w, "%s\t-\t%dµs\t%dµs\t%+dµs\t\t%s\t\n", q.name, p.Microseconds(), v.Microseconds(), (v - p).Microseconds(), q.target)
	}
	w.Flush()

	// Side by side, one row per proxy: best and median round ratios; the
	// CPU per input record of the proxy and of the consumer, without the
	// view and through it (on a shared machine the rates follow the load,
	// the CPU per record much less); and the added end-to-end latency of
	// the view over the same proxy without it.
	// "view rec/s vs now" compares each proxy's view rate with the
	// working tree's of the same round (median over the rounds): the
	// proxies' own rates without the view swing as much as the ratio.
	fmt.Printf("\n| proxy | no view rec/s | view rec/s | view vs no view | median round ratio | view rec/s vs now, median round | proxy CPU µs/rec, no view / view | consumer CPU µs/rec, no view / view | added p50 | added p99 |\n|---|---|---|---|---|---|---|---|---|---|\n")
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(n**viewRounds) }
	for _, vt := range vts {
		var vsNow []float64
		for r := range vt.views {
			vsNow = append(vsNow, vt.views[r]/now.views[r])
		}
		fmt.Printf("| %s | %.0f | %.0f | %.3fx | %.3fx | %.3fx | %.2f / %.2f | %.2f / %.2f | %+dµs | %+dµs |\n", vt.name, vt.plain, vt.view, vt.view/vt.plain, benchkit.Median(vt.ratios), benchkit.Median(vsNow),
			per(vt.proxyPlain), per(vt.proxyView), per(vt.clientPlain), per(vt.clientView),
			(quantile(vt.viewLat, 0.5) - quantile(vt.plainLat, 0.5)).Microseconds(),
			(quantile(vt.viewLat, 0.99) - quantile(vt.plainLat, 0.99)).Microseconds())
	}
}

// fetchAll reads topic from the start until want records arrived, and
// returns input records per second (in: the records of the topic read).
func fetchAll(seeds, topic string, want, in int) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cc := newClient(seeds, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer cc.Close()
	got := 0
	start := time.Now()
	for got < want {
		fs := cc.PollFetches(ctx)
		if ctx.Err() != nil {
			log.Fatalf("fetch %s via %s: %d of %d records", topic, seeds, got, want)
		}
		fs.EachError(func(t string, p int32, err error) { log.Fatalf("fetch %s/%d: %v", t, p, err) })
		got += fs.NumRecords()
	}
	return float64(in) / time.Since(start).Seconds()
}

// viewLatency produces to vb at 2,000 records/s (linger 0, zstd) and
// consumes it through every proxy as vb and as vb.view at once; it sets
// each target's sorted end-to-end latencies.
func viewLatency(brokers string, vts []*viewTarget) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type sample struct {
		at  time.Time
		lat time.Duration
	}
	samples := make([][2][]sample, len(vts))
	consume := func(addr, topic string, out *[]sample, ready *sync.WaitGroup, done *sync.WaitGroup) {
		defer done.Done()
		cc := newClient(addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()),
			kgo.FetchMaxWait(time.Second))
		defer cc.Close()
		cc.PollFetches(context.Background()) // none: assigned, at the end
		ready.Done()
		for ctx.Err() == nil {
			fs := cc.PollFetches(ctx)
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) { *out = append(*out, sample{r.Timestamp, now.Sub(r.Timestamp)}) })
		}
	}
	var ready, done sync.WaitGroup
	ready.Add(2 * len(vts))
	done.Add(2 * len(vts))
	// The first poll of a consumer at the end waits for a record: one is
	// produced every 50ms until all are polling.
	pc := newClient(brokers, kgo.DefaultProduceTopic("vb"), kgo.ProducerBatchCompression(kgo.ZstdCompression()))
	defer pc.Close()
	for i, vt := range vts {
		go consume(vt.addr, "vb", &samples[i][0], &ready, &done)
		go consume(vt.addr, "vb.view", &samples[i][1], &ready, &done)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	warm := time.NewTicker(50 * time.Millisecond)
	readyC := make(chan struct{})
	go func() { ready.Wait(); close(readyC) }()
warming:
	for i := 1; ; i++ {
		select {
		case <-readyC:
			break warming
		case <-warm.C:
			pc.Produce(ctx, &kgo.Record{Value: viewValue(rng, i)}, nil)
		}
	}
	warm.Stop()
	time.Sleep(200 * time.Millisecond)
	from := time.Now()
	tick := time.NewTicker(500 * time.Microsecond)
	end := time.After(time.Duration(*viewLatSecs) * time.Second)
	i := 1
produce:
	for {
		select {
		case <-end:
			break produce
		case <-tick.C:
			i++
			pc.Produce(ctx, &kgo.Record{Value: viewValue(rng, i)}, nil)
		}
	}
	tick.Stop()
	pc.Flush(context.Background())
	time.Sleep(time.Second)
	cancel()
	done.Wait()
	since := func(ss []sample) []time.Duration {
		var out []time.Duration
		for _, s := range ss {
			if !s.at.Before(from) {
				out = append(out, s.lat)
			}
		}
		slices.Sort(out)
		return out
	}
	for i, vt := range vts {
		vt.plainLat, vt.viewLat = since(samples[i][0]), since(samples[i][1])
	}
}
