// Package integration holds the tests that start real processes — kfake
// brokers (test/kfakebroker), the built rtproxy binary — and drive them with
// real client libraries written by other people.
//
// This file is the shared harness: building the binaries once per test run,
// starting and restarting brokers and the proxy on fixed ports, and the
// franz-go helpers tests use to assert on what actually reached the brokers.
//
// Set RTPROXY_IT_DIRECT=1 to run the client cases straight against kfake
// (no proxy) while the proxy is being developed; the proxy-address checks
// are then skipped with a log line.
package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

// BrokerPortCount is the size of the per-broker port range the proxy owns
// (its broker_port_count default). The harness reserves the whole block.
const BrokerPortCount = 100

var (
	binOnce sync.Once
	binDir  string
	binErr  map[string]error // binary name → build error, nil entries built fine
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// ModuleRoot walks up from the working directory to the folder holding go.mod.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("getwd: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// buildBinaries builds cmd/rtproxy and test/kfakebroker once per test binary
// run. A failed build is remembered per binary, so tests that only need kfake
// still run while the proxy does not compile.
func buildBinaries(t testing.TB) {
	t.Helper()
	root := ModuleRoot(t)
	binOnce.Do(func() {
		binErr = map[string]error{}
		dir, err := os.MkdirTemp("", "rtproxy-it-bin-")
		if err != nil {
			binErr["rtproxy"], binErr["kfakebroker"] = err, err
			return
		}
		binDir = dir
		goBin := filepath.Join(runtimeGOROOT(), "bin", "go")
		if _, err := os.Stat(goBin); err != nil {
			goBin = "go"
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		for name, pkg := range map[string]string{"rtproxy": "./cmd/rtproxy", "kfakebroker": "./test/kfakebroker"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cmd := exec.Command(goBin, "build", "-o", filepath.Join(dir, name), pkg)
				cmd.Dir = root
				cmd.SysProcAttr = testkit.ChildAttr()
				out, err := cmd.CombinedOutput()
				if err != nil {
					err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
				}
				mu.Lock()
				binErr[name] = err
				mu.Unlock()
			}()
		}
		wg.Wait()
	})
}

func runtimeGOROOT() string {
	if r := os.Getenv("GOROOT"); r != "" {
		return r
	}
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return "/usr/local/go"
	}
	return strings.TrimSpace(string(out))
}

// binPath returns the path of a built binary or fails the test with the
// build output.
func binPath(t testing.TB, name string) string {
	t.Helper()
	buildBinaries(t)
	if err := binErr[name]; err != nil {
		t.Fatalf("binary %s unavailable: %v", name, err)
	}
	return filepath.Join(binDir, name)
}

// --- ports -----------------------------------------------------------------

// Ports are picked below the kernel's ephemeral range (32768+) so an outgoing
// connection can never take a port we mean to reuse on a restart.
const (
	portLow  = 12000
	portHigh = 32000
)

var portMu sync.Mutex
var portsHanded = map[int]bool{} // within this process, never hand a port out twice

// FreePorts returns n individual free loopback ports.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ps := make([]int, 0, n)
	for range n {
		ps = append(ps, FreePortBlock(t, 1))
	}
	return ps
}

// FreePortBlock returns the first of n contiguous free loopback ports.
func FreePortBlock(t testing.TB, n int) int {
	t.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	for attempt := 0; attempt < 200; attempt++ {
		first := portLow + rand.IntN(portHigh-portLow-n)
		if blockFree(first, n) {
			for p := first; p < first+n; p++ {
				portsHanded[p] = true
			}
			return first
		}
	}
	t.Fatalf("no block of %d free ports in [%d,%d)", n, portLow, portHigh)
	return 0
}

func blockFree(first, n int) bool {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for p := first; p < first+n; p++ {
		if portsHanded[p] {
			return false
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			return false
		}
		ls = append(ls, l)
	}
	return true
}

// --- captured output -------------------------------------------------------

// logBuf is a goroutine-safe buffer for a child process's output.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// --- kfake -----------------------------------------------------------------

// KfakeOpts configures a kfake broker process.
type KfakeOpts struct {
	Brokers int            // default 3
	Ports   []int          // default: picked free ports, one per broker
	DataDir string         // persist here so Restart keeps data; empty = in memory
	Topics  map[string]int // created up front: name → partitions
	SASL    string         // "MECH:USER:PASS" enables SASL with that superuser
}

