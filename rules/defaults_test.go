package rules

import (
	"path/filepath"
	"testing"
	"time"
)

// TestIdleTimeoutDefault: a route without source.idle_timeout gets 30s
// from the loader, whichever way it is loaded (LoadFile for `rtproxy
// check`, LoadDir, and loadBytes, which the watcher uses), so nothing
// below rules/ needs a default of its own. A written value is kept.
func TestIdleTimeoutDefault(t *testing.T) {
	if DefaultIdleTimeout != 30*time.Second {
		t.Fatalf("DefaultIdleTimeout = %v; docs/RULES.md says 30s", DefaultIdleTimeout)
	}
	dir := t.TempDir()
	files := map[string]string{
		"flow.yaml":  "route: flow\nsource: { topic: in }\nsink: { topic: out }\n",
		"block.yaml": "route: block\nsource:\n  topic: in2\n  event_time: value.ts\n  watermark: 5s\nsink:\n  topic: out2\nsteps:\n  - window: { kind: tumbling, size: 1m, aggregate: { n: count() } }\n",
		"set.yaml":   "route: set\nsource: { topic: in3, idle_timeout: 2m }\nsink: { topic: out3 }\n",
	}
	writeFiles(t, dir, files)
	want := map[string]time.Duration{"flow": 30 * time.Second, "block": 30 * time.Second, "set": 2 * time.Minute}

	for name := range files {
		r, err := LoadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if r.Source.IdleTimeout != want[r.Name] {
			t.Errorf("LoadFile %s: idle_timeout %v, want %v", name, r.Source.IdleTimeout, want[r.Name])
		}
		res := loadBytes(filepath.Join(dir, name), []byte(files[name]), Options{})
		if res.route == nil || res.route.Source.IdleTimeout != want[r.Name] {
			t.Errorf("loadBytes %s: %+v %v, want idle_timeout %v", name, res.route, res.errs, want[r.Name])
		}
	}
	routes, errs := LoadDir(dir)
	if len(errs) > 0 || len(routes) != len(files) {
		t.Fatalf("LoadDir: %d routes, errors %v", len(routes), errs)
	}
	for _, r := range routes {
		if r.Source.IdleTimeout != want[r.Name] {
			t.Errorf("LoadDir %s: idle_timeout %v, want %v", r.Name, r.Source.IdleTimeout, want[r.Name])
		}
	}
}
