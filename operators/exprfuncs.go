package operators

import (
	"encoding/base64"
	"fmt"
	"math/bits"
	"reflect"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/builtin"
	"github.com/expr-lang/expr/vm/runtime"
)

// The budgeted expr-lang built-ins (budget.go). Each built-in of expr-lang
// v1.17 that allocates in proportion to its arguments is rewritten at
// compile time (budgetPatcher) into a call of rtproxy_<name>__ with the
// evaluation's meter as first argument. That function works out what the
// built-in is about to allocate from the arguments alone (lengths, counts
// of separators, a walk of the value), charges it, and only then calls the
// built-in itself, so the result is exactly the built-in's.
//
// Built-ins left alone, and why:
//   - all, none, any, one, filter, map, find, findIndex, findLast,
//     findLastIndex, count, sum, groupBy, sortBy, reduce: their predicate
//     charges one step per iteration (the predicate is patched); what they
//     build is at most one element per iteration, which expr's own memory
//     budget counts; sortBy also charges its n·log n comparisons.
//   - trim, trimPrefix, trimSuffix, take, first, last, get: they return a
//     part of their argument, allocating nothing in proportion to it.
//   - len, type, abs, ceil, floor, round, int, float, indexOf, lastIndexOf,
//     hasPrefix, hasSuffix, max, min, mean, now, duration, date, timezone,
//     the bit functions: constant memory.
//
// Operators: `+` on strings is budgeted by addFunc; `matches` with a
// pattern computed at run time by rtproxy_matches__ (compiling a regular
// expression costs memory in proportion to the pattern); ranges, array and
// map literals by expr's own memory budget.

// meterName is the env field holding the evaluation's meter; no rule
// writes it.
const meterName = "rtproxy_meter__"

// budgeted are the rewritten built-ins and what each costs.
var budgeted = map[string]func(m *meter, args []any) error{
	"repeat":     costRepeat,
	"split":      costSplit,
	"splitAfter": costSplit,
	"replace":    costReplace,
	"join":       costJoin,
	"upper":      costOfString("upper", caseSize),
	"lower":      costOfString("lower", caseSize),
	"toJSON":     costValue("toJSON"),
	"string":     costValue("string"),
	"fromJSON":   costOfString("fromJSON", fromJSONSize),
	"toBase64":   costOfString("toBase64", toBase64Size),
	"fromBase64": costOfString("fromBase64", fromBase64Size),
	"keys":       costMap("keys", 16),
	"values":     costMap("values", 16),
	"toPairs":    costMap("toPairs", 32),
	"fromPairs":  costList("fromPairs", 64),
	"reverse":    costList("reverse", 16),
	"uniq":       costUniq,
	"concat":     costConcat,
	"flatten":    costFlatten,
	"sort":       costSort,
	"median":     costMedian,
}

func budgetedName(name string) string { return "rtproxy_" + name + "__" }

// budgetFuncs are the expr options declaring the budgeted functions.
var budgetFuncs = func() []expr.Option {
	var opts []expr.Option
	for name, cost := range budgeted {
		call := builtinCall(name)
		opts = append(opts, expr.Function(budgetedName(name), func(args ...any) (any, error) {
			m, _ := args[0].(*meter)
			if err := cost(m, args[1:]); err != nil {
				return nil, err
			}
			return call(args[1:]...)
		}))
	}
	opts = append(opts,
		expr.Function(tickName, func(args ...any) (any, error) {
			m, _ := args[0].(*meter)
			return nil, m.step(1)
		}),
		expr.Function(sortCostName, func(args ...any) (any, error) {
			m, _ := args[0].(*meter)
			if err := m.step(sortSteps(listLen(args[1]))); err != nil {
				return nil, err
			}
			return args[1], nil
		}),
		expr.Function(matchesName, func(args ...any) (any, error) {
			m, _ := args[0].(*meter)
			s, ok1 := args[1].(string)
			p, ok2 := args[2].(string)
			if !ok1 || !ok2 {
				return nil, fmt.Errorf(`invalid operation: %T matches %T`, args[1], args[2])
			}
			// Go's regexp compiles a pattern into a program of a few
			// dozen bytes per byte of pattern.
			if err := m.alloc("matches (compiling the pattern)", mulSize(int64(len(p)), 64)); err != nil {
				return nil, err
			}
			re, err := regexp.Compile(p)
			if err != nil {
				return nil, err
			}
			return re.MatchString(s), nil
		}),
	)
	return opts
}()

