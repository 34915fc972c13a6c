package operators

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
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
// docs and the analyzer's messages name them, each with its
// implementation. The analyzer (rules/) reads it through AggregateFuncs,
// Arity and IsAggregate; the window step through aggregatorOf.
var aggregateFuncs = []aggDef{
	{AggCount, countAgg{}},
	{AggSum, sumAgg{}},
	{AggMin, extremumAgg{max: false}},
	{AggMax, extremumAgg{max: true}},
	{AggAvg, avgAgg{}},
	{AggFirst, firstLastAgg{last: false}},
	{AggLast, firstLastAgg{last: true}},
	{AggCountDistinct, countDistinctAgg{}},
}

type aggDef struct {
	fn  AggFunc
	agg aggregator
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
	return aggregateFuncs[i].agg.arity()
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

// aggregatorOf is the implementation of fn. A function that is not in the
// list (the analyzer refuses it; only a hand-built WindowSpec has one)
// gets unknownAgg: it keeps nothing, its value is null, and a snapshot of
// it fails.
func aggregatorOf(fn AggFunc) aggregator {
	for _, a := range aggregateFuncs {
		if a.fn == fn {
			return a.agg
		}
	}
	return unknownAgg{fn}
}

// aggregator is one aggregate function of window.aggregate: how it takes
// its argument, folds it into the accumulator of one window, gives the
// window row's value, and writes and reads the accumulator in a snapshot
// (the layout is at the top of window.go). The window step calls check
// and fits on every window of a record before add touches any of them, so
// an argument that does not fit leaves no window changed.
type aggregator interface {
	// arity is the number of arguments: 0 (count) or 1.
	arity() int
	// check validates a non-null argument and normalises it (numbers
	// become float64).
	check(a Aggregate, v any) (any, error)
	// fits reports whether v, checked, can be added to c.
	fits(a Aggregate, c *acc, v any) error
	// add folds v, checked and fitting, into c; t is the record's event
	// time. A null argument is never added (arity 0: v is always nil).
	add(c *acc, v any, t int64)
	// value is the aggregate's output in the window row.
	value(c *acc) any
	encode(b []byte, c *acc) ([]byte, error)
	decode(d *snapDec, c *acc)
	// mixKind is what must agree between accumulators merged into one
	// (session windows): 0 when anything merges, else a kind every
	// non-zero mixKind of the merged accumulators must equal (min and max:
	// numbers or strings).
	mixKind(c *acc) uint8
	// merge folds src into dst, as if dst had been given src's records
	// too (session windows merging). src is left unusable.
	merge(dst, src *acc)
}

// acc is the accumulator of one aggregate in one window; which fields it
// uses depends on the function. One struct for all (rather than a type per
// function) keeps a window's accumulators in one allocation.
type acc struct {
	n    int64   // count, avg
	f    float64 // sum, avg, min/max of numbers
	s    string  // min/max of strings
	kind uint8   // min/max: 0 none, 1 number, 2 string; first/last: 0 none, 1 set
	t    int64   // first/last: event time of the kept value
	v    any     // first/last
	set  map[string]struct{}
}

const (
	kindNone   = 0
	kindNumber = 1
	kindString = 2
)

// anyArg is the part of an aggregate that takes any value as it is and
// never refuses one.
type anyArg struct{}

func (anyArg) check(_ Aggregate, v any) (any, error) { return v, nil }
func (anyArg) fits(Aggregate, *acc, any) error       { return nil }
func (anyArg) arity() int                            { return 1 }

// numberArg takes numbers only, as float64.
type numberArg struct{}

func (numberArg) arity() int                      { return 1 }
func (numberArg) fits(Aggregate, *acc, any) error { return nil }
func (numberArg) check(a Aggregate, v any) (any, error) {
	f, ok := jsoncodec.ToFloat(v)
	if !ok {
		return nil, fmt.Errorf("%s(%s) got %s, want a number", a.Func, a.Arg.Source, jsonKind(v))
	}
	return f, nil
}

// countAgg is count(): the number of records, int64. Snapshot: uvarint n.
type countAgg struct{ anyArg }

func (countAgg) arity() int                 { return 0 }
func (countAgg) add(c *acc, _ any, _ int64) { c.n++ }
func (countAgg) value(c *acc) any           { return c.n }
func (countAgg) encode(b []byte, c *acc) ([]byte, error) {
	return binary.AppendUvarint(b, uint64(c.n)), nil
}
func (countAgg) decode(d *snapDec, c *acc) { c.n = int64(d.uvarint()) }
func (countAgg) mixKind(*acc) uint8        { return 0 }
func (countAgg) merge(dst, src *acc)       { dst.n += src.n }

// sumAgg is sum(x): the sum of the numbers, float64, 0 for none.
// Snapshot: 8 bytes float64 bits.
type sumAgg struct{ numberArg }

func (sumAgg) add(c *acc, v any, _ int64) { c.f += v.(float64) }
func (sumAgg) value(c *acc) any           { return c.f }
func (sumAgg) encode(b []byte, c *acc) ([]byte, error) {
	return binary.BigEndian.AppendUint64(b, math.Float64bits(c.f)), nil
}
func (sumAgg) decode(d *snapDec, c *acc) { c.f = d.float() }
func (sumAgg) mixKind(*acc) uint8        { return 0 }
func (sumAgg) merge(dst, src *acc)       { dst.f += src.f }

// avgAgg is avg(x): the mean of the numbers, float64, null for none.
// Snapshot: 8 bytes float64 bits (the sum), uvarint n.
type avgAgg struct{ numberArg }

func (avgAgg) add(c *acc, v any, _ int64) {
	c.f += v.(float64)
	c.n++
}

func (avgAgg) value(c *acc) any {
	if c.n == 0 {
		return nil
	}
	return c.f / float64(c.n)
}

func (avgAgg) encode(b []byte, c *acc) ([]byte, error) {
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(c.f))
	return binary.AppendUvarint(b, uint64(c.n)), nil
}

