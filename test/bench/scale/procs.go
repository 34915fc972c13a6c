package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// childAttr makes every child (kfake, rtproxy, perf) die with this process,
// so an interrupted benchmark leaves nothing holding ports.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// build compiles pkg (relative to the module root) into bin. rtproxy is built
// with its symbols, so that perf can name its functions.
func build(root, bin, pkg string) {
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./"+pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		log.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
}

// startBroker runs test/kfakebroker (3 brokers) as its own process and
// returns its addresses once it prints "ready".
func startBroker(bin string, partitions int, autoCreate bool) ([]string, *exec.Cmd) {
	cmd := exec.Command(bin, "-brokers", "3", "-auto-create="+strconv.FormatBool(autoCreate),
		"-default-partitions", strconv.Itoa(partitions))
	cmd.SysProcAttr = childAttr()
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	check(err)
	check(cmd.Start())
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "ready ") {
			go io.Copy(io.Discard, out)
			return strings.Split(strings.TrimPrefix(l, "ready "), ","), cmd
		}
	}
	log.Fatalf("kfake exited before ready")
	return nil, nil
}

// ports hands out listen addresses that no instance of this run holds.
type ports struct {
	mu   sync.Mutex
	used map[int]bool
	next int
}

func (p *ports) free() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		check(err)
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !p.used[port] {
			p.used[port] = true
			return "127.0.0.1:" + strconv.Itoa(port)
		}
	}
}

// block returns the first of n consecutive free ports below the ephemeral
// range (rtproxy's per-broker listeners).
func (p *ports) block(n int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.next == 0 {
		p.next = 21000 + os.Getpid()%5000
	}
	for base := p.next; base < 32000; base += n {
		ok := true
		for q := base; q < base+n && ok; q++ {
			if p.used[q] {
				ok = false
				break
			}
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(q))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok {
			for q := base; q < base+n; q++ {
				p.used[q] = true
			}
			p.next = base + n
			return base
		}
	}
	log.Fatal("no free port block")
	return 0
}

// instance is one `rtproxy run` process.
type instance struct {
	name     string
	cmd      *exec.Cmd
	admin    string // http://host:port
	stateDir string
	logPath  string
	logf     *os.File
	started  time.Time
	exited   chan struct{}
	waitErr  error
}

// startInstance starts rtproxy with its own ports and state dir in front of
// upstream; it does not wait for readiness.
func (e *env) startInstance(name, rulesDir, stateDir string) *instance {
	return e.startInstanceLog(name, rulesDir, stateDir, *logLevel)
}

func (e *env) startInstanceLog(name, rulesDir, stateDir, level string) *instance {
	check(os.MkdirAll(stateDir, 0o755))
	listen, admin := e.ports.free(), e.ports.free()
	brokerBase := e.ports.block(10)
	logPath := filepath.Join(e.tmp, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	check(err)
	cmd := exec.Command(e.proxyBin, "run", "--listen", listen, "--admin-listen", admin,
		"--broker-ports", strconv.Itoa(brokerBase), "--upstream", strings.Join(e.addrs, ","),
		"--rules-dir", rulesDir, "--state-dir", stateDir, "--log-level", level)
	cmd.Env = append(os.Environ(), "RTPROXY_BROKER_PORT_COUNT=10")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childAttr()
	in := &instance{name: name, cmd: cmd, admin: "http://" + admin, stateDir: stateDir,
		logPath: logPath, logf: logf, exited: make(chan struct{})}
	in.started = time.Now()
	check(cmd.Start())
	go func() {
		in.waitErr = cmd.Wait()
		logf.Close()
		close(in.exited)
	}()
	return in
}

func (in *instance) pid() int { return in.cmd.Process.Pid }

// waitReady waits for /readyz to answer 200.
func (in *instance) waitReady(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-in.exited:
			log.Fatalf("%s exited before ready (%v):\n%s", in.name, in.waitErr, in.tail(40))
		default:
		}
		if resp, err := httpClient.Get(in.admin + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	log.Fatalf("%s not ready after %v:\n%s", in.name, timeout, in.tail(40))
}

// stop sends SIGTERM (a graceful leave: final checkpoint of every owned
// partition) and waits; SIGKILL after 60s.
func (in *instance) stop() {
	select {
	case <-in.exited:
		return
	default:
	}
	in.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-in.exited:
	case <-time.After(60 * time.Second):
		log.Printf("%s: no exit 60s after SIGTERM; killing", in.name)
		in.cmd.Process.Kill()
		<-in.exited
	}
}