// builtinCall is expr's own implementation of the built-in name.
func builtinCall(name string) func(args ...any) (any, error) {
	f := builtin.Builtins[builtin.Index[name]]
	switch {
	case f.Func != nil:
		return f.Func
	case f.Safe != nil:
		return func(args ...any) (any, error) {
			out, _, err := f.Safe(args...)
			return out, err
		}
	case f.Fast != nil:
		return func(args ...any) (any, error) {
			if len(args) != 1 {
				return nil, fmt.Errorf("invalid number of arguments for %s (expected 1, got %d)", name, len(args))
			}
			return f.Fast(args[0]), nil
		}
	}
	panic("expr built-in " + name + " has no implementation")
}

// The other functions budgetPatcher calls.
const (
	tickName     = "rtproxy_tick__"     // one step of a predicate
	sortCostName = "rtproxy_sortcost__" // sortBy's comparisons, charged on its list
	matchesName  = "rtproxy_matches__"  // `matches` with a pattern known only at run time
)

// budgetPatcher rewrites the budgeted built-ins, the predicates and a
// run-time `matches` to charge the meter. It runs last, after the
// expression checked as written (CompileExpr compiles it once without the
// patcher first, so that errors name the built-ins as written).
type budgetPatcher struct{}

func meterNode() ast.Node { return &ast.IdentifierNode{Value: meterName} }

func (budgetPatcher) Visit(node *ast.Node) {
	if patchHelper(node) { // mask, hash (viewfuncs.go)
		return
	}
	switch n := (*node).(type) {
	case *ast.BuiltinNode:
		if _, ok := budgeted[n.Name]; ok {
			ast.Patch(node, &ast.CallNode{
				Callee:    &ast.IdentifierNode{Value: budgetedName(n.Name)},
				Arguments: append([]ast.Node{meterNode()}, n.Arguments...),
			})
			return
		}
		if n.Name == "sortBy" && len(n.Arguments) > 0 {
			n.Arguments[0] = &ast.CallNode{
				Callee:    &ast.IdentifierNode{Value: sortCostName},
				Arguments: []ast.Node{meterNode(), n.Arguments[0]},
			}
		}
	case *ast.PredicateNode:
		if seq, ok := n.Node.(*ast.SequenceNode); ok && len(seq.Nodes) == 2 {
			if c, ok := seq.Nodes[0].(*ast.CallNode); ok {
				if id, ok := c.Callee.(*ast.IdentifierNode); ok && id.Value == tickName {
					return // already patched
				}
			}
		}
		n.Node = &ast.SequenceNode{Nodes: []ast.Node{
			&ast.CallNode{Callee: &ast.IdentifierNode{Value: tickName}, Arguments: []ast.Node{meterNode()}},
			n.Node,
		}}
	case *ast.BinaryNode:
		if n.Operator != "matches" {
			return
		}
		if _, constant := n.Right.(*ast.StringNode); constant {
			return // compiled once, at load time
		}
		ast.Patch(node, &ast.CallNode{
			Callee:    &ast.IdentifierNode{Value: matchesName},
			Arguments: []ast.Node{meterNode(), n.Left, n.Right},
		})
	}
}

// The costs. Each returns nil when the arguments are not what the
// built-in takes: the built-in then fails with its own error.

func argInt(v any) (int64, bool) {
	switch v.(type) {
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, float32, float64:
		return int64(runtime.ToInt(v)), true
	}
	return 0, false
}

func costRepeat(m *meter, args []any) error {
	if len(args) != 2 {
		return nil
	}
	s, ok := args[0].(string)
	n, ok2 := argInt(args[1])
	if !ok || !ok2 || n < 0 {
		return nil
	}
	if n > 1e6 {
		// expr-lang's own repeat refuses it too, with a bare "memory
		// budget exceeded".
		return tripped(BudgetExprMemory, "expression budget exceeded: repeat %d times, more than expr-lang's 1000000", n)
	}
	return m.alloc("repeat", mulSize(int64(len(s)), n))
}

// pieces is how many parts strings.Split(s, sep) makes (SplitN with n).
func pieces(s, sep string, n int64, limited bool) int64 {
	var k int64
	if sep == "" {
		k = int64(utf8.RuneCountInString(s))
	} else {
		k = int64(strings.Count(s, sep)) + 1
	}
	if limited && n >= 0 && n < k {
		k = n
	}
	return k
}

