package pipeline

import (
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtproxy/rtproxy/state"
)

// TestFullDiskStopsRoutesNotTheProcess: when the state store's disk fills,
// pebble's fatal error used to panic and kill the process (and with it
// the proxy). Now the routes with a checkpoint to write stop, leave their
// group and show state error with the reason; /routes and the metric say
// so; the manager (and the process) go on (issue 10).
func TestFullDiskStopsRoutesNotTheProcess(t *testing.T) {
	b := startBroker(t, map[string]int{"fd": 2})
	var full atomic.Bool
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if full.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return syscall.ENOSPC
		}
		return nil
	}))
	reg := prometheus.NewRegistry()
	m, stop := runManagerWith(t, Config{Seeds: b.addrs, StateDir: "state", StateOptions: state.Options{FS: fs}, Registerer: reg},
		newRouteDef("fd", "v1", "fd", "fd.out", dedupStep(t, 0, "value.n")))
	for i := range 20 {
		b.produce(t, jsonRecord("fd", fmt.Sprint(i), map[string]any{"n": i}))
	}
	b.consume(t, "fd.out", 20, 20*time.Second, 0)
	waitFor(t, 10*time.Second, "a checkpoint", func() bool {
		st := m.Routes()
		return len(st) == 1 && st[0].LastCheckpoint != nil
	})

	full.Store(true)
	b.produce(t, jsonRecord("fd", "x", map[string]any{"n": 100}))
	waitFor(t, 20*time.Second, "the route in state error", func() bool {
		st := m.Routes()
		return len(st) == 1 && st[0].State == "error" && strings.Contains(st[0].LastError, "state store failed")
	})
	if got := gathered(t, reg, "rtproxy_state_store_failed"); got != 1 {
		t.Errorf("rtproxy_state_store_failed = %v, want 1", got)
	}
	waitFor(t, 20*time.Second, "the route leaves its group", func() bool {
		st := m.Routes()
		return gathered(t, reg, "rtproxy_route_partitions_owned") == 0 && len(st) == 1 && st[0].State == "error"
	})
	// The manager stops cleanly: nothing hangs on the broken store.
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the manager did not stop with a broken state store")
	}
}
