package rules

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/expr-lang/expr"
	"gopkg.in/yaml.v3"

	"github.com/rtproxy/rtproxy/internal/yamlbudget"
	"github.com/rtproxy/rtproxy/internal/yamlpos"
	"github.com/rtproxy/rtproxy/operators"
)

// Defaults of a rule file. docs/RULES.md states the same values; the golden
// test TestDefaultsGolden (load_test.go) pins them. The loader fills every
// one in, so a loaded Route is complete: packages below rules/ (pipeline/)
// must take these values and keep no default of their own.
const (
	DefaultFormat             = FormatJSON
	DefaultWatermark          = 0 * time.Second
	DefaultIdleTimeout        = 30 * time.Second
	DefaultStart              = "earliest"
	DefaultCheckpointInterval = 5 * time.Second
	// DefaultExactlyOnceInterval is the checkpoint interval of a route
	// with `sink.delivery: exactly_once`: its outputs become visible when
	// the checkpoint's transaction commits, so the interval is latency.
	DefaultExactlyOnceInterval = 100 * time.Millisecond
	// MaxExactlyOnceInterval bounds checkpoint_interval for exactly_once:
	// a transaction stays open one interval, and brokers abort one that
	// outlives the producer's transaction timeout (pipeline uses 10 s, as Kafka Streams does).
	MaxExactlyOnceInterval  = 5 * time.Second
	DefaultDeadLetterSuffix = ".dlq"
)

// The keys each mapping of a rule file may hold. Anything else is refused
// with the closest known key as a suggestion.
var (
	topKeys    = []string{"route", "source", "sink", "dead_letter", "checkpoint_interval", "tables", "steps", "schema_registry"}
	sourceKeys = []string{"topic", "format", "event_time", "watermark", "idle_timeout", "start", "group", "message_indexes"}
	sinkKeys   = []string{"topic", "http", "key", "delivery", "format", "subject", "schema", "message", "message_indexes"}
	tableKeys  = []string{"file", "key", "topic"}
)

// builtinNames are the names every expression sees; a join may not bind
// its row under one of them.
var builtinNames = []string{"key", "value", "headers", "timestamp", "topic", "partition", "offset", "size"}

