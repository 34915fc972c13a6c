package rules

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWatchHoldsValidCutWithoutNewline: a file cut mid-line that still
// compiles (`value.v >= 1000` cut to `value.v >= 1`) does not apply while
// the writer may still be at work; the completed file applies at once.
func TestWatchHoldsValidCutWithoutNewline(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.yaml")
	write(t, p, rule("a", "value.v >= 1000"))
	h := startWatch(t, dir)
	h.next()

	full := rule("a", "value.v >= 2000")
	cut := full[:strings.Index(full, "2000")+1] // "... >= 2", no newline
	write(t, p, cut)
	h.none(incompleteHold * 6 / 10) // the valid cut is held, not applied
	if !strings.Contains(h.logs.String(), "does not end with a newline") {
		t.Errorf("no log line about the held file; logs:\n%s", h.logs.String())
	}
	write(t, p, full)
	wrote := time.Now()
	a := h.next()
	if got := a.summary(); got != "a[value.v >= 2000]" {
		t.Fatalf("after the completed write: %q, want the full filter", got)
	}
	if d := a.at.Sub(wrote); d > incompleteHold/2 {
		t.Errorf("the completed file (ends with a newline) took %v to apply; it must not wait for the hold", d)
	}
	h.none(incompleteHold + 200*time.Millisecond) // the cut never applies later either
}

// TestWatchFileWithoutNewlineAppliesAfterHold: a complete, valid file that
// simply lacks the final newline applies once unchanged for the hold.
func TestWatchFileWithoutNewlineAppliesAfterHold(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.yaml")
	write(t, p, rule("a", "value.v == 1"))
	h := startWatch(t, dir)
	h.next()

	write(t, p, strings.TrimSuffix(rule("a", "value.v == 2"), "\n"))
	wrote := time.Now()
	a := h.next()
	if got := a.summary(); got != "a[value.v == 2]" {
		t.Fatalf("applied %q", got)
	}
	d := a.at.Sub(wrote)
	if d < incompleteHold-50*time.Millisecond || d > incompleteHold+time.Second {
		t.Errorf("applied %v after the write, want about the hold (%v)", d, incompleteHold)
	}
	// An invalid cut is refused at once, as before: the hold is only for
	// content that would run.
	write(t, p, "route: a\nsource: { topic: a.in }\nsink: { topic: a.o")
	wrote = time.Now()
	b := h.next()
	if len(b.errs) != 1 || b.at.Sub(wrote) > incompleteHold/2 {
		t.Errorf("invalid cut: %q after %v, want one error promptly", b.summary(), b.at.Sub(wrote))
	}
}

// TestWatchNewFileWithoutNewlineHeld: a new file is held the same way (it
// may be a half-written new route), but not at the first scan.
func TestWatchNewFileWithoutNewlineHeld(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), strings.TrimSuffix(rule("a", "value.v == 1"), "\n"))
	h := startWatch(t, dir)
	if got := h.next().summary(); got != "a[value.v == 1]" {
		t.Fatalf("first scan applied %q; a file present at start is not held", got)
	}
	write(t, filepath.Join(dir, "b.yaml"), strings.TrimSuffix(rule("b", "value.v == 1"), "\n"))
	h.none(incompleteHold * 6 / 10)
	if got := h.next().summary(); got != "a[value.v == 1] b[value.v == 1]" {
		t.Fatalf("after the hold: %q", got)
	}
}