// Kfake is a running test/kfakebroker process.
type Kfake struct {
	Addrs []string
	Opts  KfakeOpts

	t    testing.TB
	bin  string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	logs *logBuf
}

// StartKfake starts kfake in its own process and waits for its ready line.
// The process is killed when the test ends.
func StartKfake(t testing.TB, o KfakeOpts) *Kfake {
	t.Helper()
	if o.Brokers == 0 {
		o.Brokers = 3
	}
	if len(o.Ports) == 0 {
		o.Ports = FreePorts(t, o.Brokers)
	}
	if len(o.Ports) != o.Brokers {
		t.Fatalf("StartKfake: %d ports for %d brokers", len(o.Ports), o.Brokers)
	}
	k := &Kfake{Opts: o, t: t, bin: binPath(t, "kfakebroker"), logs: &logBuf{}}
	for _, p := range o.Ports {
		k.Addrs = append(k.Addrs, fmt.Sprintf("127.0.0.1:%d", p))
	}
	k.start()
	t.Cleanup(func() {
		k.Kill()
		if t.Failed() {
			t.Logf("kfake output:\n%s", k.Logs())
		}
	})
	return k
}

func (k *Kfake) args() []string {
	o := k.Opts
	ps := make([]string, len(o.Ports))
	for i, p := range o.Ports {
		ps[i] = strconv.Itoa(p)
	}
	args := []string{"-brokers", strconv.Itoa(o.Brokers), "-ports", strings.Join(ps, ",")}
	if o.DataDir != "" {
		args = append(args, "-data-dir", o.DataDir)
	}
	if len(o.Topics) > 0 {
		var ts []string
		for name, n := range o.Topics {
			ts = append(ts, fmt.Sprintf("%s:%d", name, n))
		}
		sort.Strings(ts)
		args = append(args, "-topics", strings.Join(ts, ","))
	}
	if o.SASL != "" {
		args = append(args, "-sasl", o.SASL)
	}
	return args
}

func (k *Kfake) start() {
	t := k.t
	t.Helper()
	var lastErr error
	// A restart can race the kernel releasing the old listeners; retry briefly.
	for attempt := 0; attempt < 20; attempt++ {
		cmd := exec.Command(k.bin, k.args()...)
		cmd.SysProcAttr = testkit.ChildAttr()
		cmd.Stderr = k.logs
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatalf("kfake stdout: %v", err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start kfake: %v", err)
		}
		ready := make(chan string, 1)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				line := sc.Text()
				k.logs.Write([]byte(line + "\n"))
				if strings.HasPrefix(line, "ready ") {
					ready <- strings.TrimPrefix(line, "ready ")
				}
			}
			io.Copy(io.Discard, stdout)
		}()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-ready:
			k.mu.Lock()
			k.cmd, k.done = cmd, done
			k.mu.Unlock()
			return
		case <-done:
			lastErr = fmt.Errorf("kfake exited before ready: %s", k.logs.String())
			time.Sleep(100 * time.Millisecond)
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Fatalf("kfake not ready after 15s; output:\n%s", k.logs.String())
		}
	}
	t.Fatalf("%v", lastErr)
}