func costSplit(m *meter, args []any) error {
	if len(args) != 2 && len(args) != 3 {
		return nil
	}
	s, ok := args[0].(string)
	sep, ok2 := args[1].(string)
	if !ok || !ok2 {
		return nil
	}
	var n int64
	if len(args) == 3 {
		if n, ok = argInt(args[2]); !ok {
			return nil
		}
	}
	// The parts share s's bytes; the list holds a 16-byte header for each.
	return m.alloc("split", addSize(mulSize(pieces(s, sep, n, len(args) == 3), 16), 24))
}

func costReplace(m *meter, args []any) error {
	if len(args) != 3 && len(args) != 4 {
		return nil
	}
	s, ok1 := args[0].(string)
	old, ok2 := args[1].(string)
	nw, ok3 := args[2].(string)
	if !ok1 || !ok2 || !ok3 {
		return nil
	}
	var k int64
	if old == "" {
		k = int64(utf8.RuneCountInString(s)) + 1
	} else {
		k = int64(strings.Count(s, old))
	}
	if len(args) == 4 {
		n, ok := argInt(args[3])
		if !ok {
			return nil
		}
		if n >= 0 && n < k {
			k = n
		}
	}
	grow := int64(len(nw)) - int64(len(old))
	if grow < 0 {
		grow = 0
	}
	return m.alloc("replace", addSize(int64(len(s)), mulSize(k, grow)))
}

func costJoin(m *meter, args []any) error {
	if len(args) != 1 && len(args) != 2 {
		return nil
	}
	glue := ""
	if len(args) == 2 {
		g, ok := args[1].(string)
		if !ok {
			return nil
		}
		glue = g
	}
	var total, k int64
	switch l := args[0].(type) {
	case []string:
		k = int64(len(l))
		for _, s := range l {
			total += int64(len(s))
		}
	case []any:
		k = int64(len(l))
		total = mulSize(k, 16) // the []string it builds first
		for _, s := range l {
			if str, ok := s.(string); ok {
				total = addSize(total, int64(len(str)))
			}
		}
	default:
		return nil
	}
	if k > 1 {
		total = addSize(total, mulSize(k-1, int64(len(glue))))
	}
	return m.alloc("join", total)
}

// costOfString charges a built-in of one string argument what size says
// it builds from a string of n bytes; other arguments are left to expr.
func costOfString(name string, size func(n int64) int64) func(*meter, []any) error {
	return func(m *meter, args []any) error {
		if len(args) != 1 {
			return nil
		}
		s, ok := args[0].(string)
		if !ok {
			return nil
		}
		return m.alloc(name, size(int64(len(s))))
	}
}

// caseSize: case mapping grows a UTF-8 string by at most half.
func caseSize(n int64) int64 { return n + n/2 }

// costValue bounds what printing a value takes (toJSON with its
// indentation, string's %v), from a walk of the value that itself charges
// a step per element.
func costValue(name string) func(*meter, []any) error {
	return func(m *meter, args []any) error {
		if len(args) != 1 {
			return nil
		}
		n, err := printedSize(m, reflect.ValueOf(args[0]), 0)
		if err != nil {
			return err
		}
		if name == "toJSON" {
			n = mulSize(n, 2) // MarshalIndent: the compact text, then the indented
		}
		return m.alloc(name, n)
	}
}

// maxPrintDepth is as deep as printedSize walks (JSON values decoded by
// rtproxy are far shallower; expr's own limit is 10000).
const maxPrintDepth = 10000

// printedSize is at least the bytes toJSON or string() prints v in, at
// nesting depth.
func printedSize(m *meter, v reflect.Value, depth int) (int64, error) {
	if depth > maxPrintDepth {
		return 0, fmt.Errorf("value nested more than %d deep", maxPrintDepth)
	}
	if err := m.step(1); err != nil {
		return 0, err
	}
	indent := int64(2*depth + 4) // newline, indentation, comma, quotes
	for v.Kind() == reflect.Interface || v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return indent + 5, nil
		}
		v = v.Elem()
	}
	switch v.Kind() {
	case reflect.String:
		// \u escapes of <, >, & and invalid UTF-8 take 6 bytes a byte.
		return addSize(mulSize(int64(v.Len()), 6), indent), nil
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Uint8 {
			return addSize(mulSize(int64(v.Len()), 4), indent), nil // base64, or %v's numbers
		}
		total := indent
		for i := range v.Len() {
			n, err := printedSize(m, v.Index(i), depth+1)
			if err != nil {
				return 0, err
			}
			total = addSize(total, n)
		}
		return total, nil
	case reflect.Map:
		total := indent
		it := v.MapRange()
		for it.Next() {
			k, err := printedSize(m, it.Key(), depth+1)
			if err != nil {
				return 0, err
			}
			n, err := printedSize(m, it.Value(), depth+1)
			if err != nil {
				return 0, err
			}
			total = addSize(total, addSize(k, n))
		}
		return total, nil
	case reflect.Struct:
		total := indent + 64 // time.Time and other leaves print in less
		for i := range v.NumField() {
			if !v.Type().Field(i).IsExported() {
				continue
			}
			n, err := printedSize(m, v.Field(i), depth+1)
			if err != nil {
				return 0, err
			}
			total = addSize(total, n)
		}
		return total, nil
	}
	return indent + 32, nil // numbers, bools, nil
}

