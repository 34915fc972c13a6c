// Command reload measures hot reload through the rtproxy binary: it runs
// two routes in front of a 3-broker kfake, reloads route A a number of
// times (atomic rename of its rule file) while route B carries steady
// traffic, and prints route B's end-to-end latency without reloads and
// during them, and route A's reload-to-effect time: from the last write of
// the file to the first record carrying the new version's marker in A's
// sink.
//
//	go run ./test/bench/reload            (make bench-reload)
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/benchkit"
)

var (
	reloads  = flag.Int("reloads", 20, "reloads of route A")
	rateB    = flag.Int("rate-b", 2000, "records/s into route B")
	rateA    = flag.Int("rate-a", 500, "records/s into route A")
	baseline = flag.Duration("baseline", 10*time.Second, "how long to measure B without reloads")
	gap      = flag.Duration("gap", 300*time.Millisecond, "pause after each reload took effect")
)

func main() {
	flag.Parse()
	log.SetFlags(0)
	root := benchkit.ModuleRoot()
	tmp, err := os.MkdirTemp("", "bench-reload-")
	check(err)
	defer os.RemoveAll(tmp)

	kfakeBin := filepath.Join(tmp, "kfakebroker")
	proxyBin := filepath.Join(tmp, "rtproxy")
	for bin, pkg := range map[string]string{kfakeBin: "test/kfakebroker", proxyBin: "cmd/rtproxy"} {
		cmd := exec.Command("go", "build", "-o", bin, "./"+pkg)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			log.Fatalf("build %s: %v\n%s", pkg, err, out)
		}
	}

	addrs, stopBroker := startBroker(kfakeBin, "ra.in:3,ra.out:3,rb.in:3,rb.out:3")
	defer stopBroker()

	rulesDir := filepath.Join(tmp, "rules")
	check(os.MkdirAll(rulesDir, 0o755))
	writeRule(rulesDir, "a.yaml", ruleA(0))
	writeRule(rulesDir, "b.yaml", `route: b
source: { topic: rb.in, format: json }
sink: { topic: rb.out }
checkpoint_interval: 1s
steps:
  - filter: int(value.id) >= 0
  - set: { seen: true }
`)
	admin, stopProxy := startProxy(proxyBin, addrs, rulesDir, filepath.Join(tmp, "state"))
	defer stopProxy()
	waitRunning(admin, "a", "b")

	// Route B: steady traffic; its sink reader records each record's
	// end-to-end latency (producer send → sink read) by send time.
	var bLat latencies
	stopB := produce(addrs, "rb.in", *rateB)
	defer stopB()
	stopBRead := consume(addrs, "rb.out", func(v map[string]any, now time.Time) {
		if ns, ok := v["send_ns"].(float64); ok {
			bLat.add(time.Unix(0, int64(ns)), now.Sub(time.Unix(0, int64(ns))))
		}
	})
	defer stopBRead()

	// Route A: traffic too, so that each version's marker shows up.
	var aMu sync.Mutex
	firstSeen := map[int]time.Time{}
	stopA := produce(addrs, "ra.in", *rateA)
	defer stopA()
	stopARead := consume(addrs, "ra.out", func(v map[string]any, now time.Time) {
		ver, ok := v["ver"].(float64)
		if !ok {
			return
		}
		aMu.Lock()
		if _, seen := firstSeen[int(ver)]; !seen {
			firstSeen[int(ver)] = now
		}
		aMu.Unlock()
	})
	defer stopARead()
	waitVer := func(v int, timeout time.Duration) (time.Time, bool) {
		deadline := time.Now().Add(timeout)
		for time.Now().Before(deadline) {
			aMu.Lock()
			at, ok := firstSeen[v]
			aMu.Unlock()
			if ok {
				return at, true
			}
			time.Sleep(time.Millisecond)
		}
		return time.Time{}, false
	}
	if _, ok := waitVer(0, 30*time.Second); !ok {
		log.Fatal("route A's first version never reached its sink")
	}

	// Warm up, then measure B without reloads.
	time.Sleep(2 * time.Second)
	baseFrom := time.Now()
	time.Sleep(*baseline)
	baseTo := time.Now()

	var effects []time.Duration
	reloadFrom := time.Now()
	for v := 1; v <= *reloads; v++ {
		writeRule(rulesDir, "a.yaml", ruleA(v))
		wrote := time.Now()
		at, ok := waitVer(v, 10*time.Second)
		if !ok {
			log.Fatalf("reload %d: version %d never reached route A's sink", v, v)
		}
		effects = append(effects, at.Sub(wrote))
		time.Sleep(*gap)
	}
	reloadTo := time.Now()
	time.Sleep(2 * time.Second) // let B's records sent during the reloads arrive

	base := bLat.between(baseFrom, baseTo)
	during := bLat.between(reloadFrom, reloadTo)
	slices.Sort(effects)
	fmt.Printf("hot reload: %d reloads of route A (atomic rename, filter+set) while route B carries %d rec/s (route A %d rec/s); 3-broker kfake, rtproxy binary\n",
		*reloads, *rateB, *rateA)
	fmt.Printf("%-28s %8s %9s %9s %9s %9s\n", "route B end-to-end latency", "records", "p50", "p99", "p99.9", "max")
	fmt.Printf("%-28s %8d %9s %9s %9s %9s\n", "without reloads", len(base), q(base, 0.5), q(base, 0.99), q(base, 0.999), q(base, 1))
	fmt.Printf("%-28s %8d %9s %9s %9s %9s\n", "during reloads", len(during), q(during, 0.5), q(during, 0.99), q(during, 0.999), q(during, 1))
	fmt.Printf("reload-to-effect (last write → first record of the new version in A's sink), %d reloads: p50 %s, max %s (target < 200ms)\n",
		len(effects), q(effects, 0.5), q(effects, 1))
}