var (
	routeNameRe  = kafkaName{max: 200} // ^[A-Za-z0-9._-]{1,200}$
	topicNameRe  = kafkaName{max: 249} // ^[A-Za-z0-9._-]{1,249}$
	identifierRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// kafkaName matches a name of 1 to max characters of [A-Za-z0-9._-], as
// the regexp ^[A-Za-z0-9._-]{1,max}$ does. It is a loop rather than that
// regexp because the counted repetition compiles to max copies of the
// class: the two regexps cost 0.37 MB of allocations at every process's
// start and kept about 0.3 MB of heap for good, pass-through included
// (docs/BENCHMARKS.md, footprint; TestKafkaNameMatchesTheRegexp).
type kafkaName struct{ max int }

// MatchString reports whether s is such a name.
func (n kafkaName) MatchString(s string) bool {
	if len(s) == 0 || len(s) > n.max {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// LoadFile parses, compiles and analyzes one rule file. The error is nil, a
// single *Error, or an ErrorList of every refusal found in the file.
func LoadFile(path string) (*Route, error) {
	return LoadFileWith(path, Options{})
}

// Options are what the proxy's configuration tells the loader.
type Options struct {
	// TablesDir is a directory whose files table `file:` entries may name,
	// besides the rules directory (the proxy's tables_dir). Empty: only
	// files inside the rules directory.
	TablesDir string
	// Allow lists the environment variables, files and URLs a rule file
	// may name (allow.go). nil: the safe default, no variable, files inside
	// the rules directory only, no URL.
	Allow *Allow
}

// LoadFileWith is LoadFile with o.
func LoadFileWith(path string, o Options) (*Route, error) {
	src, err := readRuleFile("", path)
	if err != nil {
		return nil, readError(path, err)
	}
	res := loadBytes(path, src, o)
	if len(res.errs) > 0 {
		return nil, res.errs.asError()
	}
	return res.route, nil
}

// loadResult is one load attempt of one file: the route when it is valid,
// every error otherwise, and the table files it referenced (the watcher
// watches and hashes those too).
type loadResult struct {
	route      *Route
	errs       ErrorList
	warns      ErrorList // of a valid file only
	tableFiles []string
	name       string   // the route (or guard) name as written, even when invalid
	nameNode   position // where the name is written
	guard      bool     // the file is a guard file
	// guardTopic is a guard file's topic when it could be read, even if
	// the file is refused (a closed guard blocks it: closedGuard).
	guardTopic string
	// view says the file is a view file (or, not parsed, looks like one);
	// viewTopic its topic when it could be read (a closed view stands in
	// for it: closedView).
	view      bool
	viewTopic string
}

type position struct{ line, col int }

// loader carries one file through parse, compile and analysis. Errors are
// collected, not returned at the first one, so a person sees all that is
// wrong with a file at once.
type loader struct {
	file  string
	dir   string
	src   []byte
	lines []string
	errs  ErrorList
	warns ErrorList // constructs that can grow without bound (Plan.Warnings)
	res   *loadResult
	opts  Options

	sinkFields map[string]*keyVal // sink.key compiles after the steps
	// branchFields are the `sink:` entries of each switch branch, in
	// branch order (switch.go), for checks after the steps.
	branchFields []map[string]*keyVal
	// srcReads is what expressions read of a value that still has the
	// source's shape (noteReads).
	srcReads struct {
		members map[string]bool
		whole   bool
	}
	tableDefs map[string]string // table name -> definition as written, for join fingerprints
	// hashOK says expressions may call hash(): a view with a salt.
	hashOK bool
}

func loadBytes(path string, src []byte, o Options) *loadResult {
	res := &loadResult{}
	l := &loader{
		opts:  o,
		file:  path,
		dir:   filepath.Dir(path),
		src:   src,
		lines: strings.Split(string(src), "\n"),
		res:   res,
	}
	route := l.loadGuarded()
	if len(l.errs) > 0 && !res.guard && !res.view {
		res.guard, res.guardTopic = guessGuard(l.lines) // YAML that does not parse
		if !res.guard {
			var name string
			if res.view, name, res.viewTopic = guessView(l.lines); res.view && res.name == "" {
				res.name = name
			}
		}
	}
	l.errs.sort()
	res.errs = l.errs
	if len(l.errs) == 0 {
		res.route = route
		l.warns.sort()
		res.warns = l.warns
	}
	return res
}

// warnAt records a warning at a YAML node: the rule runs, but a construct
// in it can grow without bound (its state, its work per record).
func (l *loader) warnAt(n *yaml.Node, text string, format string, args ...any) {
	line, col := 0, 0
	if n != nil {
		line, col = n.Line, n.Column
	}
	l.warns = append(l.warns, &Error{File: l.file, Line: line, Col: col, Text: shorten(text), Msg: fmt.Sprintf(format, args...)})
}

// errAt records a refusal at a YAML node.
func (l *loader) errAt(n *yaml.Node, text string, format string, args ...any) {
	line, col := 0, 0
	if n != nil {
		line, col = n.Line, n.Column
	}
	l.errs = append(l.errs, &Error{File: l.file, Line: line, Col: col, Text: shorten(text), Msg: fmt.Sprintf(format, args...)})
}

func (l *loader) errAtPos(line, col int, text string, format string, args ...any) {
	l.errs = append(l.errs, &Error{File: l.file, Line: line, Col: col, Text: shorten(text), Msg: fmt.Sprintf(format, args...)})
}

// yamlError turns a yaml.v3 syntax error into an *Error, placed by
// yamlpos.Locate (the same position `rtproxy test` gives a test file).
func (l *loader) yamlError(err error) {
	at := yamlpos.Locate(err, l.src)
	line, col, text, msg := at.Line, at.Col, at.Text, at.Msg
	hint := "fix the YAML syntax"
	if strings.Contains(msg, "mapping values are not allowed") || strings.Contains(msg, "did not find expected") {
		hint = "an expression containing `: `, `#` or a leading YAML indicator must be quoted or written in block form (`filter: |` and the expression on the next line)"
	}
	if strings.Contains(msg, "found character that cannot start any token") {
		hint = "tabs cannot indent YAML; indent with spaces"
	}
	l.errAtPos(line, col, text, "YAML syntax error: %s; %s", msg, hint)
}

// loadGuarded is load with a last line of defence: a panic in a parser
// below (yaml, expr) refuses this file instead of taking the proxy down.
func (l *loader) loadGuarded() (r *Route) {
	defer func() {
		if p := recover(); p != nil {
			l.errAtPos(1, 1, "", "internal error while reading this file (%v); please report it with the file", p)
			r = nil
		}
	}()
	return l.load()
}

func (l *loader) load() *Route {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(l.src))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			l.errAtPos(1, 1, "", "empty rule file: a rule file needs at least `route`, `source.topic` and `sink.topic`")
			return nil
		}
		l.yamlError(err)
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		l.errAt(&extra, "---", "a rule file holds one YAML document (one route); move this document to its own file")
		return nil
	} else if !errors.Is(err, io.EOF) {
		l.yamlError(err)
		return nil
	}
	if err := yamlbudget.Check(&doc); err != nil {
		e := err.(*yamlbudget.Error)
		l.errAtPos(e.Line, e.Column, "", "%s", e.Msg)
		return nil
	}
	if len(doc.Content) == 0 {
		l.errAtPos(1, 1, "", "empty rule file: a rule file needs at least `route`, `source.topic` and `sink.topic`")
		return nil
	}
	root := resolve(doc.Content[0])
	if root.Kind != yaml.MappingNode {
		l.errAt(root, root.Value, "a rule file is a YAML mapping with the keys %s", strings.Join(topKeys, ", "))
		return nil
	}
	if view, refused := l.isViewFile(root); refused {
		return nil
	} else if view {
		return l.loadView(root)
	}
	if guard, refused := l.isGuardFile(root); refused {
		return nil
	} else if guard {
		return l.loadGuard(root)
	}
	top := l.fields(root, topKeys, "rule file")

	r := &Route{Tables: map[string]TableSpec{}, at: map[string]position{}}
	if abs, err := filepath.Abs(l.file); err == nil {
		r.File = abs
	} else {
		r.File = l.file
	}

	// route
	if kv := top["route"]; kv == nil {
		l.errAt(root, "", "missing `route`: name the route (letters, digits, `.`, `_`, `-`), e.g. `route: payments-risk`")
	} else if name, ok := l.scalar(kv, "route"); ok {
		l.res.name, l.res.nameNode = name, position{kv.val.Line, kv.val.Column}
		r.at["route"] = l.res.nameNode
		if !routeNameRe.MatchString(name) {
			l.errAt(kv.val, name, "route name may contain only letters, digits, `.`, `_` and `-` (at most 200)")
		}
		r.Name = name
	}

	l.source(top["source"], root, r)
	l.sink(top["sink"], root, r, hasSwitch(top["steps"]))
	l.schemaRegistry(top["schema_registry"], r)

	// dead_letter
	r.DeadLetter = r.Source.Topic + DefaultDeadLetterSuffix
	if kv := top["dead_letter"]; kv != nil {
		if t, ok := l.topicName(kv, "dead_letter"); ok {
			r.DeadLetter = t
			r.at["dead_letter"] = position{kv.val.Line, kv.val.Column}
			switch {
			case r.Source.Topic != "" && t == r.Source.Topic:
				l.errAt(kv.val, t, "dead_letter topic is the source topic; dead letters would be read again as input. Choose another topic, e.g. `%s.dlq`", r.Source.Topic)
			case r.Sink.Topic != "" && t == r.Sink.Topic:
				l.errAt(kv.val, t, "dead_letter topic is the sink topic; dead letters would mix with results. Choose another topic, e.g. `%s.dlq`", r.Source.Topic)
			}
		}
	}

	r.CheckpointInterval = DefaultCheckpointInterval
	if r.Sink.ExactlyOnce() {
		r.CheckpointInterval = DefaultExactlyOnceInterval
	}
	if kv := top["checkpoint_interval"]; kv != nil {
		if d, ok := l.duration(kv, "checkpoint_interval", false); ok {
			r.CheckpointInterval = d
			if r.Sink.ExactlyOnce() && d > MaxExactlyOnceInterval {
				l.errAt(kv.val, kv.val.Value, "checkpoint_interval %s is too long for `sink.delivery: exactly_once`: each checkpoint is one transaction, open for the whole interval, and outputs are visible only when it commits. Use at most %s (the default for exactly_once is %s)",
					d, MaxExactlyOnceInterval, DefaultExactlyOnceInterval)
			}
		}
	}

	l.tables(top["tables"], r)
	l.steps(top["steps"], r)
	l.checkSwitchTopics(r)

	if len(l.errs) > 0 {
		return nil
	}
	r.Hash = l.hash(r)
	return r
}

