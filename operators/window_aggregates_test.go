package operators

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// aggregateScenario runs a tumbling and a sliding window with every
// aggregate function over values of each kind: numbers (float and int),
// strings, objects, booleans, missing fields, and a string after numbers
// (a dead letter). It returns each snapshot, byte for byte, the rows the
// windows emit when they close, and the same after a restore.
func aggregateScenario(t *testing.T) string {
	t.Helper()
	aggs := []struct{ name, fn, arg string }{
		{"n", "count", ""},
		{"total", "sum", "value.n"},
		{"lo", "min", "value.v"},
		{"hi", "max", "value.v"},
		{"mean", "avg", "value.n"},
		{"f", "first", "value.s"},
		{"l", "last", "value.s"},
		{"d", "count_distinct", "value.s"},
	}
	key, err := CompileExpr("value.user", nil)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, kind := range []string{"tumbling", "sliding"} {
		spec := WindowSpec{Kind: kind, Size: 1000 * 1e6, Slide: 500 * 1e6, Key: key}
		for _, a := range aggs {
			agg := Aggregate{Name: a.name, Func: AggFunc(a.fn)}
			if a.arg != "" {
				if agg.Arg, err = CompileExpr(a.arg, nil); err != nil {
					t.Fatal(err)
				}
			}
			spec.Aggregates = append(spec.Aggregates, agg)
		}
		step := NewWindow(spec)
		var c collect
		for i, v := range []map[string]any{
			{"user": "a", "n": 3.5, "v": 2.0, "s": "x"},
			{"user": "a", "n": int64(-1), "v": -7.25, "s": "y"},
			{"user": "a", "n": 2, "v": 9, "s": map[string]any{"k": []any{1.0, "z"}}},
			{"user": "a", "v": "late string", "s": "w"},
			{"user": "b", "v": "pear", "s": true},
			{"user": "b", "n": "NaN", "v": "apple", "s": 1.0},
			{"user": "b", "v": "quince", "s": int64(1)},
			{"user": "b", "v": 3.0, "s": "1"},
			{"user": "b", "v": []any{1.0}},
			{"user": "c"},
		} {
			step.Process(&Record{EventTime: int64(90*i + 40*(i%3)), Value: v, Offset: int64(i)}, &c)
		}
		var sw snapWriter
		if err := step.(Stateful).Snapshot(&sw); err != nil {
			t.Fatal(err)
		}
		for i := range sw.keys {
			fmt.Fprintf(&b, "%s snapshot %s %s\n", kind, hex.EncodeToString(sw.keys[i]), hex.EncodeToString(sw.vals[i]))
		}
		restored := NewWindow(spec)
		if err := restored.(Stateful).Restore(&sw); err != nil {
			t.Fatal(err)
		}
		step.(Timed).Advance(5000, &c)
		b.WriteString(c.String())
		var again collect
		restored.(Timed).Advance(5000, &again)
		fmt.Fprintf(&b, "%s after restore:\n%s", kind, again.String())
	}
	return b.String()
}

// TestWindowAggregatesPinned: every aggregate's checks, values and
// snapshot bytes stay what testdata/window_aggregates.txt holds (written
// before the aggregates became one type per function). A change to the
// snapshot layout must be a deliberate one: it breaks restoring the
// checkpoints of running routes.
func TestWindowAggregatesPinned(t *testing.T) {
	got := aggregateScenario(t)
	p := filepath.Join("testdata", "window_aggregates.txt")
	if os.Getenv("RTPROXY_WRITE_PIN") != "" {
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("window aggregates differ from %s:\n--- got\n%s--- want\n%s", p, got, want)
	}
}

// TestWindowUnknownAggregate: a hand-built spec with a function that is
// not an aggregate (the analyzer refuses one) keeps nothing, gives null,
// and cannot be snapshotted.
func TestWindowUnknownAggregate(t *testing.T) {
	arg, _ := CompileExpr("value.v", nil)
	step := NewWindow(WindowSpec{Kind: "tumbling", Size: 1e9, Aggregates: []Aggregate{{Name: "m", Func: "median", Arg: arg}}})
	var c collect
	step.Process(&Record{EventTime: 5, Value: map[string]any{"v": 1.0}}, &c)
	var sw snapWriter
	err := step.(Stateful).Snapshot(&sw)
	if err == nil || err.Error() != `window snapshot: m: unknown aggregate "median"` {
		t.Errorf("snapshot: %v", err)
	}
	step.(Timed).Advance(5000, &c)
	if got := c.String(); !strings.Contains(got, `"m":null`) || strings.Contains(got, "dead") {
		t.Errorf("rows: %s", got)
	}
}
