package operators

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// A step kind is declared once, by a Spec in the kind's own file. Every
// part of rtproxy reads the kind from there: rules/ parses and analyzes a
// step through its Spec (keys, types, defaults, validation, what later
// steps see), the pipeline decides shuffles, watermarks and state by the
// Traits its Compile returns (keyed, timed, stateful, absorbing, closes,
// what later steps see of the value), and the reference table of
// docs/RULES.md is generated from the Specs. A step instance implements
// the interface of each trait it declares and no other (CheckTraits).
// Adding a step kind is one file here, its tests and `go generate ./...`.

// Spec declares one step kind.
type Spec struct {
	Kind string // the key a rule file writes: `- filter: ...`
	// Form names the key that selects this spec among the specs of its
	// kind: a `join:` mapping with a `stream:` key is the stream join
	// (Form "stream"), any other the table join (Form ""). At most one
	// spec of a kind has no Form.
	Form    string
	Summary string // one sentence for the reference table
	// Order places the kind in lists (messages, docs): the order people
	// meet the kinds in, not the alphabet.
	Order int
	// Body is set for a step whose value is itself one value of this key
	// (`- filter: EXPR`, `- set: {FIELD: EXPR}`); Body.Name is the kind.
	// Otherwise the step's value is a mapping of Keys.
	Body *Key
	Keys []Key
	// KeyedBy names the key whose value partitions the state of a Keyed
	// step, for the docs ("" for other steps).
	KeyedBy string
	// Usage is how the step is written, for messages: "`join: { table:
	// merchants, on: value.merchant_id }`".
	Usage string
	// Example is a complete rule file using the step. Tests load it, and
	// the generated reference shows it.
	Example string
	// Compile checks the values a rule file gave (defaults filled in) and
	// returns what the step does. Problems are KeyErrors; the analyzer
	// attaches each to the file position of its key. It is the only check
	// a step gets: what Compile accepts, the step built by Plan.New runs.
	Compile func(a *Args) (*Plan, error)
}

// KeyType is what a key holds, as the rule file writes it.
type KeyType int

const (
	TypeExpr       KeyType = iota + 1 // an expression giving any value
	TypeCondition                     // an expression giving true or false
	TypeDuration                      // a duration greater than zero: 500ms, 30s, 5m, 1h
	TypeEnum                          // one of Key.Choices
	TypeName                          // a name that later expressions see
	TypeTable                         // the name of a table under `tables:`
	TypeFields                        // a mapping of field names to expressions
	TypeAggregates                    // a mapping of names to aggregate calls
	TypeStream                        // a second input: { topic, event_time, format } (StreamInput)
	TypeInterval                      // { before: DURATION, after: DURATION } (Interval)
	TypeBranches                      // a list of `{ when: CONDITION, sink: {...} }` (switch)
	TypeFieldNames                    // a list of field names of the value
)

var keyTypeNames = map[KeyType]string{
	TypeExpr: "expression", TypeCondition: "condition", TypeDuration: "duration", TypeEnum: "choice",
	TypeName: "name", TypeTable: "table name", TypeFields: "fields", TypeAggregates: "aggregates",
	TypeStream: "stream", TypeInterval: "interval",
	TypeFieldNames: "field names", TypeBranches: "branches",
}

func (t KeyType) String() string { return keyTypeNames[t] }

// Key is one key of a step.
type Key struct {
	Name     string
	Type     KeyType
	Required bool
	// Default is the value a rule file without the key gets, written as a
	// rule file would write it. DefaultFrom names the key whose value is
	// the default instead (join `as`: the table). Absent says in the docs
	// what no value means when there is neither ("forever").
	Default     string
	DefaultFrom string
	Absent      string
	Choices     []string // TypeEnum
	Doc         string   // one sentence for the reference table
	// Needs completes "<kind> needs `<key>`: ..." when a required key is
	// missing: what it is, with an example.
	Needs string
	// ZeroOK: a TypeDuration key that may be 0.
	ZeroOK bool
	// OtherSide: an expression read on the records of the step's second
	// input (a stream join's `other`), not on the route's.
	OtherSide bool
	// FingerprintOmitsAbsent leaves the key out of the step's fingerprint
	// when the rule file does not write it: a key added to a kind whose
	// fingerprints have shipped keeps theirs (and so their state).
	FingerprintOmitsAbsent bool
}

// Args are the values of one step as the rule file gave them, defaults
// filled in; the analyzer sets them and a Spec's Compile reads them. A key
// that the file did not give and that has no default reads as the zero
// value (nil expression, 0 duration, "").
type Args struct {
	vals    map[string]any
	written map[string]bool
}