// hash is the route's content hash: the rule file and every file table it
// reads, in table-name order.
func (l *loader) hash(r *Route) string {
	h := sha256.New()
	h.Write(l.src)
	names := make([]string, 0, len(r.Tables))
	for n := range r.Tables {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t := r.Tables[n]
		if t.File == "" {
			continue
		}
		fmt.Fprintf(h, "\x00table %s\x00", n)
		if b, err := os.ReadFile(t.File); err == nil {
			h.Write(b)
		}
	}
	for _, s := range r.Sinks() {
		if s.Schema != "" {
			fmt.Fprintf(h, "\x00sink.schema\x00%s", s.Schema)
		}
	}
	if r.View != nil && r.View.SaltFile != "" {
		// The salt itself is hashed in: a new salt reloads the view.
		fmt.Fprintf(h, "\x00hash_salt_file\x00")
		h.Write(r.View.salt)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// keyVal is one entry of a YAML mapping.
type keyVal struct {
	key, val *yaml.Node
}

// resolve follows an alias to the node it names.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 8; i++ {
		n = n.Alias
	}
	return n
}

// fields returns the entries of mapping n by key, refusing keys that are
// not in known (suggesting the closest) and keys written twice.
func (l *loader) fields(n *yaml.Node, known []string, where string) map[string]*keyVal {
	out := make(map[string]*keyVal, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			l.errAt(k, "", "a key in %s must be a plain name", where)
			continue
		}
		if !contains(known, k.Value) {
			msg := fmt.Sprintf("unknown field `%s` in %s", k.Value, where)
			if s := closest(k.Value, known); s != "" {
				msg += fmt.Sprintf("; did you mean `%s`?", s)
			} else {
				msg += fmt.Sprintf("; known fields: %s", strings.Join(known, ", "))
			}
			l.errAt(k, k.Value, "%s", msg)
			continue
		}
		if prev, dup := out[k.Value]; dup {
			l.errAt(k, k.Value, "`%s` is written twice in %s (first at line %d); keep one", k.Value, where, prev.key.Line)
			continue
		}
		out[k.Value] = &keyVal{key: k, val: v}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// scalar returns the text of a scalar value; a mapping or list where text
// belongs is refused.
func (l *loader) scalar(kv *keyVal, what string) (string, bool) {
	v := kv.val
	switch {
	case v.Kind != yaml.ScalarNode:
		l.errAt(v, kv.key.Value, "`%s` must be a single value, not a %s", what, kindName(v))
		return "", false
	case v.ShortTag() == "!!null" || strings.TrimSpace(v.Value) == "":
		l.errAt(kv.key, kv.key.Value, "`%s` is empty; give it a value", what)
		return "", false
	}
	return v.Value, true
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	}
	return "value"
}

