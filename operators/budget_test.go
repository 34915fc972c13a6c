package operators

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/expr-lang/expr"
)

// A rule cannot grow a string without bound: `+` that would build more
// than MaxStringBytes fails the evaluation (the record becomes a dead
// letter) instead of driving the process out of memory (issue 10).
func TestStringConcatenationIsBounded(t *testing.T) {
	e, err := CompileExpr(`len(reduce(1..40, #acc + #acc, "x")) > 0`, nil, expr.AsBool())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = e.Eval(&Record{Value: map[string]any{}})
	if err == nil || !strings.Contains(err.Error(), "over the limit") {
		t.Fatalf("got %v, want the string limit", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the refusal took %v", d)
	}

	// `+` keeps its meaning everywhere else.
	for src, want := range map[string]any{
		`value.a + value.b`:                    3.0,
		`value.s + "-" + value.t`:              "x-y",
		`timestamp + 1000`:                     1001, // expr's own +, unpatched
		`1 + 2`:                                3,
		`reduce(1..3, #acc + #, 0)`:            6,
		`value.a + 1`:                          2.0,
		`len(reduce(1..10, #acc + #acc, "x"))`: 1024,
	} {
		e, err := CompileExpr(src, nil)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		got, err := e.Eval(&Record{Timestamp: 1, Value: map[string]any{"a": 1.0, "b": 2.0, "s": "x", "t": "y"}})
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if got != want {
			t.Errorf("%s = %v (%T), want %v (%T)", src, got, got, want, want)
		}
	}
	if _, err := CompileExpr(`"a" + 1`, nil); err == nil {
		t.Error(`"a" + 1 compiles; the static type mismatch must stay a compile error`)
	}
}

// BenchmarkAddOperands compares `value.a + value.b` (two JSON numbers, no
// static type) compiled as rules are, through rtproxy_add__ with the
// string bound, with the same expression compiled without the bound
// (expr's own opcode, as before).
func BenchmarkAddOperands(b *testing.B) {
	const src = `value.a + value.b`
	r := &Record{Value: map[string]any{"a": 1.5, "b": 2.5}}
	bounded, err := CompileExpr(src, nil)
	if err != nil {
		b.Fatal(err)
	}
	p, err := expr.Compile(src, expr.Env(recordEnv{}), fetchFunc, expr.Patch(fetchPatcher{}))
	if err != nil {
		b.Fatal(err)
	}
	unbounded := &Expr{Source: src, program: p}
	for _, c := range []struct {
		name string
		e    *Expr
	}{{"bounded", bounded}, {"expr's own +", unbounded}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := c.e.Eval(r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// allocDuring returns the bytes allocated while f ran.
func allocDuring(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// evalOver compiles src as a route expression, evaluates it on a record
// whose value is value, and requires a budget error allocating less than
// maxAlloc on the way.
func evalOver(t *testing.T, src string, value any, maxAlloc uint64, opts ...expr.Option) error {
	t.Helper()
	e, err := CompileExpr(src, nil, opts...)
	if err != nil {
		t.Fatalf("%s: %v", src, err)
	}
	var got any
	alloc := allocDuring(func() { got, err = e.Eval(&Record{Value: value}) })
	if err == nil {
		t.Fatalf("%s = %T (no error), want the expression budget to refuse it", src, got)
	}
	if !IsBudget(err) || !errors.Is(err, ErrBudget) {
		t.Fatalf("%s: %v, want an error wrapping ErrBudget", src, err)
	}
	if evalReason(err) != ReasonBudget {
		t.Fatalf("%s: reason %s, want budget", src, evalReason(err))
	}
	if alloc > maxAlloc {
		t.Fatalf("%s allocated %d bytes before refusing, want at most %d: the budget must be charged before allocating", src, alloc, maxAlloc)
	}
	return err
}

// Issue 25, finding 4: `repeat` allocated len(s) × n before expr's budget
// saw it. With one 200 KB record, `len(repeat(value, 1000000)) > 0` was a
// fatal out-of-memory; 1000 repeats (200 MB) passed. Now the bytes are
// charged before strings.Repeat runs: both are refused having allocated
// next to nothing.
func TestRepeatChargedBeforeAllocating(t *testing.T) {
	big := strings.Repeat("v", 200_000)
	evalOver(t, `len(repeat(value, 1000)) > 0`, big, 1<<20, expr.AsBool())
	err := evalOver(t, `len(repeat(value, 1000000)) > 0`, big, 1<<20, expr.AsBool())
	if !strings.Contains(err.Error(), "repeat would allocate 200000000000 bytes") || !strings.Contains(err.Error(), "limits.expr_memory_bytes") {
		t.Errorf("error %q does not say what and which limit", err)
	}
	// The route step of the finding: passes check, and `rtproxy test`
	// died allocating 1 TB.
	evalOver(t, `len(repeat(repeat("x", 999999), 1000000))`, map[string]any{}, 4<<20)
	// Products that overflow int64 are refused, not wrapped around.
	evalOver(t, `repeat(repeat("xx", 1000), 9223372036854775807)`, map[string]any{}, 1<<20)
}

// Issue 25, finding 4: `split` had no budget; a 50 MB record of commas took
// RSS from 159 MB to 1.14 GB. 4 MB of commas make 4M parts, 64 MB of
// string headers, over the default 32 MiB: refused before splitting.
func TestSplitChargedBeforeAllocating(t *testing.T) {
	commas := strings.Repeat(",", 4<<20)
	evalOver(t, `len(split(value, ",")) < 100`, commas, 1<<20, expr.AsBool())
	evalOver(t, `len(splitAfter(value, ",")) < 100`, commas, 1<<20, expr.AsBool())
	evalOver(t, `len(split(value, "")) < 100`, commas, 1<<20, expr.AsBool())
}

// Issue 25: a guard check had no time bound; a nested `all` took 33 ms
// per record. Every predicate iteration is a step now: 2000 × 2000 are
// over the default million.
func TestNestedPredicatesAreBounded(t *testing.T) {
	items := make([]any, 2000)
	for i := range items {
		items[i] = float64(i)
	}
	// The time bound (a backstop, wall time on a shared machine) out of
	// the way: the step bound is the deterministic one.
	defer SetLimits(Limits{})
	SetLimits(Limits{ExprTime: time.Minute})
	start := time.Now()
	err := evalOver(t, `all(value.items, {all(value.items, {# >= 0})})`, map[string]any{"items": items}, 16<<20, expr.AsBool())
	if !strings.Contains(err.Error(), "limits.expr_steps") {
		t.Errorf("error %q does not name limits.expr_steps", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the refusal took %v", d)
	}
	// 200 × 200 are well within it, and the answer is expr's.
	e, err := CompileExpr(`all(value.items, {all(value.items, {# >= 0})})`, nil, expr.AsBool())
	if err != nil {
		t.Fatal(err)
	}
	if v, err := e.Eval(&Record{Value: map[string]any{"items": items[:200]}}); err != nil || v != true {
		t.Fatalf("got %v, %v", v, err)
	}
}

// The time bound: with the step bound out of the way, an evaluation that
// runs longer than limits.expr_time is stopped, within a small multiple
// of the bound.
func TestEvaluationTimeIsBounded(t *testing.T) {
	defer SetLimits(Limits{})
	SetLimits(Limits{ExprSteps: 1 << 60, ExprTime: 5 * time.Millisecond})
	items := make([]any, 5000)
	for i := range items {
		items[i] = float64(i)
	}
	start := time.Now()
	err := evalOver(t, `all(value.items, {all(value.items, {# >= 0})})`, map[string]any{"items": items}, 16<<20, expr.AsBool())
	d := time.Since(start)
	if !strings.Contains(err.Error(), "limits.expr_time") {
		t.Errorf("error %q does not name limits.expr_time", err)
	}
	if d > time.Second {
		t.Errorf("stopped after %v, bound 5ms", d)
	}
	if BudgetTrips(BudgetExprTime) == 0 {
		t.Error("the expr_time trip was not counted")
	}
}
