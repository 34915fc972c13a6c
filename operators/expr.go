package operators

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"sync"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/vm"
	"github.com/expr-lang/expr/vm/runtime"
	"github.com/rtproxy/rtproxy/internal/jsoncodec"
)

// Expr is one compiled expr-lang expression of a rule file, evaluated
// against a record. Compile it once at load time with CompileExpr.
type Expr struct {
	Source  string
	program *vm.Program
	reads   valueReads
	// fast evaluates the commonest expressions without the VM, or is nil
	// (fastexpr.go).
	fast *fastExpr
	// hash says the expression calls hash() (viewfuncs.go).
	hash bool
}

// valueReads is what an expression reads of `value`: the top-level
// members it names (value.x, value?.x, value["x"]), and whether it uses
// value any other way (whole), which needs every member.
type valueReads struct {
	members []string
	whole   bool
	// bound is, per name bound by a join, what the expression reads of
	// it the same way (a name not read is absent).
	bound map[string]*valueReads
}

// ValueReads returns the top-level members of value the expression reads,
// and whole when it reads value as a whole (passes it on, indexes it with
// a computed name), so that no member may be left out.
func (e *Expr) ValueReads() (members []string, whole bool) {
	return e.reads.members, e.reads.whole
}

// BoundReads is ValueReads for a name bound by a join (`as`): the
// top-level members of the bound value the expression reads, and whole
// when it uses the value any other way. Comparing the name with nil
// (`auth != nil`) reads no member. A name it does not read: nil, false.
func (e *Expr) BoundReads(name string) (members []string, whole bool) {
	if b := e.reads.bound[name]; b != nil {
		return b.members, b.whole
	}
	return nil, false
}

// readsObserver records valueReads; it runs before the other patchers, on
// the tree as written. Walk visits children first, so each use of the
// `value` identifier is counted, then the member accesses that name a
// constant property of it: any use left over reads value whole.
type readsObserver struct {
	r     *valueReads
	uses  int
	named int
	// bound are the names joins bound, and boundUses, boundNamed their
	// counts as uses and named of value.
	bound                 []string
	boundUses, boundNamed map[string]int
	env                   bool // $env: every bound name read whole
}

// boundRead counts a use of a bound name (named: a constant member of it,
// or a comparison with nil, which reads no member).
func (o *readsObserver) boundRead(name string, named bool, member string) {
	if o.r.bound == nil {
		o.r.bound, o.boundUses, o.boundNamed = map[string]*valueReads{}, map[string]int{}, map[string]int{}
	}
	b := o.r.bound[name]
	if b == nil {
		b = &valueReads{}
		o.r.bound[name] = b
	}
	if !named {
		o.boundUses[name]++
	} else {
		o.boundNamed[name]++
		if member != "" && !slices.Contains(b.members, member) {
			b.members = append(b.members, member)
		}
	}
	b.whole = o.env || o.boundUses[name] > o.boundNamed[name]
}

// isBound is the bound name n is, if it is one.
func (o *readsObserver) isBound(n ast.Node) (string, bool) {
	id, ok := n.(*ast.IdentifierNode)
	if !ok || !slices.Contains(o.bound, id.Value) {
		return "", false
	}
	return id.Value, true
}

func (o *readsObserver) Visit(node *ast.Node) {
	switch x := (*node).(type) {
	case *ast.IdentifierNode:
		if slices.Contains(o.bound, x.Value) {
			o.boundRead(x.Value, false, "")
		}
		switch x.Value {
		case "value":
			o.uses++
		case "$env":
			o.uses++ // $env.value, $env["value"]: value by another name
			o.env = true
			for _, name := range o.bound {
				o.boundRead(name, false, "")
			}
		}
	case *ast.BinaryNode:
		if x.Operator != "==" && x.Operator != "!=" {
			break
		}
		if _, isNil := x.Right.(*ast.NilNode); isNil {
			if name, ok := o.isBound(x.Left); ok {
				o.boundRead(name, true, "")
			}
		} else if _, isNil := x.Left.(*ast.NilNode); isNil {
			if name, ok := o.isBound(x.Right); ok {
				o.boundRead(name, true, "")
			}
		}
	case *ast.MemberNode:
		if name, ok := o.isBound(x.Node); ok && !x.Method {
			if prop, ok := x.Property.(*ast.StringNode); ok {
				o.boundRead(name, true, prop.Value)
			}
			return
		}
		id, ok := x.Node.(*ast.IdentifierNode)
		if !ok || id.Value != "value" || x.Method {
			return
		}
		if prop, ok := x.Property.(*ast.StringNode); ok {
			o.named++
			if !slices.Contains(o.r.members, prop.Value) {
				o.r.members = append(o.r.members, prop.Value)
			}
		}
	}
	o.r.whole = o.uses > o.named
}

