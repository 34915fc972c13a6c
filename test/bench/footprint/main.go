// Command footprint measures what an idle rtproxy sidecar costs: resident
// memory, CPU at rest and threads, for pass-through (no rules), the
// quickstart's three JSON routes with their sources idle, and the same with
// extra idle routes (the cost of one more route). It runs each scenario on
// the working tree's binary and, with -base REV, on the binary of an older
// commit, alternated in one sitting, against one external kfake.
//
//	make bench-footprint                          # the working tree only
//	make bench-footprint ARGS='-base HEAD~10'     # before and after
//
// Each run settles for -settle (20 s), then samples for -sample (30 s): CPU
// is the process's user+system time over the sample (millicores, in clock
// ticks of 10 ms: 0.33 millicores over 30 s), and again by the scheduler's
// count of its threads (/proc/PID/task/*/schedstat: exact, with the
// timeslices run per second, its wake-ups), RSS the median of one reading
// per second (VmRSS), threads the last reading. The
// broker's KIP-848 heartbeat interval is Kafka's default, 5s (-heartbeat).
//
// -scenarios exactly-once (not in the default set) runs three exactly-once
// routes that read 300 records and then rest: an exactly-once route's
// checkpoint skip at rest (docs/ARCHITECTURE.md, invariants 80 and 90).
package main

import (
	"bufio"
	"context"
	"encoding/json"
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
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/benchkit"
)

var (
	base   = flag.String("base", "", "also measure the rtproxy of this git revision (built from `git archive`)")
	settle = flag.Duration("settle", 20*time.Second, "wait after ready before sampling")
	sample = flag.Duration("sample", 30*time.Second, "sampling period")
	rounds = flag.Int("rounds", 1, "runs of each (binary, scenario), alternated")
	extra  = flag.Int("extra-routes", 5, "idle routes added in the third scenario")
	// kfakebroker's 500ms (fast failover in tests) would be most of an idle
	// route's wake-ups; a KIP-848 broker tells members its interval, and
	// Kafka's default (group.consumer.heartbeat.interval.ms) is 5s.
	heartbeat = flag.Duration("heartbeat", 5*time.Second, "the broker's KIP-848 group heartbeat interval")
	scenSel   = flag.String("scenarios", "passthrough,quickstart,quickstart+extra", "scenarios to run (also: exactly-once)")
)

type scenario struct {
	name   string
	routes int // JSON routes besides the quickstart's (0 with quickstart false)
	qs     bool
	// eo: three exactly-once routes (a filter, a window, a drop_duplicates)
	// that read a few records each, then rest.
	eo bool
}

type result struct {
	rssMiB  float64
	milli   float64 // utime+stime, in clock ticks
	threads int
	// schedMilli is the CPU by the scheduler's count (schedCPU), exact;
	// slices the timeslices run per second (the process's wake-ups).
	schedMilli, slices float64
}

func main() {
	log.SetFlags(log.Ltime)
	flag.Parse()
	root := benchkit.ModuleRoot()
	work, err := os.MkdirTemp("", "rtproxy-footprint-")
	check(err)
	defer os.RemoveAll(work)

	kfakeBin := filepath.Join(work, "kfakebroker")
	build(root, kfakeBin, "./test/kfakebroker")
	bins := []struct{ name, path string }{{"after", filepath.Join(work, "rtproxy-after")}}
	build(root, bins[0].path, "./cmd/rtproxy")
	if *base != "" {
		src := filepath.Join(work, "base-src")
		check(os.MkdirAll(src, 0o755))
		sh(root, fmt.Sprintf("git archive %s | tar -x -C %s", *base, src))
		p := filepath.Join(work, "rtproxy-before")
		build(src, p, "./cmd/rtproxy")
		bins = append([]struct{ name, path string }{{"before " + *base, p}}, bins...)
	}

	var scens []scenario
	for _, s := range strings.Split(*scenSel, ",") {
		switch s {
		case "passthrough":
			scens = append(scens, scenario{name: "pass-through, no rules"})
		case "quickstart":
			scens = append(scens, scenario{name: "quickstart's 3 JSON routes, idle", qs: true})
		case "quickstart+extra":
			scens = append(scens, scenario{name: fmt.Sprintf("quickstart + %d idle routes", *extra), qs: true, routes: *extra})
		case "exactly-once":
			scens = append(scens, scenario{name: "3 exactly-once routes, at rest", eo: true})
		default:
			log.Fatalf("unknown scenario %q", s)
		}
	}

	res := map[string][]result{}
	for r := 0; r < *rounds; r++ {
		for _, sc := range scens {
			for _, b := range bins {
				x := measure(root, work, kfakeBin, b.path, sc)
				log.Printf("%s / %s: RSS %.1f MiB, %.2f millicores (%.2f by schedstat, %.1f wake-ups/s), %d threads", b.name, sc.name, x.rssMiB, x.milli, x.schedMilli, x.slices, x.threads)
				res[b.name+"\x00"+sc.name] = append(res[b.name+"\x00"+sc.name], x)
			}
		}
	}

	fmt.Printf("\n| binary | scenario | RSS (MiB) | idle CPU (millicores) | threads | idle CPU, schedstat (millicores, rounds) | wake-ups/s |\n|---|---|---|---|---|---|---|\n")
	for _, sc := range scens {
		for _, b := range bins {
			rs := res[b.name+"\x00"+sc.name]
			var rss, cpu, th, sch, sl []float64
			var each []string
			for _, x := range rs {
				rss = append(rss, x.rssMiB)
				cpu = append(cpu, x.milli)
				th = append(th, float64(x.threads))
				sch = append(sch, x.schedMilli)
				sl = append(sl, x.slices)
				each = append(each, fmt.Sprintf("%.2f", x.schedMilli))
			}
			fmt.Printf("| %s | %s | %.1f | %.2f | %.0f | %.2f (%s) | %.1f |\n", b.name, sc.name, benchkit.Median(rss), benchkit.Median(cpu), benchkit.Median(th),
				benchkit.Median(sch), strings.Join(each, ", "), benchkit.Median(sl))
		}
	}
	if len(scens) == 3 && !scens[2].eo {
		for _, b := range bins {
			q := benchkit.Median(col(res[b.name+"\x00"+scens[1].name]))
			e := benchkit.Median(col(res[b.name+"\x00"+scens[2].name]))
			fmt.Printf("\n%s: each further idle route %.2f MiB\n", b.name, (e-q)/float64(*extra))
		}
	}
}

