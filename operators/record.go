// Package operators holds the pure stream operators of rtproxy, one file per
// step kind, each declared once by its Spec (spec.go): filter, set, map,
// explode, broadcast join, tumbling and sliding windows, drop_duplicates.
//
// An operator is a function of (record, state) to output records and dead
// letters. It performs no I/O: it never imports franz-go, pebble, or anything
// under pipeline/ or protocol/. State goes through the small interfaces of
// package state; tables through the Table interface below.
//
// The Record type is shared with pipeline/, which builds records from Kafka
// and turns the outputs back into Kafka records.
package operators

import "github.com/rtproxy/rtproxy/internal/jsoncodec"

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Record is one record as the steps of a route see it.
//
// Value is the decoded value: for format json any JSON value (usually
// map[string]any), for format raw the string of the bytes. Raw keeps the
// original value bytes so a dead letter can carry them unchanged.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     any
	Raw       []byte
	Headers   []Header
	Timestamp int64 // epoch millis of the Kafka record
	EventTime int64 // epoch millis: source.event_time, or Timestamp when unset

	// Bound holds names bound by join steps (`as`). Joined rows are never
	// merged into Value.
	Bound map[string]any

	// Window is set on rows emitted by a window step.
	Window *WindowRef

	// Branch is the switch branch whose sink takes the record (the index
	// among the branches; 0 for a route without a switch, whose one sink
	// is branch 0). Only the switch step, the last, sets it.
	Branch int
	// HashKey is the salt hash() keys its HMAC with (a view's
	// hash_salt_file, viewfuncs.go); nil: hash() fails.
	HashKey []byte

	// env is what expressions see, kept in the record so evaluating costs
	// no allocation; the key string and header map are built at the first
	// Eval and reused by every later expression on this record (exprEnv).
	env recordEnv
	// meter is the budget of the evaluation in progress (budget.go), and
	// fan the fan-out budget of the input record r came from, shared with
	// every record a step made of it.
	meter meter
	fan   *fanout
	// fanPaid says an explode already charged the window updates this
	// copy causes.
	fanPaid bool
	// shuffleKey caches the key a Keyed step computed in ShuffleKey so
	// Process does not evaluate the key expression a second time.
	shuffleKey    string
	shuffleKeyFor *Expr
	// rawValue is the Value SetJSON decoded from rawFrom (then Raw), and
	// valueChanged says a step changed it in place since (ValueBytes,
	// rawvalue.go).
	rawValue     any
	rawFrom      []byte
	rawSet       bool
	valueChanged bool
	// partialOf is the object SetJSONMembers decoded from partialFrom with
	// only the members the route reads: while Value is that object it is
	// encoded by splicing it into partialFrom (EncodeValue).
	partialOf   map[string]any
	partialFrom []byte
	// partialWant is the members SetJSONMembers was asked for: a step
	// that keeps the record's bytes (a stream join's buffer) decodes them
	// again with the same members.
	partialWant jsoncodec.Fields
}

// ResetEnv forgets the expression environment cached on r. Call it after
// changing Key or Headers of a record that has already been evaluated (the
// other fields are picked up on every Eval without it), or before reusing a
// Record value for another record. It also forgets what SetJSON decoded, so
// ValueBytes returns false until the next SetJSON.
func (r *Record) ResetEnv() {
	r.env = recordEnv{}
	r.fan = nil
	r.shuffleKeyFor = nil
	r.rawValue, r.rawFrom, r.rawSet = nil, nil, false
	r.partialOf, r.partialFrom, r.partialWant = nil, nil, nil
}

// WindowRef names the window a row came from: [Start, End) in epoch millis.
type WindowRef struct {
	Start, End int64
}

// Reason is why a record became a dead letter. The values are a contract:
// they are written to the rtproxy-reason header.
type Reason string

const (
	ReasonDecode  Reason = "decode"  // the value could not be decoded (not JSON)
	ReasonError   Reason = "error"   // an expression failed at runtime
	ReasonBudget  Reason = "budget"  // the record went over a per-record budget (budget.go)
	ReasonLate    Reason = "late"    // every window of the record had closed
	ReasonMissing Reason = "missing" // a join found no row and missing: dead_letter
)

// Emitter receives what a step produces. Emit passes a record on to the
// next step (or to the sink after the last one). DeadLetter sends the
// record to the route's dead-letter topic with a reason.
type Emitter interface {
	Emit(r *Record)
	DeadLetter(r *Record, reason Reason, err error)
}