func (k *Kfake) signal(sig syscall.Signal) {
	k.mu.Lock()
	cmd, done := k.cmd, k.done
	k.cmd = nil
	k.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

// Stop sends SIGTERM and waits for the process to exit.
func (k *Kfake) Stop() { k.signal(syscall.SIGTERM) }

// Kill sends SIGKILL and waits for the process to exit.
func (k *Kfake) Kill() { k.signal(syscall.SIGKILL) }

// Restart stops a running broker (SIGTERM) if needed and starts it again on
// the same ports and data dir.
func (k *Kfake) Restart() {
	k.t.Helper()
	k.Stop()
	k.start()
}

// Logs returns everything the process printed so far.
func (k *Kfake) Logs() string { return k.logs.String() }

// --- proxy -----------------------------------------------------------------

// ProxyOpts configures an rtproxy process.
type ProxyOpts struct {
	Upstream  []string
	RulesDir  string   // default: a fresh temp dir
	StateDir  string   // default: a fresh temp dir
	ExtraArgs []string // appended after the harness's flags
	Env       []string // added to the inherited environment
}

// Proxy is a running rtproxy binary.
type Proxy struct {
	Addr            string // bootstrap, 127.0.0.1:PORT
	AdminURL        string // http://127.0.0.1:PORT
	AdminAddr       string
	BrokerPortFirst int
	Opts            ProxyOpts

	t    testing.TB
	bin  string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	logs *logBuf
}

// StartProxy starts the built rtproxy binary in front of o.Upstream and
// waits until /readyz answers 200 (20s, failing with the proxy's logs).
func StartProxy(t testing.TB, o ProxyOpts) *Proxy {
	t.Helper()
	if o.RulesDir == "" {
		o.RulesDir = t.TempDir()
	}
	if o.StateDir == "" {
		o.StateDir = t.TempDir()
	}
	ports := FreePorts(t, 2)
	p := &Proxy{
		Addr:            fmt.Sprintf("127.0.0.1:%d", ports[0]),
		AdminAddr:       fmt.Sprintf("127.0.0.1:%d", ports[1]),
		BrokerPortFirst: FreePortBlock(t, BrokerPortCount),
		Opts:            o,
		t:               t,
		bin:             binPath(t, "rtproxy"),
		logs:            &logBuf{},
	}
	p.AdminURL = "http://" + p.AdminAddr
	for attempt := 1; ; attempt++ {
		err := p.start()
		if err == nil {
			break
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			t.Fatalf("%v", err)
		}
		// Lost a port race with another process: pick new ports.
		ports := FreePorts(t, 2)
		p.Addr = fmt.Sprintf("127.0.0.1:%d", ports[0])
		p.AdminAddr = fmt.Sprintf("127.0.0.1:%d", ports[1])
		p.AdminURL = "http://" + p.AdminAddr
		p.BrokerPortFirst = FreePortBlock(t, BrokerPortCount)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("rtproxy logs:\n%s", p.Logs())
		}
	})
	return p
}

func (p *Proxy) args() []string {
	args := []string{"run",
		"--listen", p.Addr,
		"--advertise-host", "127.0.0.1",
		"--broker-ports", strconv.Itoa(p.BrokerPortFirst),
		"--admin-listen", p.AdminAddr,
		"--rules-dir", p.Opts.RulesDir,
		"--state-dir", p.Opts.StateDir,
	}
	if len(p.Opts.Upstream) > 0 {
		args = append(args, "--upstream", strings.Join(p.Opts.Upstream, ","))
	}
	return append(args, p.Opts.ExtraArgs...)
}

// errPortTaken marks a start that failed because a port was taken between
// picking it and binding it (another process won the race).
var errPortTaken = errors.New("address already in use")

