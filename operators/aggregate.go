package operators

import (
	"slices"
	"strings"
)

// AggFunc is an aggregate function of window.aggregate.
type AggFunc string

const (
	AggCount         AggFunc = "count"          // records: int64
	AggSum           AggFunc = "sum"            // float64; 0 for none
	AggMin           AggFunc = "min"            // float64 or string; null for none
	AggMax           AggFunc = "max"            // float64 or string; null for none
	AggAvg           AggFunc = "avg"            // float64; null for none
	AggFirst         AggFunc = "first"          // value at the smallest event time
	AggLast          AggFunc = "last"           // value at the largest event time
	AggCountDistinct AggFunc = "count_distinct" // exact: int64
)

// aggregateFuncs is the one list of aggregate functions, in the order the
// docs and the analyzer's messages name them, with the number of
// arguments each takes. The analyzer (rules/) reads it through
// AggregateFuncs, Arity and IsAggregate.
var aggregateFuncs = []aggDef{
	{AggCount, 0},
	{AggSum, 1},
	{AggMin, 1},
	{AggMax, 1},
	{AggAvg, 1},
	{AggFirst, 1},
	{AggLast, 1},
	{AggCountDistinct, 1},
}

type aggDef struct {
	fn    AggFunc
	arity int
}

// AggregateFuncs returns the aggregate functions, in the order the docs
// name them.
func AggregateFuncs() []AggFunc {
	out := make([]AggFunc, len(aggregateFuncs))
	for i, a := range aggregateFuncs {
		out[i] = a.fn
	}
	return out
}

// Arity is the number of arguments fn takes: 0 for count(), 1 for the
// others, and -1 when fn is not an aggregate function.
func (fn AggFunc) Arity() int {
	i := slices.IndexFunc(aggregateFuncs, func(a aggDef) bool { return a.fn == fn })
	if i < 0 {
		return -1
	}
	return aggregateFuncs[i].arity
}

// Usage is how fn is written in a rule file, with x for its argument:
// "count()", "sum(x)".
func (fn AggFunc) Usage() string {
	return string(fn) + "(" + strings.Repeat("x", max(fn.Arity(), 0)) + ")"
}

// IsAggregate reports whether name is an aggregate function (for the
// analyzer, which refuses aggregates outside window.aggregate).
func IsAggregate(name string) bool {
	return AggFunc(name).Arity() >= 0
}
