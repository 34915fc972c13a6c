package rules

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// secretLines is what an outside file holds; none of it may be shown.
const secretLines = "root:$6$SECRET-HASH-do-not-show:19000:0:99999:7:::\nroute: SECRET-ROUTE-do-not-show\n"

// confineDir is a rules directory with one good route, a link to
// /proc/self/environ, a link to a file outside holding secret lines (as
// /etc/shadow would, readable here by the test), and a link to a FIFO of
// the directory. It returns the directory and the outside file.
func confineDir(t *testing.T) (string, string) {
	t.Helper()
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "shadow")
	write(t, outside, secretLines)
	write(t, filepath.Join(dir, "good.yaml"), rule("good", "true"))
	must(t, os.Symlink("/proc/self/environ", filepath.Join(dir, "environ.yaml")))
	must(t, os.Symlink(outside, filepath.Join(dir, "shadow.yaml")))
	return dir, outside
}

func assertNoSecret(t *testing.T, what, s string) {
	t.Helper()
	for _, secret := range []string{"SECRET-HASH", "SECRET-ROUTE", "RTPROXY_CONFINE_SECRET", "hunter2"} {
		if strings.Contains(s, secret) {
			t.Fatalf("%s shows the content of a file outside the rules directory (%s):\n%s", what, secret, s)
		}
	}
}

// TestRuleFileSymlinkOutsideIsRefused: rule files that resolve outside the
// rules directory are refused unread, by LoadDir, CheckPaths and the
// watcher alike, and their content reaches no error, output or log.
func TestRuleFileSymlinkOutsideIsRefused(t *testing.T) {
	t.Setenv("RTPROXY_CONFINE_SECRET", "hunter2")
	dir, _ := confineDir(t)

	routes, errs := LoadDir(dir)
	if len(routes) != 1 || routes[0].Name != "good" {
		t.Fatalf("LoadDir routes = %v, want only good", routes)
	}
	var all []string
	for _, e := range errs {
		all = append(all, e.Error())
	}
	joined := strings.Join(all, "\n")
	assertNoSecret(t, "LoadDir errors", joined)
	for _, name := range []string{"environ.yaml", "shadow.yaml"} {
		if !strings.Contains(joined, name+": rule file refused: ") || !strings.Contains(joined, "outside the directory") {
			t.Errorf("no refusal of %s in:\n%s", name, joined)
		}
	}

	var out bytes.Buffer
	if CheckPaths(&out, []string{dir}) {
		t.Fatal("check passed a directory with links outside it")
	}
	assertNoSecret(t, "check", out.String())
	if !strings.Contains(out.String(), "ok "+filepath.Join(dir, "good.yaml")) || strings.Count(out.String(), "rule file refused") != 2 {
		t.Fatalf("check output:\n%s", out.String())
	}
	// Named alone, too.
	out.Reset()
	if CheckPaths(&out, []string{filepath.Join(dir, "shadow.yaml")}) {
		t.Fatal("check passed a link to a file outside")
	}
	assertNoSecret(t, "check FILE", out.String())

	if _, err := LoadFile(filepath.Join(dir, "environ.yaml")); err == nil {
		t.Fatal("LoadFile read a link to /proc/self/environ")
	} else {
		assertNoSecret(t, "LoadFile", err.Error())
	}

	h := startWatch(t, dir)
	a := h.next()
	if got := a.summary(); !strings.HasPrefix(got, "good[true]") || len(a.errs) != 2 {
		t.Fatalf("watcher applied %s", got)
	}
	assertNoSecret(t, "watcher errors", a.summary())
	assertNoSecret(t, "watcher logs", h.logs.String())
}

