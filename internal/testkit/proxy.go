package testkit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BrokerPortCount is the size of the per-broker port range the proxy owns
// (its broker_port_count default). StartProxy reserves the whole block.
const BrokerPortCount = 100

// ProxyOpts configures an rtproxy process. StartProxy and Restart read it
// at every start, so a test may change Env between a Stop and a Restart.
type ProxyOpts struct {
	Upstream  []string // --upstream; none runs the embedded development cluster
	RulesDir  string   // default: a fresh temp dir
	StateDir  string   // default: a fresh temp dir
	ExtraArgs []string // appended after the harness's flags
	Env       []string // added to the environment
	Dir       string   // working directory (relative RulesDir etc. are from it); default: the test's
	// CleanEnv starts the proxy with PATH alone (then Env) instead of the
	// test binary's environment, so no RTPROXY_* setting leaks in.
	CleanEnv bool
	// Binary is the rtproxy to run; default RtproxyBinary(t).
	Binary string
	// BrokerPortCount is the size of the per-broker port block reserved
	// (default BrokerPortCount); another size is also passed to the proxy
	// as RTPROXY_BROKER_PORT_COUNT.
	BrokerPortCount int
	// ReadyTimeout bounds the wait for /readyz 200 at every start
	// (default 20s).
	ReadyTimeout time.Duration
}

// Proxy is a running rtproxy binary.
type Proxy struct {
	Addr            string // bootstrap, 127.0.0.1:PORT
	AdminURL        string // http://127.0.0.1:PORT
	AdminAddr       string
	BrokerPortFirst int
	Opts            ProxyOpts

	t    testing.TB
	run  current
	logs *logBuf
}

// StartProxy starts rtproxy (`rtproxy run`) on free loopback ports in front
// of o.Upstream and waits until /readyz answers 200 (o.ReadyTimeout,
// failing with the proxy's logs). A start that lost a port to another
// process is retried on new ports. The process is killed when the test
// ends; the test's log then shows its logs if the test failed.
func StartProxy(t testing.TB, o ProxyOpts) *Proxy {
	t.Helper()
	if o.RulesDir == "" {
		o.RulesDir = t.TempDir()
	}
	if o.StateDir == "" {
		o.StateDir = t.TempDir()
	}
	if o.Binary == "" {
		o.Binary = RtproxyBinary(t)
	}
	if o.BrokerPortCount == 0 {
		o.BrokerPortCount = BrokerPortCount
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 20 * time.Second
	}
	p := &Proxy{Opts: o, t: t, logs: &logBuf{}}
	for attempt := 1; ; attempt++ {
		// On a retry: lost a port race with another process, pick new ports.
		ports := FreePorts(t, 2)
		p.Addr = fmt.Sprintf("127.0.0.1:%d", ports[0])
		p.AdminAddr = fmt.Sprintf("127.0.0.1:%d", ports[1])
		p.AdminURL = "http://" + p.AdminAddr
		p.BrokerPortFirst = FreePortBlock(t, o.BrokerPortCount)
		err := p.start()
		if err == nil {
			break
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			t.Fatalf("%v", err)
		}
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

func (p *Proxy) env() []string {
	env := os.Environ()
	if p.Opts.CleanEnv {
		env = []string{"PATH=" + os.Getenv("PATH")}
	}
	if n := p.Opts.BrokerPortCount; n != BrokerPortCount {
		env = append(env, "RTPROXY_BROKER_PORT_COUNT="+strconv.Itoa(n))
	}
	return append(env, p.Opts.Env...)
}

// errPortTaken marks a start that failed because a port was taken between
// picking it and binding it (another process won the race).
var errPortTaken = errors.New("address already in use")

// start runs the binary and waits for /readyz. It returns an error wrapping
// errPortTaken when the proxy exited because a port was taken.
func (p *Proxy) start() error {
	mark := len(p.logs.String())
	c, err := startChildIn(p.Opts.Dir, p.Opts.Binary, p.args(), p.env(), p.logs, p.logs)
	if err != nil {
		return fmt.Errorf("start rtproxy: %w", err)
	}
	p.run.set(c)

	timeout := p.Opts.ReadyTimeout
	deadline := time.Now().Add(timeout)
	hc := &http.Client{Timeout: time.Second}
	for {
		if c.exited() {
			p.run.take()
			out := p.logs.String()[mark:]
			if strings.Contains(out, "address already in use") {
				return fmt.Errorf("rtproxy exited before ready: %w; logs:\n%s", errPortTaken, out)
			}
			return fmt.Errorf("rtproxy exited before ready (%v); logs:\n%s", c.cmd.ProcessState, p.logs.String())
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
			return fmt.Errorf("rtproxy /readyz not 200 after %v (last: %v); logs:\n%s", timeout, errOrStatus(resp, err), p.logs.String())
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
	if c := p.run.get(); c != nil {
		return c.cmd.Process.Pid
	}
	return 0
}

// Running reports whether the proxy process is alive.
func (p *Proxy) Running() bool {
	c := p.run.get()
	return c != nil && !c.exited()
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

// Signal sends sig (such as SIGHUP) to the running proxy.
func (p *Proxy) Signal(sig os.Signal) error {
	c := p.run.get()
	if c == nil {
		return errors.New("rtproxy is not running")
	}
	return c.cmd.Process.Signal(sig)
}

// Terminate sends SIGTERM and waits up to grace for the proxy to exit; if
// it still runs then, Terminate kills it and reports exited false. code is
// the exit status, -1 when a signal ended the process or none was running.
func (p *Proxy) Terminate(grace time.Duration) (code int, exited bool) {
	c := p.run.take()
	if c == nil {
		return -1, true
	}
	exited = c.stop(syscall.SIGTERM, grace)
	return c.exitCode(), exited
}

// Stop sends SIGTERM and returns the exit code (-1 if killed by a signal).
// It fails the test if the proxy needs more than 20s to exit.
func (p *Proxy) Stop() int {
	p.t.Helper()
	code, exited := p.Terminate(20 * time.Second)
	if !exited {
		p.t.Errorf("rtproxy did not exit within 20s of SIGTERM; killed")
	}
	return code
}

// Kill sends SIGKILL and waits for exit.
func (p *Proxy) Kill() {
	if c := p.run.take(); c != nil {
		c.kill()
	}
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
