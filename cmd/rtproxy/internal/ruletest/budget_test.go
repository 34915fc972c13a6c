package ruletest

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Issue 25, findings 4 and 9, through `rtproxy test`: a route step
// `set: {n: len(repeat(repeat("x", 999999), 1000000))}` passed check and
// the run died allocating 1 TB (check refuses that one now, constant as
// it is; here it reads the "x" from the record); an explode of 10k items before a window
// sliding by 1 ms ran out of memory. Each hostile record is now one dead
// letter with reason budget, the run stays small and quick, and the next
// record goes through.
func TestBudgetsThroughTheRunner(t *testing.T) {
	items := make([]int, 10000)
	for i := range items {
		items[i] = i
	}
	big, _ := json.Marshal(map[string]any{"items": items})
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"repeat.yaml": "route: repeat\nsource: { topic: in }\nsink: { topic: out }\nsteps:\n  - set: {n: 'len(repeat(repeat(value.s, 999999), 1000000))'}\n",
		"repeat.test.yaml": `tests:
  - name: a terabyte
    input:
      - value: {s: x}
    expect:
      dead_letters:
        - {value: {s: x}, reason: budget, step: "0:set"}
`,
		// An expression the pipeline evaluates itself: its budget error is
		// reason budget too.
		"clock.yaml": "route: clock\nsource: { topic: in, event_time: 'len(repeat(value.s, 100000000))' }\nsink: { topic: out }\n",
		"clock.test.yaml": `tests:
  - name: event time over the budget
    input:
      - value: {s: abc}
    expect:
      dead_letters:
        - {value: {s: abc}, reason: budget, step: source}
`,
		"fan.yaml": "route: fan\nsource: { topic: orders }\nsink: { topic: fan.out }\nsteps:\n  - explode: { each: value.items, as: item }\n  - window: { kind: sliding, size: 10s, slide: 1ms, key: item, aggregate: { n: count() } }\n",
		"fan.test.yaml": `tests:
  - name: ten thousand items into ten thousand windows
    input:
      - value: ` + string(big) + `
        timestamp: 1000
    expect:
      dead_letters:
        - {reason: budget, step: "0:explode"}
`,
	})
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	code, out := run(t, Options{Verbose: true}, dir)
	runtime.ReadMemStats(&after)
	if code != ExitPass {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if !strings.Contains(out, "PASS: repeat/a terabyte") || !strings.Contains(out, "PASS: fan/ten thousand") ||
		!strings.Contains(out, "PASS: clock/event time") {
		t.Errorf("report:\n%s", out)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("took %v", d)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 512<<20 {
		t.Errorf("allocated %d MB", grew>>20)
	}
}
