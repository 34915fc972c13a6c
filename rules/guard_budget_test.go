package rules

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// Issue 25, finding 4 and "a guard check has no time bound": with a guard
// `len(repeat(value, 1000000)) > 0`, one 200 KB record was a fatal
// out-of-memory; `len(split(value, ",")) < 100` on a record of commas
// grew the process by a gigabyte; a nested `all` took 33 ms per record.
// Each record is now refused by the check that went over its budget,
// with a message naming the limit, having allocated next to nothing.
func TestGuardCheckBudgets(t *testing.T) {
	g := loadGuardText(t, `guard: hostile
topic: t
format: raw
checks:
  - check: len(repeat(value, 1000000)) > 0
    name: repeat
`).Guard
	gs := loadGuardText(t, `guard: hostile-split
topic: t
format: raw
checks:
  - check: len(split(value, ",")) < 100
    name: split
`).Guard
	gn := loadGuardText(t, `guard: hostile-nested
topic: t
checks:
  - check: all(value.items, {all(value.items, {# >= 0})})
    name: nested
`).Guard

	items := "[" + strings.Repeat("1,", 3000) + "1]"
	for _, c := range []struct {
		g     *Guard
		value string
		check string
		want  string
	}{
		{g, strings.Repeat("v", 200_000), "repeat", "limits.expr_memory_bytes"},
		{gs, strings.Repeat(",", 4<<20), "split", "limits.expr_memory_bytes"},
		{gn, `{"items":` + items + `}`, "nested", "limits.expr_"},
	} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		start := time.Now()
		check, msg, ok := c.g.Check(produced("t", c.value))
		d := time.Since(start)
		runtime.ReadMemStats(&after)
		if ok || check != c.check {
			t.Fatalf("%s: check=%q ok=%v msg=%q, want check %q to refuse the record", c.check, check, ok, msg, c.check)
		}
		if !strings.Contains(msg, "budget exceeded") || !strings.Contains(msg, c.want) {
			t.Errorf("%s: message %q does not say which budget", c.check, msg)
		}
		if strings.Contains(msg, "vvvv") || strings.Contains(msg, ",,,,") {
			t.Errorf("%s: message %q carries the record's value", c.check, msg)
		}
		// The value and its decoding are a few MB; what the check would
		// have built is 200 GB, 64 MB and 9M iterations.
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 24<<20 {
			t.Errorf("%s: allocated %d bytes checking one record", c.check, grew)
		}
		if d > 2*time.Second {
			t.Errorf("%s: took %v", c.check, d)
		}
	}
	// A well-behaved record of the same guards passes.
	if _, msg, ok := gs.Check(produced("t", "a,b,c")); !ok {
		t.Errorf("a,b,c refused: %s", msg)
	}
	if _, msg, ok := gn.Check(produced("t", `{"items":[1,2,3]}`)); !ok {
		t.Errorf("three items refused: %s", msg)
	}
}

// Issue 25, finding 4: `set: {n: len(repeat(repeat("x", 999999),
// 1000000))}` passed `rtproxy check`. An expression that reads nothing of
// the record and goes over the budget is refused at check; one that reads
// the record is bounded at run time and passes.
func TestCheckRefusesConstantOverBudget(t *testing.T) {
	got := loadErrors(t, map[string]string{"r.yaml": base + "steps:\n  - set: {n: 'len(repeat(repeat(\"x\", 999999), 1000000))'}\n"})
	if len(got) != 1 || !strings.HasPrefix(got[0], "r.yaml:7:14: set n goes over the expression budget whatever the record holds") || !strings.Contains(got[0], "limits.expr_memory_bytes") {
		t.Errorf("errors %q", got)
	}
	got = loadErrors(t, map[string]string{"r.yaml": base + "steps:\n  - filter: 'len(1..2000000000) > 0'\n"})
	if len(got) != 1 || !strings.Contains(got[0], "goes over the expression budget") {
		t.Errorf("a range of 2e9: errors %q", got)
	}
	for _, ok := range []string{
		"  - set: {n: 'len(repeat(value.s, 1000000))'}\n",
		"  - set: {n: 'len(repeat(\"x\", 1000))'}\n",
		"  - filter: 'now() != nil'\n",
	} {
		if got := loadErrors(t, map[string]string{"r.yaml": base + "steps:\n" + ok}); len(got) != 0 {
			t.Errorf("%s refused: %q", ok, got)
		}
	}
}
