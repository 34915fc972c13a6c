package operators

// The fast path of the commonest expressions. Most expressions in rule
// files are member paths (`value.user_id`), comparisons of a member with a
// constant (`value.amount > 0`), arithmetic on numbers and `&&`/`||` of
// those. The expr VM evaluates each in a few hundred nanoseconds, most of
// it the VM's own: taking a VM from the pool, calling the member fetch
// function through a slice of arguments, boxing and unboxing. A chain of
// filter, set and map evaluates six expressions per record, which was a
// third of the chain's CPU (docs/BENCHMARKS.md, "Expressions without the
// VM").
//
// fastExpr is a tree of those few node kinds, built from the expression as
// written. It evaluates only while every value it meets has a type whose
// semantics it repeats exactly (objects for members, float64 and the
// constants for numbers, strings, bools, nil for equality); on anything
// else it gives up (ok false) and the VM evaluates the whole expression,
// producing the same value or the same positioned error as always.
// Evaluation has no side effects, so giving up half-way costs only time.
// TestFastExprAgreesWithVM and FuzzFastExpr hold the two to the same result.

import (
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/parser"
)

type fastKind uint8

const (
	fastPath  fastKind = iota // root (value or a bound name) and members
	fastConst                 // a literal
	fastCmp                   // == != < <= > >=
	fastArith                 // + - * /
	fastAnd                   // && and
	fastOr                    // || or
	fastNot                   // ! not
	fastNeg                   // unary -
	fastCond                  // c ? a : b, if c { a } else { b }
)

type fastExpr struct {
	kind fastKind
	op   string

	// fastPath: bound is false for `value`, true for a name a join bound.
	root  string
	bound bool
	props []string

	// fastConst: the literal as the VM has it, and as a number when it
	// is one (an integer constant meets a float64 as a float64 in expr).
	c     any
	num   float64
	isNum bool

	a, b, c2 *fastExpr
}

// compileFast builds the fast tree of src, or nil when src uses anything
// it does not evaluate itself. bound are the join names in effect.
func compileFast(src string, bound []string) *fastExpr {
	tree, err := parser.Parse(src)
	if err != nil {
		return nil
	}
	f := buildFast(tree.Node, bound)
	if f == nil || f.kind == fastConst {
		return nil // a constant expression: the VM has it folded
	}
	return f
}

func buildFast(n ast.Node, bound []string) *fastExpr {
	switch x := n.(type) {
	case *ast.IdentifierNode:
		return fastRoot(x.Value, bound)
	case *ast.MemberNode:
		if x.Optional || x.Method {
			return nil
		}
		prop, ok := x.Property.(*ast.StringNode)
		if !ok {
			return nil
		}
		base := buildFast(x.Node, bound)
		if base == nil || base.kind != fastPath {
			return nil
		}
		props := append(append([]string(nil), base.props...), prop.Value)
		return &fastExpr{kind: fastPath, root: base.root, bound: base.bound, props: props}
	case *ast.IntegerNode:
		return &fastExpr{kind: fastConst, c: x.Value, num: float64(x.Value), isNum: true}
	case *ast.FloatNode:
		return &fastExpr{kind: fastConst, c: x.Value, num: x.Value, isNum: true}
	case *ast.StringNode:
		return &fastExpr{kind: fastConst, c: x.Value}
	case *ast.BoolNode:
		return &fastExpr{kind: fastConst, c: x.Value}
	case *ast.NilNode:
		return &fastExpr{kind: fastConst, c: nil}
	case *ast.UnaryNode:
		a := buildFast(x.Node, bound)
		if a == nil {
			return nil
		}
		switch x.Operator {
		case "-":
			if a.kind == fastConst {
				switch v := a.c.(type) {
				case int:
					return &fastExpr{kind: fastConst, c: -v, num: float64(-v), isNum: true}
				case float64:
					return &fastExpr{kind: fastConst, c: -v, num: -v, isNum: true}
				}
				return nil
			}
			return &fastExpr{kind: fastNeg, a: a}
		case "!", "not":
			if a.kind == fastConst {
				return nil
			}
			return &fastExpr{kind: fastNot, a: a}
		}
		return nil
	case *ast.BinaryNode:
		a, b := buildFast(x.Left, bound), buildFast(x.Right, bound)
		if a == nil || b == nil || (a.kind == fastConst && b.kind == fastConst) {
			return nil
		}
		switch x.Operator {
		case "==", "!=", "<", "<=", ">", ">=":
			return &fastExpr{kind: fastCmp, op: x.Operator, a: a, b: b}
		case "+", "-", "*", "/":
			if !a.numeric() || !b.numeric() {
				if x.Operator != "+" {
					return nil
				}
			}
			return &fastExpr{kind: fastArith, op: x.Operator, a: a, b: b}
		case "&&", "and":
			return &fastExpr{kind: fastAnd, a: a, b: b}
		case "||", "or":
			return &fastExpr{kind: fastOr, a: a, b: b}
		}
		return nil
	case *ast.ConditionalNode:
		c, a, b := buildFast(x.Cond, bound), buildFast(x.Exp1, bound), buildFast(x.Exp2, bound)
		if c == nil || a == nil || b == nil || c.kind == fastConst {
			return nil
		}
		return &fastExpr{kind: fastCond, a: c, b: a, c2: b}
	}
	return nil
}