func (l *loader) topicName(kv *keyVal, what string) (string, bool) {
	t, ok := l.scalar(kv, what)
	if !ok {
		return "", false
	}
	if !topicNameRe.MatchString(t) || t == "." || t == ".." {
		l.errAt(kv.val, t, "`%s` is not a valid Kafka topic name: use letters, digits, `.`, `_` and `-` (at most 249)", what)
		return "", false
	}
	return t, true
}

// duration parses a Go duration (30s, 5m, 1h30m). zeroOK allows 0.
func (l *loader) duration(kv *keyVal, what string, zeroOK bool) (time.Duration, bool) {
	s, ok := l.scalar(kv, what)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		l.errAt(kv.val, s, "bad duration for `%s`: write a number with a unit, e.g. 500ms, 30s, 5m or 1h", what)
		return 0, false
	}
	if d < 0 && zeroOK {
		l.errAt(kv.val, s, "`%s` must not be negative", what)
		return 0, false
	}
	if d < 0 || (d == 0 && !zeroOK) {
		l.errAt(kv.val, s, "`%s` must be greater than zero", what)
		return 0, false
	}
	return d, true
}

// oneOf checks an enumerated value.
func (l *loader) oneOf(kv *keyVal, what string, allowed ...string) (string, bool) {
	s, ok := l.scalar(kv, what)
	if !ok {
		return "", false
	}
	if !contains(allowed, s) {
		msg := fmt.Sprintf("`%s` must be one of %s", what, strings.Join(allowed, ", "))
		if c := closest(s, allowed); c != "" {
			msg += fmt.Sprintf("; did you mean `%s`?", c)
		}
		l.errAt(kv.val, s, "%s", msg)
		return "", false
	}
	return s, true
}

