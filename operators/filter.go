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

// NewFilter returns the `filter:` step.
func NewFilter(pred *Expr) Step { return &filter{pred: pred} }

func (f *filter) Kind() string { return "filter" }

func (f *filter) Process(r *Record, out Emitter) {
	defer recoverTo("filter", r, out)
	v, err := f.pred.Eval(r)
	if err != nil {
		out.DeadLetter(r, ReasonError, fmt.Errorf("filter: %w", err))
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