// fastRoot is a path of no members: `value` or a bound join name.
func fastRoot(name string, bound []string) *fastExpr {
	for _, b := range bound {
		if b == name {
			return &fastExpr{kind: fastPath, root: name, bound: true}
		}
	}
	if name == "value" {
		return &fastExpr{kind: fastPath, root: name}
	}
	return nil
}

// numeric reports a node that can only give a number or give up: a
// numeric constant, arithmetic other than a `+` of strings, a negation,
// or a member (whose value decides).
func (f *fastExpr) numeric() bool {
	switch f.kind {
	case fastConst:
		return f.isNum
	case fastPath, fastArith, fastNeg, fastCond:
		return true
	}
	return false
}

// eval evaluates f against r; ok is false when a value's type is one the
// fast path does not repeat the VM's semantics for.
func (f *fastExpr) eval(r *Record) (any, bool) {
	switch f.kind {
	case fastPath:
		var v any
		if f.bound {
			v = r.Bound[f.root]
		} else {
			v = r.Value
		}
		for _, p := range f.props {
			m, ok := v.(map[string]any)
			if !ok {
				return nil, false // nil, a list, a string: the VM's fetch says what
			}
			v = m[p]
		}
		return v, true
	case fastConst:
		return f.c, true
	case fastCmp:
		return f.cmp(r)
	case fastArith:
		if x, ok := f.number(r); ok {
			return x, true
		}
		if f.op == "+" {
			return f.concat(r)
		}
		return nil, false
	case fastNeg:
		x, ok := f.number(r)
		if !ok {
			return nil, false
		}
		return x, true
	case fastAnd, fastOr:
		x, ok := f.boolOf(f.a, r)
		if !ok {
			return nil, false
		}
		if x != (f.kind == fastAnd) {
			return x, true // false && …, true || …: the right side is not evaluated
		}
		y, ok := f.boolOf(f.b, r)
		if !ok {
			return nil, false
		}
		return y, true
	case fastNot:
		x, ok := f.boolOf(f.a, r)
		if !ok {
			return nil, false
		}
		return !x, true
	case fastCond:
		c, ok := f.boolOf(f.a, r)
		if !ok {
			return nil, false
		}
		if c {
			return f.b.eval(r)
		}
		return f.c2.eval(r)
	}
	return nil, false
}

func (f *fastExpr) boolOf(n *fastExpr, r *Record) (bool, bool) {
	v, ok := n.eval(r)
	if !ok {
		return false, false
	}
	b, ok := v.(bool)
	return b, ok
}

