// Package ruletest is `rtproxy test`: test files that sit beside rule
// files, give a route input records, move its clock, and state what its
// sink and dead-letter topic must receive. Tests run through
// pipeline.Driver, which is the route as `rtproxy run` builds it, with
// in-memory topics and a clock of the test's own.
package ruletest

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/internal/yamlbudget"
	"github.com/rtproxy/rtproxy/internal/yamlpos"
	"github.com/rtproxy/rtproxy/rules"
)

// Suffix is what a test file's name ends with: <rule file name>.test.yaml
// (.test.yml is read too).
const Suffix = ".test.yaml"

// File is one parsed test file.
type File struct {
	Path  string
	Route string // the route under test, when the file names it
	View  string // the view under test, when the file names it (`view:`)
	Tests []*Test
}

// Test is one test of a file.
type Test struct {
	Name       string
	Line       int
	Partitions int // 0: the highest input partition + 1
	Tables     map[string]*TableRows
	Steps      []Step // inputs and clock moves, in order
	Expect     Expect
	// Client is who fetches, for a view's test (`client:`); nil: a client
	// the view applies to (its test runs the view).
	Client *Client
}

// Client is a view test's fetching client.
type Client struct {
	Line                            int
	ClientID, Principal, TLSSubject string
}

// TableRows replaces one table's rows for a test.
type TableRows struct {
	Line  int
	List  []map[string]any // rows keyed by the table's key field (file tables)
	ByKey map[string]map[string]any
}

// Step is an input record or a clock move.
type Step struct {
	Line int
	// An input record.
	Input *Record
	// A clock move: the watermark to a time, or idle time passing.
	Watermark *time.Time
	Idle      time.Duration
}

// Record is an input record, or the fields an expected record must have
// (nil fields are not compared).
type Record struct {
	Line      int
	Key       *string
	NullKey   bool // key: null
	Value     any  // the value tree; a string is the value's bytes as written
	HasValue  bool
	Headers   map[string]string
	Timestamp *time.Time
	Partition int32
	Offset    int64 // -1: next
	// Topic is the topic an input record is written to: "" the route's
	// source, or the `stream.topic` of one of its stream joins.
	Topic string
	// Expected records only.
	Window *[2]int64 // rtproxy-window: start, end (epoch millis)
	Reason string    // dead letters: rtproxy-reason
	Step   string    // dead letters: rtproxy-step
	Error  string    // dead letters: a part of rtproxy-error
}

// Expect is what a test expects the route to write.
type Expect struct {
	Line        int
	AnyOrder    bool
	Sink        []*Record
	DeadLetters []*Record
	// Sinks are the records expected on each sink of a route with a
	// switch, by the sink's name (its topic, or http-<branch>), in the
	// order written (SinkNames); nil when the file gives no `sinks:`.
	Sinks     map[string][]*Record
	SinkNames []string
	SinksLine int
	// Records are what a client of a view fetches (view tests): the
	// records that pass, at their offsets, and for a record the view
	// cannot process the placeholder (a null value, `error:`).
	Records []*Record
}

// Error is a malformed test file: its position and what is wrong.
type Error struct {
	File      string
	Line, Col int
	Msg       string
}

func (e *Error) Error() string {
	if e.Line == 0 {
		return fmt.Sprintf("%s: %s", e.File, e.Msg)
	}
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Col, e.Msg)
}

// Errors are every error found in one file.
type Errors []*Error

func (es Errors) Error() string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = e.Error()
	}
	return strings.Join(s, "\n")
}

type parser struct {
	file string
	errs Errors
}

func (p *parser) errAt(n *yaml.Node, f string, args ...any) {
	e := &Error{File: p.file, Msg: fmt.Sprintf(f, args...)}
	if n != nil {
		e.Line, e.Col = n.Line, n.Column
	}
	p.errs = append(p.errs, e)
}

// Load parses a test file. The error is nil or Errors.
func Load(path string) (*File, error) {
	// Confined as rule files are: a test file that resolves out of its
	// directory, is not a regular file or is too large is not read.
	src, err := rules.ReadConfined("", path, rules.MaxRuleFileBytes)
	if err != nil {
		var re *rules.FileRefusedError
		if errors.As(err, &re) {
			return nil, Errors{{File: path, Msg: "test file refused: " + re.Msg}}
		}
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, Errors{{File: path, Msg: fmt.Sprintf("cannot read test file: %v", err)}}
	}
	return Parse(path, src)
}

