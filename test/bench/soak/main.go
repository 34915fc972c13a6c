// Command soak is `make soak`: a chaos soak of rtproxy (issue 10). It runs
// test/kfakebroker (3 brokers, a data directory kept across restarts) and
// the rtproxy binary as separate processes, with two routes:
//
//   - route A (soak-a), stateless: filter + set, soak.a → soak.a.out (the
//     route creates its sink);
//   - route B (soak-b), stateful: drop_duplicates by value.id (ttl 10m),
//     soak.b → soak.b.out. Ids are unique, so every record passes once, and
//     a replay after a crash is dropped.
//
// A franz-go producer writes -rate records/s of ~300-byte JSON (unique id,
// sequence number; key = id) through the proxy, split between soak.a and
// soak.b, for -duration; it keeps every id it got an acknowledgement for.
// Consumers read soak.a.out, soak.b.out and the dead-letter topics directly
// from kfake (not through the proxy, so that what is counted does not depend
// on the component under test) from their start.
//
// Meanwhile a chaos loop restarts kfake (-kfake-every), deletes route A's
// sink (-delete-every), fills the state directory (a tmpfs of its own) until
// ENOSPC and frees it, restarting rtproxy when its state store failed
// (-fill-every), rewrites both rule files (-rules-every), opens bursts of
// idle connections to the proxy (-conns-every), runs a hostile client
// (-hostile-every: compressed record bombs to a guarded topic, slow
// announced produces, malformed frames; hostile.go), and samples
// rtproxy's RSS every second.
//
// At the end it waits for the sinks to be quiet and prints, per route, the
// acknowledged ids, the ids seen in the sink, the missing ones, the ones
// destroyed with a deleted sink (route A), the repeats, and the RSS against
// -rss-bound; it exits 1 when an id is missing or RSS passed the bound.
//
//	go run ./test/bench/soak [-duration 10m] [-rate 5000]
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

var (
	duration     = flag.Duration("duration", 10*time.Minute, "how long the producer and the chaos run")
	rate         = flag.Int("rate", 5000, "records per second, in total, split between the two routes")
	size         = flag.Int("size", 300, "bytes per record")
	partitions   = flag.Int("partitions", 8, "partitions of the source topics")
	kfakeEvery   = flag.Duration("kfake-every", 2*time.Minute, "restart kfake this often (0: never)")
	kfakeDown    = flag.Duration("kfake-down", time.Second, "how long kfake stays down at a restart")
	deleteEvery  = flag.Duration("delete-every", 3*time.Minute, "delete route A's sink this often, first at half of it (0: never)")
	fillEvery    = flag.Duration("fill-every", 4*time.Minute, "fill the state dir this often, first at 3/4 of it (0: never)")
	fillHold     = flag.Duration("fill-hold", 5*time.Second, "how long the state dir stays full")
	rulesEvery   = flag.Duration("rules-every", 10*time.Second, "rewrite the rule files this often (0: never)")
	connsEvery   = flag.Duration("conns-every", 30*time.Second, "open a burst of idle connections this often, first at half of it (0: never)")
	connCount    = flag.Int("conns", 500, "connections per burst")
	connHold     = flag.Duration("conn-hold", 2*time.Second, "how long a burst's connections stay open")
	rssBound     = flag.Int("rss-bound", 512, "MiB of rtproxy RSS the soak allows")
	hostileEvery = flag.Duration("hostile-every", 20*time.Second, "run a round of the hostile client this often, first at half of it (0: never; hostile.go)")
	hostileHold  = flag.Duration("hostile-hold", 3*time.Second, "how long the hostile client's slow announces stay open")
	bandBefore   = flag.Duration("band-before", 5*time.Second, "a deleted sink destroyed outputs of source offsets above what the consumer had read this long before the delete")
	recreateWait = flag.Duration("recreate-wait", 30*time.Second, "how long the route gets to recreate its deleted sink before the soak does")
	quiet        = flag.Duration("quiet", 15*time.Second, "at the end, wait until the sinks are quiet this long (or every acknowledged id is accounted for)")
	drainMax     = flag.Duration("drain-max", 5*time.Minute, "at most this long for the end's wait")
	tmpfsSize    = flag.String("tmpfs-size", "256m", "size of the state dir's tmpfs")
	noTmpfs      = flag.Bool("no-tmpfs", false, "use a plain state dir (and skip the fill action)")
	proxySrc     = flag.String("rtproxy-src", "", "build rtproxy from this module tree instead of the working tree")
	logLevel     = flag.String("log-level", "info", "rtproxy --log-level")
	keep         = flag.Bool("keep", false, "keep the temporary directory (logs, data) even when the soak passes")
	verbose      = flag.Bool("v", false, "log every rule rewrite and connection burst")
)

