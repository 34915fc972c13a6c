package operators

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// pipe feeds what one step emits into the next, and records dead letters.
type pipe struct {
	next  Step
	sink  *deadSink
	emits int
}

func (p *pipe) Emit(r *Record) {
	p.emits++
	p.next.Process(r, p.sink)
}
func (p *pipe) DeadLetter(r *Record, reason Reason, err error) { p.sink.DeadLetter(r, reason, err) }

type deadSink struct {
	emits int
	dead  []string
}

func (d *deadSink) Emit(*Record) { d.emits++ }
func (d *deadSink) DeadLetter(_ *Record, reason Reason, err error) {
	d.dead = append(d.dead, fmt.Sprintf("%s: %v", reason, err))
}

func boundExpr(t testing.TB, src string) *Expr {
	t.Helper()
	e, err := CompileExpr(src, []string{"item"})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// Issue 25, finding 9: `explode` of 10k items before a sliding window with
// a 1 ms slide ran out of memory: each copy updates 10000 windows, keyed
// by the item each its own. The copies of one record share its fan-out
// budget (limits.max_fanout, 100000): the copy that would go over is a
// dead letter with reason budget, the rest of that record's fan-out is
// dropped, and the window holds at most the budget's worth of states.
func TestExplodeIntoSlidingWindowIsBounded(t *testing.T) {
	items := make([]any, 50)
	for i := range items {
		items[i] = fmt.Sprint("sku", i)
	}
	w := NewWindow(WindowSpec{Kind: "sliding", Size: 10 * time.Second, Slide: time.Millisecond,
		Key: boundExpr(t, "item"), Aggregates: []Aggregate{{Name: "n", Func: AggCount}}})
	ex := &explode{each: boundExpr(t, "value.items"), as: "item"}
	sink := &deadSink{}
	p := &pipe{next: w, sink: sink}

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ex.Process(&Record{Offset: 1, EventTime: 1_700_000_000_000, Value: map[string]any{"items": items}}, p)
	runtime.ReadMemStats(&after)

	if len(sink.dead) != 1 || !strings.HasPrefix(sink.dead[0], "budget: window: fan-out budget exceeded") || !strings.Contains(sink.dead[0], "limits.max_fanout") {
		t.Fatalf("dead letters %q, want one with reason budget naming limits.max_fanout", sink.dead)
	}
	// The explode's 50 copies count, then 10000 windows each: nine copies
	// fit in 100000.
	if open := w.(*window).open; open != 90_000 {
		t.Errorf("%d window states open, want the 9 copies' 90000", open)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 128<<20 {
		t.Errorf("allocated %d bytes for one record", grew)
	}
	// The next record has a budget of its own.
	sink.dead = nil
	ex.Process(&Record{Offset: 2, EventTime: 1_700_000_000_000, Value: map[string]any{"items": items[:5]}}, p)
	if len(sink.dead) != 0 {
		t.Fatalf("the next record: %q", sink.dead)
	}
}

// Two explodes multiply: 400 × 400 copies of one record are over the
// budget at the second explode, before its copies are made.
func TestExplodeOfExplodeIsBounded(t *testing.T) {
	defer SetLimits(Limits{})
	SetLimits(Limits{FanOut: 10_000})
	list := make([]any, 400)
	for i := range list {
		list[i] = float64(i)
	}
	inner := &explode{each: boundExpr(t, "value.items"), as: "y"}
	sink := &deadSink{}
	p := &pipe{next: inner, sink: sink}
	outer := &explode{each: boundExpr(t, "value.items"), as: "item"}
	outer.Process(&Record{Value: map[string]any{"items": list}}, p)
	// 400 + 400·24 = 10000: the 25th inner explode's 400 copies go over.
	if len(sink.dead) != 1 || !strings.HasPrefix(sink.dead[0], "budget: explode y: fan-out budget exceeded") {
		t.Fatalf("dead letters %q", sink.dead)
	}
	if sink.emits != 400*24 {
		t.Errorf("%d records out, want %d", sink.emits, 400*24)
	}
}

// The open-windows budget bounds the state of one window step whatever
// the records: past it, a record that would open more states is a dead
// letter with reason budget, and records of open windows still count.
func TestOpenWindowsAreBounded(t *testing.T) {
	defer SetLimits(Limits{})
	SetLimits(Limits{OpenWindows: 1000})
	w := NewWindow(WindowSpec{Kind: "sliding", Size: time.Second, Slide: 10 * time.Millisecond,
		Key: boundExpr(t, "value.k"), Aggregates: []Aggregate{{Name: "n", Func: AggCount}}})
	sink := &deadSink{}
	for i := range 20 {
		w.Process(&Record{Offset: int64(i), EventTime: 5000, Value: map[string]any{"k": fmt.Sprint(i)}}, sink)
	}
	if len(sink.dead) != 10 || !strings.Contains(sink.dead[0], "limits.max_open_windows") || !strings.HasPrefix(sink.dead[0], "budget: ") {
		t.Fatalf("%d dead letters, want 10 (100 windows per key, 1000 states): %q", len(sink.dead), sink.dead)
	}
	// An existing key adds no state: still accepted.
	sink.dead = nil
	w.Process(&Record{Offset: 99, EventTime: 5000, Value: map[string]any{"k": "3"}}, sink)
	if len(sink.dead) != 0 {
		t.Fatalf("a record of open windows refused: %q", sink.dead)
	}
	// Closing windows frees their states.
	w.(Timed).Advance(1_000_000, sink)
	if open := w.(*window).open; open != 0 {
		t.Errorf("%d states open after every window closed", open)
	}
}

// Told the windows after it (as the route builder tells it), explode
// refuses the whole record before making a copy: no window changes.
func TestExplodeChargesTheWindowsAfterIt(t *testing.T) {
	items := make([]any, 50)
	for i := range items {
		items[i] = fmt.Sprint("sku", i)
	}
	w := NewWindow(WindowSpec{Kind: "sliding", Size: 10 * time.Second, Slide: time.Millisecond,
		Key: boundExpr(t, "item"), Aggregates: []Aggregate{{Name: "n", Func: AggCount}}})
	ex := &explode{each: boundExpr(t, "value.items"), as: "item"}
	var s Step = ex
	s.(FanOutSetter).SetFanOutAfter(WindowsPerRecord(10*time.Second, time.Millisecond))
	sink := &deadSink{}
	ex.Process(&Record{EventTime: 1_700_000_000_000, Value: map[string]any{"items": items}}, &pipe{next: w, sink: sink})
	if len(sink.dead) != 1 || !strings.Contains(sink.dead[0], "each updating 10000 windows after it") || !strings.HasPrefix(sink.dead[0], "budget: ") {
		t.Fatalf("dead letters %q", sink.dead)
	}
	if open := w.(*window).open; open != 0 {
		t.Errorf("%d window states opened by a refused record", open)
	}
	// Nine items fit: 9 × 10001 < 100000; their windows are paid, so the
	// window does not charge them again.
	sink.dead = nil
	ex.Process(&Record{EventTime: 1_700_000_000_000, Value: map[string]any{"items": items[:9]}}, &pipe{next: w, sink: sink})
	if len(sink.dead) != 0 || w.(*window).open != 90_000 {
		t.Fatalf("nine items: dead %q, %d states", sink.dead, w.(*window).open)
	}
}
