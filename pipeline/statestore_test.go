package pipeline

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rtproxy/rtproxy/rules"
	"github.com/rtproxy/rtproxy/state"
)

// TestPassThroughOpensNoStateStore: a proxy without routes never opens
// the state store (pebble) when its directory holds no earlier state: the
// directory stays empty while it runs, the state gauges read 0 and a
// retention sweep finds nothing; the first route to start opens it. A
// directory an earlier run left state in is opened at the start, as
// before (invariant 99).
func TestPassThroughOpensNoStateStore(t *testing.T) {
	dir := t.TempDir() + "/pipelines" // missing, as on a fresh pod
	reg := prometheus.NewRegistry()
	m, err := New(testConfig(Config{Seeds: []string{"127.0.0.1:1"}, StateDir: dir, Registerer: reg, StateRetention: time.Hour}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	entries := func() []string {
		es, err := os.ReadDir(dir)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		return names
	}
	time.Sleep(200 * time.Millisecond)
	if got := entries(); len(got) != 0 {
		t.Fatalf("no routes: the state directory holds %v, want nothing (the store opened)", got)
	}
	m.dropExpired(time.Now(), time.Nanosecond, map[string]time.Time{}) // a sweep with nothing open
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP rtproxy_state_memory_bytes Memory the state store (pebble) holds for every route together, by part: block_cache, memtables.
# TYPE rtproxy_state_memory_bytes gauge
rtproxy_state_memory_bytes{part="block_cache"} 0
rtproxy_state_memory_bytes{part="memtables"} 0
`), "rtproxy_state_memory_bytes"); err != nil {
		t.Errorf("state gauges before the store opened: %v", err)
	}

	// The first route opens it, in its setup, before it needs a broker
	// (the seed here answers nothing).
	m.Apply([]*rules.Route{newRouteDef("pay", "h1", "in", "out")})
	deadline := time.Now().Add(10 * time.Second)
	for m.store() == nil || len(entries()) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("a route started: the state directory holds %v, want pebble's files", entries())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStateLeftByAnEarlierRunOpensAtStart: New opens a directory holding
// state at once, as before the store was opened lazily: state retention
// sees the stored routes from the start, and a store that cannot open is
// refused at the start.
func TestStateLeftByAnEarlierRunOpensAtStart(t *testing.T) {
	dir := t.TempDir()
	db, err := state.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	m, err := New(testConfig(Config{Seeds: []string{"127.0.0.1:1"}, StateDir: dir, Registerer: prometheus.NewRegistry()}))
	if err != nil {
		t.Fatal(err)
	}
	defer m.closeState()
	if m.store() == nil {
		t.Fatal("a directory with an earlier run's state: not opened by New")
	}

	// A directory that holds something pebble cannot open fails New.
	bad := t.TempDir()
	if err := os.WriteFile(bad+"/CURRENT", []byte("MANIFEST-nonexistent\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if m2, err := New(testConfig(Config{Seeds: []string{"127.0.0.1:1"}, StateDir: bad, Registerer: prometheus.NewRegistry()})); err == nil {
		m2.closeState()
		t.Fatal("a broken store: New accepted it, want it refused at the start")
	}
}

// TestStateOpenFailureIsTheRoutesError: when the first route cannot open
// the store (here its directory is a file by then), the route shows state
// error with the reason and retries; the proxy runs on.
func TestStateOpenFailureIsTheRoutesError(t *testing.T) {
	dir := t.TempDir() + "/pipelines"
	m, err := New(testConfig(Config{Seeds: []string{"127.0.0.1:1"}, StateDir: dir, Registerer: prometheus.NewRegistry()}))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	m.Apply([]*rules.Route{newRouteDef("pay", "h1", "in", "out")})
	deadline := time.Now().Add(10 * time.Second)
	for {
		rs := m.Routes()
		if len(rs) == 1 && rs[0].State == "error" && strings.Contains(rs[0].LastError, "open state "+dir) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("routes %+v: want pay in state error, its last error the failed open of %s", rs, dir)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if m.store() != nil {
		t.Fatal("a failed open left a store")
	}
}