// CompileExpr compiles src against the record environment. bound are the
// names that join steps before this expression bind (`as`). opts are extra
// expr options (for example expr.AsBool() for a filter).
func CompileExpr(src string, bound []string, opts ...expr.Option) (*Expr, error) {
	var reads valueReads
	var hashes hashFinder
	options := func(budget bool) []expr.Option {
		reads = valueReads{}
		hashes = hashFinder{}
		all := []expr.Option{expr.Env(recordEnv{}), fetchFunc, expr.Patch(&readsObserver{r: &reads, bound: bound}), expr.Patch(&hashes)}
		if len(bound) > 0 {
			all = append(all, expr.Patch(boundPatcher(bound)))
		}
		all = append(all, expr.Patch(fetchPatcher{}), addFunc, expr.Patch(addPatcher{}))
		all = append(all, opts...)
		all = append(all, helperCheck...)
		if budget {
			all = append(all, helperBudgeted...)
			all = append(all, budgetFuncs...)
			all = append(all, expr.Patch(budgetPatcher{}))
		}
		return all
	}
	// Checked as written first, so that a type error names the built-ins
	// as the rule wrote them; then compiled with the budget patcher, which
	// routes the allocating built-ins and every predicate through the
	// evaluation's meter (budget.go, exprfuncs.go).
	if _, err := expr.Compile(src, options(false)...); err != nil {
		return nil, err
	}
	p, err := expr.Compile(src, options(true)...)
	if err != nil {
		return nil, fmt.Errorf("%s: compiling with the expression budget: %w", src, err)
	}
	e := &Expr{Source: src, program: p, reads: reads, hash: hashes.found}
	if len(opts) == 0 {
		// An option (AsBool, AsInt64) changes what the VM returns; the
		// routes' own expressions take none.
		e.fast = compileFast(src, bound)
	}
	return e, nil
}

// vms recycles expr VMs: expr.Run allocates a VM and its stack for every
// evaluation, and an Expr is shared by the step instances of all tasks,
// so it cannot own one.
var vms = sync.Pool{New: func() any { return new(vm.VM) }}

// Eval evaluates the expression against r. A runtime failure comes back as
// an error whose text starts with the expression source and carries expr's
// message with the position (line:column and a caret under the culprit).
// Eval never panics: the expr VM recovers its own panics into errors.
func (e *Expr) Eval(r *Record) (any, error) {
	if e.fast != nil {
		if v, ok := e.fast.eval(r); ok {
			return v, nil
		}
	}
	return e.evalVM(r)
}

// evalVM is Eval on the expr VM.
func (e *Expr) evalVM(r *Record) (any, error) {
	m := vms.Get().(*vm.VM)
	r.meter.reset()
	out, err := m.Run(e.program, r.exprEnv())
	vms.Put(m)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e.Source, err)
	}
	return out, nil
}