var t0 = time.Now()

func since() time.Duration { return time.Since(t0) }

// findings counts the log lines that report something wrong with rtproxy
// (they start with FINDING); the temporary directory is kept when any was
// logged.
var findings atomic.Int64

func logf(format string, args ...any) {
	if strings.HasPrefix(format, "FINDING") {
		findings.Add(1)
	}
	d := since()
	log.Printf("%s +%02d:%04.1f %s", time.Now().UTC().Format("15:04:05"), int(d.Minutes()), d.Seconds()-60*float64(int(d.Minutes())), fmt.Sprintf(format, args...))
}

var (
	cleanupOnce sync.Once
	cleanupFn   = func() {}
)

func cleanup() { cleanupOnce.Do(func() { cleanupFn() }) }

func fatalf(format string, args ...any) {
	logf("FATAL: "+format, args...)
	cleanup()
	os.Exit(2)
}

// soak is one run.
type soak struct {
	tmp, rulesDir, stateDir string
	tmpfs                   bool
	tmpfsNote               string
	kf, px                  *proc
	kfAddrs                 []string
	bootstrap               string
	adm                     admin
	books                   []*book // A, B

	opMu sync.Mutex // one heavy chaos action (or a supervisor restart) at a time

	mu          sync.Mutex
	aCons       *consumer
	deletions   []deletion
	ruleVersion int
	counts      map[string]int64
	timeline    []mark
	brokenSince time.Time // the supervisor saw the state store failed
	countOrder  []string
	maxRSS      int64
	maxRSSAt    time.Duration
	lastRSS     int64
	maxKfakeRSS int64
	maxStateUse int64
	filling     atomic.Bool // a fill is under way: the state dir's use is not sampled
}

func (s *soak) add(name string, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.counts[name]; !ok {
		s.countOrder = append(s.countOrder, name)
	}
	s.counts[name] += n
}

func (s *soak) count(name string) { s.add(name, 1) }

// mark is one entry of the chaos timeline printed at the end.
type mark struct {
	at   time.Duration
	what string
}

func (s *soak) mark(at time.Duration, what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timeline = append(s.timeline, mark{at, what})
}

func (s *soak) get(name string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[name]
}

