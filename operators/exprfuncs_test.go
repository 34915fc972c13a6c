package operators

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/expr-lang/expr"
)

// budgetValue is the record value the budget tests evaluate against.
func budgetValue(n int) map[string]any {
	items := make([]any, n)
	strs := make([]any, n)
	obj := map[string]any{}
	for i := range items {
		items[i] = float64(i % 97)
		strs[i] = fmt.Sprintf("s%d<&>", i)
		obj[fmt.Sprint("k", i)] = float64(i)
	}
	return map[string]any{
		"s": strings.Repeat("ab,c ", n), "items": items, "strs": strs, "obj": obj,
		"nested": []any{items, []any{items, strs}}, "json": "[" + strings.Repeat("1,", n) + "1]",
		"b64": "YWJj", "pairs": []any{[]any{"a", 1.0}, []any{"b", 2.0}},
	}
}

// Every budgeted built-in, with an expression that makes it work on its
// whole argument.
var budgetedCalls = map[string]string{
	"repeat":     `repeat(value.s, 3)`,
	"split":      `split(value.s, ",")`,
	"splitAfter": `splitAfter(value.s, ",", 5)`,
	"replace":    `replace(value.s, "a", "xyz")`,
	"join":       `join(value.strs, "--")`,
	"upper":      `upper(value.s)`,
	"lower":      `lower(value.s)`,
	"toJSON":     `toJSON(value)`,
	"string":     `string(value.obj)`,
	"fromJSON":   `fromJSON(value.json)`,
	"toBase64":   `toBase64(value.s)`,
	"fromBase64": `fromBase64(toBase64(value.s))`,
	"keys":       `keys(value.obj)`,
	"values":     `values(value.obj)`,
	"toPairs":    `toPairs(value.obj)`,
	"fromPairs":  `fromPairs(value.pairs)`,
	"reverse":    `reverse(value.items)`,
	"uniq":       `uniq(value.items)`,
	"concat":     `concat(value.items, value.strs, value.items)`,
	"flatten":    `flatten(value.nested)`,
	"sort":       `sort(value.strs)`,
	"median":     `median(value.items)`,
}

// TestBudgetedBuiltinsAgreeWithExpr: the budgeted built-ins give exactly
// what expr-lang's own give (compiled without the budget, as a
// reference), for every one of them and a few mixed expressions.
func TestBudgetedBuiltinsAgreeWithExpr(t *testing.T) {
	if len(budgetedCalls) != len(budgeted) {
		t.Fatalf("%d calls tested, %d built-ins budgeted", len(budgetedCalls), len(budgeted))
	}
	extra := []string{
		`len(split(value.s, ",")) + len(split("", ""))`, `split("a,b,c", ",", 2)`, `split("a,b,c", ",", -1)`, `split("a,b", ",", 0)`,
		`replace("aaa", "a", "b", 2)`, `replace("abc", "", "-")`, `join(["a", "b"])`, `trim(upper(" x "))`,
		`map(value.items, # * 2)`, `filter(value.items, # > 50)`, `reduce(value.items, #acc + #, 0)`,
		`sortBy(value.strs, #)[0]`, `sortBy(value.items, #, "desc")[0]`, `groupBy(value.items, int(#) % 3)[0][1]`, `count(value.items, # > 5)`,
		`sum(value.items)`, `sum(value.items, # * 2)`, `"x" matches "^x$"`, `value.s matches ("a" + "b")`, `value.s matches "^ab"`,
		`any(value.strs, # matches "s1.*")`, `toJSON(map(value.items, ({"x": #})))`, `string(1.5) + string(nil) + string(true)`,
		`first(sort(value.items))`, `uniq([1, 1.0, "1", 2])`, `let x = repeat("a", 2); x + x`, `reduce(1..3, #acc + string(#), "")`,
		`findLast(value.items, # < 10)`, `one(value.items, # == 96)`, `none(value.items, # > 1000)`,
	}
	srcs := extra
	for _, src := range budgetedCalls {
		srcs = append(srcs, src)
	}
	value := budgetValue(300)
	for _, src := range srcs {
		e, err := CompileExpr(src, nil)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		got, err := e.Eval(&Record{Value: value})
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		ref, err := expr.Compile(src, expr.Env(map[string]any{"value": value}))
		if err != nil {
			t.Fatalf("reference %s: %v", src, err)
		}
		want, err := expr.Run(ref, map[string]any{"value": value})
		if err != nil {
			t.Fatalf("reference %s: %v", src, err)
		}
		if !sameUnordered(got, want) {
			t.Errorf("%s = %.200v, expr gives %.200v", src, got, want)
		}
	}
}

