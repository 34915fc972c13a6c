package operators

import (
	"fmt"
	"maps"
	"reflect"
)

func init() {
	register(&Spec{
		Kind:    "explode",
		Order:   35,
		Summary: "Turns one record into one record per element of a list, in order, each with the element bound under a name for the steps after it.",
		Keys: []Key{
			{Name: "each", Type: TypeExpr, Required: true,
				Doc:   "The list. Null or an empty list gives no record (counted as dropped); anything else that is not a list, or a list of more than 10,000 elements, is a dead letter (reason `error`).",
				Needs: "the expression that gives the list, e.g. `each: value.items`"},
			{Name: "as", Type: TypeName, Required: true,
				Doc:   "The name each element is bound under. It must not hide a built-in name, an expr-lang function or an earlier step's name.",
				Needs: "the name each element is bound under, e.g. `as: item`"},
		},
		Usage: "`explode: { each: value.items, as: item }`",
		Example: `route: order-lines
source: { topic: orders }
sink: { topic: order-lines }
steps:
  - explode: { each: value.lines, as: line }
  - map: { order: value.id, sku: line.sku, qty: line.qty }
`,
		Compile: func(a *Args) (*Plan, error) {
			each, as := a.Expr("each"), a.String("as")
			return &Plan{
				New:    func(BuildEnv) (Step, error) { return &explode{each: each, as: as}, nil },
				Binds:  as,
				FanOut: MaxExplode, FanOutUnit: "records",
			}, nil
		},
	})
}

// MaxExplode is the most records one explode makes of one record: a
// record is bounded in bytes, but an expression can build a list far
// longer than any record.
const MaxExplode = 10000

// explode emits one copy of the record per element of a list, with the
// element bound under `as`, in list order. Each copy has its own value
// object (a later `set` on one copy does not reach the others) and the
// source position of the record it came from, so a replay emits the same
// copies in the same order.
type explode struct {
	each *Expr
	as   string
	// after is how many window updates each copy causes in the steps
	// after it (the sliding windows' windows per record, multiplied; 1
	// when none): the explode charges the fan-out budget for them too,
	// before it makes a copy (SetFanOutAfter).
	after int64
}

// FanOutSetter is a step told, when the route is built, the fan-out each
// record it emits causes in the steps after it.
type FanOutSetter interface {
	SetFanOutAfter(n int64)
}

// SetFanOutAfter implements FanOutSetter.
func (e *explode) SetFanOutAfter(n int64) { e.after = n }

func (e *explode) Kind() string { return "explode" }

func (e *explode) Process(r *Record, out Emitter) {
	defer recoverTo("explode", r, out)
	v, err := e.each.Eval(r)
	if err != nil {
		out.DeadLetter(r, evalReason(err), fmt.Errorf("explode %s: %w", e.as, err))
		return
	}
	if v == nil {
		return
	}
	list := reflect.ValueOf(v)
	if k := list.Kind(); k != reflect.Slice && k != reflect.Array {
		out.DeadLetter(r, ReasonError, fmt.Errorf("explode %s: each (%s) gave %s, not a list", e.as, e.each.Source, jsonKind(v)))
		return
	}
	n := list.Len()
	if n > MaxExplode {
		out.DeadLetter(r, ReasonError, fmt.Errorf("explode %s: each (%s) gave %d elements, more than %d", e.as, e.each.Source, n, MaxExplode))
		return
	}
	cost, what := int64(n), "explode "+e.as
	if e.after > 1 {
		cost = mulSize(cost, e.after+1)
		what = fmt.Sprintf("explode %s (%d elements, each updating %d windows after it)", e.as, n, e.after)
	}
	if err := chargeFanOut(r, what, cost); err != nil {
		if err != errFanOutSpent {
			out.DeadLetter(r, ReasonBudget, fmt.Errorf("explode %s: %w", e.as, err))
		}
		return
	}
	for i := range n {
		out.Emit(e.copyWith(r, list.Index(i).Interface()))
	}
}

// copyWith is a copy of r with elem bound under the step's name. The value
// object is copied one level deep: `set` writes only top-level members,
// and nothing writes inside nested ones. A value that was still the
// decoding of the record's bytes stays so, and goes out as those bytes;
// one a step had changed stays changed.
func (e *explode) copyWith(r *Record, elem any) *Record {
	c := &Record{
		Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
		Key: r.Key, Value: r.Value, Raw: r.Raw, Headers: r.Headers,
		Timestamp: r.Timestamp, EventTime: r.EventTime, Window: r.Window,
		fan: r.fan, // the copies share the input record's fan-out budget
		// The windows after the explode are paid for.
		fanPaid: e.after > 1,
	}
	if obj, ok := r.Value.(map[string]any); ok {
		c.Value = maps.Clone(obj)
	}
	if _, ok := r.ValueBytes(); ok {
		c.rawValue, c.rawFrom, c.rawSet = c.Value, r.rawFrom, true
	} else if r.rawSet {
		// A step changed the value since it was decoded from Raw: the
		// copy is as rewritten (Rewritten), so a dead letter of it
		// encodes its value, not Raw, which no longer holds it.
		c.rawValue, c.rawFrom, c.rawSet, c.valueChanged = r.rawValue, r.rawFrom, true, true
	}
	if r.Partial() {
		// The copy is as partial as the original: it keeps the bytes the
		// members it lacks are in.
		c.partialOf, c.partialFrom = c.Value.(map[string]any), r.partialFrom
	}
	c.Bound = make(map[string]any, len(r.Bound)+1)
	maps.Copy(c.Bound, r.Bound)
	c.Bound[e.as] = elem
	return c
}
