package rules

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A table file must be a regular file: a FIFO would hang the reload that
// opens it, and with it every other rule change (issue 10).
func TestTableFileMustBeRegular(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, "m.jsonl"), 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	rule := "route: r1\nsource: { topic: in }\nsink: { topic: out }\ntables:\n  m: { file: m.jsonl, key: id }\n"
	if err := os.WriteFile(filepath.Join(dir, "r.yaml"), []byte(rule), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := LoadFile(filepath.Join(dir, "r.yaml")); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "is not a regular file") {
			t.Fatalf("got %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("loading a rule file whose table is a FIFO hangs")
	}
}