func main() {
	flag.Parse()
	log.SetFlags(0)
	log.SetOutput(os.Stdout)
	root := moduleRoot()
	s := &soak{counts: map[string]int64{}}
	var err error
	s.tmp, err = os.MkdirTemp("", "soak-")
	if err != nil {
		log.Fatal(err)
	}
	s.rulesDir = filepath.Join(s.tmp, "rules")
	s.stateDir = filepath.Join(s.tmp, "state")
	for _, d := range []string{s.rulesDir, s.stateDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			log.Fatal(err)
		}
	}
	cleanupFn = func() {
		if s.px != nil {
			s.px.stop(20 * time.Second)
		}
		if s.kf != nil {
			s.kf.stop(20 * time.Second)
		}
		if s.tmpfs {
			if err := syscall.Unmount(s.stateDir, 0); err != nil {
				logf("unmount %s: %v; detaching", s.stateDir, err)
				syscall.Unmount(s.stateDir, syscall.MNT_DETACH)
			}
		}
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		logf("%v: stopping everything (logs in %s)", sig, s.tmp)
		cleanup()
		os.Exit(130)
	}()

	// Binaries.
	kfakeBin, proxyBin := filepath.Join(s.tmp, "kfakebroker"), filepath.Join(s.tmp, "rtproxy")
	src := root
	if *proxySrc != "" {
		src = *proxySrc
	}
	if err := build(root, kfakeBin, "test/kfakebroker"); err != nil {
		fatalf("%v", err)
	}
	if err := build(src, proxyBin, "cmd/rtproxy"); err != nil {
		fatalf("%v", err)
	}
	rev, _ := exec.Command("git", "-C", src, "describe", "--always", "--dirty").Output()
	t0 = time.Now() // the clock of the log starts after the builds

	// The state dir: a small tmpfs of its own, so that it can be filled.
	if *noTmpfs {
		s.tmpfsNote = "-no-tmpfs"
	} else if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+*tmpfsSize, "tmpfs", s.stateDir).CombinedOutput(); err != nil {
		s.tmpfsNote = fmt.Sprintf("mount failed: %v %s", err, strings.TrimSpace(string(out)))
		logf("NOTE: could not mount a tmpfs on the state dir (%s); the fill action is skipped", s.tmpfsNote)
	} else {
		s.tmpfs = true
	}

	// Fixed ports, so that a restarted process comes back on the same
	// addresses.
	used := map[int]bool{}
	var kports []string
	for i := 0; i < 3; i++ {
		kports = append(kports, strconv.Itoa(freePort(used)))
	}
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(used))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", freePort(used))
	brokerBase := freeBlock(used, 10)
	s.bootstrap = listen
	s.adm = admin("http://" + adminAddr)

	s.kf = &proc{name: "kfake", bin: kfakeBin, logPath: filepath.Join(s.tmp, "kfake.log"),
		args: []string{"-brokers", "3", "-ports", strings.Join(kports, ","), "-data-dir", filepath.Join(s.tmp, "kfake-data"),
			"-topics", fmt.Sprintf("soak.a:%d,soak.b:%d,%s:1", *partitions, *partitions, hostileTopic), "-default-partitions", strconv.Itoa(*partitions),
			"-auto-create=false"}}
	line, err := s.kf.start("ready ", time.Minute)
	if err != nil {
		fatalf("kfake: %v", err)
	}
	s.kfAddrs = strings.Split(line, ",")

	if err := writeRule(s.rulesDir, "soak-a.yaml", ruleA(0)); err != nil {
		fatalf("%v", err)
	}
	if err := writeRule(s.rulesDir, "soak-b.yaml", ruleB(0)); err != nil {
		fatalf("%v", err)
	}
	if *hostileEvery > 0 {
		// The hostile client's guard: loaded, it has the proxy read every
		// Produce request whole (hostile.go).
		if err := writeRule(s.rulesDir, "soak-hostile.yaml", hostileGuard); err != nil {
			fatalf("%v", err)
		}
		buildBombs()
	}
	s.px = &proc{name: "rtproxy", bin: proxyBin, logPath: filepath.Join(s.tmp, "rtproxy.log"),
		args: []string{"run", "--listen", listen, "--admin-listen", adminAddr, "--broker-ports", strconv.Itoa(brokerBase),
			"--upstream", strings.Join(s.kfAddrs, ","), "--rules-dir", s.rulesDir, "--state-dir", s.stateDir, "--log-level", *logLevel},
		env: []string{"RTPROXY_BROKER_PORT_COUNT=10"}}

	load, _ := os.ReadFile("/proc/loadavg")
	header := fmt.Sprintf("rtproxy soak — %s, %s, rtproxy %s, %d CPUs, %v at %d rec/s of %d B (two routes), %d partitions, state dir %s; load average at start %s",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), runtime.Version(), strings.TrimSpace(string(rev)), runtime.NumCPU(),
		*duration, *rate, *size, *partitions, map[bool]string{true: "tmpfs " + *tmpfsSize, false: "plain"}[s.tmpfs],
		strings.Join(strings.Fields(string(load))[:3], " "))
	logf("%s", header)
	logf("kfake %v (data %s), rtproxy bootstrap %s, admin %s, logs in %s", s.kfAddrs, filepath.Join(s.tmp, "kfake-data"), listen, adminAddr, s.tmp)
	s.startProxy()

	capacity := int(float64(*rate)*duration.Seconds()/2*1.1) + 1024
	s.books = []*book{newBook("a", "soak-a", *partitions, capacity), newBook("b", "soak-b", *partitions, capacity)}
	a, b := s.books[0], s.books[1]
	s.aCons = startConsumer(s.kfAddrs, []string{a.sink}, a.output)
	bCons := startConsumer(s.kfAddrs, []string{b.sink}, b.output)
	dlqCons := startConsumer(s.kfAddrs, []string{a.dlq, b.dlq}, func(r *kgo.Record) {
		if r.Topic == a.dlq {
			a.deadLetter(r)
		} else {
			b.deadLetter(r)
		}
	})

	// Samplers and the supervisor run until the very end.
	bgCtx, bgStop := context.WithCancel(context.Background())
	var bgWG sync.WaitGroup
	bgWG.Add(1)
	go func() { defer bgWG.Done(); s.sample(bgCtx) }()

	prodCtx, prodStop := context.WithCancel(context.Background())
	prod, err := startProducer(prodCtx, s.bootstrap, *rate, *size, s.books)
	if err != nil {
		fatalf("producer: %v", err)
	}
	chaosCtx, chaosStop := context.WithCancel(context.Background())
	var chaosWG sync.WaitGroup
	s.startChaos(chaosCtx, &chaosWG)
	logf("producing %d rec/s through the proxy for %v, with chaos", *rate, *duration)

	time.Sleep(*duration)
	logf("duration over: stopping the chaos and the producer")
	chaosStop()
	prodStop()
	chaosWG.Wait()
	prod.finish(2 * time.Minute)
	for _, bk := range s.books {
		bk.mu.Lock()
		logf("producer done: %s: %d acknowledged, %d failed (not counted)", bk.route, bk.acked, bk.failed)
		bk.mu.Unlock()
	}
	logf("producer: %d records sent in all; pacing fell behind by at most %d records", prod.sent.Load(), prod.behindMx.Load())

	// Wait for the sinks: every acknowledged id accounted for, or quiet.
	t := time.Now()
	for {
		time.Sleep(time.Second)
		ra, rb := s.classify(a), s.classify(b)
		a.mu.Lock()
		la := a.lastOut
		a.mu.Unlock()
		b.mu.Lock()
		lb := b.lastOut
		b.mu.Unlock()
		last := la
		if lb.After(last) {
			last = lb
		}
		if ra.missing == 0 && rb.missing == 0 {
			logf("every acknowledged id is accounted for, %v after the producer stopped", time.Since(t).Round(time.Second))
			break
		}
		if time.Since(last) > *quiet {
			logf("sinks quiet for %v: route A %d unaccounted for, route B %d", *quiet, ra.missing, rb.missing)
			break
		}
		if time.Since(t) > *drainMax {
			logf("still not quiet after %v; reporting", *drainMax)
			break
		}
	}
	finalRoutes, _ := s.adm.routes()
	finalMetrics, _ := s.adm.metrics()
	bgStop()
	bgWG.Wait()
	s.mu.Lock()
	aCons := s.aCons
	s.mu.Unlock()
	aCons.stop(nil)
	bCons.stop(nil)
	dlqCons.stop(nil)
	how, took := s.px.stop(time.Minute)
	logf("rtproxy stopped at the end: %s in %v", how, took.Round(time.Millisecond))
	s.kf.stop(time.Minute)
	cleanup()

	ok := s.report(header, finalRoutes, finalMetrics, how)
	if !ok || *keep || findings.Load() > 0 {
		logf("logs and data kept in %s", s.tmp)
	} else {
		os.RemoveAll(s.tmp)
	}
	if !ok {
		os.Exit(1)
	}
}

