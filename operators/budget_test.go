package operators

import (
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
