package operators

import (
	"fmt"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
)

// Field is one `name: expression` entry of a set or map step.
type Field struct {
	Name string
	Expr *Expr
}

// set adds or overwrites fields of the value and keeps the others. Every
// expression of one set sees the value as it was before the step: all are
// evaluated first, then assigned. So a failure leaves the record exactly
// as it came in, which is what the dead letter must carry.
type set struct {
	fields []Field
}

func init() {
	register(&Spec{
		Kind:    "set",
		Order:   40,
		Summary: "Adds or overwrites fields of the value (a JSON object) and keeps the others; every expression sees the value as it was before the step.",
		Body: &Key{Name: "set", Type: TypeFields, Required: true,
			Doc: "The fields to set, each `FIELD: EXPRESSION`."},
		Usage: "`- set: { amount_cents: int(value.amount * 100) }`",
		Example: `route: payments-cents
source: { topic: payments }
sink: { topic: payments.cents }
steps:
  - set: { amount_cents: int(value.amount * 100) }
`,
		Compile: func(a *Args) (*Plan, error) {
			fields := a.Fields("set")
			return &Plan{
				New:    func(BuildEnv) (Step, error) { return NewSet(fields), nil },
				Traits: Traits{Value: ValueMerged},
				Fields: fieldNames(fields),
			}, nil
		},
	})
	register(&Spec{
		Kind:    "map",
		Order:   50,
		Summary: "Replaces the value with exactly the object its fields build; later steps can read only these fields.",
		Body: &Key{Name: "map", Type: TypeFields, Required: true,
			Doc: "The fields of the new value, each `FIELD: EXPRESSION`."},
		Usage: "`- map: { user: value.user.id }`",
		Example: `route: logins-slim
source: { topic: logins }
sink: { topic: logins.slim }
steps:
  - map: { user: value.user.id, ok: value.result == "success" }
`,
		Compile: func(a *Args) (*Plan, error) {
			fields := a.Fields("map")
			return &Plan{
				New:    func(BuildEnv) (Step, error) { return NewMap(fields), nil },
				Traits: Traits{Value: ValueReplaced},
				Fields: fieldNames(fields),
			}, nil
		},
	})
}

func fieldNames(fields []Field) []string {
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.Name
	}
	return names
}

// NewSet returns the `set:` step. The value must be a JSON object; any
// other value is a dead letter with ReasonError.
func NewSet(fields []Field) Step { return &set{fields: fields} }

func (s *set) Kind() string { return "set" }

func (s *set) Process(r *Record, out Emitter) {
	defer recoverTo("set", r, out)
	obj, ok := r.Value.(map[string]any)
	if !ok {
		out.DeadLetter(r, ReasonError, fmt.Errorf("set: value is %s, not an object", jsonKind(r.Value)))
		return
	}
	// Results wait in a stack buffer so the common small set costs no
	// allocation beyond the map growth itself.
	var buf [16]any
	vals := buf[:0]
	for _, f := range s.fields {
		v, err := f.Expr.Eval(r)
		if err != nil {
			out.DeadLetter(r, evalReason(err), fmt.Errorf("set %s: %w", f.Name, err))
			return
		}
		vals = append(vals, v)
	}
	for i, f := range s.fields {
		obj[f.Name] = vals[i]
	}
	r.ValueChanged()
	r.shuffleKeyFor = nil // a key computed before may read a changed field
	out.Emit(r)
}

// mapStep replaces the value with exactly the object its fields build.
type mapStep struct {
	fields []Field
}

// NewMap returns the `map:` step: the value becomes exactly this object,
// whatever the value was before (object, scalar or raw string).
func NewMap(fields []Field) Step { return &mapStep{fields: fields} }

func (m *mapStep) Kind() string { return "map" }

func (m *mapStep) Process(r *Record, out Emitter) {
	defer recoverTo("map", r, out)
	obj := make(map[string]any, len(m.fields))
	for _, f := range m.fields {
		v, err := f.Expr.Eval(r)
		if err != nil {
			out.DeadLetter(r, evalReason(err), fmt.Errorf("map %s: %w", f.Name, err))
			return
		}
		obj[f.Name] = v
	}
	r.Value = obj
	r.shuffleKeyFor = nil
	out.Emit(r)
}

// jsonKind names the JSON kind of a decoded value for error messages.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case bool:
		return "a bool"
	}
	if _, ok := jsoncodec.ToFloat(v); ok {
		return "a number"
	}
	return fmt.Sprintf("%T", v)
}