// sample runs every second until ctx ends: rtproxy's RSS, the history of
// route A's read offsets, the supervisor (a process that exited on its own
// is logged and started again), and a status line every 30 s.
func (s *soak) sample(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		n++
		if r := rssBytes(s.px.pid()); r > 0 {
			s.mu.Lock()
			s.lastRSS = r
			if r > s.maxRSS {
				s.maxRSS, s.maxRSSAt = r, since()
			}
			s.mu.Unlock()
		}
		if r := rssBytes(s.kf.pid()); r > 0 {
			s.mu.Lock()
			s.maxKfakeRSS = max(s.maxKfakeRSS, r)
			s.mu.Unlock()
		}
		if used, _ := dirUsage(s.stateDir); used > 0 && s.tmpfs && !s.filling.Load() {
			s.mu.Lock()
			s.maxStateUse = max(s.maxStateUse, used)
			s.mu.Unlock()
		}
		s.books[0].snapshot()
		s.supervise(n)
		if n%30 == 0 {
			s.status()
		}
	}
}

// supervise restarts a process that exited without being asked to, as the
// kubelet would, and logs it.
func (s *soak) supervise(n int) {
	if !s.opMu.TryLock() {
		return // a chaos action is stopping or starting something
	}
	defer s.opMu.Unlock()
	if s.kf.died() {
		s.mark(since(), "kfake exited on its own: "+s.kf.exitText())
		logf("FINDING: kfake exited on its own (%s):\n%s", s.kf.exitText(), tail(s.kf.logPath, 20))
		s.count("kfake unexpected exits")
		if _, err := s.kf.start("ready ", 5*time.Minute); err != nil {
			fatalf("kfake restart: %v", err)
		}
	}
	if s.px.died() {
		s.mark(since(), "rtproxy exited on its own: "+s.px.exitText())
		logf("FINDING: rtproxy exited on its own (%s):\n%s", s.px.exitText(), tail(s.px.logPath, 40))
		s.count("rtproxy unexpected exits")
		time.Sleep(time.Second)
		s.startProxy()
		s.count("rtproxy restarts (after an unexpected exit)")
		return
	}
	// A state store that failed outside a fill (or whose failure the fill
	// did not see): restart rtproxy, as an operator alerting on the metric
	// or on /routes would, once it has lasted 10 s.
	if n%5 != 0 {
		return
	}
	broken := ""
	if m, err := s.adm.metrics(); err == nil && m["rtproxy_state_store_failed"] == 1 {
		broken = "rtproxy_state_store_failed 1"
	}
	if rs, err := s.adm.routes(); err == nil {
		for _, r := range rs {
			if r.State == "error" && strings.Contains(r.LastError, "state store failed") {
				broken += fmt.Sprintf(" route %s in error: %q", r.Name, r.LastError)
			}
		}
	}
	if broken == "" {
		s.brokenSince = time.Time{}
		return
	}
	if s.brokenSince.IsZero() {
		s.brokenSince = time.Now()
		return
	}
	if time.Since(s.brokenSince) >= 10*time.Second {
		logf("FINDING: the state store is broken outside a fill (%s); restarting rtproxy", strings.TrimSpace(broken))
		s.mark(since(), "supervisor: the state store is broken ("+strings.TrimSpace(broken)+"); restart rtproxy")
		s.brokenSince = time.Time{}
		s.restartProxy("store broken, seen by the supervisor")
	}
}