// Parse parses a test file's bytes.
func Parse(path string, src []byte) (*File, error) {
	p := &parser{file: path}
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, Errors{syntaxError(path, src, err)}
	}
	if err := yamlbudget.Check(&doc); err != nil {
		e := err.(*yamlbudget.Error)
		return nil, Errors{{File: path, Line: e.Line, Col: e.Column, Msg: e.Msg}}
	}
	f := &File{Path: path}
	if len(doc.Content) == 0 {
		return nil, Errors{{File: path, Msg: "empty test file; want `tests:`, a list of tests"}}
	}
	root := doc.Content[0]
	fields := p.fields(root, "the test file", "route", "view", "tests")
	if fields == nil {
		return nil, p.errs
	}
	if n := fields["route"]; n != nil {
		f.Route = p.str(n, "route")
	}
	if n := fields["view"]; n != nil {
		f.View = p.str(n, "view")
		if f.Route != "" {
			p.errAt(n, "a test file tests a route (`route:`) or a view (`view:`), not both")
		}
	}
	tests := fields["tests"]
	switch {
	case tests == nil:
		p.errAt(root, "no `tests:`; want a list of tests, each with `name`, `input` and `expect`")
	case tests.Kind != yaml.SequenceNode || len(tests.Content) == 0:
		p.errAt(tests, "`tests` must be a non-empty list of tests")
	default:
		names := map[string]int{}
		for _, tn := range tests.Content {
			t := p.test(tn)
			if t == nil {
				continue
			}
			if prev, dup := names[t.Name]; dup {
				p.errAt(tn, "test name %q is already used at line %d; names must be unique in a file", t.Name, prev)
			}
			names[t.Name] = t.Line
			f.Tests = append(f.Tests, t)
		}
	}
	if len(p.errs) > 0 {
		return nil, p.errs
	}
	return f, nil
}

// syntaxError places a YAML syntax error of a test file where `rtproxy
// check` places the same mistake in a rule file (yamlpos.Locate).
func syntaxError(path string, src []byte, err error) *Error {
	at := yamlpos.Locate(err, src)
	msg := "not valid YAML: " + at.Msg
	if at.Text != "" {
		msg += fmt.Sprintf(" (near `%s`)", shortLine(at.Text))
	}
	return &Error{File: path, Line: at.Line, Col: at.Col, Msg: msg}
}

// shortLine is a source line cut for an error message.
func shortLine(s string) string {
	s = strings.TrimSpace(s)
	if r := []rune(s); len(r) > 60 {
		s = string(r[:60]) + "…"
	}
	return s
}

// fields reads a mapping whose keys must be among known.
func (p *parser) fields(n *yaml.Node, what string, known ...string) map[string]*yaml.Node {
	if n.Kind != yaml.MappingNode {
		p.errAt(n, "%s must be a mapping with keys %s", what, strings.Join(known, ", "))
		return nil
	}
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !slices.Contains(known, k.Value) {
			p.errAt(k, "unknown key %q in %s; known keys: %s", k.Value, what, strings.Join(known, ", "))
			continue
		}
		if _, dup := out[k.Value]; dup {
			p.errAt(k, "key %q given twice in %s", k.Value, what)
			continue
		}
		out[k.Value] = v
	}
	return out
}

func (p *parser) str(n *yaml.Node, what string) string {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.errAt(n, "%s must be a string", what)
		return ""
	}
	return n.Value
}

