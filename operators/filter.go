package operators

import "fmt"

// filter passes the records its predicate holds for. A false predicate
// drops the record (the pipeline counts it as dropped, it is not a dead
// letter); a predicate that fails or is not a bool sends the record to the
// dead-letter output with ReasonError, because silently dropping it would
// hide a broken rule.
type filter struct {
	pred *Expr
}

func init() {
	register(&Spec{
		Kind:    "filter",
		Order:   10,
		Summary: "Keeps the records for which a condition is true and drops the others.",
		Body: &Key{Name: "filter", Type: TypeCondition, Required: true,
			Doc: "The condition. A record for which it fails, or gives something other than true or false, is a dead letter (reason `error`)."},
		Usage: "`- filter: value.amount > 0`",
		Example: `route: big-payments
source: { topic: payments }
sink: { topic: payments.big }
steps:
  - filter: value.amount >= 1000
`,
		Compile: func(a *Args) (*Plan, error) {
			pred := a.Expr("filter")
			return &Plan{New: func(BuildEnv) (Step, error) { return NewFilter(pred), nil }}, nil
		},
	})
}

// NewFilter returns the `filter:` step.
func NewFilter(pred *Expr) Step { return &filter{pred: pred} }

func (f *filter) Kind() string { return "filter" }

func (f *filter) Process(r *Record, out Emitter) {
	defer recoverTo("filter", r, out)
	v, err := f.pred.Eval(r)
	if err != nil {
		out.DeadLetter(r, evalReason(err), fmt.Errorf("filter: %w", err))
		return
	}
	b, ok := v.(bool)
	if !ok {
		out.DeadLetter(r, ReasonError, fmt.Errorf("filter: %s: result is %T (%v), not bool", f.pred.Source, v, v))
		return
	}
	if b {
		out.Emit(r)
	}
}