func (l *loader) mapping(kv *keyVal, what, example string) bool {
	if kv.val.Kind != yaml.MappingNode {
		l.errAt(kv.val, kv.key.Value, "`%s` must be a mapping, e.g. %s", what, example)
		return false
	}
	return true
}

func (l *loader) source(kv *keyVal, root *yaml.Node, r *Route) {
	r.Source = Source{Format: DefaultFormat, Watermark: DefaultWatermark, IdleTimeout: DefaultIdleTimeout, Start: DefaultStart}
	if kv == nil {
		l.errAt(root, "", "missing `source`: name the topic this route reads, e.g. `source: { topic: payments }`")
		return
	}
	if !l.mapping(kv, "source", "`source: { topic: payments }`") {
		return
	}
	f := l.fields(kv.val, sourceKeys, "source")
	if t := f["topic"]; t == nil {
		l.errAt(kv.key, "source", "missing `source.topic`: the topic this route reads")
	} else if name, ok := l.topicName(t, "source.topic"); ok {
		r.Source.Topic = name
		r.at["source.topic"] = position{t.val.Line, t.val.Column}
	}
	if x := f["format"]; x != nil {
		if s, ok := l.readFormat(x, "source.format", FormatJSON, FormatRaw, FormatAvro, FormatProtobuf); ok {
			r.Source.Format = s
		}
	}
	r.Source.MessageIndexes = l.messageIndexes(f["message_indexes"], "source", r.Source.Format)
	if x := f["watermark"]; x != nil {
		if d, ok := l.duration(x, "source.watermark", true); ok {
			r.Source.Watermark = d
		}
	}
	if x := f["idle_timeout"]; x != nil {
		if d, ok := l.duration(x, "source.idle_timeout", false); ok {
			r.Source.IdleTimeout = d
		}
	}
	if x := f["start"]; x != nil {
		if s, ok := l.oneOf(x, "source.start", "earliest", "latest"); ok {
			r.Source.Start = s
		}
	}
	if x := f["group"]; x != nil {
		// A group id has the topic name's alphabet: it names the group in
		// ACLs and in kafka-consumer-groups output.
		if name, ok := l.scalar(x, "source.group"); ok {
			if !topicNameRe.MatchString(name) || name == "." || name == ".." {
				l.errAt(x.val, name, "`source.group` is not a valid consumer group id here: use letters, digits, `.`, `_` and `-` (at most 249)")
			} else {
				r.Source.Group = name
				r.at["source.group"] = position{x.val.Line, x.val.Column}
			}
		}
	}
	if x := f["event_time"]; x != nil {
		sc := &scope{shape: sourceShape(r.Source.Format)}
		r.Source.EventTime = l.expr(x, "source.event_time", sc, exprAny)
		if r.Source.EventTime != nil {
			l.checkEventTimeType(x, r.Source.EventTime.Source)
		}
	}
}

var gotTypeRe = regexp.MustCompile(`but got (.+)$`)

// checkEventTimeType refuses an event_time whose type is known and is
// none of a number, a string or a time (a comparison, a map, a list).
func (l *loader) checkEventTimeType(kv *keyVal, src string) {
	_, err := operators.CompileExpr(src, nil, expr.AsInt64())
	if err == nil {
		return // a number, or unknown until run time
	}
	m := gotTypeRe.FindStringSubmatch(err.Error())
	if m == nil || m[1] == "string" || strings.Contains(m[1], "time.Time") {
		return
	}
	l.errAt(kv.val, src, "source.event_time gives %s; it must give epoch milliseconds (a number), an RFC 3339 string or a time, e.g. `value.ts`", m[1])
}

