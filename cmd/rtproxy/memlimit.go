package main

import (
	"bufio"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
)

// memLimitShare is the part of the container's memory limit given to the Go
// heap's soft limit when GOMEMLIMIT is not set: the rest covers what the
// runtime does not count (goroutine stacks it cannot reclaim at once, the
// binary's pages, pebble's block cache outside the heap with cgo).
const memLimitShare = 0.9

// containerMemLimit returns the memory limit of the cgroup this process runs
// in, in bytes, read under root (/ in production; a test's directory in
// tests): cgroup v2's memory.max of the process's own group, else cgroup v1's
// memory.limit_in_bytes. ok is false when there is no limit ("max", a v1
// value near 2^63, or no cgroup files).
func containerMemLimit(root string) (limit int64, ok bool) {
	// cgroup v2: /proc/self/cgroup has one line "0::/path".
	if group, found := ownCgroupV2(filepath.Join(root, "proc/self/cgroup")); found {
		for dir := group; ; dir = filepath.Dir(dir) {
			if n, lim := readLimit(filepath.Join(root, "sys/fs/cgroup", dir, "memory.max")); lim {
				return n, true
			}
			if dir == "/" || dir == "." {
				break
			}
		}
	}
	// cgroup v1: the memory controller's line "N:memory:/path"; inside a
	// container the group is usually mounted at the controller's root.
	if group, found := ownCgroupV1Memory(filepath.Join(root, "proc/self/cgroup")); found {
		if n, lim := readLimit(filepath.Join(root, "sys/fs/cgroup/memory", group, "memory.limit_in_bytes")); lim {
			return n, true
		}
	}
	if n, lim := readLimit(filepath.Join(root, "sys/fs/cgroup/memory/memory.limit_in_bytes")); lim {
		return n, true
	}
	return 0, false
}

// ownCgroupV1Memory reads the memory controller's group from a
// /proc/self/cgroup (cgroup v1 or hybrid).
func ownCgroupV1Memory(file string) (string, bool) {
	f, err := os.Open(file)
	if err != nil {
		return "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				return filepath.Clean(parts[2]), true
			}
		}
	}
	return "", false
}

// ownCgroupV2 reads the process's cgroup v2 path from a /proc/self/cgroup.
func ownCgroupV2(file string) (string, bool) {
	f, err := os.Open(file)
	if err != nil {
		return "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
			if p == "" {
				p = "/"
			}
			return filepath.Clean(p), true
		}
	}
	return "", false
}

// readLimit parses a memory.max or memory.limit_in_bytes file; "max" and the
// values cgroup v1 writes for "no limit" (page-rounded 2^63−1) are no limit.
func readLimit(file string) (int64, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	if s == "" || s == "max" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n >= 1<<62 {
		return 0, false
	}
	return n, true
}

// setMemLimit gives the Go runtime a soft memory limit of memLimitShare of the
// container's limit, unless GOMEMLIMIT is set (the runtime read it already) or
// there is no limit. It returns the limit it set, 0 for none.
func setMemLimit(root string, lookup func(string) (string, bool)) int64 {
	if v, set := lookup("GOMEMLIMIT"); set && v != "" {
		return 0
	}
	lim, ok := containerMemLimit(root)
	if !ok {
		return 0
	}
	soft := int64(float64(lim) * memLimitShare)
	debug.SetMemoryLimit(soft)
	return soft
}

// setMemProfileRate stops the runtime's sampling of allocations when
// nothing can read the heap profile: it is served only under
// /debug/pprof/ (pprof: true). Each sampled allocation's stack is kept
// by the runtime for the life of the process, with a 1.4 MB hash table
// that the samples touch page by page: about 0.3 MiB of a pass-through
// proxy's resident memory and 1 MiB of the quickstart's at rest
// (docs/BENCHMARKS.md, footprint). A rate set with GODEBUG=memprofilerate
// is left as set.
func setMemProfileRate(pprof bool, godebug string) {
	if pprof {
		return
	}
	for _, kv := range strings.Split(godebug, ",") {
		if strings.HasPrefix(strings.TrimSpace(kv), "memprofilerate=") {
			return
		}
	}
	runtime.MemProfileRate = 0
}