func (s *soak) status() {
	var parts []string
	for _, b := range s.books {
		b.mu.Lock()
		parts = append(parts, fmt.Sprintf("%s: acked %d seen %d", b.route, b.acked, b.distinct))
		b.mu.Unlock()
	}
	rs, _ := s.adm.routes()
	var states []string
	for _, r := range rs {
		lag := int64(0)
		for _, p := range r.Partitions {
			lag += p.Lag
		}
		st := fmt.Sprintf("%s %s lag %d", r.Name, r.State, lag)
		if r.LastError != "" {
			st += fmt.Sprintf(" (last_error %.120q)", r.LastError)
		}
		states = append(states, st)
	}
	s.mu.Lock()
	rss, maxRSS := s.lastRSS, s.maxRSS
	s.mu.Unlock()
	used, _ := dirUsage(s.stateDir)
	logf("status: %s; rtproxy RSS %d MiB (max %d); state dir %d MiB; routes: %s",
		strings.Join(parts, ", "), rss>>20, maxRSS>>20, used>>20, strings.Join(states, "; "))
}

// restartSinkConsumer replaces route A's sink consumer after a delete: the
// old one hands over what it had fetched, the new one reads the recreated
// topic from its start.
func (s *soak) restartSinkConsumer() {
	a := s.books[0]
	s.mu.Lock()
	old := s.aCons
	s.mu.Unlock()
	old.stop(a.output)
	c := startConsumer(s.kfAddrs, []string{a.sink}, a.output)
	s.mu.Lock()
	s.aCons = c
	s.mu.Unlock()
}