// recordEnv is what an expression sees. It is a struct rather than a map
// so that it lives inside the Record (no allocation per record) and holds
// its numbers unboxed; expr reads its fields by index. Names bound by joins
// are not fields: boundPatcher rewrites them at compile time into lookups
// in Bound, so `merchant.avg` reads r.Bound["merchant"]["avg"].
type recordEnv struct {
	Key       string            `expr:"key"`
	Value     any               `expr:"value"`
	Headers   map[string]string `expr:"headers"`
	Timestamp int64             `expr:"timestamp"`
	Topic     string            `expr:"topic"`
	Partition int32             `expr:"partition"`
	Offset    int64             `expr:"offset"`
	Size      int64             `expr:"size"` // len(Raw): bytes of the value as produced
	Bound     map[string]any    `expr:"rtproxy_bound__"`
	Meter     *meter            `expr:"rtproxy_meter__"`    // the evaluation's budget (budget.go)
	HashKey   []byte            `expr:"rtproxy_hash_key__"` // the salt of hash() (viewfuncs.go)
	ready     bool              // Key and Headers are filled in
}

// boundName is the env field that holds join rows; no rule writes it.
const boundName = "rtproxy_bound__"

// boundPatcher turns each identifier naming a bound join row into
// rtproxy_bound__["name"], keeping its position for error messages.
type boundPatcher []string

func (b boundPatcher) Visit(node *ast.Node) {
	id, ok := (*node).(*ast.IdentifierNode)
	if !ok || !slices.Contains(b, id.Value) {
		return
	}
	ast.Patch(node, &ast.MemberNode{
		Node:     &ast.IdentifierNode{Value: boundName},
		Property: &ast.StringNode{Value: id.Value},
	})
}

// fetchName is the function fetchPatcher calls; no rule writes it.
const fetchName = "rtproxy_fetch__"

// fetchFunc reads a field of a decoded JSON object. expr's own member
// access goes through reflect (MapIndex, a sync.Map type cache and a copy
// of the value), which was 40% of a filter+set+map chain in the profile; a
// type switch on map[string]any costs a plain map index. Anything else
// falls back to expr's runtime.Fetch, whose panics the VM turns into the
// usual positioned error.
var fetchFunc = expr.Function(fetchName, func(args ...any) (any, error) {
	if m, ok := args[0].(map[string]any); ok {
		return m[args[1].(string)], nil
	}
	if args[0] == nil {
		return nil, fmt.Errorf("cannot fetch %v from <nil>", args[1])
	}
	return runtime.Fetch(args[0], args[1]), nil
}, new(func(any, string) any))

// fetchPatcher rewrites `x.name` and `x["name"]` into rtproxy_fetch__(x,
// "name") where x has no static type (a JSON value or a join row). Members
// with a static type (headers) keep expr's access, and so does every member
// of an optional chain (`a?.b.c`), whose short-circuit the compiler builds
// around member nodes.
type fetchPatcher struct{}

func (fetchPatcher) Visit(node *ast.Node) {
	m, ok := (*node).(*ast.MemberNode)
	if !ok || m.Optional || m.Method {
		return
	}
	prop, ok := m.Property.(*ast.StringNode)
	if !ok {
		return
	}
	if t := m.Node.Type(); t != nil && t.Kind() != reflect.Interface && t != mapStringAny {
		return
	}
	for n := m.Node; ; {
		switch x := n.(type) {
		case *ast.MemberNode:
			if x.Optional {
				return
			}
			n = x.Node
			continue
		case *ast.CallNode:
			if id, ok := x.Callee.(*ast.IdentifierNode); ok && id.Value == fetchName {
				n = x.Arguments[0]
				continue
			}
		case *ast.ChainNode:
			return
		}
		break
	}
	ast.Patch(node, &ast.CallNode{
		Callee:    &ast.IdentifierNode{Value: fetchName},
		Arguments: []ast.Node{m.Node, &ast.StringNode{Value: prop.Value}},
	})
}

var mapStringAny = reflect.TypeOf(map[string]any{})

// Env is what an expression sees for record r, as a map (for tools and
// tests; evaluation itself uses the struct cached on r).
func Env(r *Record) map[string]any {
	e := r.exprEnv()
	env := map[string]any{
		"key":       e.Key,
		"value":     e.Value,
		"headers":   e.Headers,
		"timestamp": e.Timestamp,
		"topic":     e.Topic,
		"partition": e.Partition,
		"offset":    e.Offset,
		"size":      e.Size,
	}
	for k, v := range r.Bound {
		env[k] = v
	}
	return env
}

