package operators

import (
	"strings"
	"testing"
)

// TestWindowResumeKeepsClosedWindowsClosed plays a crash after a window
// closed past the last snapshot: Resume with the close journal drops the
// window from the restored state without a row, skips the replayed record
// that was already counted in it, dead-letters a new record behind it as
// late, and the next window closes with exactly its own records.
func TestWindowResumeKeepsClosedWindowsClosed(t *testing.T) {
	spec := windowSpec(t, "tumbling", 1000, 1000, false)
	rec := func(p int32, off, ts int64, v float64) *Record {
		return &Record{Partition: p, Offset: off, EventTime: ts, Value: map[string]any{"user": "u", "v": v, "s": "x"}}
	}
	a := NewWindow(spec)
	tm := a.(interface {
		ClosesAt(int64) bool
		Advance(int64, Emitter)
	})
	var before collect
	a.Process(rec(0, 0, 100, 1), &before)
	a.Process(rec(1, 0, 1100, 2), &before)
	tm.Advance(50, &before)
	var snap snapWriter
	if err := a.(Stateful).Snapshot(&snap); err != nil {
		t.Fatal(err)
	}
	if tm.ClosesAt(900) {
		t.Fatal("ClosesAt(900) with windows ending at 1000 and 2000: want false")
	}
	if !tm.ClosesAt(1050) {
		t.Fatal("ClosesAt(1050) with a window ending at 1000: want true")
	}
	tm.Advance(1050, &before)
	if len(before.out) != 1 || before.out[0].Window.Start != 0 || before.out[0].Value.(map[string]any)["n"] != int64(1) {
		t.Fatalf("before the crash: %s", before.String())
	}

	// The crash: restore the snapshot (window [0,1000) is open in it) and
	// the journal written at 1050 with p0 and p1 applied up to offset 0.
	b := NewWindow(spec)
	if err := b.(Stateful).Restore(&snap); err != nil {
		t.Fatal(err)
	}
	b.(interface {
		Resume(int64, map[int32]int64)
	}).Resume(1050, map[int32]int64{0: 0, 1: 0})
	if n := b.(*window).OpenWindows(); n != 1 {
		t.Fatalf("open windows after Resume: %d, want 1 ([1000,2000) only)", n)
	}
	if b.(*window).ClosesAt(1050) {
		t.Fatal("ClosesAt(1050) after Resume(1050): want false")
	}
	var after collect
	b.Process(rec(0, 0, 100, 1), &after) // replayed, counted before the crash
	if len(after.lines) != 0 {
		t.Fatalf("replayed record already counted: %s, want nothing", after.String())
	}
	b.Process(rec(0, 1, 500, 7), &after) // new, behind the closed window
	if len(after.lines) != 1 || !strings.HasPrefix(after.lines[0], "dead reason=late") {
		t.Fatalf("new record behind a closed window: %s, want one late dead letter", after.String())
	}
	b.Process(rec(1, 1, 1500, 3), &after)
	b.(*window).Advance(2000, &after)
	if len(after.out) != 1 {
		t.Fatalf("after the replay: %s, want one row", after.String())
	}
	row := after.out[0].Value.(map[string]any)
	if after.out[0].Window.Start != 1000 || row["n"] != int64(2) || row["total"] != 5.0 {
		t.Fatalf("window [1000,2000): %s, want n=2 total=5", after.String())
	}
}
