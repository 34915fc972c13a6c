// Package rules owns rule files: it parses the YAML, compiles every expr
// expression once, runs the analyzer that refuses plans that cannot run
// (with file:line:col errors), and watches the rules directory.
//
// It may import operators (the step specs, their traits and types),
// internal/serde (sink schema checks) and internal/jsoncodec; it must never
// import pipeline/ or protocol/ (docs/ARCHITECTURE.md, "Packages and their
// arrows"; test/layering checks it).
package rules

import (
	"time"

	"github.com/rtproxy/rtproxy/operators"
)

// Route is one compiled, analyzed rule file: everything pipeline/ needs to
// run it. A guard file (guard.go) is a Route too, with Guard set.
type Route struct {
	Name string // unique across the rules directory, route and guard names together
	File string // absolute path of the rule file
	Hash string // hex sha256 of the file content (and of file tables it reads)

	// Guard is non-nil for a guard file: then Source, Sink, Steps are
	// empty; Name, File, Hash are set as for routes.
	Guard *Guard
	// View is non-nil for a view file (view.go): then Name is the topic
	// name clients fetch, Steps its compiled steps, Source.Topic and
	// Source.Format the view's topic and format, Sink empty.
	View *View

	Source Source
	// Sink is the `sink:` block. For a route with a switch step (Switch
	// set) only Sink.Delivery is set: the branches name the sinks.
	Sink Sink
	// Switch is the branches of the route's `switch` step (its last),
	// nil without one: each output goes to the sink of the branch the
	// step chose (operators.Record.Branch).
	Switch             []Branch
	DeadLetter         string // defaults to "<source topic>.dlq"
	CheckpointInterval time.Duration
	Tables             map[string]TableSpec
	Steps              []StepSpec
	// SchemaRegistry is the rule file's `schema_registry:`, overriding the
	// proxy's for this route; nil: the proxy's.
	SchemaRegistry *SchemaRegistry

	// at is where the keys the route graph checks (graph.go) are written:
	// "route", "source.topic", "source.group", "sink.topic", "dead_letter".
	at map[string]position
}

// Source is the `source:` block.
type Source struct {
	Topic       string
	Format      Format          // FormatJSON, FormatRaw, FormatAvro or FormatProtobuf
	EventTime   *operators.Expr // nil: the record timestamp
	Watermark   time.Duration   // allowed lateness
	IdleTimeout time.Duration
	Start       string // "earliest" or "latest"
	// DecodeMembers says that the route's expressions read only the
	// top-level Members of a JSON value while it has the source's shape
	// (before a map or window replaces it), so a record may be decoded in
	// part (operators.Record.SetJSONMembers). False: decode it whole.
	DecodeMembers bool
	Members       []string
	// Group is the consumer group every instance running the route joins;
	// "" means "rtproxy.<route>" (GroupID).
	Group string
	// MessageIndexes is how Protobuf records write their message indexes:
	// "zigzag" (the default) or "unsigned" (confluent-kafka-python ≤ 1.7).
	MessageIndexes string
}

// GroupID is the consumer group of the route: source.group, or
// "rtproxy.<route>".
func (r *Route) GroupID() string {
	if r.Source.Group != "" {
		return r.Source.Group
	}
	return "rtproxy." + r.Name
}

// Branch is one branch of a `switch` step: its condition (nil: the
// default branch, the last) and its sink, whose Delivery is the route's.
type Branch struct {
	When *operators.Expr
	Sink Sink
	Line int // where the branch is written
}

// Sinks are where the route writes outputs: each switch branch's sink in
// branch order (Record.Branch indexes it), or the route's one sink.
func (r *Route) Sinks() []Sink {
	if r.Switch == nil {
		return []Sink{r.Sink}
	}
	out := make([]Sink, len(r.Switch))
	for i, b := range r.Switch {
		out[i] = b.Sink
	}
	return out
}

// SinkTopics are the topics the route's sinks write (an HTTP sink has
// none).
func (r *Route) SinkTopics() []string {
	var out []string
	for _, s := range r.Sinks() {
		if s.Topic != "" {
			out = append(out, s.Topic)
		}
	}
	return out
}

// Sink is the `sink:` block, or the `sink:` of a switch branch.
type Sink struct {
	// Name labels the sink in metrics and on /routes: its topic, or
	// "http" for an HTTP sink ("http-<branch>" in a switch, branches
	// counted from 1), so no URL lands in a label.
	Name  string
	Topic string
	HTTP  *HTTPSink       // sink.http (sink_http.go); Topic is empty then
	Key   *operators.Expr // nil: the source key (window rows: the window key)
	// Delivery is DeliveryAtLeastOnce (the default) or DeliveryExactlyOnce.
	Delivery string
	// Format is FormatJSON (the default), FormatAvro or FormatProtobuf; the
	// last two write through the schema registry with the schema of
	// Subject: Schema (the text of the file SchemaFile) registered there,
	// or, when empty, the subject's latest version. Message names the
	// Protobuf message ("": the file's first).
	Format     Format
	Subject    string // default "<sink.topic>-value"
	SchemaFile string
	Schema     string
	Message    string
	// MessageIndexes: as Source.MessageIndexes, for the values written.
	MessageIndexes string
}

// Sink delivery guarantees (`sink.delivery`).
const (
	DeliveryAtLeastOnce = "at_least_once"
	// DeliveryExactlyOnce: each checkpoint is one Kafka transaction over
	// the route's outputs, dead letters, changelog writes and group offsets.
	DeliveryExactlyOnce = "exactly_once"
)

// Target names where the sink writes: its topic, or what a sink of
// another kind writes to. A switch route's top-level Sink has none.
func (s Sink) Target() string {
	if s.HTTP != nil {
		return s.HTTP.URL
	}
	return s.Topic
}

// ExactlyOnce reports whether the route's outputs are transactional.
func (s Sink) ExactlyOnce() bool { return s.Delivery == DeliveryExactlyOnce }

// TableSpec is one entry of `tables:`. Exactly one of File or Topic is set.
// A file table is loaded by rules (Table is set); a topic table is fed by
// the pipeline (Table is nil until the pipeline provides one).
type TableSpec struct {
	Name  string
	File  string // absolute path
	Key   string // field of each row that is its key (file tables)
	Topic string
	Table operators.Table
}

// StepSpec is one compiled step.
type StepSpec struct {
	Index int    // position in steps:, from 0
	Kind  string // the step kind: an operators.Spec
	// Fingerprint identifies the step's definition: the same text in the
	// same position with the same upstream semantics gives the same
	// fingerprint. State of a step whose fingerprint is unchanged survives
	// a reload; a changed step starts empty.
	Fingerprint string
	// Def is the step's definition in the canonical form the fingerprint
	// hashes (for status pages and logs).
	Def       string
	Line, Col int
	Table     string // join steps: the table name
	// Input is the second topic a stream join reads (Traits.TwoInputs),
	// nil for every other step.
	Input *operators.StreamInput
	// Traits are what the step's Compile declared: the pipeline decides
	// segments, watermarks, snapshots and the close journal by them,
	// without building the step. Every instance Build makes implements
	// exactly these (operators.CheckTraits).
	Traits operators.Traits
	// Build makes one instance of the step. The pipeline builds a Keyed
	// step once per owned partition of its repartition topic, each with its
	// own KV, and every other step once per task.
	Build func(operators.BuildEnv) (operators.Step, error)
}

// BuildEnv is what a step instance is built with.
type BuildEnv = operators.BuildEnv