// start runs the binary and waits for /readyz. It returns an error wrapping
// errPortTaken when the proxy exited because a port was taken.
func (p *Proxy) start() error {
	mark := len(p.logs.String())
	cmd := exec.Command(p.bin, p.args()...)
	cmd.SysProcAttr = testkit.ChildAttr()
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	cmd.Env = append(os.Environ(), p.Opts.Env...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start rtproxy: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()

	deadline := time.Now().Add(20 * time.Second)
	hc := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-done:
			p.mu.Lock()
			p.cmd = nil
			p.mu.Unlock()
			out := p.logs.String()[mark:]
			if strings.Contains(out, "address already in use") {
				return fmt.Errorf("rtproxy exited before ready: %w; logs:\n%s", errPortTaken, out)
			}
			return fmt.Errorf("rtproxy exited before ready (%v); logs:\n%s", cmd.ProcessState, p.logs.String())
		default:
		}
		resp, err := hc.Get(p.AdminURL + "/readyz")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("rtproxy /readyz not 200 after 20s (last: %v); logs:\n%s", errOrStatus(resp, err), p.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func errOrStatus(resp *http.Response, err error) string {
	if err != nil {
		return err.Error()
	}
	return resp.Status
}

// PID is the running proxy's process id (0 when stopped).
func (p *Proxy) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running reports whether the proxy process is alive.
func (p *Proxy) Running() bool {
	p.mu.Lock()
	done := p.done
	stopped := p.cmd == nil
	p.mu.Unlock()
	if stopped || done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// RSSKiB reads the proxy's resident set size (VmRSS) from /proc.
func (p *Proxy) RSSKiB(t testing.TB) int64 {
	t.Helper()
	pid := p.PID()
	if pid == 0 {
		t.Fatalf("proxy is not running")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read proxy status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				n, err := strconv.ParseInt(f[0], 10, 64)
				if err == nil {
					return n
				}
			}
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// Stop sends SIGTERM and returns the exit code (-1 if killed by a signal).
// It fails the test if the proxy needs more than 20s to exit.
func (p *Proxy) Stop() int {
	p.t.Helper()
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return -1
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-done
		p.t.Errorf("rtproxy did not exit within 20s of SIGTERM; killed")
	}
	return cmd.ProcessState.ExitCode()
}

// Kill sends SIGKILL and waits for exit.
func (p *Proxy) Kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-done
}

// Restart stops the proxy (SIGTERM) if it runs and starts it again with the
// same ports and directories, waiting for /readyz.
func (p *Proxy) Restart() {
	p.t.Helper()
	p.Stop()
	for attempt := 1; ; attempt++ {
		err := p.start()
		if err == nil {
			return
		}
		if !errors.Is(err, errPortTaken) || attempt == 5 {
			p.t.Fatalf("restart: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Logs returns the proxy's captured stdout and stderr.
func (p *Proxy) Logs() string { return p.logs.String() }

// Metrics fetches /metrics as text.
func (p *Proxy) Metrics(t testing.TB) string {
	t.Helper()
	resp, err := http.Get(p.AdminURL + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s: %s", resp.Status, b)
	}
	return string(b)
}

// GetJSON fetches an admin path (such as "/routes") and decodes its JSON
// body into out, failing on a non-200 status.
func (p *Proxy) GetJSON(t testing.TB, path string, out any) {
	t.Helper()
	resp, err := http.Get(p.AdminURL + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", path, resp.Status, b)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("GET %s: not JSON (%v): %s", path, err, b)
	}
}

// WriteRuleFile writes a rule file atomically (temp file + rename, as an
// editor or a ConfigMap update would) into dir and returns its path.
func WriteRuleFile(t testing.TB, dir, name, yaml string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	tmp, err := os.CreateTemp(dir, ".tmp-"+name+"-")
	if err != nil {
		t.Fatalf("write rule %s: %v", name, err)
	}
	if _, err := tmp.WriteString(yaml); err != nil {
		t.Fatalf("write rule %s: %v", name, err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatalf("write rule %s: %v", name, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		t.Fatalf("write rule %s: %v", name, err)
	}
	return path
}

// Eventually retries cond every 50ms until it returns nil or timeout
// passes, then fails with its last error.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %v: %v", what, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// --- stack: kfake + proxy --------------------------------------------------

// Stack is one kfake cluster with an rtproxy in front of it.
type Stack struct {
	Kfake     *Kfake
	Proxy     *Proxy // nil in direct mode (RTPROXY_IT_DIRECT=1)
	Bootstrap []string
}

// DirectMode reports whether client cases should skip the proxy.
func DirectMode() bool { return os.Getenv("RTPROXY_IT_DIRECT") == "1" }

// StartStack starts kfake and, unless in direct mode, the proxy in front.
func StartStack(t testing.TB, ko KfakeOpts, po ProxyOpts) *Stack {
	t.Helper()
	s := &Stack{Kfake: StartKfake(t, ko)}
	if DirectMode() {
		t.Logf("RTPROXY_IT_DIRECT=1: clients talk to kfake directly")
		s.Bootstrap = s.Kfake.Addrs
		return s
	}
	po.Upstream = s.Kfake.Addrs
	s.Proxy = StartProxy(t, po)
	s.Bootstrap = []string{s.Proxy.Addr}
	return s
}

// AssertOnlyProxyAddrs checks what a client saw as broker addresses.
func (s *Stack) AssertOnlyProxyAddrs(t testing.TB, seen []string) {
	t.Helper()
	if s.Proxy == nil {
		if len(seen) == 0 {
			t.Errorf("client reported no broker addresses")
		}
		t.Logf("direct mode: not checking addresses %v", seen)
		return
	}
	AssertOnlyProxyAddrs(t, seen, s.Proxy)
}

// AssertProxyCarried fails unless the proxy's rtproxy_proxy_requests_total
// counted at least one request of each API key: proof that the client's
// traffic of that kind went through the proxy rather than around it.
func (s *Stack) AssertProxyCarried(t testing.TB, keys ...kmsg.Key) {
	t.Helper()
	if s.Proxy == nil {
		return
	}
	text := s.Proxy.Metrics(t)
	for _, k := range keys {
		name := kmsg.NameForKey(int16(k))
		prefix := `rtproxy_proxy_requests_total{api="` + name + `"} `
		var v float64
		for _, line := range strings.Split(text, "\n") {
			if rest, ok := strings.CutPrefix(line, prefix); ok {
				v, _ = strconv.ParseFloat(strings.TrimSpace(rest), 64)
			}
		}
		if v < 1 {
			t.Errorf("proxy counted %v %s requests; the client's %s traffic did not go through it", v, name, name)
		}
	}
}

// AssertOnlyProxyAddrs fails unless seen is non-empty and every address is
// the proxy's bootstrap or one of its per-broker listeners on 127.0.0.1.
func AssertOnlyProxyAddrs(t testing.TB, seen []string, proxy *Proxy) {
	t.Helper()
	if len(seen) == 0 {
		t.Errorf("client reported no broker addresses; cannot prove it saw only the proxy")
		return
	}
	for _, a := range seen {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			t.Errorf("address %q: %v", a, err)
			continue
		}
		n, _ := strconv.Atoi(port)
		inRange := n >= proxy.BrokerPortFirst && n < proxy.BrokerPortFirst+BrokerPortCount
		if host != "127.0.0.1" || !(inRange || a == proxy.Addr) {
			t.Errorf("client saw %q, which is not a proxy address (bootstrap %s, broker ports %d-%d)",
				a, proxy.Addr, proxy.BrokerPortFirst, proxy.BrokerPortFirst+BrokerPortCount-1)
		}
	}
}

// --- tools -----------------------------------------------------------------

// DebianPython is the interpreter that sees Debian's python3-kafka and
// python3-confluent-kafka (the PATH python3 is a pyenv shim).
const DebianPython = "/usr/bin/python3"

// RequireTool skips the test when a client tool or library is missing, or
// fails it when CI=true, where every client must be present. Names:
// "python3-kafka", "python3-confluent-kafka", "kafkajs", or any executable.
func RequireTool(t testing.TB, name string) {
	t.Helper()
	var err error
	switch name {
	case "python3-kafka":
		err = exec.Command(DebianPython, "-c", "import kafka").Run()
	case "python3-confluent-kafka":
		err = exec.Command(DebianPython, "-c", "import confluent_kafka").Run()
	case "kafkajs":
		if _, err = exec.LookPath("node"); err == nil {
			_, err = os.Stat(filepath.Join(ModuleRoot(t), "test", "integration", "node_modules", "kafkajs", "package.json"))
		}
	default:
		_, err = exec.LookPath(name)
	}
	if err == nil {
		return
	}
	msg := fmt.Sprintf("client %q is missing (%v); install it with `make deps`", name, err)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " — CI=true, so a missing client is a failure")
	}
	t.Skip(msg)
}

// --- franz-go helpers ------------------------------------------------------

// NewClient returns a franz-go client closed at test end, with linger 0.
func NewClient(t testing.TB, seeds []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	all := append([]kgo.Opt{kgo.SeedBrokers(seeds...), kgo.ProducerLinger(0)}, opts...)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// MakeRecords makes n records with keys "k-<i>" and values "<prefix>-<i>".
func MakeRecords(topic, prefix string, n int) []*kgo.Record {
	rs := make([]*kgo.Record, n)
	for i := range rs {
		rs[i] = &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k-%d", i), Value: fmt.Appendf(nil, "%s-%d", prefix, i)}
	}
	return rs
}

// Produce writes n records (see MakeRecords) synchronously and returns
// their values in order.
func Produce(t testing.TB, seeds []string, topic, prefix string, n int) []string {
	t.Helper()
	// Uncompressed, so that clients without snappy/lz4 libraries can read them.
	cl := NewClient(t, seeds, kgo.ProducerBatchCompression(kgo.NoCompression()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs := MakeRecords(topic, prefix, n)
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce %d records to %s: %v", n, topic, err)
	}
	return Values(rs)
}

// Consume reads topic from the start (all partitions, no group) until it has
// want records, failing after timeout with what it got.
func Consume(t testing.TB, seeds []string, topic string, want int, timeout time.Duration, opts ...kgo.Opt) []*kgo.Record {
	t.Helper()
	cl := NewClient(t, seeds, append([]kgo.Opt{kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, opts...)...)
	return PollN(t, cl, want, timeout)
}

// PollN polls cl until it has want records or timeout passes (failing).
func PollN(t testing.TB, cl *kgo.Client, want int, timeout time.Duration) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var got []*kgo.Record
	for len(got) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records within %v", len(got), want, timeout)
		}
		fs.EachError(func(tp string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Logf("fetch %s[%d]: %v", tp, p, err)
			}
		})
		got = append(got, fs.Records()...)
	}
	return got
}

// ConsumeQuiet reads topic from the start until no record arrives for quiet
// (after at least min records or the overall timeout), returning everything.
// Use it to prove that records are absent (aborted transactions).
func ConsumeQuiet(t testing.TB, seeds []string, topic string, min int, quiet, timeout time.Duration, opts ...kgo.Opt) []*kgo.Record {
	t.Helper()
	cl := NewClient(t, seeds, append([]kgo.Opt{kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, opts...)...)
	deadline := time.Now().Add(timeout)
	var got []*kgo.Record
	for time.Now().Before(deadline) {
		wait := quiet
		if len(got) < min {
			wait = time.Until(deadline)
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		fs := cl.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachRecord(func(r *kgo.Record) { got = append(got, r); n++ })
		if n == 0 && len(got) >= min {
			return got
		}
	}
	if len(got) < min {
		t.Fatalf("consumed %d records, want at least %d within %v", len(got), min, timeout)
	}
	return got
}

// Values returns the records' values as strings, in order.
func Values(rs []*kgo.Record) []string {
	vs := make([]string, len(rs))
	for i, r := range rs {
		vs[i] = string(r.Value)
	}
	return vs
}

// AssertSameSet fails unless got and want hold the same strings with the same
// multiplicity (order ignored: records spread over partitions).
func AssertSameSet(t testing.TB, what string, got, want []string) {
	t.Helper()
	g := append([]string(nil), got...)
	w := append([]string(nil), want...)
	sort.Strings(g)
	sort.Strings(w)
	if len(g) != len(w) {
		t.Errorf("%s: got %d records, want %d\n got: %s\nwant: %s", what, len(g), len(w), clip(g), clip(w))
		return
	}
	for i := range g {
		if g[i] != w[i] {
			t.Errorf("%s: record sets differ at sorted index %d: got %q, want %q\n got: %s\nwant: %s", what, i, g[i], w[i], clip(g), clip(w))
			return
		}
	}
}

func clip(s []string) string {
	if len(s) > 12 {
		return fmt.Sprintf("%q … (%d more)", s[:12], len(s)-12)
	}
	return fmt.Sprintf("%q", s)
}

// MetadataBrokers asks for cluster metadata through cl and returns the
// broker addresses the response carried, as host:port.
func MetadataBrokers(t testing.TB, cl *kgo.Client) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("metadata: %v", err)
	}
	var addrs []string
	for _, b := range resp.Brokers {
		addrs = append(addrs, net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port))))
	}
	return addrs
}

// CoordinatorAddrs asks FindCoordinator for a group key and returns the
// address it names.
func CoordinatorAddrs(t testing.TB, cl *kgo.Client, group string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrFindCoordinatorRequest()
	req.CoordinatorKey = group
	req.CoordinatorKeys = []string{group}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("find coordinator: %v", err)
	}
	var addrs []string
	if len(resp.Coordinators) > 0 {
		for _, c := range resp.Coordinators {
			addrs = append(addrs, net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port))))
		}
	} else {
		addrs = append(addrs, net.JoinHostPort(resp.Host, strconv.Itoa(int(resp.Port))))
	}
	return addrs
}

// UniqueTopic returns a topic name unique to the test.
func UniqueTopic(t testing.TB, base string) string {
	return fmt.Sprintf("%s-%d", base, rand.IntN(1_000_000))
}
