package protocol

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testkit.Cleanup()
	os.Exit(code)
}

// startKfake runs a 3-broker kfake in its own process and returns its
// broker addresses.
func startKfake(t testing.TB, args ...string) []string {
	t.Helper()
	addrs, _ := testkit.StartKfake(t, args...)
	return addrs
}

// startKfakeProc is startKfake that also returns the process, for tests
// that kill the broker.
func startKfakeProc(t testing.TB, args ...string) ([]string, *exec.Cmd) {
	t.Helper()
	return testkit.StartKfake(t, args...)
}

// syncBuffer is a log sink tests can read while the proxy writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type testProxy struct {
	*Proxy
	logs *syncBuffer
	reg  *prometheus.Registry
	stop func()
}

// randomPortFirst picks a per-broker port range start; PortMap skips ports
// another process holds, so a collision costs nothing but a log line.
func randomPortFirst() int { return 20000 + rand.IntN(400)*100 }

// startProxy runs a proxy in front of upstream until the test ends, and
// waits until it is Ready.
func startProxy(t testing.TB, upstream []string, mod func(*Config)) *testProxy {
	t.Helper()
	tp := startProxyNoWait(t, upstream, mod)
	deadline := time.Now().Add(10 * time.Second)
	for !tp.Ready() {
		if time.Now().After(deadline) {
			t.Fatalf("proxy not ready; logs:\n%s", tp.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return tp
}

// startProxyNoWait runs a proxy without waiting for upstream metadata.
func startProxyNoWait(t testing.TB, upstream []string, mods ...func(*Config)) *testProxy {
	t.Helper()
	logs := &syncBuffer{}
	reg := prometheus.NewRegistry()
	cfg := Config{
		Listen:          "127.0.0.1:0",
		AdvertiseHost:   "127.0.0.1",
		BrokerPortFirst: randomPortFirst(),
		BrokerPortCount: 100,
		MaxFrameBytes:   100 << 20,
		// config.Default's decode budgets
		MaxDecodedBytes:      32 << 20,
		MaxRecordsPerRequest: 200_000,
		MaxDecodedBytesTotal: 128 << 20,
		Upstream:             upstream,
		ShutdownGrace:        2 * time.Second,
		Logger:               slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registerer:           reg,
	}
	for _, mod := range mods {
		if mod != nil {
			mod(&cfg)
		}
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run returned %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Errorf("Run did not return after cancel")
			}
		})
	}
	t.Cleanup(stop)
	return &testProxy{Proxy: p, logs: logs, reg: reg, stop: stop}
}

// isProxyAddr reports whether addr is the bootstrap or inside the
// per-broker range.
func (tp *testProxy) isProxyAddr(host string, port int32) bool {
	if net.JoinHostPort(host, fmt.Sprint(port)) == tp.Addr() {
		return true
	}
	return host == tp.cfg.AdvertiseHost && int(port) >= tp.cfg.BrokerPortFirst &&
		int(port) < tp.cfg.BrokerPortFirst+tp.cfg.BrokerPortCount
}

// waitLog waits until the proxy's log contains every one of subs on one line.
func (tp *testProxy) waitLog(t testing.TB, subs ...string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, l := range strings.Split(tp.logs.String(), "\n") {
			all := true
			for _, s := range subs {
				all = all && strings.Contains(l, s)
			}
			if all {
				return l
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no log line with %q; logs:\n%s", subs, tp.logs.String())
	return ""
}

// metricValue reads a counter or gauge child.
func metricValue(t testing.TB, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	switch {
	case d.Counter != nil:
		return d.Counter.GetValue()
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	}
	t.Fatalf("metric is neither counter nor gauge")
	return 0
}
