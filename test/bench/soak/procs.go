package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
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

// childAttr makes every child die with this process, so an interrupted soak
// leaves nothing holding ports (the tmpfs is unmounted by the signal
// handler in main).
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// build compiles pkg (relative to the module root src) into bin.
func build(src, bin, pkg string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./"+pkg)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %v\n%s", pkg, err, out)
	}
	return nil
}

// freePort returns a port nothing listens on now, not in used.
func freePort(used map[int]bool) int {
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fatalf("free port: %v", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !used[p] {
			used[p] = true
			return p
		}
	}
}

// freeBlock returns the first of n consecutive free ports below the
// ephemeral range (rtproxy's per-broker listeners), none of them in used.
func freeBlock(used map[int]bool, n int) int {
	for base := 23000 + os.Getpid()%4000; base < 32000; base += n {
		ok := true
		for q := base; q < base+n && ok; q++ {
			if used[q] {
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
				used[q] = true
			}
			return base
		}
	}
	fatalf("no free port block")
	return 0
}

// proc is a child process that the chaos stops and starts again with the
// same arguments; an exit nobody asked for is noticed by the supervisor.
type proc struct {
	name    string
	bin     string
	args    []string
	env     []string
	logPath string

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	waitErr  error
	expected bool // the exit was asked for (stop)
	starts   int
}

// start runs the process; it appends its stdout and stderr to logPath
// (except what readyLine consumes). When readyPrefix is not empty it waits
// for a stdout line starting with it.
func (p *proc) start(readyPrefix string, timeout time.Duration) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return "", err
	}
	p.starts++
	fmt.Fprintf(logf, "=== soak: start %d of %s at %s ===\n", p.starts, p.name, time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stderr = logf
	cmd.SysProcAttr = childAttr()
	var out io.ReadCloser
	if readyPrefix != "" {
		if out, err = cmd.StdoutPipe(); err != nil {
			logf.Close()
			return "", err
		}
	} else {
		cmd.Stdout = logf
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return "", err
	}
	exited := make(chan struct{})
	p.cmd, p.exited, p.expected, p.waitErr = cmd, exited, false, nil
	ready := make(chan string, 1)
	if out != nil {
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				l := sc.Text()
				if strings.HasPrefix(l, readyPrefix) {
					ready <- strings.TrimPrefix(l, readyPrefix)
					io.Copy(logf, out)
					return
				}
				fmt.Fprintln(logf, l)
			}
		}()
	}
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		logf.Close()
		close(exited)
	}()
	if out == nil {
		return "", nil
	}
	select {
	case l := <-ready:
		return l, nil
	case <-exited:
		return "", fmt.Errorf("%s exited before ready: %v\n%s", p.name, p.waitErr, tail(p.logPath, 30))
	case <-time.After(timeout):
		return "", fmt.Errorf("%s not ready after %v", p.name, timeout)
	}
}

// stop sends SIGTERM and waits for the exit (SIGKILL after grace). It
// returns how the process exited.
func (p *proc) stop(grace time.Duration) (string, time.Duration) {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.expected = true
	p.mu.Unlock()
	if cmd == nil {
		return "not running", 0
	}
	t := time.Now()
	select {
	case <-exited:
		return "had already exited: " + p.exitText(), 0
	default:
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		cmd.Process.Kill()
		<-exited
		return fmt.Sprintf("no exit %v after SIGTERM; killed", grace), time.Since(t)
	}
	return p.exitText(), time.Since(t)
}

func (p *proc) exitText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.waitErr == nil {
		return "exit 0"
	}
	return p.waitErr.Error()
}

// died reports an exit that nobody asked for.
func (p *proc) died() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited == nil || p.expected {
		return false
	}
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	select {
	case <-p.exited:
		return 0
	default:
	}
	return p.cmd.Process.Pid
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// rssBytes is VmRSS of pid from /proc/PID/status.
func rssBytes(pid int) int64 {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			f := strings.Fields(l)
			if len(f) >= 2 {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

// admin is rtproxy's admin endpoint.
type admin string

func (a admin) ready() bool {
	resp, err := httpClient.Get(string(a) + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// routeStatus is the part of a /routes entry the soak reads.
type routeStatus struct {
	Name       string `json:"name"`
	State      string `json:"state"`
	LastError  string `json:"last_error"`
	RuleError  string `json:"rule_error"`
	Partitions []struct {
		Partition  int32 `json:"partition"`
		DoneOffset int64 `json:"done_offset"`
		Lag        int64 `json:"lag"`
	} `json:"partitions"`
}

func (a admin) routes() ([]routeStatus, error) {
	resp, err := httpClient.Get(string(a) + "/routes")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var rs []routeStatus
	if err := json.NewDecoder(resp.Body).Decode(&rs); err != nil {
		return nil, err
	}
	return rs, nil
}

func (a admin) route(name string) (routeStatus, bool) {
	rs, err := a.routes()
	if err != nil {
		return routeStatus{}, false
	}
	for _, r := range rs {
		if r.Name == name {
			return r, true
		}
	}
	return routeStatus{}, false
}

// metrics returns /metrics as name{labels} → value (the rtproxy_ series).
func (a admin) metrics() (map[string]float64, error) {
	resp, err := httpClient.Get(string(a) + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "rtproxy_") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err == nil {
			out[l[:i]] = v
		}
	}
	return out, sc.Err()
}

// metricSum adds the samples of one metric (every label set).
func metricSum(m map[string]float64, name string) float64 {
	var s float64
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			s += v
		}
	}
	return s
}

// dirUsage is the used bytes of the filesystem holding dir.
func dirUsage(dir string) (used, size int64) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0
	}
	size = int64(st.Blocks) * st.Bsize
	return size - int64(st.Bfree)*st.Bsize, size
}

// countLines counts, in a log file, the lines that contain each needle.
func countLines(path string, needles []string) map[string]int {
	out := map[string]int{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		for _, n := range needles {
			if strings.Contains(l, n) {
				out[n]++
			}
		}
	}
	return out
}

// grepLines returns up to max lines of a file containing needle.
func grepLines(path, needle string, max int) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() && len(out) < max {
		if strings.Contains(sc.Text(), needle) {
			out = append(out, sc.Text())
		}
	}
	return out
}

func moduleRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		fatalf("%v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		p := filepath.Dir(dir)
		if p == dir {
			fatalf("no go.mod above the working directory")
		}
		dir = p
	}
}
