// Command tap is `make bench-tap`: the latency from producing a record
// through rtproxy to a consumer of a stateless route's sink, with the
// produce-path tap on and off, against the floor (produce to a consumer of
// the source through the same proxy), at 2k and 10k records/s of 1 KiB
// JSON over 8 partitions, in one run.
//
// kfake (test/kfakebroker) and two rtproxy binaries run as their own
// processes: one with proxy.tap on, one with it off (RTPROXY_PROXY_TAP),
// each with the same route on its own source topic.
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
	duration   = flag.Duration("duration", 8*time.Second, "measured time per run")
	warmup     = flag.Duration("warmup", 2*time.Second, "unmeasured time before each run")
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
	_, err = kadm.NewClient(adm).CreateTopics(ctx, int32(*partitions), -1, nil, "tap-on", "tap-on.out", "tap-off", "tap-off.out")
	cancel()
	check(err)
	adm.Close()

	on := startProxy(rtBin, dir, "on", brokers, 29500, "true")
	defer on.stop()
	off := startProxy(rtBin, dir, "off", brokers, 29600, "false")
	defer off.stop()

	type row struct {
		rate int
		name string
		r    result
	}
	var rows []row
	for _, rs := range strings.Split(*rates, ",") {
		rate, err := strconv.Atoi(strings.TrimSpace(rs))
		check(err)
		for _, c := range []struct {
			name, via, topic, sink string
		}{
			{"floor: produce → consume of the source", on.addr, "tap-on", "tap-on"},
			{"route, tap on", on.addr, "tap-on", "tap-on.out"},
			{"route, tap off", off.addr, "tap-off", "tap-off.out"},
		} {
			r := measure(c.via, c.topic, c.sink, rate)
			log.Printf("%d rec/s %-40s n=%d p50=%v p99=%v p999=%v", rate, c.name, r.n, r.p50, r.p99, r.p999)
			rows = append(rows, row{rate, c.name, r})
		}
	}
	fmt.Printf("\nproduce-path tap: %d B JSON records, %d partitions, franz-go linger 0 (acks=all), %v measured per run\n\n", *size, *partitions, *duration)
	fmt.Println("| rec/s | path | records | p50 | p99 | p999 |")
	fmt.Println("|---:|---|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Printf("| %d | %s | %d | %s | %s | %s |\n", r.rate, r.name, r.r.n, ms(r.r.p50), ms(r.r.p99), ms(r.r.p999))
	}
	fmt.Println()
	for i := 0; i+2 < len(rows); i += 3 {
		floor, tapOn, tapOff := rows[i].r, rows[i+1].r, rows[i+2].r
		verdict := "met"
		if tapOn.p99 > floor.p99 {
			verdict = "missed"
		}
		fmt.Printf("%d rec/s: tap on p99 %s against the floor's %s (target: no worse: %s); tap off p99 %s\n",
			rows[i].rate, ms(tapOn.p99), ms(floor.p99), verdict, ms(tapOff.p99))
	}
	for _, p := range []*proxy{on, off} {
		fmt.Printf("proxy tap=%s: %s\n", p.tap, p.tapped())
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
