package main

import (
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"testing"
)

// writeTree writes files (path relative to root → content) under a new root.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range files {
		f := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestContainerMemLimit(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string]string
		want  int64
		ok    bool
	}{
		{"v2 own group", map[string]string{
			"proc/self/cgroup":                          "0::/kubepods/pod1/c1\n",
			"sys/fs/cgroup/kubepods/pod1/c1/memory.max": "268435456\n",
		}, 268435456, true},
		{"v2 limit on a parent", map[string]string{
			"proc/self/cgroup":                          "0::/kubepods/pod1/c1\n",
			"sys/fs/cgroup/kubepods/pod1/c1/memory.max": "max\n",
			"sys/fs/cgroup/kubepods/memory.max":         "536870912\n",
		}, 536870912, true},
		{"v2 namespaced root", map[string]string{
			"proc/self/cgroup":         "0::/\n",
			"sys/fs/cgroup/memory.max": "134217728\n",
		}, 134217728, true},
		{"v2 no limit", map[string]string{
			"proc/self/cgroup":         "0::/\n",
			"sys/fs/cgroup/memory.max": "max\n",
		}, 0, false},
		{"v1 hybrid, own group", map[string]string{
			"proc/self/cgroup": "4:memory:/process_api/c2\n0::/\n",
			"sys/fs/cgroup/memory/process_api/c2/memory.limit_in_bytes": "1073741824\n",
		}, 1073741824, true},
		{"v1 unlimited", map[string]string{
			"proc/self/cgroup":                           "4:memory:/\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
		}, 0, false},
		{"v1 cpu,memory joined", map[string]string{
			"proc/self/cgroup": "3:cpu,memory:/x\n",
			"sys/fs/cgroup/memory/x/memory.limit_in_bytes": "2147483648\n",
		}, 2147483648, true},
		{"nothing", map[string]string{}, 0, false},
		{"garbage", map[string]string{
			"proc/self/cgroup":         "0::/\n",
			"sys/fs/cgroup/memory.max": "lots\n",
		}, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := containerMemLimit(writeTree(t, c.files))
			if got != c.want || ok != c.ok {
				t.Fatalf("containerMemLimit = %d, %v; want %d, %v", got, ok, c.want, c.ok)
			}
		})
	}
}

func TestSetMemLimit(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(old)
	root := writeTree(t, map[string]string{
		"proc/self/cgroup":         "0::/\n",
		"sys/fs/cgroup/memory.max": "1000000000\n",
	})
	none := func(string) (string, bool) { return "", false }
	if got := setMemLimit(root, none); got != 900000000 {
		t.Fatalf("setMemLimit = %d, want 90%% of the limit", got)
	}
	if got := debug.SetMemoryLimit(-1); got != 900000000 {
		t.Fatalf("runtime limit %d, want 900000000", got)
	}
	debug.SetMemoryLimit(old)
	set := func(k string) (string, bool) { return "512MiB", k == "GOMEMLIMIT" }
	if got := setMemLimit(root, set); got != 0 {
		t.Fatalf("with GOMEMLIMIT set, setMemLimit = %d, want 0 (the runtime's own)", got)
	}
	if got := debug.SetMemoryLimit(-1); got != old {
		t.Fatalf("with GOMEMLIMIT set the limit changed to %d", got)
	}
}

// TestSetMemProfileRate: allocations are sampled only when the heap
// profile can be read (pprof: true) or a rate was asked for in GODEBUG.
func TestSetMemProfileRate(t *testing.T) {
	saved := runtime.MemProfileRate
	defer func() { runtime.MemProfileRate = saved }()
	for _, c := range []struct {
		pprof   bool
		godebug string
		want    int
	}{
		{true, "", 512 << 10},
		{false, "", 0},
		{false, "gctrace=1", 0},
		{false, "gctrace=1, memprofilerate=4096", 512 << 10},
		{false, "memprofilerate=1", 512 << 10},
	} {
		runtime.MemProfileRate = 512 << 10
		setMemProfileRate(c.pprof, c.godebug)
		if runtime.MemProfileRate != c.want {
			t.Errorf("pprof %v, GODEBUG %q: rate %d, want %d", c.pprof, c.godebug, runtime.MemProfileRate, c.want)
		}
	}
}