func col(rs []result) []float64 {
	var v []float64
	for _, x := range rs {
		v = append(v, x.rssMiB)
	}
	return v
}

// measure runs one (binary, scenario) on a fresh kfake and state directory.
func measure(root, work, kfakeBin, bin string, sc scenario) result {
	dir, err := os.MkdirTemp(work, "run-")
	check(err)
	defer os.RemoveAll(dir)
	topics := []string{"access-log:3", "clicks:3", "payments:3"}
	for i := 0; i < sc.routes; i++ {
		topics = append(topics, fmt.Sprintf("idle%d:3", i))
	}
	if sc.eo {
		topics = append(topics, "eo:3")
	}
	broker, ready := benchkit.StartProc(kfakeBin, "-brokers", "1", "-topics", strings.Join(topics, ","), "-auto-create=true", "-group-heartbeat", heartbeat.String())
	defer benchkit.StopProc(broker)
	addrs := strings.Split(ready, ",")

	rules := filepath.Join(dir, "rules")
	check(os.MkdirAll(rules, 0o755))
	if sc.qs {
		for _, f := range []string{"access-log-errors.yaml", "clicks-per-minute.yaml", "payments-risk.yaml", "merchants.jsonl"} {
			b, err := os.ReadFile(filepath.Join(root, "examples/quickstart/rules", f))
			check(err)
			check(os.WriteFile(filepath.Join(rules, f), b, 0o644))
		}
	}
	for i := 0; i < sc.routes; i++ {
		y := fmt.Sprintf("route: idle%d\nsource: { topic: idle%d }\nsink: { topic: idle%d.out }\nsteps:\n  - filter: value.n > 0\n", i, i, i)
		check(os.WriteFile(filepath.Join(rules, fmt.Sprintf("idle%d.yaml", i)), []byte(y), 0o644))
	}
	if sc.eo {
		writeEORoutes(rules)
	}
	admin := benchkit.FreeAddr()
	cfg := fmt.Sprintf("listen: %s\nbroker_ports: %d\nupstream: [%s]\nrules_dir: %s\nstate_dir: %s\nadmin_listen: %s\nlog_level: warn\n",
		benchkit.FreeAddr(), benchkit.FreePortBlock(100), strings.Join(addrs, ", "), rules, filepath.Join(dir, "state"), admin)
	cfgFile := filepath.Join(dir, "rtproxy.yaml")
	check(os.WriteFile(cfgFile, []byte(cfg), 0o644))

	cmd := exec.Command(bin, "run", "--config", cfgFile)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	check(cmd.Start())
	defer benchkit.StopProc(cmd)
	deadline := time.Now().Add(60 * time.Second)
	for {
		r, err := http.Get("http://" + admin + "/readyz")
		if err == nil {
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
			if r.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			log.Fatalf("rtproxy not ready after 60s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if sc.eo {
		feedEO(addrs, admin)
	}
	time.Sleep(*settle)
	pid := cmd.Process.Pid
	c0, t0 := benchkit.ProcCPU(pid), time.Now()
	ns0, sl0 := schedCPU(pid)
	var rss []float64
	for time.Since(t0) < *sample {
		rss = append(rss, float64(status(pid, "VmRSS:"))/1024)
		time.Sleep(time.Second)
	}
	c1, t1 := benchkit.ProcCPU(pid), time.Now()
	ns1, sl1 := schedCPU(pid)
	return result{
		rssMiB:     benchkit.Median(rss),
		milli:      float64(c1-c0) / float64(t1.Sub(t0)) * 1000,
		threads:    status(pid, "Threads:"),
		schedMilli: float64(ns1-ns0) / float64(t1.Sub(t0)) * 1000,
		slices:     float64(sl1-sl0) / t1.Sub(t0).Seconds(),
	}
}

// schedCPU sums /proc/PID/task/*/schedstat over the process's threads:
// nanoseconds on a CPU and timeslices run (each one a thread woken and
// scheduled). The time is exact to the nanosecond, where utime+stime
// (ProcCPU) moves in clock ticks of 10 ms, 0.33 millicores over 30 s:
// too coarse for a process that idles near 1 millicore. A thread that
// exits during the sample takes its counts with it (none do at rest).
func schedCPU(pid int) (ns, slices int64) {
	dirs, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	check(err)
	for _, d := range dirs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, d.Name()))
		if err != nil {
			continue // the thread exited
		}
		f := strings.Fields(string(b))
		if len(f) < 3 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		s, _ := strconv.ParseInt(f[2], 10, 64)
		ns, slices = ns+n, slices+s
	}
	return ns, slices
}