// number evaluates f as a float64: a member that holds one, a numeric
// constant, or arithmetic and negation of those. expr computes a float64
// with an int constant as float64(int) and its `/` always in floats, so
// the results are the VM's; an int from elsewhere (an Avro long) gives up.
func (f *fastExpr) number(r *Record) (float64, bool) {
	switch f.kind {
	case fastConst:
		return f.num, f.isNum
	case fastArith:
		x, ok := f.a.number(r)
		if !ok {
			return 0, false
		}
		y, ok := f.b.number(r)
		if !ok {
			return 0, false
		}
		switch f.op {
		case "+":
			return x + y, true
		case "-":
			return x - y, true
		case "*":
			return x * y, true
		case "/":
			return x / y, true
		}
		return 0, false
	case fastNeg:
		x, ok := f.a.number(r)
		return -x, ok
	}
	v, ok := f.eval(r)
	if !ok {
		return 0, false
	}
	x, ok := v.(float64)
	return x, ok
}

// operands evaluates both sides of a binary node.
func (f *fastExpr) operands(r *Record) (x, y any, ok bool) {
	if x, ok = f.a.eval(r); !ok {
		return nil, nil, false
	}
	y, ok = f.b.eval(r)
	return x, y, ok
}

// concat is `+` of two strings, bounded like addFunc (over the bound, the
// VM gives addFunc's error).
func (f *fastExpr) concat(r *Record) (any, bool) {
	x, y, ok := f.operands(r)
	if !ok {
		return nil, false
	}
	s, ok1 := x.(string)
	t, ok2 := y.(string)
	if !ok1 || !ok2 || len(s)+len(t) > MaxStringBytes {
		return nil, false
	}
	return s + t, true
}

// cmp compares like expr's runtime.Equal and Less for numbers (float64,
// the integers of Avro and Protobuf, the literals), strings, bools and nil
// against those.
func (f *fastExpr) cmp(r *Record) (any, bool) {
	x, y, ok := f.operands(r)
	if !ok {
		return nil, false
	}
	eq := f.op == "==" || f.op == "!="
	if xn, ok := numberOf(x); ok {
		yn, ok := numberOf(y)
		if !ok {
			return f.unequal(y)
		}
		if xn.isInt && yn.isInt {
			return ordered(f.op, xn.i, yn.i) // expr: int(x) < int(y), exact
		}
		return ordered(f.op, xn.float(), yn.float()) // expr: float64(x) < float64(y)
	}
	switch a := x.(type) {
	case string:
		b, ok := y.(string)
		if !ok {
			return f.unequal(y)
		}
		return ordered(f.op, a, b)
	case bool:
		b, ok := y.(bool)
		if !ok {
			return f.unequal(y)
		}
		if eq {
			return (a == b) == (f.op == "=="), true
		}
	case nil:
		if !eq {
			return nil, false
		}
		switch y.(type) {
		case nil:
			return f.op == "==", true
		case float64, int, int64, int32, string, bool:
			return f.op == "!=", true
		}
	}
	return nil, false
}

// num is a number an operand gave: an integer (a literal, or an Avro
// long or int) or a float64.
type num struct {
	i     int64
	f     float64
	isInt bool
}

func (n num) float() float64 {
	if n.isInt {
		return float64(n.i)
	}
	return n.f
}

// numberOf is v as a num when v is one of the number types the fast path
// compares: expr compares two integers exactly and anything else with a
// float64 as float64s, and so does cmp.
func numberOf(v any) (num, bool) {
	switch x := v.(type) {
	case float64:
		return num{f: x}, true
	case int:
		return num{i: int64(x), isInt: true}, true
	case int64:
		return num{i: x, isInt: true}, true
	case int32:
		return num{i: int64(x), isInt: true}, true
	}
	return num{}, false
}

// ordered compares two numbers (floats with Go's NaN rules, as expr
// does) or two strings.
func ordered[T float64 | int64 | string](op string, a, b T) (any, bool) {
	switch op {
	case "==":
		return a == b, true
	case "!=":
		return a != b, true
	case "<":
		return a < b, true
	case "<=":
		return a <= b, true
	case ">":
		return a > b, true
	case ">=":
		return a >= b, true
	}
	return nil, false
}

// unequal is == or != of a number, string or bool against y of another
// type: only nil is certain (unequal); other mixes (1 == "1") are the VM's
// to decide.
func (f *fastExpr) unequal(y any) (any, bool) {
	if y == nil && (f.op == "==" || f.op == "!=") {
		return f.op == "!=", true
	}
	return nil, false
}
