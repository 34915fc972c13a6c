package operators

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/vm"
)

// Expr is one compiled expr-lang expression of a rule file, evaluated
// against a record. Compile it once at load time with CompileExpr.
type Expr struct {
	Source  string
	program *vm.Program
}

// CompileExpr compiles src against the record environment. bound are the
// names that join steps before this expression bind (`as`). opts are extra
// expr options (for example expr.AsBool() for a filter).
func CompileExpr(src string, bound []string, opts ...expr.Option) (*Expr, error) {
	all := []expr.Option{expr.Env(&recordEnv{})}
	if len(bound) > 0 {
		all = append(all, expr.Patch(boundPatcher(bound)))
	}
	all = append(all, opts...)
	p, err := expr.Compile(src, all...)
	if err != nil {
		return nil, err
	}
	return &Expr{Source: src, program: p}, nil
}

// vms recycles expr VMs: expr.Run allocates a VM and its stack for every
// evaluation, and an Expr is shared by the step instances of all workers,
// so it cannot own one.
var vms = sync.Pool{New: func() any { return new(vm.VM) }}

// Eval evaluates the expression against r. A runtime failure comes back as
// an error whose text starts with the expression source and carries expr's
// message with the position (line:column and a caret under the culprit).
// Eval never panics: the expr VM recovers its own panics into errors.
func (e *Expr) Eval(r *Record) (any, error) {
	m := vms.Get().(*vm.VM)
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
	Bound     map[string]any    `expr:"rtproxy_bound__"`
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
	e.Timestamp = r.Timestamp
	e.Topic = r.Topic
	e.Partition = r.Partition
	e.Offset = r.Offset
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
	if f, ok := toFloat(v); ok {
		return strconv.FormatFloat(f, 'f', -1, 64), nil
	}
	return "", fmt.Errorf("%w, got %T", errKeyType, v)
}

// toFloat reports v as a float64 if it is any Go number.
func toFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case int32:
		return float64(x), true
	case float32:
		return float64(x), true
	case int8:
		return float64(x), true
	case int16:
		return float64(x), true
	case uint:
		return float64(x), true
	case uint8:
		return float64(x), true
	case uint16:
		return float64(x), true
	case uint32:
		return float64(x), true
	case uint64:
		return float64(x), true
	}
	return math.NaN(), false
}
