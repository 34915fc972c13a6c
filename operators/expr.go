package operators

import (
	"fmt"

	"github.com/expr-lang/expr"
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

// Eval evaluates the expression against r.
func (e *Expr) Eval(r *Record) (any, error) {
	out, err := expr.Run(e.program, Env(r))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e.Source, err)
	}
	return out, nil
}

// envTypes is the shape expressions are type-checked against.
func envTypes(bound []string) map[string]any {
	env := map[string]any{
		"key":       "",
		"value":     any(nil),
		"headers":   map[string]string{},
		"timestamp": int64(0),
		"topic":     "",
		"partition": int32(0),
		"offset":    int64(0),
	}
	for _, b := range bound {
		env[b] = map[string]any{}
	}
	return env
}

// Env is what an expression sees for record r.
func Env(r *Record) map[string]any {
	h := make(map[string]string, len(r.Headers))
	for _, x := range r.Headers {
		h[x.Key] = string(x.Value)
	}
	env := map[string]any{
		"key":       string(r.Key),
		"value":     r.Value,
		"headers":   h,
		"timestamp": r.Timestamp,
		"topic":     r.Topic,
		"partition": r.Partition,
		"offset":    r.Offset,
	}
	for k, v := range r.Bound {
		env[k] = v
	}
	return env
}
