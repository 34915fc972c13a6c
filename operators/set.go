package operators

import "fmt"

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
			out.DeadLetter(r, ReasonError, fmt.Errorf("set %s: %w", f.Name, err))
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
			out.DeadLetter(r, ReasonError, fmt.Errorf("map %s: %w", f.Name, err))
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
	if _, ok := toFloat(v); ok {
		return "a number"
	}
	return fmt.Sprintf("%T", v)
}
