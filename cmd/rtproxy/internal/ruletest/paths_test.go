package ruletest

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTestFileConfined: a test file that is a link out of its directory,
// or a FIFO, is refused without being read (nothing of what it holds is
// shown, the FIFO does not hang the run); a rule file that is a link out of
// it is refused the same way; a ConfigMap's links inside the directory are
// read.
func TestTestFileConfined(t *testing.T) {
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "secret.test.yaml")
	writeFiles(t, filepath.Dir(outside), map[string]string{"secret.test.yaml": "tests: SECRET-LINE-not-shown\n"})
	writeFiles(t, dir, map[string]string{
		"a.yaml": "route: a\nsource: { topic: in }\nsink: { topic: out }\n",
	})
	if err := os.Symlink(outside, filepath.Join(dir, "a.test.yaml")); err != nil {
		t.Fatal(err)
	}
	code, out := run(t, Options{}, dir)
	if code != ExitMalformed || strings.Contains(out, "SECRET-LINE") || !strings.Contains(out, "test file refused") {
		t.Fatalf("exit %d:\n%s", code, out)
	}

	fifoDir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(fifoDir, "f.test.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan string, 1)
	go func() { _, out := run(t, Options{}, filepath.Join(fifoDir, "f.test.yaml")); done <- out }()
	select {
	case out := <-done:
		if !strings.Contains(out, "not a regular file") {
			t.Fatalf("a FIFO test file:\n%s", out)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("rtproxy test blocked on a FIFO test file")
	}

	// The route under test is confined too.
	ruleDir := t.TempDir()
	writeFiles(t, filepath.Dir(outside), map[string]string{"r.yaml": "route: SECRET-ROUTE-not-shown\n"})
	if err := os.Symlink(filepath.Join(filepath.Dir(outside), "r.yaml"), filepath.Join(ruleDir, "r.yaml")); err != nil {
		t.Fatal(err)
	}
	writeFiles(t, ruleDir, map[string]string{"r.test.yaml": "tests:\n  - name: x\n    input: [{ value: 1 }]\n    expect: { sink: [] }\n"})
	code, out = run(t, Options{}, ruleDir)
	if code == ExitPass || strings.Contains(out, "SECRET-ROUTE") || !strings.Contains(out, "rule file refused") {
		t.Fatalf("a rule file outside: exit %d:\n%s", code, out)
	}

	// The kubelet's ConfigMap layout.
	cm := t.TempDir()
	stamp := filepath.Join(cm, "..2026_x")
	if err := os.Mkdir(stamp, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFiles(t, stamp, map[string]string{
		"p.yaml":      "route: p\nsource: { topic: in }\nsink: { topic: out }\nsteps:\n  - filter: value.n > 1\n",
		"p.test.yaml": "tests:\n  - name: kept\n    input: [{ value: { n: 2 } }, { value: { n: 1 } }]\n    expect: { sink: [{ value: { n: 2 } }] }\n",
	})
	for _, l := range [][2]string{{"..2026_x", "..data"}, {"..data/p.yaml", "p.yaml"}, {"..data/p.test.yaml", "p.test.yaml"}} {
		if err := os.Symlink(l[0], filepath.Join(cm, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	if code, out := run(t, Options{Verbose: true}, cm); code != ExitPass || !strings.Contains(out, "--- PASS: p/kept") {
		t.Fatalf("ConfigMap layout: exit %d\n%s", code, out)
	}
}
