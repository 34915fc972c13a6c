package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/rtproxy/rtproxy/rules"
)

// lockedBuffer collects log output written from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A route whose source topic does not exist yet is "waiting" (not
// "error"), says so once in the log, keeps looking, and runs and processes
// records once the topic is created.
func TestRouteWaitsForMissingSourceTopic(t *testing.T) {
	b := startBroker(t, nil)
	var logs lockedBuffer
	m, err := New(testConfig(Config{Seeds: b.addrs, StateDir: t.TempDir(), SourceRetry: 100 * time.Millisecond,
		Registerer: prometheus.NewRegistry(),
		Logger:     slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}))
	if err != nil {
		t.Fatal(err)
	}
	m.Apply([]*rules.Route{newRouteDef("clicks-route", "v1", "clicks", "clicks.out", filterStep(t, 0, "value.n > 1"))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	const msg = `source topic "clicks" does not exist yet; retrying every 100ms`
	waitFor(t, 10*time.Second, "the route is waiting", func() bool {
		st := m.Routes()
		return len(st) == 1 && st[0].State == "waiting"
	})
	if st := m.Routes()[0]; st.LastError != msg {
		t.Errorf("last_error %q, want %q", st.LastError, msg)
	}
	m.mu.Lock()
	r := m.mu.routes["clicks-route"]
	m.mu.Unlock()
	tried := r.life.setupAttempts.Load()
	waitFor(t, 10*time.Second, "five more attempts", func() bool { return r.life.setupAttempts.Load() >= tried+5 })
	if st := m.Routes()[0]; st.State != "waiting" || st.LastError != msg {
		t.Errorf("after retries: state %q last_error %q", st.State, st.LastError)
	}
	out := logs.String()
	if n := strings.Count(out, "does not exist yet"); n != 1 {
		t.Errorf("waiting message logged %d times, want once:\n%s", n, out)
	}
	if !strings.Contains(out, "level=INFO msg="+fmt.Sprintf("%q", msg)) {
		t.Errorf("no INFO line with %q:\n%s", msg, out)
	}
	if strings.Contains(out, "level=WARN") || strings.Contains(out, "UNKNOWN_TOPIC") {
		t.Errorf("a missing source topic logged as a fault:\n%s", out)
	}

	cl := b.client(t)
	resp, err := kadm.NewClient(cl).CreateTopic(context.Background(), 2, -1, nil, "clicks")
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create clicks: %v", err)
	}
	b.produce(t, jsonRecord("clicks", "a", map[string]any{"n": 1}), jsonRecord("clicks", "b", map[string]any{"n": 2}),
		jsonRecord("clicks", "c", map[string]any{"n": 3}))
	got := b.consume(t, "clicks.out", 2, 20*time.Second, 300*time.Millisecond)
	keys := map[string]bool{}
	for _, r := range got {
		keys[string(r.Key)] = true
	}
	if len(got) != 2 || !keys["b"] || !keys["c"] {
		t.Errorf("sink holds %d records with keys %v, want b and c", len(got), keys)
	}
	st := m.Routes()[0]
	if st.State != "running" || st.LastError != "" || len(st.Partitions) != 2 {
		t.Errorf("after the topic exists: state %q last_error %q partitions %d", st.State, st.LastError, len(st.Partitions))
	}
	if n := strings.Count(logs.String(), "does not exist yet"); n != 1 {
		t.Errorf("waiting message logged %d times in all, want once", n)
	}
}

// A start: latest route that waited for its topic starts at the topic's
// beginning: records written between the topic's creation and the next
// retry arrived after the route began, so "latest" must not skip them.
func TestLatestRouteThatWaitedKeepsEarlyRecords(t *testing.T) {
	b := startBroker(t, nil)
	m, err := New(testConfig(Config{Seeds: b.addrs, StateDir: t.TempDir(), SourceRetry: 2 * time.Second,
		Registerer: prometheus.NewRegistry(),
		Logger:     slog.New(slog.NewTextHandler(&lockedBuffer{}, nil))}))
	if err != nil {
		t.Fatal(err)
	}
	def := newRouteDef("late-topic", "v1", "late.in", "late.out", filterStep(t, 0, "value.n > 0"))
	def.Source.Start = "latest"
	m.Apply([]*rules.Route{def})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitFor(t, 10*time.Second, "the route is waiting", func() bool {
		st := m.Routes()
		return len(st) == 1 && st[0].State == "waiting"
	})

	cl := b.client(t)
	resp, err := kadm.NewClient(cl).CreateTopic(context.Background(), 2, -1, nil, "late.in")
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create late.in: %v", err)
	}
	// Written before the route's next look at the topic (up to 2s away).
	b.produce(t, jsonRecord("late.in", "a", map[string]any{"n": 1}), jsonRecord("late.in", "b", map[string]any{"n": 2}))
	got := b.consume(t, "late.out", 2, 20*time.Second, 300*time.Millisecond)
	keys := map[string]bool{}
	for _, r := range got {
		keys[string(r.Key)] = true
	}
	if len(got) != 2 || !keys["a"] || !keys["b"] {
		t.Errorf("sink holds %d records with keys %v, want a and b", len(got), keys)
	}
}