// status reads one numeric field of /proc/PID/status (kB for memory).
func status(pid int, field string) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	check(err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field); ok {
			n, _ := strconv.Atoi(strings.Fields(v)[0])
			return n
		}
	}
	return 0
}

func build(dir, out, pkg string) {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		log.Fatalf("build %s in %s: %v\n%s", pkg, dir, err, b)
	}
}

func sh(dir, script string) {
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		log.Fatalf("%s: %v\n%s", script, err, b)
	}
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// writeEORoutes writes the exactly-once scenario's routes: a filter, a
// tumbling window and a drop_duplicates on one source, each committing a
// transaction per checkpoint_interval (100ms) while records move.
func writeEORoutes(dir string) {
	common := "source: { topic: eo, format: json, event_time: value.ts, watermark: 0s, idle_timeout: 1m }\n"
	for name, steps := range map[string]string{
		"eo-filter": "  - filter: int(value.n) % 5 != 0\n",
		"eo-window": "  - window: { kind: tumbling, size: 1s, key: value.user, aggregate: { n: count() } }\n",
		"eo-dedup":  "  - drop_duplicates: { key: value.n, ttl: 1h }\n",
	} {
		y := fmt.Sprintf("route: %s\n%ssink: { topic: %s.out, delivery: exactly_once }\ndead_letter: %s.dlq\nsteps:\n%s",
			name, common, name, name, steps)
		check(os.WriteFile(filepath.Join(dir, name+".yaml"), []byte(y), 0o644))
	}
}

// feedEO writes a few records to the exactly-once routes' source once
// they run, and waits until each route has checkpointed them: what rests
// after is a route that has worked (tasks, state, a committed cut).
func feedEO(addrs []string, admin string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ProducerLinger(0))
	check(err)
	defer cl.Close()
	var rs []*kgo.Record
	for i := range 300 {
		v := fmt.Sprintf(`{"n":%d,"user":"u%d","ts":%d}`, i, i%7, 1_000_000+i*10)
		rs = append(rs, &kgo.Record{Topic: "eo", Key: []byte(strconv.Itoa(i)), Value: []byte(v)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	check(cl.ProduceSync(ctx, rs...).FirstErr())
	// Every route has read its source to the end (lag 0 on /routes).
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if eoCaughtUp(admin) {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	log.Printf("the exactly-once routes did not catch up within 60s; measuring anyway")
}

// eoCaughtUp reports whether /routes shows every route running with no
// source lag.
func eoCaughtUp(admin string) bool {
	r, err := http.Get("http://" + admin + "/routes")
	if err != nil {
		return false
	}
	defer r.Body.Close()
	var routes []struct {
		State      string `json:"state"`
		Partitions []struct {
			Lag int64 `json:"lag"`
		} `json:"partitions"`
	}
	if json.NewDecoder(r.Body).Decode(&routes) != nil || len(routes) != 3 {
		return false
	}
	for _, rt := range routes {
		if rt.State != "running" || len(rt.Partitions) == 0 {
			return false
		}
		for _, p := range rt.Partitions {
			if p.Lag != 0 {
				return false
			}
		}
	}
	return true
}