// tail returns the last n lines of the instance's log.
func (in *instance) tail(n int) string {
	b, _ := os.ReadFile(in.logPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

// routes is /routes, decoded loosely: the status format is growing (owned
// partitions, group generation, restore state), and this benchmark reads
// what it finds.
func (in *instance) routes() ([]map[string]any, error) {
	resp, err := httpClient.Get(in.admin + "/routes")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var rs []map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&rs); err != nil {
		return nil, err
	}
	return rs, nil
}

func (in *instance) route(name string) map[string]any {
	rs, err := in.routes()
	if err != nil {
		return nil
	}
	for _, r := range rs {
		if r["name"] == name {
			return r
		}
	}
	return nil
}

// metrics returns the lines of /metrics whose names start with prefix.
func (in *instance) metrics(prefix string) []string {
	resp, err := httpClient.Get(in.admin + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// metricSum adds up the samples of one metric name (every label set).
func metricSum(lines []string, name string) (float64, bool) {
	var sum float64
	found := false
	for _, l := range lines {
		n, rest, _ := strings.Cut(l, " ")
		if i := strings.IndexByte(n, '{'); i >= 0 {
			n = n[:i]
			if j := strings.LastIndexByte(l, '}'); j >= 0 {
				rest = strings.TrimSpace(l[j+1:])
			}
		}
		if n != name {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		if err == nil {
			sum += v
			found = true
		}
	}
	return sum, found
}

// waitRunning waits until every instance shows every named route running.
func waitRunning(ins []*instance, names []string, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for _, in := range ins {
		for {
			rs, _ := in.routes()
			running := 0
			for _, r := range rs {
				for _, n := range names {
					if r["name"] == n && r["state"] == "running" {
						running++
					}
				}
			}
			if running == len(names) {
				break
			}
			if time.Now().After(deadline) {
				b, _ := json.Marshal(rs)
				log.Fatalf("%s: routes %v not running after %v: %s\n%s", in.name, names, timeout, b, in.tail(30))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// clkTck is the unit of utime and stime in /proc/PID/stat.
var clkTck = func() float64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if v, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64); err == nil && v > 0 {
			return v
		}
	}
	return 100
}()

// cpuTime is utime+stime of pid from /proc/PID/stat (every thread, the
// process itself; not its children).
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// f[0] is field 3 (state): utime is field 14, stime field 15.
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return time.Duration((ut + st) / clkTck * float64(time.Second))
}

func cpuOf(ins []*instance) []time.Duration {
	out := make([]time.Duration, len(ins))
	for i, in := range ins {
		out[i] = cpuTime(in.pid())
	}
	return out
}

// profiler records a perf profile of some processes for a while (-profile).
type profiler struct {
	cmd  *exec.Cmd
	out  string
	done chan struct{}
}

// startPerf records pids at 499 Hz with call graphs until stop; nil when
// -profile is off or perf is missing.
func (e *env) startPerf(label string, pids ...int) *profiler {
	if !*profile {
		return nil
	}
	if _, err := exec.LookPath("perf"); err != nil {
		log.Printf("profile %s: no perf on PATH", label)
		return nil
	}
	var ps []string
	for _, p := range pids {
		ps = append(ps, strconv.Itoa(p))
	}
	out := filepath.Join(e.tmp, "perf-"+label+".data")
	cmd := exec.Command("perf", "record", "-q", "-F", "499", "-g", "-p", strings.Join(ps, ","), "-o", out)
	cmd.SysProcAttr = childAttr()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		log.Printf("profile %s: %v", label, err)
		return nil
	}
	p := &profiler{cmd: cmd, out: out, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	return p
}

// stop ends the recording and returns the top of the flat and cumulative
// profiles by function.
func (p *profiler) stop(label string) string {
	if p == nil {
		return ""
	}
	p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
	report := func(args ...string) string {
		out, err := exec.Command("perf", append([]string{"report", "-i", p.out, "--stdio", "-g", "none",
			"--sort", "symbol", "--percent-limit", "1"}, args...)...).Output()
		if err != nil {
			return fmt.Sprintf("perf report: %v", err)
		}
		var keep []string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") && !strings.Contains(l, "Samples") {
				continue
			}
			keep = append(keep, l)
			if len(keep) >= 28 {
				break
			}
		}
		return strings.Join(keep, "\n")
	}
	return fmt.Sprintf("perf profile %s (flat, self time):\n%s\n\nperf profile %s (cumulative, with callees):\n%s\n",
		label, report("--no-children"), label, report("--children"))
}

// restoreLog sums what the instance logged of its restores from the
// changelog (msg="state restored from changelog", level info): tasks,
// records read, keys rebuilt, and the longest and summed task durations.
func (in *instance) restoreLog() (tasks int, records, keys int64, longest, total time.Duration) {
	b, _ := os.ReadFile(in.logPath)
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, `msg="state restored from changelog"`) {
			continue
		}
		tasks++
		for _, f := range strings.Fields(l) {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				continue
			}
			switch k {
			case "records":
				n, _ := strconv.ParseInt(v, 10, 64)
				records += n
			case "keys":
				n, _ := strconv.ParseInt(v, 10, 64)
				keys += n
			case "duration":
				d, _ := time.ParseDuration(v)
				total += d
				longest = max(longest, d)
			}
		}
	}
	return
}