// NewArgs returns empty Args.
func NewArgs() *Args { return &Args{vals: map[string]any{}, written: map[string]bool{}} }

// Set sets key to v; written says whether the rule file wrote it (rather
// than a default).
func (a *Args) Set(key string, v any, written bool) {
	a.vals[key] = v
	if written {
		a.written[key] = true
	}
}

// Written reports whether the rule file wrote key.
func (a *Args) Written(key string) bool { return a.written[key] }

// Expr is an expression key (TypeExpr, TypeCondition).
func (a *Args) Expr(key string) *Expr { e, _ := a.vals[key].(*Expr); return e }

// Duration is a TypeDuration key.
func (a *Args) Duration(key string) time.Duration { d, _ := a.vals[key].(time.Duration); return d }

// String is a TypeEnum, TypeName or TypeTable key.
func (a *Args) String(key string) string { s, _ := a.vals[key].(string); return s }

// Fields is a TypeFields key.
func (a *Args) Fields(key string) []Field { f, _ := a.vals[key].([]Field); return f }

// Stream is a TypeStream key.
func (a *Args) Stream(key string) StreamInput { s, _ := a.vals[key].(StreamInput); return s }

// Interval is a TypeInterval key.
func (a *Args) Interval(key string) Interval { i, _ := a.vals[key].(Interval); return i }

// Names is a TypeFieldNames key.
func (a *Args) Names(key string) []string { n, _ := a.vals[key].([]string); return n }

// Aggregates is a TypeAggregates key.
func (a *Args) Aggregates(key string) []Aggregate { g, _ := a.vals[key].([]Aggregate); return g }

// Branches is a TypeBranches key.
func (a *Args) Branches(key string) []Branch { b, _ := a.vals[key].([]Branch); return b }

// Plan is a compiled step: how to build it, and what the steps after it
// see.
type Plan struct {
	// New builds one instance of the step. The pipeline builds a Keyed
	// step once per owned partition of its segment, each with its own KV.
	New func(BuildEnv) (Step, error)
	// Traits are what the pipeline decides the step by; Traits.Value is
	// what later steps see of the value. Fields are its fields
	// (ValueReplaced) or the fields added (ValueMerged).
	Traits
	Fields []string
	// Binds is a name later expressions see (join `as`); ClearsNames says
	// later expressions see none of the names bound before (a window row
	// is no one record).
	Binds       string
	ClearsNames bool
	Table       string // the table the step reads, "" for none
	// Input is the second input of a step with TwoInputs (a stream join).
	Input *StreamInput
	// Warnings are what the analyzer can tell will grow without bound (the
	// step's state, its work per record); the rule runs, and `rtproxy
	// check` shows them.
	Warnings KeyErrors
	// FanOut is the most records or window updates the step makes of one
	// record it gets (explode: MaxExplode; a sliding window: its windows
	// per record); 0 or 1: one at most. EndsFanOut says what the step
	// emits is no longer per record (a window emitting on close). The
	// analyzer multiplies them along the steps (limits.max_fanout).
	FanOut     int64
	EndsFanOut bool
	// FanOutExact says FanOut is what every record costs (a window's
	// windows per record), not an upper bound that depends on the record
	// (an explode's list); FanOutUnit names what is made ("records",
	// "window updates").
	FanOutExact bool
	FanOutUnit  string
}

// Traits are what the pipeline and the docs need to know of a step
// without building it. Compile declares them; each instance Plan.New
// builds implements exactly the interfaces its traits name (CheckTraits
// says whether it does; the pipeline checks every instance it builds, and
// a test every spec's).
type Traits struct {
	// Keyed: the step's state is partitioned by its key (Keyed): it opens
	// a segment of its own, read through a repartition topic, its changes
	// logged to a changelog topic.
	Keyed bool
	// Timed: the step reacts to the watermark (Timed): its segment
	// receives watermarks, and writers before it send markers.
	Timed bool
	// Stateful: the step's state is snapshotted at checkpoints (Stateful).
	Stateful bool
	// Absorbing: the step takes records into its state and emits later
	// (Absorbing): a Process that emits nothing is not a drop.
	Absorbing bool
	// Closes: the step closes what it holds as the watermark passes and
	// emits it then (Closer): the close journal keeps closed state closed
	// across a crash.
	Closes bool
	// TwoInputs: the step reads a second topic (TwoInputs, Plan.Input):
	// the route's group reads it too, and its records are keyed into the
	// step's repartition topic as the other side.
	TwoInputs bool
	// HoldsWatermark is how far behind the watermark it was given the step
	// may emit (millis): the steps after it, in the segments that follow,
	// see the watermark held back by this much, so what it emits is not
	// late to them. A stream join emits a pair up to `grace` behind the
	// watermark, and a record that matched nothing once the watermark has
	// passed its window plus `grace`.
	HoldsWatermark int64
	// Value is what later steps see of the value.
	Value ValueEffect
}