// TestRuleFileConfigMapLayout: the kubelet's layout of a ConfigMap volume
// (route.yaml -> ..data/route.yaml, ..data -> ..2026_x) is symlinks inside
// the directory, and loads.
func TestRuleFileConfigMapLayout(t *testing.T) {
	dir := t.TempDir()
	must(t, os.Mkdir(filepath.Join(dir, "..2026_x"), 0o755))
	write(t, filepath.Join(dir, "..2026_x", "route.yaml"), rule("cm", "value.v == 1")+"tables:\n  m: { file: m.jsonl, key: id }\n")
	write(t, filepath.Join(dir, "..2026_x", "m.jsonl"), `{"id": "k"}`+"\n")
	must(t, os.Symlink("..2026_x", filepath.Join(dir, "..data")))
	must(t, os.Symlink("..data/route.yaml", filepath.Join(dir, "route.yaml")))
	must(t, os.Symlink("..data/m.jsonl", filepath.Join(dir, "m.jsonl")))

	routes, errs := LoadDir(dir)
	if len(errs) > 0 || len(routes) != 1 || routes[0].Name != "cm" {
		t.Fatalf("LoadDir: %v %v", routes, errs)
	}
	var out bytes.Buffer
	if !CheckPaths(&out, []string{dir}) {
		t.Fatalf("check refused a ConfigMap layout:\n%s", out.String())
	}
	if !CheckPaths(&out, []string{filepath.Join(dir, "route.yaml")}) {
		t.Fatalf("check FILE refused a ConfigMap layout:\n%s", out.String())
	}
	// A relative path to it, from its parent.
	t.Chdir(filepath.Dir(dir))
	rel := filepath.Base(dir)
	if routes, errs := LoadDir(rel); len(errs) > 0 || len(routes) != 1 {
		t.Fatalf("LoadDir(%s): %v %v", rel, routes, errs)
	}
	h := startWatch(t, rel)
	if got := h.next().summary(); got != "cm[value.v == 1]" {
		t.Fatalf("watcher applied %q", got)
	}
}

// TestReadConfined: only regular files of the directory, bounded in size;
// a FIFO does not block the read.
func TestReadConfined(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "ok.yaml"), "route: x\n")
	must(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	write(t, filepath.Join(dir, "sub", "inner.yaml"), "route: y\n")
	must(t, os.Symlink("sub/inner.yaml", filepath.Join(dir, "inner.yaml")))
	must(t, syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644))
	must(t, os.Symlink("fifo.yaml", filepath.Join(dir, "tofifo.yaml")))
	must(t, os.Symlink("/dev/zero", filepath.Join(dir, "zero.yaml")))
	write(t, filepath.Join(dir, "big.yaml"), strings.Repeat("#", MaxRuleFileBytes+1))

	if b, err := ReadConfined(dir, filepath.Join(dir, "ok.yaml"), MaxRuleFileBytes); err != nil || string(b) != "route: x\n" {
		t.Fatalf("ok.yaml: %q %v", b, err)
	}
	if b, err := ReadConfined(dir, filepath.Join(dir, "inner.yaml"), MaxRuleFileBytes); err != nil || string(b) != "route: y\n" {
		t.Fatalf("a link inside: %q %v", b, err)
	}
	for name, want := range map[string]string{
		"fifo.yaml":   "not a regular file",
		"tofifo.yaml": "not a regular file",
		"zero.yaml":   "outside the directory",
		"big.yaml":    "more than the",
	} {
		done := make(chan error, 1)
		go func() {
			_, err := ReadConfined(dir, filepath.Join(dir, name), MaxRuleFileBytes)
			done <- err
		}()
		select {
		case err := <-done:
			var re *FileRefusedError
			if err == nil || !strings.Contains(err.Error(), want) || !errorsAs(err, &re) {
				t.Errorf("%s: %v, want a refusal saying %q", name, err, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the read blocked", name)
		}
	}
	// The directory named relatively is the same directory.
	t.Chdir(dir)
	if _, err := ReadConfined(".", "inner.yaml", MaxRuleFileBytes); err != nil {
		t.Fatalf("relative: %v", err)
	}
	if _, err := ReadConfined("sub", "ok.yaml", MaxRuleFileBytes); err == nil {
		t.Fatal("a file outside sub read as inside it")
	}
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }
