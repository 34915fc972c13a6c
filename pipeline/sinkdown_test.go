package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/rules"
)

func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var ps []string
	var ls []net.Listener
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ps = append(ps, fmt.Sprint(l.Addr().(*net.TCPAddr).Port))
	}
	for _, l := range ls {
		l.Close()
	}
	return ps
}

// With the brokers gone the route reports the trouble in Status and in
// rtproxy_pipeline_sink_errors_total, and when they come back (same ports,
// same data) it resumes by itself without losing a record.
func TestBrokersDownThenBack(t *testing.T) {
	ports := strings.Join(freePorts(t, 3), ",")
	data := t.TempDir()
	b := startBroker(t, map[string]int{"sd": 2}, "-ports", ports, "-data-dir", data)
	def := newRouteDef("sd", "v1", "sd", "sd.out", filterStep(t, 0, "value.n >= 0"))
	reg := prometheus.NewRegistry()
	m, err := New(testConfig(Config{Seeds: b.addrs, StateDir: t.TempDir(), Registerer: reg, StopTimeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	m.Apply([]*rules.Route{def})
	ctx, cancel := contextWithCancel()
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() { cancel(); <-done }()

	var first []string
	for i := 0; i < 20; i++ {
		r := jsonRecord("sd", fmt.Sprint(i), map[string]any{"n": i})
		b.produce(t, r)
		first = append(first, srcRef(r))
	}
	b.consume(t, "sd.out", 20, 20*time.Second, 0)

	b.cmd.Process.Kill()
	b.cmd.Wait()
	waitFor(t, 20*time.Second, "Status and metrics report the unreachable brokers", func() bool {
		st := m.Routes()
		return len(st) == 1 && st[0].State == "error" && st[0].LastError != "" &&
			gathered(t, reg, "rtproxy_pipeline_sink_errors_total") > 0
	})
	t.Logf("while down: %+v", m.Routes()[0].LastError)

	b = startBroker(t, nil, "-ports", ports, "-data-dir", data)
	var second []string
	for i := 20; i < 40; i++ {
		r := jsonRecord("sd", fmt.Sprint(i), map[string]any{"n": i})
		b.produce(t, r)
		second = append(second, srcRef(r))
	}
	out := b.consume(t, "sd.out", 40, 30*time.Second, 300*time.Millisecond)
	seen := map[string]bool{}
	for _, r := range out {
		seen[header(r, HeaderSource)] = true
	}
	for _, ref := range append(first, second...) {
		if !seen[ref] {
			t.Errorf("%s missing from the sink after the brokers came back", ref)
		}
	}
	waitFor(t, 20*time.Second, "the route reports running again", func() bool {
		st := m.Routes()
		return len(st) == 1 && st[0].State == "running"
	})
}

func contextWithCancel() (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}

// gathered sums a metric family from reg.
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// Stopping while the brokers are down ends within StopTimeout and writes
// no checkpoint past unacknowledged outputs: after the brokers return, a
// new run replays and every record reaches the sink.
func TestStopWhileBrokersDown(t *testing.T) {
	ports := strings.Join(freePorts(t, 3), ",")
	data := t.TempDir()
	b := startBroker(t, map[string]int{"sw": 2}, "-ports", ports, "-data-dir", data)
	dir := t.TempDir()
	def := newRouteDef("sw", "v1", "sw", "sw.out", filterStep(t, 0, "value.n >= 0"))
	var refs []string
	for i := 0; i < 30; i++ {
		r := jsonRecord("sw", fmt.Sprint(i), map[string]any{"n": i})
		b.produce(t, r)
		refs = append(refs, srcRef(r))
	}
	m, err := New(testConfig(Config{Seeds: b.addrs, StateDir: dir, StopTimeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	m.Apply([]*rules.Route{def})
	ctx, cancel := contextWithCancel()
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	b.consume(t, "sw.out", 30, 20*time.Second, 0)

	b.cmd.Process.Kill()
	b.cmd.Wait()
	time.Sleep(200 * time.Millisecond)
	t0 := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return within 15s of cancel while the brokers were down")
	}
	t.Logf("stopped in %v with the brokers down", time.Since(t0).Round(time.Millisecond))

	b = startBroker(t, nil, "-ports", ports, "-data-dir", data)
	t.Logf("broker back after %v", time.Since(t0).Round(time.Millisecond))
	runManager(t, b, dir, def)
	out := b.consume(t, "sw.out", 30, 30*time.Second, 300*time.Millisecond)
	t.Logf("sink read back after %v", time.Since(t0).Round(time.Millisecond))
	seen := map[string]bool{}
	for _, r := range out {
		seen[header(r, HeaderSource)] = true
	}
	for _, ref := range refs {
		if !seen[ref] {
			t.Errorf("%s missing after restart", ref)
		}
	}
}

// syncBuffer is a log destination tests can read while the Manager writes.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
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

// A swap (or a removal, then a restore) while the brokers are gone: the
// old version's stop gives up after StopTimeout with outputs
// unacknowledged, leaving an uncommitted frozen cut and drop_duplicates
// state past the last checkpoint. That state is discarded, so once the
// brokers return the new version starts (its DropStepsExcept is not
// refused) from the last committed checkpoint and replays: every record
// reaches the sink, none is taken for a duplicate of itself, and every
// repeat carries the rtproxy-source of its input.
func TestSwapWhileSinkDownReplaysFromCommitted(t *testing.T) {
	t.Run("swap", func(t *testing.T) { stopGivesUp(t, false) })
	// The route is removed while the brokers are down and restored after
	// they return: the same stop, the same discard.
	t.Run("remove-restore", func(t *testing.T) { stopGivesUp(t, true) })
}

func stopGivesUp(t *testing.T, removeRestore bool) {
	ports := strings.Join(freePorts(t, 3), ",")
	data := t.TempDir()
	b := startBroker(t, map[string]int{"sg": 2}, "-ports", ports, "-data-dir", data)
	def := func(hash, ver string) *rules.Route {
		return newRouteDef("sg", hash, "sg", "sg.out", dedupStep(t, 0, "value.id"), setStep(t, 1, [][2]string{{"ver", `"` + ver + `"`}}))
	}
	logs := &syncBuffer{}
	reg := prometheus.NewRegistry()
	m, err := New(testConfig(Config{Seeds: b.addrs, StateDir: t.TempDir(), Registerer: reg, StopTimeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}))
	if err != nil {
		t.Fatal(err)
	}
	m.Apply([]*rules.Route{def("h1", "v1")})
	ctx, cancel := contextWithCancel()
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		<-done
		if testing.Verbose() || t.Failed() {
			t.Logf("manager log:\n%s", logs.String())
		}
	}()

	var recs []*kgo.Record
	batch := func(from, to int) []*kgo.Record {
		var rs []*kgo.Record
		for i := from; i < to; i++ {
			rs = append(rs, jsonRecord("sg", fmt.Sprint(i), map[string]any{"id": fmt.Sprint("id", i)}))
		}
		recs = append(recs, rs...)
		return rs
	}
	b.produce(t, batch(0, 50)...)
	b.consume(t, "sg.out", 50, 20*time.Second, 0)
	// A checkpoint past the first batch: the committed recovery point. First
	// wait until all of the first batch is done, then for a checkpoint taken
	// after that moment (rather than requiring a poll to land within 100ms
	// of a checkpoint, which a loaded machine may miss every time).
	var allDone time.Time
	waitFor(t, 30*time.Second, "the first batch is done", func() bool {
		st := m.Routes()
		if len(st) != 1 || len(st[0].Partitions) == 0 {
			return false
		}
		for _, p := range st[0].Partitions {
			if p.Lag != 0 {
				return false
			}
		}
		allDone = time.Now()
		return true
	})
	waitFor(t, 30*time.Second, "a checkpoint covers the first batch", func() bool {
		st := m.Routes()
		return len(st) == 1 && st[0].LastCheckpoint != nil && st[0].LastCheckpoint.After(allDone)
	})

	// The second batch is being processed when the brokers go: its outputs
	// cannot be acknowledged.
	b.produce(t, batch(50, 4050)...)
	waitFor(t, 10*time.Second, "the route takes in the second batch", func() bool {
		return gathered(t, reg, "rtproxy_pipeline_records_in_total") > 50
	})
	b.cmd.Process.Kill()
	b.cmd.Wait()
	in := gathered(t, reg, "rtproxy_pipeline_records_in_total")
	t0 := time.Now()
	if removeRestore {
		m.Apply(nil)
	} else {
		m.Apply([]*rules.Route{def("h2", "v2")})
	}
	t.Logf("swap returned after %v with the brokers down (%v records taken in)", time.Since(t0).Round(time.Millisecond), in)
	if l := logs.String(); !strings.Contains(l, "final checkpoint not written") || !strings.Contains(l, "uncommitted state discarded") {
		t.Fatalf("the old version's stop did not give up on unacknowledged outputs (nothing to test); log:\n%s", l)
	}

	b = startBroker(t, nil, "-ports", ports, "-data-dir", data)
	if removeRestore {
		m.Apply([]*rules.Route{def("h2", "v2")})
	}
	out := b.consume(t, "sg.out", len(recs), 40*time.Second, 500*time.Millisecond)
	seen := map[string]int{}
	v2 := 0
	for _, r := range out {
		src := header(r, HeaderSource)
		if src == "" {
			t.Errorf("output %s has no rtproxy-source", r.Value)
		}
		seen[src]++
		if strings.Contains(string(r.Value), `"ver":"v2"`) {
			v2++
		}
	}
	for _, r := range recs {
		if seen[srcRef(r)] == 0 {
			t.Errorf("%s (%s) lost: not in the sink after the brokers returned", srcRef(r), r.Value)
		}
	}
	if len(seen) != len(recs) {
		t.Errorf("sink names %d distinct sources, want %d", len(seen), len(recs))
	}
	if v2 == 0 {
		t.Errorf("no output from the new version")
	}
	t.Logf("sink: %d outputs for %d records (%d by v2, %d repeats)", len(out), len(recs), v2, len(out)-len(recs))
	waitFor(t, 20*time.Second, "the new version reports running", func() bool {
		st := m.Routes()
		return len(st) == 1 && st[0].State == "running"
	})
}

// TestReloadingRouteStaysInRoutes: while a route stops for a new version
// of its rule file (slowly here: the brokers are down, so its final
// commit waits), /routes still lists it, as "reloading". It used to
// vanish for up to the stop timeout (found by make soak).
func TestReloadingRouteStaysInRoutes(t *testing.T) {
	b := startBroker(t, map[string]int{"rl": 1})
	m, _ := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), StopTimeout: 2 * time.Second},
		newRouteDef("rl", "v1", "rl", "rl.out"))
	b.produce(t, jsonRecord("rl", "0", map[string]any{"n": 0}))
	b.consume(t, "rl.out", 1, 20*time.Second, 0)
	b.cmd.Process.Kill()
	b.cmd.Wait()

	applied := make(chan struct{})
	go func() { m.Apply([]*rules.Route{newRouteDef("rl", "v2", "rl", "rl.out")}); close(applied) }()
	saw := false
	for !saw {
		select {
		case <-applied:
			t.Fatal("the swap finished before /routes was seen during it")
		default:
		}
		for _, st := range m.Routes() {
			if st.Name == "rl" && st.State == "reloading" {
				saw = true
			}
		}
		if len(m.Routes()) == 0 {
			t.Fatal("/routes is empty while the route reloads")
		}
		time.Sleep(5 * time.Millisecond)
	}
	<-applied
}
