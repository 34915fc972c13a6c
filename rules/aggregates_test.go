package rules

import (
	"fmt"
	"strings"
	"testing"

	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/parser"

	"github.com/rtproxy/rtproxy/operators"
)

// TestAggregatesAreOperators: the analyzer knows the aggregate functions
// from operators' one list, each with its own number of arguments, and
// nothing else.
func TestAggregatesAreOperators(t *testing.T) {
	fns := operators.AggregateFuncs()
	if len(fns) != 8 {
		t.Fatalf("operators lists %d aggregate functions: %v", len(fns), fns)
	}
	var agg strings.Builder
	for i, fn := range fns {
		arg := ""
		if fn.Arity() == 1 {
			arg = "value.a"
		}
		fmt.Fprintf(&agg, "        a%d: %s(%s)\n", i, fn, arg)
	}
	file := base + "steps:\n  - window:\n      kind: tumbling\n      size: 1m\n      aggregate:\n" + agg.String()
	if errs := loadErrors(t, map[string]string{"r.yaml": file}); errs != nil {
		t.Fatalf("every aggregate of operators.AggregateFuncs in one window is refused:\n%s", strings.Join(errs, "\n"))
	}
	want := "r.yaml:11:12: aggregate m must be one aggregate call: count(), sum(x), min(x), max(x), avg(x), first(x), last(x) or count_distinct(x) (near `m`)"
	got := loadErrors(t, map[string]string{"r.yaml": base + "steps:\n  - window:\n      kind: tumbling\n      size: 1m\n      aggregate:\n        m: ''\n"})
	if strings.Join(got, "\n") != want {
		t.Errorf("errors:\n got: %s\nwant: %s", strings.Join(got, "\n      "), want)
	}
	for _, name := range []string{"mean", "median", "COUNT", "len"} {
		file := base + "steps:\n  - window:\n      kind: tumbling\n      size: 1m\n      aggregate:\n        m: " + name + "(value.a)\n"
		if errs := loadErrors(t, map[string]string{"r.yaml": file}); errs == nil {
			t.Errorf("%s(value.a) is taken as an aggregate", name)
		}
	}
}

// TestAggregateCallShapes pins which calls are aggregates outside
// window.aggregate: the aggregate functions expr-lang lacks in any form,
// the ones it has only with the aggregate's own number of arguments.
// (An expr-lang upgrade that adds avg or count_distinct fails here.)
func TestAggregateCallShapes(t *testing.T) {
	for src, want := range map[string]bool{
		"count()": true, "count(value.items, #.ok)": false,
		"sum(value.a)": true, "sum(value.items, #.price)": false,
		"min(value.a)": true, "min(1, 2, 3)": false,
		"max(value.a)": true, "max(value.a, value.b)": false,
		"first(value.a)": true, "last(value.a)": true,
		"avg(value.a)": true, "avg(value.a, value.b)": true, "avg()": true,
		"count_distinct(value.a)": true, "count_distinct()": true,
		"mean(value.a)": false, "len(value.a)": false,
	} {
		// As checkTree: what does not parse with the aggregates as plain
		// calls (a `#` predicate) is left to expr-lang, and so is a call
		// that parses as one of its builtins.
		got := false
		if tree, err := parser.ParseWithConfig(src, aggConfig()); err == nil {
			if call, ok := tree.Node.(*ast.CallNode); ok {
				_, got = isAggregateCall(call)
			}
		}
		if got != want {
			t.Errorf("isAggregateCall(%s) = %v, want %v", src, got, want)
		}
	}
}