// exprEnv returns the environment cached in r. The key string and the
// header map are built at the first call only; the rest is copied on every
// call because steps change Value and Bound in place.
func (r *Record) exprEnv() *recordEnv {
	e := &r.env
	if !e.ready {
		e.Key = string(r.Key)
		e.Headers = nil
		if len(r.Headers) > 0 {
			e.Headers = make(map[string]string, len(r.Headers))
			for _, x := range r.Headers {
				e.Headers[x.Key] = string(x.Value)
			}
		}
		e.ready = true
	}
	e.Value = r.Value
	e.Bound = r.Bound
	e.Meter = &r.meter
	e.HashKey = r.HashKey
	e.Timestamp = r.Timestamp
	e.Topic = r.Topic
	e.Partition = r.Partition
	e.Offset = r.Offset
	e.Size = int64(len(r.Raw))
	return e
}

// errKeyType is returned when a key expression yields something that
// cannot name a key (an object, a list).
var errKeyType = errors.New("key must be a string, number or bool")

// keyString turns the result of a key expression (join on, window key,
// drop_duplicates key) into the string the state and tables are indexed
// by. Numbers print without a trailing ".0" so that a JSON 42 (float64)
// and an expr 42 (int) name the same key; nil is the empty key.
func keyString(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	case int:
		return strconv.Itoa(x), nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case int32:
		return strconv.FormatInt(int64(x), 10), nil
	case uint64:
		return strconv.FormatUint(x, 10), nil
	case float32:
		return strconv.FormatFloat(float64(x), 'f', -1, 32), nil
	case bool:
		return strconv.FormatBool(x), nil
	case nil:
		return "", nil
	case []byte:
		return string(x), nil
	}
	if f, ok := jsoncodec.ToFloat(v); ok {
		return strconv.FormatFloat(f, 'f', -1, 64), nil
	}
	return "", fmt.Errorf("%w, got %T", errKeyType, v)
}

// MaxStringBytes bounds a string that `+` builds during one evaluation.
// expr's memory budget counts ranges and arrays but not concatenation, so
// `reduce(1..40, #acc + #acc, "x")` would otherwise double a string forty
// times and take the process down (and, as the record replays after the
// crash, take it down again). A `+` whose string result would exceed this
// fails the evaluation: the record goes to the dead-letter topic with
// reason error.
const MaxStringBytes = 1 << 20

// addName is the function addPatcher calls; no rule writes it.
const addName = "rtproxy_add__"

// addFunc is `+` with the string bound; every other operand pair adds as
// expr's own `+` does.
var addFunc = expr.Function(addName, func(args ...any) (any, error) {
	if a, ok := args[0].(string); ok {
		if b, ok := args[1].(string); ok {
			if len(a)+len(b) > MaxStringBytes {
				return nil, tripped(BudgetExprMemory, "expression budget exceeded: string concatenation would build %d bytes, over the limit of %d bytes per string", len(a)+len(b), MaxStringBytes)
			}
			m, _ := args[2].(*meter)
			if err := m.alloc("string concatenation", int64(len(a)+len(b))); err != nil {
				return nil, err
			}
			return a + b, nil
		}
	}
	return runtime.Add(args[0], args[1]), nil
}, new(func(any, any, any) any))

// addPatcher rewrites `a + b` into rtproxy_add__(a, b) unless an operand
// is statically a number: numbers keep expr's own (faster) `+`, and a
// static mismatch such as `"a" + 1` keeps its compile-time error.
type addPatcher struct{}

func (addPatcher) Visit(node *ast.Node) {
	b, ok := (*node).(*ast.BinaryNode)
	if !ok || b.Operator != "+" {
		return
	}
	if isNumber(b.Left.Type()) || isNumber(b.Right.Type()) {
		return
	}
	ast.Patch(node, &ast.CallNode{
		Callee:    &ast.IdentifierNode{Value: addName},
		Arguments: []ast.Node{b.Left, b.Right, &ast.IdentifierNode{Value: meterName}},
	})
}

func isNumber(t reflect.Type) bool {
	if t == nil {
		return false
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return true
	}
	return false
}