func (p *parser) test(n *yaml.Node) *Test {
	fs := p.fields(n, "a test", "name", "partitions", "tables", "input", "expect", "client")
	if fs == nil {
		return nil
	}
	t := &Test{Line: n.Line}
	if cn := fs["client"]; cn != nil {
		t.Client = p.client(cn)
	}
	if fs["name"] == nil {
		p.errAt(n, "a test needs a `name`")
	} else {
		t.Name = strings.TrimSpace(p.str(fs["name"], "name"))
		if t.Name == "" {
			p.errAt(fs["name"], "a test's name must not be empty")
		}
	}
	if pn := fs["partitions"]; pn != nil {
		v, err := strconv.Atoi(pn.Value)
		if pn.Kind != yaml.ScalarNode || err != nil || v < 1 || v > 1024 {
			p.errAt(pn, "partitions must be a whole number from 1 to 1024")
		}
		t.Partitions = v
	}
	if tn := fs["tables"]; tn != nil {
		t.Tables = p.tables(tn)
	}
	in := fs["input"]
	if in == nil || in.Kind != yaml.SequenceNode || len(in.Content) == 0 {
		at := in
		if at == nil {
			at = n
		}
		p.errAt(at, "a test needs `input`, a list of records and `advance:` steps")
	} else {
		for _, sn := range in.Content {
			if s, ok := p.step(sn); ok {
				t.Steps = append(t.Steps, s)
			}
		}
	}
	if en := fs["expect"]; en == nil {
		p.errAt(n, "a test needs `expect` (with `sink:` and, when any are expected, `dead_letters:`; for a view, `records:`)")
	} else {
		t.Expect = p.expect(en)
	}
	if t.Partitions > 0 {
		for _, s := range t.Steps {
			if s.Input != nil && int(s.Input.Partition) >= t.Partitions {
				p.errAt(n, "line %d: partition %d, but the test has partitions: %d", s.Line, s.Input.Partition, t.Partitions)
			}
		}
	}
	return t
}

// client reads a view test's `client:`.
func (p *parser) client(n *yaml.Node) *Client {
	fs := p.fields(n, "client", "client_id", "principal", "tls_subject")
	if fs == nil {
		return nil
	}
	c := &Client{Line: n.Line}
	for name, dst := range map[string]*string{"client_id": &c.ClientID, "principal": &c.Principal, "tls_subject": &c.TLSSubject} {
		if v := fs[name]; v != nil {
			*dst = p.str(v, "client."+name)
		}
	}
	return c
}

func (p *parser) tables(n *yaml.Node) map[string]*TableRows {
	if n.Kind != yaml.MappingNode {
		p.errAt(n, "tables must map table names to their rows")
		return nil
	}
	out := map[string]*TableRows{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		tr := &TableRows{Line: k.Line}
		switch v.Kind {
		case yaml.SequenceNode:
			for _, rn := range v.Content {
				row, ok := p.object(rn, "a table row")
				if ok {
					tr.List = append(tr.List, row)
				}
			}
		case yaml.MappingNode:
			tr.ByKey = map[string]map[string]any{}
			for j := 0; j+1 < len(v.Content); j += 2 {
				row, ok := p.object(v.Content[j+1], "a table row")
				if ok {
					tr.ByKey[v.Content[j].Value] = row
				}
			}
		default:
			p.errAt(v, "table %q: rows are a list of objects (keyed by the table's key field) or a mapping from key to object", k.Value)
			continue
		}
		out[k.Value] = tr
	}
	return out
}

func (p *parser) object(n *yaml.Node, what string) (map[string]any, bool) {
	v, err := nodeValue(n)
	if err != nil {
		p.errAt(n, "%s: %v", what, err)
		return nil, false
	}
	m, ok := v.(map[string]any)
	if !ok {
		p.errAt(n, "%s must be an object", what)
		return nil, false
	}
	return m, true
}

var recordKeys = []string{"key", "value", "headers", "timestamp", "partition", "offset", "topic"}

func (p *parser) step(n *yaml.Node) (Step, bool) {
	s := Step{Line: n.Line}
	if n.Kind == yaml.MappingNode && len(n.Content) >= 2 && n.Content[0].Value == "advance" {
		if len(n.Content) > 2 {
			p.errAt(n.Content[2], "an `advance:` step has nothing beside it; put the record in its own list item")
			return s, false
		}
		fs := p.fields(n.Content[1], "advance", "watermark", "idle")
		if fs == nil {
			return s, false
		}
		if (fs["watermark"] == nil) == (fs["idle"] == nil) {
			p.errAt(n.Content[1], "advance takes one of `watermark: TIME` or `idle: DURATION`")
			return s, false
		}
		if w := fs["watermark"]; w != nil {
			t, ok := p.time(w, "advance.watermark")
			s.Watermark = &t
			return s, ok
		}
		d, err := time.ParseDuration(fs["idle"].Value)
		if err != nil || d <= 0 || d > 30*24*time.Hour {
			p.errAt(fs["idle"], "advance.idle must be a positive duration up to 720h, such as 30s or 5m")
			return s, false
		}
		s.Idle = d
		return s, true
	}
	r, ok := p.record(n, "an input record", recordKeys)
	if ok && !r.HasValue {
		p.errAt(n, "an input record needs a `value` (null for a tombstone)")
		ok = false
	}
	s.Input = r
	return s, ok
}