func (avgAgg) decode(d *snapDec, c *acc) {
	c.f = d.float()
	c.n = int64(d.uvarint())
}

func (avgAgg) mixKind(*acc) uint8 { return 0 }
func (avgAgg) merge(dst, src *acc) {
	dst.f += src.f
	dst.n += src.n
}

// extremumAgg is min(x) (max false) and max(x) (max true): of numbers or
// of strings (bytewise), not both in one window; null for none.
// Snapshot: kind byte, 0 none | 1 number + 8 bytes float64 bits |
// 2 string + uvarint len + bytes.
type extremumAgg struct{ max bool }

func (extremumAgg) arity() int { return 1 }

func (extremumAgg) check(a Aggregate, v any) (any, error) {
	if f, ok := jsoncodec.ToFloat(v); ok {
		return f, nil
	}
	if _, ok := v.(string); ok {
		return v, nil
	}
	return nil, fmt.Errorf("%s(%s) got %s, want a number or a string", a.Func, a.Arg.Source, jsonKind(v))
}

func (extremumAgg) fits(a Aggregate, c *acc, v any) error {
	if c.kind == kindNone {
		return nil
	}
	_, isStr := v.(string)
	if isStr != (c.kind == kindString) {
		had := "numbers"
		if c.kind == kindString {
			had = "strings"
		}
		return fmt.Errorf("%s(%s) got %s after %s in the same window", a.Func, a.Arg.Source, jsonKind(v), had)
	}
	return nil
}

func (e extremumAgg) add(c *acc, v any, _ int64) {
	if s, ok := v.(string); ok {
		if c.kind == kindNone || (!e.max && s < c.s) || (e.max && s > c.s) {
			c.s, c.kind = s, kindString
		}
		return
	}
	f := v.(float64)
	if c.kind == kindNone || (!e.max && f < c.f) || (e.max && f > c.f) {
		c.f, c.kind = f, kindNumber
	}
}

func (extremumAgg) value(c *acc) any {
	switch c.kind {
	case kindNumber:
		return c.f
	case kindString:
		return c.s
	}
	return nil
}

func (extremumAgg) encode(b []byte, c *acc) ([]byte, error) {
	b = append(b, c.kind)
	switch c.kind {
	case kindNumber:
		b = binary.BigEndian.AppendUint64(b, math.Float64bits(c.f))
	case kindString:
		b = binary.AppendUvarint(b, uint64(len(c.s)))
		b = append(b, c.s...)
	}
	return b, nil
}

func (extremumAgg) mixKind(c *acc) uint8 { return c.kind }

func (e extremumAgg) merge(dst, src *acc) {
	switch src.kind {
	case kindNumber:
		e.add(dst, src.f, 0)
	case kindString:
		e.add(dst, src.s, 0)
	}
}

func (extremumAgg) decode(d *snapDec, c *acc) {
	c.kind = d.byte()
	switch c.kind {
	case kindNone:
	case kindNumber:
		c.f = d.float()
	case kindString:
		c.s = string(d.bytes())
	default:
		d.fail("kind %d", c.kind)
	}
}

// firstLastAgg is first(x) (last false), the value of the record with the
// smallest event time (ties: the earlier record processed), and last(x)
// (last true), the largest (ties: the later record). Snapshot: kind byte,
// 0 none | 1 + time of the record + uvarint len + JSON of the value.
type firstLastAgg struct {
	anyArg
	last bool
}

func (fl firstLastAgg) add(c *acc, v any, t int64) {
	if c.kind == kindNone || (!fl.last && t < c.t) || (fl.last && t >= c.t) {
		c.v, c.t, c.kind = v, t, 1
	}
}