// SourceShaped reports whether later steps still see the value in the
// shape it had when it came in (a step that replaces the value ends it).
func (t Traits) SourceShaped() bool { return t.Value != ValueReplaced }

// CheckTraits reports how s differs from the traits its plan declared:
// nil when s implements exactly the interfaces t names.
func CheckTraits(t Traits, s Step) error {
	_, keyed := s.(Keyed)
	_, timed := s.(Timed)
	_, stateful := s.(Stateful)
	_, absorbing := s.(Absorbing)
	_, closes := s.(Closer)
	_, two := s.(TwoInputs)
	var bad []string
	for _, c := range []struct {
		name       string
		decl, impl bool
	}{{"keyed", t.Keyed, keyed}, {"timed", t.Timed, timed}, {"stateful", t.Stateful, stateful},
		{"absorbing", t.Absorbing, absorbing}, {"closes", t.Closes, closes}, {"two inputs", t.TwoInputs, two}} {
		if c.decl != c.impl {
			bad = append(bad, fmt.Sprintf("%s declared %v, built %v", c.name, c.decl, c.impl))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("step %s: its traits differ from its plan's: %s", s.Kind(), strings.Join(bad, "; "))
	}
	return nil
}

// ValueEffect is what a step does to the shape of the value.
type ValueEffect int

const (
	ValueSame     ValueEffect = iota // the value is passed on as it came
	ValueReplaced                    // the value becomes an object of exactly Plan.Fields
	ValueMerged                      // Plan.Fields are added to an object
	ValueDropped                     // Plan.Fields are removed from an object
)

// BuildEnv is what a step instance is built with.
type BuildEnv struct {
	KV     KV               // the step's state namespace (Keyed steps)
	Tables map[string]Table // every table of the route, by name
}

// KeyError is one problem Compile finds, with the key it is about.
type KeyError struct {
	Key    string // "" the step as a whole
	Entry  string // an entry of a mapping-valued key (an aggregate's name)
	AtName bool   // the problem is the key being there, not its value
	Msg    string
}

func (e *KeyError) Error() string { return e.Msg }

// KeyErrors is every problem Compile found.
type KeyErrors []*KeyError

func (l KeyErrors) Error() string {
	parts := make([]string, len(l))
	for i, e := range l {
		parts[i] = e.Msg
	}
	return strings.Join(parts, "; ")
}

var specs []*Spec

// register declares a step kind; each kind's file calls it from init.
func register(s *Spec) {
	if s.Kind == "" || s.Compile == nil || (s.Body == nil) == (len(s.Keys) == 0) {
		panic(fmt.Sprintf("operators: incomplete step spec %q", s.Kind))
	}
	if s.Body != nil && s.Body.Name != s.Kind {
		panic(fmt.Sprintf("operators: step %q: the body key must be named after the kind", s.Kind))
	}
	if SpecForm(s.Kind, s.Form) != nil {
		panic(fmt.Sprintf("operators: step %q (form %q) declared twice", s.Kind, s.Form))
	}
	specs = append(specs, s)
	slices.SortStableFunc(specs, func(a, b *Spec) int { return a.Order - b.Order })
}

// Specs are the declared step kinds, in Order.
func Specs() []*Spec { return slices.Clone(specs) }

// SpecOf is the declared kind (its spec without a Form), or nil.
func SpecOf(kind string) *Spec { return SpecForm(kind, "") }

// SpecForm is the declared spec of kind with the given Form, or nil.
func SpecForm(kind, form string) *Spec {
	for _, s := range specs {
		if s.Kind == kind && s.Form == form {
			return s
		}
	}
	return nil
}

// FormsOf are the Forms of kind's specs other than "", in Order.
func FormsOf(kind string) []string {
	var out []string
	for _, s := range specs {
		if s.Kind == kind && s.Form != "" {
			out = append(out, s.Form)
		}
	}
	return out
}

// ID names a spec uniquely: its kind, or kind-form.
func (s *Spec) ID() string {
	if s.Form == "" {
		return s.Kind
	}
	return s.Kind + "-" + s.Form
}

// StepKinds are the declared kinds' names, in Order, each once.
func StepKinds() []string {
	var out []string
	for _, s := range specs {
		if !slices.Contains(out, s.Kind) {
			out = append(out, s.Kind)
		}
	}
	return out
}

// KeyNames are the names of the keys of a mapping step, in declared order.
func (s *Spec) KeyNames() []string {
	out := make([]string, len(s.Keys))
	for i, k := range s.Keys {
		out[i] = k.Name
	}
	return out
}