func (p *parser) record(n *yaml.Node, what string, known []string) (*Record, bool) {
	fs := p.fields(n, what, known...)
	if fs == nil {
		return nil, false
	}
	before := len(p.errs)
	r := &Record{Line: n.Line, Offset: -1}
	if k := fs["key"]; k != nil {
		if k.Kind == yaml.ScalarNode && k.Tag == "!!null" {
			r.NullKey = true
		} else if k.Kind != yaml.ScalarNode {
			p.errAt(k, "key must be a string (or null)")
		} else {
			r.Key = &k.Value
		}
	}
	if v := fs["value"]; v != nil {
		val, err := nodeValue(v)
		if err != nil {
			p.errAt(v, "value: %v", err)
		}
		r.Value, r.HasValue = val, true
	}
	if h := fs["headers"]; h != nil {
		if h.Kind != yaml.MappingNode {
			p.errAt(h, "headers must map header names to string values")
		} else {
			r.Headers = map[string]string{}
			for i := 0; i+1 < len(h.Content); i += 2 {
				if h.Content[i+1].Kind != yaml.ScalarNode {
					p.errAt(h.Content[i+1], "header %q: the value must be a string", h.Content[i].Value)
				}
				r.Headers[h.Content[i].Value] = h.Content[i+1].Value
			}
		}
	}
	if ts := fs["timestamp"]; ts != nil {
		t, _ := p.time(ts, "timestamp")
		r.Timestamp = &t
	}
	if pn := fs["partition"]; pn != nil {
		v, err := strconv.Atoi(pn.Value)
		if err != nil || v < 0 || v >= 1024 {
			p.errAt(pn, "partition must be a whole number from 0 to 1023")
		}
		r.Partition = int32(v)
	}
	if tn := fs["topic"]; tn != nil {
		r.Topic = p.str(tn, "topic")
	}
	if on := fs["offset"]; on != nil {
		v, err := strconv.ParseInt(on.Value, 10, 64)
		if err != nil || v < 0 {
			p.errAt(on, "offset must be a whole number, 0 or more")
		}
		r.Offset = v
	}
	if wn := fs["window"]; wn != nil {
		wf := p.fields(wn, "window", "start", "end")
		if wf != nil {
			if wf["start"] == nil || wf["end"] == nil {
				p.errAt(wn, "window needs `start` and `end`")
			} else {
				s, _ := p.time(wf["start"], "window.start")
				e, _ := p.time(wf["end"], "window.end")
				r.Window = &[2]int64{s.UnixMilli(), e.UnixMilli()}
			}
		}
	}
	for name, dst := range map[string]*string{"reason": &r.Reason, "step": &r.Step, "error": &r.Error} {
		if v := fs[name]; v != nil {
			*dst = p.str(v, name)
		}
	}
	return r, len(p.errs) == before
}

// time reads epoch millis or an RFC 3339 time.
func (p *parser) time(n *yaml.Node, what string) (time.Time, bool) {
	if n.Kind == yaml.ScalarNode {
		if ms, err := strconv.ParseInt(n.Value, 10, 64); err == nil {
			return time.UnixMilli(ms).UTC(), true
		}
		if t, err := time.Parse(time.RFC3339Nano, n.Value); err == nil {
			return t.UTC(), true
		}
	}
	p.errAt(n, "%s must be epoch milliseconds or an RFC 3339 time such as 2026-01-01T00:01:00Z", what)
	return time.Time{}, false
}

var (
	sinkKeys = append(slices.Clone(recordKeys[:4]), "window")
	dlqKeys  = append(slices.Clone(recordKeys[:4]), "reason", "step", "error")
	// viewKeys: what a view's client fetches (the offset it is at; error:
	// the placeholder of a record the view could not process).
	viewKeys = append(slices.Clone(recordKeys[:4]), "partition", "offset", "error")
)