func (l *loader) sink(kv *keyVal, root *yaml.Node, r *Route, hasSwitch bool) {
	r.Sink.Delivery = DeliveryAtLeastOnce
	if hasSwitch {
		l.switchRouteSink(kv, r)
		return
	}
	if kv == nil {
		l.errAt(root, "", "missing `sink`: name the topic results go to, e.g. `sink: { topic: payments.risk }`")
		return
	}
	if !l.mapping(kv, "sink", "`sink: { topic: payments.risk }`") {
		return
	}
	f := l.fields(kv.val, sinkKeys, "sink")
	l.sinkFields = f
	if d := f["delivery"]; d != nil {
		if v, ok := l.oneOf(d, "sink.delivery", DeliveryAtLeastOnce, DeliveryExactlyOnce); ok {
			r.Sink.Delivery = v
		}
	}
	l.sinkSpec(kv, f, &r.Sink, r, "sink.topic")
	if r.Sink.HTTP != nil && r.Sink.ExactlyOnce() {
		d := f["delivery"]
		l.errAt(d.val, d.val.Value, "%v", errHTTPExactlyOnce)
	}
	// sink.key is compiled after the steps: it sees what the last step emits.
}

// sinkSpec reads where a sink writes and how (topic or http, format,
// subject, schema, message, message_indexes) into s: the route's sink, or
// a switch branch's. at is the key under which the topic's position is
// kept for the route graph checks (graph.go).
func (l *loader) sinkSpec(kv *keyVal, f map[string]*keyVal, s *Sink, r *Route, at string) {
	if hx := f["http"]; hx != nil {
		if t := f["topic"]; t != nil {
			l.errAt(t.key, "topic", "sink has `topic` and `http`; a sink writes to one of them")
		}
		l.httpSink(hx, s)
		s.Name = "http"
	} else if t := f["topic"]; t == nil {
		l.errAt(kv.key, kv.key.Value, "missing `sink.topic`: the topic results go to (or `sink.http`: an HTTP endpoint)")
	} else if name, ok := l.topicName(t, "sink.topic"); ok {
		s.Topic, s.Name = name, name
		r.at[at] = position{t.val.Line, t.val.Column}
		if name == r.Source.Topic {
			l.errAt(t.val, name, "sink topic is the source topic; the route would read its own output forever. Write results to another topic, e.g. `%s.out`", name)
		}
	}
	if s.HTTP != nil {
		for _, k := range []string{"format", "subject", "schema", "message"} {
			if x := f[k]; x != nil {
				l.errAt(x.key, k, "`sink.%s` is for a topic sink; an HTTP sink sends each output's value as JSON", k)
				delete(f, k)
			}
		}
	}
	l.sinkFormat(f, s)
}

// switchRouteSink reads the top-level `sink:` of a route whose steps end
// with a switch: the branches name the sinks, so it may only say the
// route's delivery, which covers every branch's sink.
func (l *loader) switchRouteSink(kv *keyVal, r *Route) {
	if kv == nil {
		return
	}
	if !l.mapping(kv, "sink", "`sink: { delivery: exactly_once }`") {
		return
	}
	f := l.fields(kv.val, sinkKeys, "sink")
	for _, k := range sinkKeys {
		if x := f[k]; x != nil && k != "delivery" {
			l.errAt(x.key, k, "this route ends with a `switch`, whose branches name the sinks; `sink.%s` belongs in a branch's `sink:`. The top-level `sink:` of a route with a switch holds only `delivery`, the route's delivery to every branch", k)
		}
	}
	if d := f["delivery"]; d != nil {
		if v, ok := l.oneOf(d, "sink.delivery", DeliveryAtLeastOnce, DeliveryExactlyOnce); ok {
			r.Sink.Delivery = v
		}
	}
}

