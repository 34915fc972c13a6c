package rules

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Table files must be regular files inside the rules directory or the
// proxy's tables_dir: a rule file cannot read any file the proxy can, and
// a FIFO cannot hang the reload that opens it (issue 10).
func TestTableFileConfinement(t *testing.T) {
	tablesDir := t.TempDir()
	outside := filepath.Join(tablesDir, "secret.jsonl")
	if err := os.WriteFile(outside, []byte(`{"id":"s"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rule := func(path string) string {
		return "route: r1\nsource: { topic: in }\nsink: { topic: out }\ntables:\n  m: { file: " + path + ", key: id }\n"
	}
	load := func(t *testing.T, dir, file string, o Options) error {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "r.yaml"), []byte(file), 0o644); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := LoadFileWith(filepath.Join(dir, "r.yaml"), o); done <- err }()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("loading the rule file hangs")
			return nil
		}
	}
	refused := func(t *testing.T, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("got %v, want %q", err, want)
		}
	}
	t.Run("an absolute path outside", func(t *testing.T) {
		refused(t, load(t, t.TempDir(), rule(outside), Options{}), "is outside the rules directory")
	})
	t.Run("a relative path that climbs out", func(t *testing.T) {
		dir := t.TempDir()
		rel, _ := filepath.Rel(dir, outside)
		refused(t, load(t, dir, rule(rel), Options{}), "is outside the rules directory")
	})
	t.Run("a symlink inside pointing outside", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.Symlink(outside, filepath.Join(dir, "m.jsonl")); err != nil {
			t.Fatal(err)
		}
		refused(t, load(t, dir, rule("m.jsonl"), Options{}), "is outside the rules directory")
	})
	t.Run("proc", func(t *testing.T) {
		refused(t, load(t, t.TempDir(), rule("/proc/self/environ"), Options{TablesDir: tablesDir}), "is outside the rules directory or tables_dir")
	})
	t.Run("a FIFO inside", func(t *testing.T) {
		dir := t.TempDir()
		if err := syscall.Mkfifo(filepath.Join(dir, "m.jsonl"), 0o600); err != nil {
			t.Skipf("mkfifo: %v", err)
		}
		refused(t, load(t, dir, rule("m.jsonl"), Options{}), "is not a regular file")
	})
	t.Run("a file in tables_dir", func(t *testing.T) {
		if err := load(t, t.TempDir(), rule(outside), Options{TablesDir: tablesDir}); err != nil {
			t.Fatalf("refused: %v", err)
		}
	})
	t.Run("a regular file inside, through a symlinked rules directory", func(t *testing.T) {
		real := t.TempDir()
		if err := os.WriteFile(filepath.Join(real, "m.jsonl"), []byte(`{"id":"a"}`+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(t.TempDir(), "rules")
		if err := os.Symlink(real, link); err != nil {
			t.Fatal(err)
		}
		if err := load(t, link, rule("m.jsonl"), Options{}); err != nil {
			t.Fatalf("refused: %v", err)
		}
	})
}
