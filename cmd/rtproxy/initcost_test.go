package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// initLine is one line of GODEBUG=inittrace=1: "init PKG @T ms, C ms
// clock, B bytes, A allocs".
var initLine = regexp.MustCompile(`^init (\S+) @\S+ ms, \S+ ms clock, (\d+) bytes, (\d+) allocs$`)

// TestBinaryOwnInitsAreSmall: this project's own package inits, which run
// in every process whether or not it serves a route, stay small. Each
// allocates under 64 KB (all together under 192 KB): work that only some
// processes need waits until one needs it. It failed before: rules
// allocated 453 KB at init (two regexps with counted repetitions), main
// 159 KB (the status page's templates) (docs/BENCHMARKS.md, footprint).
func TestBinaryOwnInitsAreSmall(t *testing.T) {
	code, _, stderr := runBinary(t, []string{"GODEBUG=inittrace=1"}, "version")
	if code != 0 {
		t.Fatalf("version: exit %d\n%s", code, stderr)
	}
	const each, all = 64 << 10, 192 << 10
	total, seen := 0, 0
	for _, line := range strings.Split(stderr, "\n") {
		m := initLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		seen++
		pkg := m[1]
		if pkg != "main" && !strings.HasPrefix(pkg, "github.com/rtproxy/rtproxy/") {
			continue
		}
		n, _ := strconv.Atoi(m[2])
		total += n
		if n >= each {
			t.Errorf("init of %s allocates %d bytes, want under %d: make the work lazy (sync.OnceValue)", pkg, n, each)
		}
	}
	if seen < 50 {
		t.Fatalf("read %d init lines from GODEBUG=inittrace=1; the format changed?\n%s", seen, stderr)
	}
	if total >= all {
		t.Errorf("this project's inits allocate %d bytes together, want under %d", total, all)
	}
}
