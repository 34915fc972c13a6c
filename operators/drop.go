package operators

import "fmt"

// drop removes fields from the value, a JSON object, and keeps the
// others: the way a view (or a route) leaves out what a reader must not
// get at all, where mask or hash would still show something. A field the
// value does not have is no error.
type drop struct {
	fields []string
}

func init() {
	register(&Spec{
		Kind:    "drop",
		Order:   45,
		Summary: "Removes fields from the value (a JSON object) and keeps the others.",
		Body: &Key{Name: "drop", Type: TypeFieldNames, Required: true,
			Doc: "The fields to remove, a list of names; a field the value does not have is skipped."},
		Usage: "`- drop: [email, phone]`",
		Example: `route: payments-public
source: { topic: payments }
sink: { topic: payments.public }
steps:
  - drop: [card, email]
`,
		Compile: func(a *Args) (*Plan, error) {
			names := a.Names("drop")
			return &Plan{
				New:    func(BuildEnv) (Step, error) { return NewDrop(names), nil },
				Traits: Traits{Value: ValueDropped},
				Fields: names,
			}, nil
		},
	})
}

// NewDrop returns the `drop:` step. The value must be a JSON object; any
// other value is a dead letter with ReasonError.
func NewDrop(fields []string) Step { return &drop{fields: fields} }

func (d *drop) Kind() string { return "drop" }

func (d *drop) Process(r *Record, out Emitter) {
	defer recoverTo("drop", r, out)
	obj, ok := r.Value.(map[string]any)
	if !ok {
		out.DeadLetter(r, ReasonError, fmt.Errorf("drop: value is %s, not an object", jsonKind(r.Value)))
		return
	}
	if r.Partial() {
		// Splicing a partly decoded object back (EncodeValue) would put
		// the dropped members back from the raw bytes: the loader decodes
		// whole for a drop (rules), so this is a bug, and never a leak.
		out.DeadLetter(r, ReasonError, fmt.Errorf("drop: the value was decoded only in part; cannot remove members from it"))
		return
	}
	changed := false
	for _, f := range d.fields {
		if _, has := obj[f]; has {
			delete(obj, f)
			changed = true
		}
	}
	if changed {
		r.ValueChanged()
		r.shuffleKeyFor = nil
	}
	out.Emit(r)
}
