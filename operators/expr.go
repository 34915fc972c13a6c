package operators

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/types"
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
	env := envTypes(bound)
	all := append([]expr.Option{expr.Env(env)}, opts...)
	p, err := expr.Compile(src, all...)
	if err != nil {
		return nil, err
	}
	return &Expr{Source: src, program: p}, nil
}

// Eval evaluates the expression against r. A runtime failure comes back as
// an error whose text starts with the expression source and carries expr's
// message with the position (line:column and a caret under the culprit).
// Eval never panics: the expr VM recovers its own panics into errors.
func (e *Expr) Eval(r *Record) (any, error) {
	out, err := expr.Run(e.program, r.exprEnv())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e.Source, err)
	}
	return out, nil
}

// envTypes is the shape expressions are type-checked against. It is a
// types.Map rather than a map of sample values because value and the bound
// names have no static type (any JSON value, or nil when a join missed): a
// nil sample would type them as nil and refuse `value.amount` at compile
// time. The runtime env is still a plain map[string]any, so expr keeps its
// fast path for top-level names.
func envTypes(bound []string) types.Map {
	env := types.Map{
		"key":       types.String,
		"value":     types.Any,
		"headers":   types.TypeOf(map[string]string{}),
		"timestamp": types.Int64,
		"topic":     types.String,
		"partition": types.Int32,
		"offset":    types.Int64,
	}
	for _, b := range bound {
		env[b] = types.Any
	}
	return env
}

// Env is what an expression sees for record r. The map is cached on r and
// shared by every expression evaluated on it: treat it as read-only.
func Env(r *Record) map[string]any {
	return r.exprEnv()
}

// exprEnv returns the environment cached on r, building it at the first
// call. The map env lets expr use its OpLoadFast path (a plain map index)
// for top-level names; a struct env would go through reflection. Value and
// Bound are refreshed on every call because steps change them in place
// (set, map, join); the other fields are fixed for the life of a record.
func (r *Record) exprEnv() map[string]any {
	if r.env == nil {
		h := make(map[string]string, len(r.Headers))
		for _, x := range r.Headers {
			h[x.Key] = string(x.Value)
		}
		r.env = make(map[string]any, 8+len(r.Bound))
		r.env["key"] = string(r.Key)
		r.env["headers"] = h
		r.env["timestamp"] = r.Timestamp
		r.env["topic"] = r.Topic
		r.env["partition"] = r.Partition
		r.env["offset"] = r.Offset
	}
	r.env["value"] = r.Value
	for k, v := range r.Bound {
		r.env[k] = v
	}
	return r.env
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