func (p *parser) expect(n *yaml.Node) Expect {
	e := Expect{Line: n.Line}
	fs := p.fields(n, "expect", "order", "sink", "sinks", "dead_letters", "records")
	if fs == nil {
		return e
	}
	if o := fs["order"]; o != nil {
		switch o.Value {
		case "strict":
		case "any":
			e.AnyOrder = true
		default:
			p.errAt(o, "order must be `strict` (the default: in the order written) or `any` (as a set)")
		}
	}
	if sn := fs["sinks"]; sn != nil {
		p.expectSinks(sn, &e)
	}
	for name, dst := range map[string]*[]*Record{"sink": &e.Sink, "dead_letters": &e.DeadLetters, "records": &e.Records} {
		ln := fs[name]
		if ln == nil {
			continue
		}
		if ln.Kind != yaml.SequenceNode {
			if ln.Tag != "!!null" {
				p.errAt(ln, "expect.%s must be a list of records ([] for none)", name)
			}
			continue
		}
		keys := sinkKeys
		switch name {
		case "dead_letters":
			keys = dlqKeys
		case "records":
			keys = viewKeys
		}
		*dst = []*Record{}
		for _, rn := range ln.Content {
			if r, ok := p.record(rn, "an expected record in expect."+name, keys); ok {
				*dst = append(*dst, r)
			}
		}
	}
	return e
}

// expectSinks reads expect.sinks: a mapping from a sink's name to the
// records it must receive (a route with a switch writes to several).
func (p *parser) expectSinks(n *yaml.Node, e *Expect) {
	e.SinksLine = n.Line
	if n.Kind != yaml.MappingNode {
		p.errAt(n, "expect.sinks must be a mapping from a sink (its topic) to a list of records, e.g. `sinks: { payments.large: [ ... ], payments.rest: [] }`")
		return
	}
	e.Sinks = map[string][]*Record{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, ln := n.Content[i], n.Content[i+1]
		name := k.Value
		if _, dup := e.Sinks[name]; dup {
			p.errAt(k, "sink %q given twice in expect.sinks", name)
			continue
		}
		if ln.Kind != yaml.SequenceNode {
			p.errAt(ln, "expect.sinks.%s must be a list of records ([] for none)", name)
			continue
		}
		recs := []*Record{}
		for _, rn := range ln.Content {
			if r, ok := p.record(rn, "an expected record in expect.sinks."+name, sinkKeys); ok {
				recs = append(recs, r)
			}
		}
		e.Sinks[name] = recs
		e.SinkNames = append(e.SinkNames, name)
	}
}

// nodeValue turns a YAML node into the value tree JSON gives: objects,
// arrays, strings, float64 numbers, booleans and nil. Values go through
// JSON so that numbers are exactly what the pipeline's decoder yields.
func nodeValue(n *yaml.Node) (any, error) {
	v, err := plain(n)
	if err != nil {
		return nil, err
	}
	if _, ok := v.(string); ok || v == nil {
		return v, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return jsoncodec.Decode(b)
}

func plain(n *yaml.Node) (any, error) {
	switch n.Kind {
	case yaml.AliasNode:
		return plain(n.Alias)
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			v, err := plain(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			m[n.Content[i].Value] = v
		}
		return m, nil
	case yaml.SequenceNode:
		s := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := plain(c)
			if err != nil {
				return nil, err
			}
			s = append(s, v)
		}
		return s, nil
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return nil, nil
		case "!!bool":
			return n.Value == "true" || n.Value == "True" || n.Value == "TRUE", nil
		case "!!int":
			i, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
			if err != nil {
				return nil, fmt.Errorf("integer %s: %w", n.Value, err)
			}
			return float64(i), nil
		case "!!float":
			f, err := strconv.ParseFloat(n.Value, 64)
			if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
				return nil, fmt.Errorf("%s is not a number JSON can hold", n.Value)
			}
			return f, nil
		}
		return n.Value, nil
	}
	return nil, fmt.Errorf("unsupported YAML node")
}

// RuleFileFor is the rule file a test file tests: the same name without
// ".test" (.yaml or .yml).
func RuleFileFor(testPath string) string {
	base := strings.TrimSuffix(strings.TrimSuffix(testPath, Suffix), ".test.yml")
	for _, ext := range []string{".yaml", ".yml"} {
		if _, err := os.Stat(base + ext); err == nil {
			return base + ext
		}
	}
	return base + ".yaml"
}

// IsTestFile reports whether name is a test file's name.
func IsTestFile(name string) bool {
	b := strings.ToLower(filepath.Base(name))
	return strings.HasSuffix(b, Suffix) || strings.HasSuffix(b, ".test.yml")
}
