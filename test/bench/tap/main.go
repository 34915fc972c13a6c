// Command tap is `make bench-tap`: the latency from producing a record
// through rtproxy to a consumer of a stateless route's sink, with the
// produce-path tap on and off, against the floor (produce to a consumer of
// the source through the same proxy), at 2k and 10k records/s of 1 KiB
// JSON over 8 partitions, in one run.
//
// kfake (test/kfakebroker) and two rtproxy binaries run as their own
// processes: one with proxy.tap on, one with it off (RTPROXY_PROXY_TAP),
// each with the same route on its own source topic. A fourth path is the
// two-hop floor: a hand-written franz-go loop in this process (consume the
// source from the brokers, produce each value unchanged to its sink with
// linger 0 and acks=all), the least any route that writes its outputs to
// Kafka can cost.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/benchkit"
)

var (
	duration   = flag.Duration("duration", 5*time.Second, "measured time per run")
	warmup     = flag.Duration("warmup", time.Second, "unmeasured time before each run")
	rounds     = flag.Int("rounds", 3, "runs of every path per rate, alternated")
	size       = flag.Int("size", 1024, "bytes per record")
	partitions = flag.Int("partitions", 8, "source partitions")
	rates      = flag.String("rates", "2000,10000", "records per second, comma-separated")
)

const ruleFmt = `route: %[1]s
source: { topic: %[2]s, format: json }
sink: { topic: %[2]s.out }
steps:
  - filter: value.amount >= 0
  - set: { tag: '"seen"' }
`

func main() {
	flag.Parse()
	log.SetFlags(0)
	root := benchkit.ModuleRoot()
	dir, err := os.MkdirTemp("", "bench-tap")
	check(err)
	defer os.RemoveAll(dir)
	kfakeBin, rtBin := filepath.Join(dir, "kfakebroker"), filepath.Join(dir, "rtproxy")
	for bin, pkg := range map[string]string{kfakeBin: "./test/kfakebroker", rtBin: "./cmd/rtproxy"} {
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			log.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	kfake, brokers := benchkit.StartProc(kfakeBin, "-brokers", "3", "-auto-create=false")
	defer benchkit.StopProc(kfake)
	seeds := strings.Split(brokers, ",")
	adm, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	check(err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	_, err = kadm.NewClient(adm).CreateTopics(ctx, int32(*partitions), -1, nil, "tap-on", "tap-on.out", "tap-off", "tap-off.out", "tap-hand", "tap-hand.out")
	cancel()
	check(err)
	adm.Close()

	on := startProxy(rtBin, dir, "on", brokers, 29500, "true")
	defer on.stop()
	off := startProxy(rtBin, dir, "off", brokers, 29600, "false")
	defer off.stop()
	hopCtx, stopHop := context.WithCancel(context.Background())
	defer stopHop()
	go handHop(hopCtx, seeds, "tap-hand", "tap-hand.out")

	paths := []struct {
		name, via, topic, sink string
	}{
		{"floor: produce → consume of the source", on.addr, "tap-on", "tap-on"},
		{"route, tap on", on.addr, "tap-on", "tap-on.out"},
		{"route, tap off", off.addr, "tap-off", "tap-off.out"},
		{"two-hop floor: hand-written franz-go loop", on.addr, "tap-hand", "tap-hand.out"},
	}
	fmt.Printf("\nproduce-path tap: %d B JSON records, %d partitions, franz-go linger 0 (acks=all), %v measured per run, %d rounds (each path once per round, the order rotated)\n\n",
		*size, *partitions, *duration, *rounds)
	fmt.Println("| rec/s | path | records | median p50 | median p99 | median p999 | p99 by round |")
	fmt.Println("|---:|---|---:|---:|---:|---:|---|")
	var verdicts []string
	for _, rs := range strings.Split(*rates, ",") {
		rate, err := strconv.Atoi(strings.TrimSpace(rs))
		check(err)
		got := make([][]result, len(paths))
		for round := range *rounds {
			for k := range paths {
				i := (k + round) % len(paths)
				c := paths[i]
				r := measure(c.via, c.topic, c.sink, rate)
				log.Printf("round %d %d rec/s %-42s n=%d p50=%v p99=%v p999=%v", round, rate, c.name, r.n, r.p50, r.p99, r.p999)
				got[i] = append(got[i], r)
			}
		}
		med := make([]result, len(paths))
		for i, c := range paths {
			n, p50s, p99s, p999s, by := 0, []float64{}, []float64{}, []float64{}, []string{}
			for _, r := range got[i] {
				n += r.n
				p50s, p99s, p999s = append(p50s, float64(r.p50)), append(p99s, float64(r.p99)), append(p999s, float64(r.p999))
				by = append(by, fmt.Sprintf("%.1f", float64(r.p99)/1e6))
			}
			med[i] = result{n: n, p50: time.Duration(benchkit.Median(p50s)), p99: time.Duration(benchkit.Median(p99s)), p999: time.Duration(benchkit.Median(p999s))}
			fmt.Printf("| %d | %s | %d | %s | %s | %s | %s ms |\n", rate, c.name, n, ms(med[i].p50), ms(med[i].p99), ms(med[i].p999), strings.Join(by, ", "))
		}
		verdict := "met"
		if med[1].p99 > med[0].p99 {
			verdict = "missed"
		}
		verdicts = append(verdicts, fmt.Sprintf("%d rec/s: tap on median p99 %s against the floor's %s (target: no worse: %s); tap off %s; two-hop floor %s",
			rate, ms(med[1].p99), ms(med[0].p99), verdict, ms(med[2].p99), ms(med[3].p99)))
	}
	fmt.Println()
	for _, v := range verdicts {
		fmt.Println(v)
	}
	for _, p := range []*proxy{on, off} {
		fmt.Printf("proxy tap=%s: %s\n", p.tap, p.tapped())
	}
}

// handHop is the two-hop floor: it consumes from (directly from the
// brokers, as a route does) and produces every record's value unchanged to
// the same partition of to, linger 0, acks=all, until ctx ends.
func handHop(ctx context.Context, seeds []string, from, to string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(from),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchMaxWait(250*time.Millisecond), // the route's
		kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	check(err)
	defer cl.Close()
	for ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			cl.Produce(ctx, &kgo.Record{Topic: to, Partition: r.Partition, Key: r.Key, Value: r.Value}, nil)
		})
	}
}