// hasSwitch reports whether the steps of a rule file include a `switch`
// step (looked for before the sink is read: such a route's sinks are its
// branches').
func hasSwitch(steps *keyVal) bool {
	if steps == nil || steps.val.Kind != yaml.SequenceNode {
		return false
	}
	for _, item := range steps.val.Content {
		item = resolve(item)
		if item.Kind == yaml.MappingNode && len(item.Content) > 0 && resolve(item.Content[0]).Value == "switch" {
			return true
		}
	}
	return false
}

func (l *loader) tables(kv *keyVal, r *Route) {
	if kv == nil || (kv.val.Kind == yaml.ScalarNode && kv.val.ShortTag() == "!!null") {
		return
	}
	if !l.mapping(kv, "tables", "`tables: { merchants: { file: merchants.jsonl, key: merchant_id } }`") {
		return
	}
	for i := 0; i+1 < len(kv.val.Content); i += 2 {
		k, v := resolve(kv.val.Content[i]), resolve(kv.val.Content[i+1])
		name := k.Value
		if k.Kind != yaml.ScalarNode || strings.TrimSpace(name) == "" {
			l.errAt(k, "", "a table needs a name")
			continue
		}
		if _, dup := r.Tables[name]; dup {
			l.errAt(k, name, "table `%s` is defined twice; keep one", name)
			continue
		}
		where := "table `" + name + "`"
		if v.Kind != yaml.MappingNode {
			l.errAt(v, name, "%s must be `{ file: PATH, key: FIELD }` or `{ topic: TOPIC }`", where)
			continue
		}
		f := l.fields(v, tableKeys, where)
		spec := TableSpec{Name: name}
		// The table counts as defined even when its entry is wrong, so a
		// join to it is not refused a second time as "undefined".
		l.table(k, f, &spec, where)
		r.Tables[name] = spec
		if l.tableDefs == nil {
			l.tableDefs = map[string]string{}
		}
		var def strings.Builder
		for _, key := range tableKeys {
			if x := f[key]; x != nil {
				fmt.Fprintf(&def, "%s=%s ", key, x.val.Value)
			}
		}
		l.tableDefs[name] = def.String()
	}
}

// table fills spec from one entry of `tables:`; a file table is loaded
// here, so a table that cannot be read refuses the rule file.
func (l *loader) table(k *yaml.Node, f map[string]*keyVal, spec *TableSpec, where string) {
	file, topic := f["file"], f["topic"]
	switch {
	case file != nil && topic != nil:
		l.errAt(topic.key, "topic", "%s has both `file` and `topic`; a table comes from one of them", where)
	case file == nil && topic == nil:
		l.errAt(k, spec.Name, "%s needs `file` (JSON lines or CSV) or `topic` (a compacted topic)", where)
	case topic != nil:
		if t, ok := l.topicName(topic, where+" topic"); ok {
			spec.Topic = t
		}
		if key := f["key"]; key != nil {
			l.errAt(key.key, "key", "a topic table is keyed by the record key; remove `key` from %s", where)
		}
	default:
		l.fileTable(k, file, f["key"], spec, where)
	}
}

func (l *loader) fileTable(k *yaml.Node, file, key *keyVal, spec *TableSpec, where string) {
	p, ok := l.scalar(file, where+" file")
	if !ok {
		return
	}
	if key == nil {
		l.errAt(k, spec.Name, "%s needs `key`: the field of each row that joins look up, e.g. `key: merchant_id`", where)
		return
	}
	field, ok := l.scalar(key, where+" key")
	if !ok {
		return
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(l.dir, p)
	}
	if abs, err := filepath.Abs(p); err == nil {
		p = abs
	}
	spec.File, spec.Key = p, field
	if err := tableFileAllowed(l.dir, l.opts.TablesDir, p); err != nil {
		l.errAt(file.val, file.val.Value, "%s: %v", where, err)
		return
	}
	l.res.tableFiles = append(l.res.tableFiles, p)
	t, err := operators.LoadFileTable(p, field)
	if err != nil {
		l.errAt(file.val, file.val.Value, "%s cannot be loaded: %s; fix the table file or the `key`", where, strings.TrimPrefix(unwrapPathError(err).Error(), "table "))
		return
	}
	spec.Table = t
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Path, pe.Err)
	}
	return err
}