// sameUnordered is reflect.DeepEqual, except that lists from a map's keys
// (whose order Go randomizes) compare as multisets.
func sameUnordered(a, b any) bool {
	if reflect.DeepEqual(a, b) {
		return true
	}
	la, ok1 := a.([]any)
	lb, ok2 := b.([]any)
	if !ok1 || !ok2 || len(la) != len(lb) {
		if pa, ok := a.([][2]any); ok {
			pb, _ := b.([][2]any)
			return len(pa) == len(pb) && sameUnordered(fmt.Sprint(len(pa)), fmt.Sprint(len(pb)))
		}
		return false
	}
	count := map[string]int{}
	for _, x := range la {
		count[fmt.Sprintf("%T %v", x, x)]++
	}
	for _, x := range lb {
		count[fmt.Sprintf("%T %v", x, x)]--
	}
	for _, n := range count {
		if n != 0 {
			return false
		}
	}
	return true
}

// TestEveryBudgetedBuiltinIsCharged: under a 64 KiB budget each budgeted
// built-in, on arguments that make it build more, is refused with its
// name in the error, having allocated less than it would have built.
func TestEveryBudgetedBuiltinIsCharged(t *testing.T) {
	defer SetLimits(Limits{})
	SetLimits(Limits{ExprBytes: 64 << 10, ExprSteps: 50_000, ExprTime: time.Minute})
	value := budgetValue(20_000)
	pairs := make([]any, 5000)
	for i := range pairs {
		pairs[i] = []any{fmt.Sprint(i), float64(i)}
	}
	value["pairs"] = pairs
	for name, src := range budgetedCalls {
		if name == "splitAfter" {
			src = `splitAfter(value.s, ",")`
		}
		t.Run(name, func(t *testing.T) {
			err := evalOver(t, src, value, 8<<20)
			if !strings.Contains(err.Error(), "limits.expr_") {
				t.Errorf("%s: %v does not name its limit", src, err)
			}
		})
	}
	// `+` on strings counts against the same budget, and a run-time
	// pattern of `matches` too.
	evalOver(t, `len(value.s + value.s + value.s) > 0`, value, 8<<20)
	evalOver(t, `value.s matches value.s`, value, 8<<20)
	evalOver(t, `sortBy(value.items, #)`, value, 8<<20)
}

// FuzzBudgetedBuiltins: for any string, count and separators the budgeted
// string built-ins give expr's own answer, or a budget error when (and
// only when) the answer is over the budget.
func FuzzBudgetedBuiltins(f *testing.F) {
	f.Add("a,b,,c", ",", "xy", int64(3))
	f.Add("", "", "", int64(0))
	f.Add("ééé", "", "ab", int64(-1))
	f.Add(strings.Repeat("ab", 100), "b", strings.Repeat("z", 50), int64(1000))
	defer SetLimits(Limits{})
	SetLimits(Limits{ExprBytes: 1 << 16, ExprTime: time.Minute})
	srcs := []string{
		`repeat(value.s, value.n)`, `split(value.s, value.sep)`, `split(value.s, value.sep, value.n)`,
		`splitAfter(value.s, value.sep, value.n)`, `replace(value.s, value.sep, value.t)`, `replace(value.s, value.sep, value.t, value.n)`,
		`join(split(value.s, value.sep), value.t)`, `upper(value.s) + lower(value.t)`, `toBase64(value.s)`,
		`toJSON(split(value.s, value.sep))`, `value.s matches value.t`,
	}
	type compiled struct{ e, ref *Expr }
	var progs []compiled
	for _, src := range srcs {
		e, err := CompileExpr(src, nil)
		if err != nil {
			f.Fatal(err)
		}
		ref, err := expr.Compile(src, expr.Env(recordEnv{}))
		if err != nil {
			f.Fatal(err)
		}
		progs = append(progs, compiled{e, &Expr{Source: src, program: ref}})
	}
	f.Fuzz(func(t *testing.T, s, sep, tt string, n int64) {
		if n > 1<<20 || n < -1<<20 {
			n %= 1 << 20
		}
		if len(s)*int(max(n, 1)) > 1<<24 {
			return // the reference would build it
		}
		value := map[string]any{"s": s, "sep": sep, "t": tt, "n": n}
		for _, p := range progs {
			got, err := p.e.Eval(&Record{Value: value})
			want, werr := p.ref.evalVM(&Record{Value: value})
			switch {
			case IsBudget(err):
				// Refused: the reference must have built something big,
				// or failed itself.
				if werr == nil && approxSize(want) < 1<<12 {
					t.Fatalf("%s on %q %q %q %d: refused (%v), but expr gives a small %.100v", p.e.Source, s, sep, tt, n, err, want)
				}
			case (err == nil) != (werr == nil):
				t.Fatalf("%s on %q %q %q %d: %v, expr: %v", p.e.Source, s, sep, tt, n, err, werr)
			case err == nil && !reflect.DeepEqual(got, want):
				t.Fatalf("%s on %q %q %q %d = %.100v, expr gives %.100v", p.e.Source, s, sep, tt, n, got, want)
			}
		}
	})
}

// approxSize is about how many bytes v takes.
func approxSize(v any) int {
	switch x := v.(type) {
	case string:
		return len(x)
	case []string:
		n := 16 * len(x)
		for _, s := range x {
			n += len(s)
		}
		return n
	}
	return 0
}