// ruleA is route A's version v: it stamps v with set.
func ruleA(v int) string {
	return fmt.Sprintf(`route: a
source: { topic: ra.in, format: json }
sink: { topic: ra.out }
checkpoint_interval: 1s
steps:
  - filter: int(value.id) %% 1000 != %d
  - set: { ver: %d }
`, v, v)
}

// writeRule writes a rule file by atomic rename, as an editor would.
func writeRule(dir, name, body string) {
	f, err := os.CreateTemp(dir, ".tmp-"+name)
	check(err)
	_, err = f.WriteString(body)
	check(err)
	check(f.Close())
	check(os.Rename(f.Name(), filepath.Join(dir, name)))
}

// latencies collects (send time, latency) samples.
type latencies struct {
	mu   sync.Mutex
	sent []time.Time
	lat  []time.Duration
}

func (l *latencies) add(sent time.Time, d time.Duration) {
	l.mu.Lock()
	l.sent = append(l.sent, sent)
	l.lat = append(l.lat, d)
	l.mu.Unlock()
}

// between returns the sorted latencies of records sent in [from, to).
func (l *latencies) between(from, to time.Time) []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []time.Duration
	for i, s := range l.sent {
		if !s.Before(from) && s.Before(to) {
			out = append(out, l.lat[i])
		}
	}
	slices.Sort(out)
	return out
}

// q is the p-quantile of sorted ds, rounded for printing.
func q(ds []time.Duration, p float64) string {
	if len(ds) == 0 {
		return "-"
	}
	i := int(p * float64(len(ds)-1))
	d := ds[i]
	if d < 10*time.Millisecond {
		return d.Round(10 * time.Microsecond).String()
	}
	return d.Round(100 * time.Microsecond).String()
}

// produce sends {"id":i,"send_ns":...} to topic at perSec until stopped.
func produce(addrs []string, topic string, perSec int) func() {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ProducerLinger(0))
	check(err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		start := time.Now()
		for i := 0; ctx.Err() == nil; i++ {
			if due := start.Add(time.Duration(i) * time.Second / time.Duration(perSec)); time.Until(due) > 0 {
				time.Sleep(time.Until(due))
			}
			v := fmt.Appendf(nil, `{"id":%d,"send_ns":%d}`, i, time.Now().UnixNano())
			cl.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte(strconv.Itoa(i)), Value: v}, func(_ *kgo.Record, err error) {
				if err != nil && ctx.Err() == nil {
					log.Printf("produce %s: %v", topic, err)
				}
			})
		}
	}()
	return func() { cancel(); <-done; cl.Close() }
}

// consume reads topic from the start and hands each decoded value, with
// the time it was read, to fn.
func consume(addrs []string, topic string, fn func(map[string]any, time.Time)) func() {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	check(err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				var v map[string]any
				if json.Unmarshal(r.Value, &v) == nil {
					fn(v, now)
				}
			})
		}
	}()
	return func() { cancel(); <-done; cl.Close() }
}

func startBroker(bin, topics string) ([]string, func()) {
	cmd := exec.Command(bin, "-brokers", "3", "-auto-create=false", "-topics", topics)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	check(err)
	check(cmd.Start())
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "ready ") {
			go io.Copy(io.Discard, out)
			return strings.Split(strings.TrimPrefix(l, "ready "), ","), func() { cmd.Process.Kill(); cmd.Wait() }
		}
	}
	log.Fatalf("kfake exited before ready")
	return nil, nil
}

// startProxy runs the rtproxy binary and returns its admin URL once
// /readyz answers 200.
func startProxy(bin string, upstream []string, rulesDir, stateDir string) (string, func()) {
	listen, admin := benchkit.FreeAddr(), benchkit.FreeAddr()
	brokerBase := benchkit.FreePortBlock(10)
	logf, err := os.Create(filepath.Join(filepath.Dir(rulesDir), "rtproxy.log"))
	check(err)
	cmd := exec.Command(bin, "run", "--listen", listen, "--admin-listen", admin,
		"--broker-ports", strconv.Itoa(brokerBase), "--upstream", strings.Join(upstream, ","),
		"--rules-dir", rulesDir, "--state-dir", stateDir, "--log-level", "warn")
	cmd.Env = append(os.Environ(), "RTPROXY_BROKER_PORT_COUNT=10")
	cmd.Stdout, cmd.Stderr = logf, logf
	check(cmd.Start())
	stop := func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
		logf.Close()
	}
	url := "http://" + admin
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url, stop
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	b, _ := os.ReadFile(logf.Name())
	log.Fatalf("rtproxy not ready after 30s:\n%s", b)
	return "", nil
}

// waitRunning waits until /routes shows every named route running.
func waitRunning(admin string, names ...string) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var rs []struct{ Name, State string }
		if resp, err := http.Get(admin + "/routes"); err == nil {
			json.NewDecoder(resp.Body).Decode(&rs)
			resp.Body.Close()
		}
		running := 0
		for _, r := range rs {
			if slices.Contains(names, r.Name) && r.State == "running" {
				running++
			}
		}
		if running == len(names) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	log.Fatalf("routes %v not running after 30s", names)
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