type result struct {
	n              int
	p50, p99, p999 time.Duration
}

// measure produces at rate to topic through via for warmup+duration and
// measures, at a consumer of sink through via, now − send_ns of every
// record sent after the warmup.
func measure(via, topic, sink string, rate int) result {
	cons, err := kgo.NewClient(kgo.SeedBrokers(via), kgo.ConsumeTopics(sink), kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()),
		kgo.FetchMaxWait(10*time.Millisecond))
	check(err)
	defer cons.Close()
	ctx0, cancel0 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	cons.PollFetches(ctx0)
	cancel0()
	prod, err := kgo.NewClient(kgo.SeedBrokers(via), kgo.ProducerLinger(0), kgo.MaxBufferedRecords(1<<16))
	check(err)
	defer prod.Close()
	lats, _ := benchkit.Latency{Prod: prod, Cons: cons, Topic: topic, Rate: rate, Size: *size,
		Warmup: *warmup, Duration: *duration, Tail: time.Second}.Run()
	q := func(p float64) time.Duration { return benchkit.Quantile(lats, p) }
	return result{n: len(lats), p50: q(0.5), p99: q(0.99), p999: q(0.999)}
}

type proxy struct {
	cmd       *exec.Cmd
	addr, adm string
	tap       string
}

// startProxy runs rtproxy with one route on source tap-NAME and proxy.tap
// set as given, and waits for /readyz.
func startProxy(bin, dir, name, brokers string, port int, tap string) *proxy {
	rules := filepath.Join(dir, "rules-"+name)
	check(os.MkdirAll(rules, 0o755))
	check(os.WriteFile(filepath.Join(rules, "r.yaml"), []byte(fmt.Sprintf(ruleFmt, "tap-"+name, "tap-"+name)), 0o644))
	p := &proxy{addr: "127.0.0.1:" + strconv.Itoa(port), adm: "127.0.0.1:" + strconv.Itoa(port+99), tap: tap}
	p.cmd = exec.Command(bin, "run", "--upstream", brokers, "--listen", p.addr, "--broker-ports", strconv.Itoa(port+1),
		"--admin-listen", p.adm, "--rules-dir", rules, "--state-dir", filepath.Join(dir, "state-"+name), "--log-level", "warn")
	p.cmd.Env = append(os.Environ(), "RTPROXY_PROXY_TAP="+tap, "RTPROXY_BROKER_PORT_COUNT=10")
	p.cmd.Stderr = os.Stderr
	check(p.cmd.Start())
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := http.Get("http://" + p.adm + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 && routeRunning(p.adm) {
				return p
			}
		}
		if time.Now().After(deadline) {
			log.Fatalf("rtproxy (tap %s) not ready with its route running in 30s", tap)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// routeRunning reports whether the route runs and owns its partitions.
func routeRunning(adm string) bool {
	s := getRoutes(adm)
	return strings.Contains(s, `"state": "running"`) && strings.Contains(s, `"done_offset"`)
}

func getRoutes(adm string) string {
	resp, err := http.Get("http://" + adm + "/routes")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// tapped is the route's tapped_records and tapped_share from /routes.
func (p *proxy) tapped() string {
	s := getRoutes(p.adm)
	var out []string
	for _, k := range []string{`"tapped_records"`, `"tapped_share"`} {
		if i := strings.Index(s, k); i >= 0 {
			j := strings.IndexAny(s[i:], ",\n}")
			out = append(out, strings.TrimSpace(s[i:i+j]))
		}
	}
	return strings.Join(out, " ")
}

func (p *proxy) stop() { benchkit.StopProc(p.cmd) }

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