func (firstLastAgg) value(c *acc) any   { return c.v }
func (firstLastAgg) mixKind(*acc) uint8 { return 0 }

// merge keeps the value of the smaller (first) or larger (last) time; on
// a tie first keeps dst's and last takes src's, as add does for a record
// processed after dst's.
func (fl firstLastAgg) merge(dst, src *acc) {
	if src.kind != kindNone {
		fl.add(dst, src.v, src.t)
	}
}

func (firstLastAgg) encode(b []byte, c *acc) ([]byte, error) {
	b = append(b, c.kind)
	if c.kind == kindNone {
		return b, nil
	}
	b = putTime(b, c.t)
	j, err := jsoncodec.Append(nil, c.v)
	if err != nil {
		return nil, err
	}
	b = binary.AppendUvarint(b, uint64(len(j)))
	return append(b, j...), nil
}

func (firstLastAgg) decode(d *snapDec, c *acc) {
	c.kind = d.byte()
	switch c.kind {
	case kindNone:
	case 1:
		c.t = d.time()
		j := d.bytes()
		if d.err == nil {
			v, err := jsoncodec.Decode(j)
			if err != nil {
				d.fail("%v", err)
			}
			c.v = v
		}
	default:
		d.fail("kind %d", c.kind)
	}
}

// countDistinctAgg is count_distinct(x): the number of distinct values,
// exactly, int64; 1 and 1.0 are one value, "1" is another (distinctKey).
// Snapshot: uvarint count, then each member (uvarint len + bytes) in byte
// order.
type countDistinctAgg struct{}

func (countDistinctAgg) arity() int                            { return 1 }
func (countDistinctAgg) check(_ Aggregate, v any) (any, error) { return distinctKey(v) }
func (countDistinctAgg) fits(Aggregate, *acc, any) error       { return nil }
func (countDistinctAgg) value(c *acc) any                      { return int64(len(c.set)) }
func (countDistinctAgg) mixKind(*acc) uint8                    { return 0 }

// merge unions the sets, moving the smaller into the larger.
func (countDistinctAgg) merge(dst, src *acc) {
	if len(src.set) > len(dst.set) {
		dst.set, src.set = src.set, dst.set
	}
	if dst.set == nil {
		dst.set = make(map[string]struct{}, len(src.set))
	}
	for m := range src.set {
		dst.set[m] = struct{}{}
	}
}

func (countDistinctAgg) add(c *acc, v any, _ int64) {
	if c.set == nil {
		c.set = make(map[string]struct{})
	}
	c.set[v.(string)] = struct{}{}
}

func (countDistinctAgg) encode(b []byte, c *acc) ([]byte, error) {
	members := make([]string, 0, len(c.set))
	for m := range c.set {
		members = append(members, m)
	}
	slices.Sort(members)
	b = binary.AppendUvarint(b, uint64(len(members)))
	for _, m := range members {
		b = binary.AppendUvarint(b, uint64(len(m)))
		b = append(b, m...)
	}
	return b, nil
}

func (countDistinctAgg) decode(d *snapDec, c *acc) {
	n := d.uvarint()
	if n > uint64(len(d.b)) { // each member takes at least one byte
		d.fail("count_distinct of %d members in %d bytes", n, len(d.b))
		return
	}
	c.set = make(map[string]struct{}, n)
	for range n {
		m := d.bytes()
		if d.err != nil {
			return
		}
		c.set[string(m)] = struct{}{}
	}
}

// distinctKey is the identity of a value for count_distinct: a kind letter
// then the value, so 1 (int) and 1.0 are one member and "1" is another.
func distinctKey(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return "s" + x, nil
	case bool:
		return "b" + strconv.FormatBool(x), nil
	}
	if f, ok := jsoncodec.ToFloat(v); ok {
		return "n" + strconv.FormatFloat(f, 'g', -1, 64), nil
	}
	b, err := jsoncodec.Append([]byte{'j'}, v)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// unknownAgg is a function not in aggregateFuncs.
type unknownAgg struct{ fn AggFunc }

func (unknownAgg) arity() int                            { return 1 }
func (unknownAgg) check(_ Aggregate, v any) (any, error) { return v, nil }
func (unknownAgg) fits(Aggregate, *acc, any) error       { return nil }
func (unknownAgg) add(*acc, any, int64)                  {}
func (unknownAgg) value(*acc) any                        { return nil }
func (u unknownAgg) encode([]byte, *acc) ([]byte, error) {
	return nil, fmt.Errorf("unknown aggregate %q", u.fn)
}
func (unknownAgg) decode(*snapDec, *acc) {}
func (unknownAgg) mixKind(*acc) uint8    { return 0 }
func (unknownAgg) merge(*acc, *acc)      {}
