package operators

import "fmt"

// switchStep sends each record to the sink of the first branch whose
// condition holds: it sets Record.Branch and emits the record; the
// pipeline's sink set writes it to that branch's sink. A branch without a
// condition (the last only: rules/ refuses it elsewhere) takes every
// record the branches before it did not. A record no branch takes is
// dropped (emits nothing: the pipeline counts it in
// rtproxy_pipeline_records_dropped_total with the step's label). A
// condition that fails, or gives something other than true or false,
// makes the record a dead letter with ReasonError, as a filter's does.
type switchStep struct {
	branches []Branch
}

// Branch is one entry of a `switch` step as the step sees it: its
// condition (nil: the default branch) and the name of its sink, for
// messages. Where the sink writes and how is rules/ and the pipeline's.
type Branch struct {
	When *Expr
	Sink string
}

func init() {
	register(&Spec{
		Kind:    "switch",
		Order:   90,
		Summary: "Sends each record to the sink of the first branch whose `when` holds (a branch without `when`, last, takes the rest); a record no branch takes is dropped. The last step; the route's sinks are its branches'.",
		Body: &Key{Name: "switch", Type: TypeBranches, Required: true,
			Doc: "The branches, tried in order: each `{ when: CONDITION, sink: { topic | http, key, format, subject, schema, message, message_indexes } }`. The last may leave out `when`. A `when` that fails, or gives something other than true or false, makes the record a dead letter (reason `error`)."},
		Usage: "`- switch: [ { when: value.amount > 1000, sink: { topic: payments.large } }, { sink: { topic: payments.rest } } ]`",
		Example: `route: payments-by-size
source: { topic: payments }
steps:
  - filter: value.amount > 0
  - switch:
      - when: value.amount > 1000
        sink: { topic: payments.large, key: value.account }
      - when: value.currency != "EUR"
        sink: { topic: payments.foreign }
      - sink: { topic: payments.rest }
`,
		Compile: func(a *Args) (*Plan, error) {
			bs := a.Branches("switch")
			if len(bs) == 0 {
				return nil, &KeyError{Key: "switch", Msg: "switch needs at least one branch: `- switch: [ { when: value.amount > 1000, sink: { topic: payments.large } }, { sink: { topic: payments.rest } } ]`"}
			}
			for i, b := range bs {
				if b.When == nil && i != len(bs)-1 {
					return nil, &KeyError{Key: "switch", Msg: fmt.Sprintf("switch branch %d has no `when`: only the last branch may be the default (a branch after it could never be taken)", i+1)}
				}
			}
			return &Plan{New: func(BuildEnv) (Step, error) { return NewSwitch(bs), nil }}, nil
		},
	})
}

// NewSwitch returns the `switch:` step.
func NewSwitch(branches []Branch) Step { return &switchStep{branches: branches} }

func (s *switchStep) Kind() string { return "switch" }

func (s *switchStep) Process(r *Record, out Emitter) {
	defer recoverTo("switch", r, out)
	for i := range s.branches {
		b := &s.branches[i]
		if b.When == nil {
			r.Branch = i
			out.Emit(r)
			return
		}
		v, err := b.When.Eval(r)
		if err != nil {
			out.DeadLetter(r, evalReason(err), fmt.Errorf("switch branch %d (%s): %w", i+1, b.Sink, err))
			return
		}
		t, ok := v.(bool)
		if !ok {
			out.DeadLetter(r, ReasonError, fmt.Errorf("switch branch %d (%s): %s: result is %T (%v), not bool", i+1, b.Sink, b.When.Source, v, v))
			return
		}
		if t {
			r.Branch = i
			out.Emit(r)
			return
		}
	}
	// No branch took it: dropped, counted by the pipeline as a drop.
}