// fromJSONSize: a decoded JSON value takes at most about 24 bytes of
// memory per byte of text (`[0,0,...]`: a 16-byte interface and slice
// growth per two bytes).
func fromJSONSize(n int64) int64 { return mulSize(n, 24) }

// toBase64Size and fromBase64Size: the input, and the output twice (the
// encoder's buffer and the string made of it).
func toBase64Size(n int64) int64 { return n + 2*int64(base64.StdEncoding.EncodedLen(int(n))) }

func fromBase64Size(n int64) int64 { return n + 2*int64(base64.StdEncoding.DecodedLen(int(n))) }

// listLen is the length of a list argument, or 0.
func listLen(v any) int64 {
	switch l := v.(type) {
	case []any:
		return int64(len(l))
	case nil:
		return 0
	}
	rv := reflect.ValueOf(v)
	if k := rv.Kind(); k == reflect.Slice || k == reflect.Array || k == reflect.Map || k == reflect.String {
		return int64(rv.Len())
	}
	return 0
}

func costMap(name string, per int64) func(*meter, []any) error {
	return func(m *meter, args []any) error {
		if len(args) != 1 || reflect.ValueOf(args[0]).Kind() != reflect.Map {
			return nil
		}
		n := listLen(args[0])
		return m.alloc(name, addSize(mulSize(n, per), mulSize(n, 16))) // the result and MapKeys
	}
}

func costList(name string, per int64) func(*meter, []any) error {
	return func(m *meter, args []any) error {
		if len(args) != 1 {
			return nil
		}
		return m.alloc(name, mulSize(listLen(args[0]), per))
	}
}

// costUniq: uniq compares each element with every distinct one before it.
func costUniq(m *meter, args []any) error {
	if len(args) != 1 {
		return nil
	}
	n := listLen(args[0])
	if err := m.alloc("uniq", mulSize(n, 16)); err != nil {
		return err
	}
	return m.step(mulSize(n, n) / 2)
}

func costConcat(m *meter, args []any) error {
	var n int64
	for _, a := range args {
		n = addSize(n, listLen(a))
	}
	// append doubles: up to twice the result.
	return m.alloc("concat", mulSize(n, 32))
}

func costFlatten(m *meter, args []any) error {
	if len(args) != 1 {
		return nil
	}
	n, err := leaves(m, reflect.ValueOf(args[0]), 0)
	if err != nil {
		return err
	}
	// Each level appends what the level below returned.
	return m.alloc("flatten", mulSize(n, 32))
}

// leaves counts what flatten returns, charging a step per element.
func leaves(m *meter, v reflect.Value, depth int) (int64, error) {
	if depth > maxPrintDepth {
		return 0, nil // flatten refuses it itself
	}
	for v.Kind() == reflect.Interface || v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return 1, nil
		}
		v = v.Elem()
	}
	if k := v.Kind(); k != reflect.Slice && k != reflect.Array {
		return 1, nil
	}
	if err := m.step(int64(v.Len()) + 1); err != nil {
		return 0, err
	}
	var n int64
	for i := range v.Len() {
		c, err := leaves(m, v.Index(i), depth+1)
		if err != nil {
			return 0, err
		}
		n = addSize(n, c)
	}
	return n, nil
}

// sortSteps are the comparisons of sorting n elements.
func sortSteps(n int64) int64 {
	if n < 2 {
		return n
	}
	return mulSize(n, int64(bits.Len64(uint64(n))))
}

func costSort(m *meter, args []any) error {
	if len(args) != 1 && len(args) != 2 {
		return nil
	}
	n := listLen(args[0])
	if err := m.alloc("sort", mulSize(n, 16)); err != nil {
		return err
	}
	return m.step(sortSteps(n))
}

func costMedian(m *meter, args []any) error {
	var n int64
	for _, a := range args {
		n = addSize(n, listLen(a))
		if listLen(a) == 0 {
			n = addSize(n, 1)
		}
	}
	// The values collected, with append's doubling.
	return m.alloc("median", mulSize(n, 16))
}
