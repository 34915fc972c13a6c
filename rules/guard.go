package rules

import (
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/parser"
	"gopkg.in/yaml.v3"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/operators"
)

// A guard file (top-level key `guard` instead of `route`) declares checks
// that every record produced to a topic must pass; the proxy rejects a
// produce batch holding a record that fails one. rules parses and
// validates guard files and runs their checks (Guard.Check); protocol/
// enforces them on the wire.

// Guard is the content of a guard file. A loaded Guard is complete: every
// default is filled in.
type Guard struct {
	Topic  string // name or glob (path.Match syntax)
	Format Format // FormatJSON, FormatRaw, FormatAvro or FormatProtobuf
	// MessageIndexes is how Protobuf message indexes are encoded
	// ("zigzag" or "unsigned"); set only with FormatProtobuf.
	MessageIndexes string
	OnReject       string // GuardReject or GuardDeadLetter
	DeadLetter     string // set when OnReject == GuardDeadLetter
	// Checks are the checks as listed, in order. With format json a value
	// that does not decode fails the built-in ValidJSON before any of
	// them, whether or not it is listed: Check can report ValidJSON for a
	// guard whose Checks do not name it.
	Checks []GuardCheck
	// Members are the top-level members of a JSON object value the checks
	// read, when the loader could name them all (no check reads `value`
	// whole): Check decodes only those and validates the rest with the
	// skip scanner (operators.Record.SetJSONMembers), which refuses
	// exactly what a whole decode refuses. Nil: decode the value whole.
	Members jsoncodec.Fields
	// Closed is set on the stand-in the watcher puts in force for a guard
	// file that is invalid and has no valid version to keep (at start, or
	// a new file): the guard fails closed, every record produced to Topic
	// ("*" when the file does not say) fails GuardInvalid with Closed as
	// its message, until the file is fixed.
	Closed string
}

// Values of a guard file.
const (
	GuardReject     = "reject"
	GuardDeadLetter = "dead_letter"
	// ValidJSON is the built-in check: the value is valid JSON.
	ValidJSON = "valid_json"
	// GuardInvalid is the check a closed guard (Guard.Closed) fails.
	GuardInvalid = "guard_invalid"
	// DefaultGuardDeadLetterSuffix makes a guard's default dead-letter
	// topic, "<guard name>.rejected".
	DefaultGuardDeadLetterSuffix = ".rejected"
)

// GuardCheck is one entry of a guard's `checks`.
type GuardCheck struct {
	Name    string          // given name, else ValidJSON for the built-in, else the expression source
	Message string          // given message; default: "check `NAME` failed"
	Cond    *operators.Expr // nil for the built-in valid_json
}

// The keys of a guard file and of one of its checks.
var (
	guardKeys      = []string{"guard", "topic", "format", "on_reject", "dead_letter", "checks", "schema_registry", "message_indexes"}
	guardCheckKeys = []string{"check", "message", "name"}
)

// maxCheckName bounds a check's given name: it labels a metric series and
// travels in a header and in produce errors.
const maxCheckName = 200

// globChars are the characters path.Match gives a meaning to.
const globChars = `*?[\`

func isGlob(topic string) bool { return strings.ContainsAny(topic, globChars) }

// Matches reports whether produced records of topic are subject to g.
func (g *Guard) Matches(topic string) bool {
	if !isGlob(g.Topic) {
		return topic == g.Topic
	}
	ok, _ := path.Match(g.Topic, topic)
	return ok
}

// Check runs g's checks on one produced record r (Topic, Partition, Key,
// Raw = the value bytes (nil for a null value), Headers, Timestamp set by
// the caller; Check decodes Value itself per Format) in order, and returns
// the name and message of the first that fails; ok is true when every
// check passes. It never panics. It is safe for concurrent use by many
// goroutines, each with its own record.
//
// With format json the value is decoded once (r.SetJSON, or only the
// members the checks read: Members), and a value
// that is not JSON fails ValidJSON before any other check; a null value
// (a tombstone) is `value` nil and passes ValidJSON. With format raw,
// `value` is the string of the bytes and ValidJSON runs where listed. A
// check whose evaluation fails fails the record with the error (its first
// line) as the message.
func (g *Guard) Check(r *operators.Record) (check, message string, ok bool) {
	if g.Closed != "" {
		return GuardInvalid, g.Closed, false
	}
	cur := -1
	defer func() {
		if p := recover(); p != nil {
			check, message, ok = ValidJSON, fmt.Sprintf("internal error while checking the record: %v", p), false
			if cur >= 0 {
				check = g.Checks[cur].Name
			}
		}
	}()
	r.ResetEnv() // a reused Record must not show a previous record's key or headers
	switch {
	case g.Format.Registry():
		// The caller decodes (it holds the registry client) and calls
		// CheckDecoded; without one a record cannot pass.
		return GuardDecode, "format " + string(g.Format) + " needs a schema registry decoder; none is set", false
	case g.Format == FormatRaw:
		r.Value = string(r.Raw)
	case r.Raw == nil:
		r.Value = nil
	case g.Members != nil:
		if err := r.SetJSONMembers(r.Raw, g.Members); err != nil {
			return ValidJSON, notJSON(err), false
		}
	default:
		if err := r.SetJSON(r.Raw); err != nil {
			return ValidJSON, notJSON(err), false
		}
	}
	return g.runChecks(r, &cur)
}

// runChecks runs g's checks on r, whose Value is set; cur is the index of
// the check running, for the caller's recover.
func (g *Guard) runChecks(r *operators.Record, cur *int) (check, message string, ok bool) {
	for i := range g.Checks {
		*cur = i
		c := &g.Checks[i]
		if c.Cond == nil {
			// With format json the value decoded above.
			if g.Format == FormatRaw && r.Raw != nil {
				if _, err := jsoncodec.Decode(r.Raw); err != nil {
					return c.Name, notJSON(err), false
				}
			}
			continue
		}
		v, err := c.Cond.Eval(r)
		if err != nil {
			return c.Name, firstLine(err.Error()), false
		}
		b, isBool := v.(bool)
		if !isBool {
			return c.Name, fmt.Sprintf("%s: result is %T (%v), not true or false", c.Cond.Source, v, v), false
		}
		if !b {
			return c.Name, c.Message, false
		}
	}
	return "", "", true
}

func notJSON(err error) string {
	return "value is not valid JSON: " + strings.TrimPrefix(err.Error(), "decode json: ")
}

// firstLine is an evaluation error without expr's source excerpt and
// caret, which follow on further lines.
func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return strings.TrimSpace(s[:i])
	}
	return s
}

// mappingKey returns the key node named name of mapping n, or nil.
func mappingKey(n *yaml.Node, name string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := resolve(n.Content[i]); k.Kind == yaml.ScalarNode && k.Value == name {
			return k
		}
	}
	return nil
}

// isGuardFile decides which kind of rule file root is: a guard when it
// has `guard` (or, without `route`, `checks`). A file with both `route`
// and `guard` is refused here.
func (l *loader) isGuardFile(root *yaml.Node) (guard, refused bool) {
	g, r := mappingKey(root, "guard"), mappingKey(root, "route")
	switch {
	case g != nil && r != nil:
		l.errAt(g, "guard", "a rule file is either a route (`route:`) or a guard (`guard:`), not both; put the guard in a file of its own")
		return false, true
	case g != nil:
		return true, false
	case r == nil && mappingKey(root, "checks") != nil:
		return true, false
	}
	return false, false
}

// loadGuard loads a guard file whose root mapping is root.
func (l *loader) loadGuard(root *yaml.Node) *Route {
	l.res.guard = true
	f := l.fields(root, guardKeys, "guard file")
	r := &Route{}
	if abs, err := filepath.Abs(l.file); err == nil {
		r.File = abs
	} else {
		r.File = l.file
	}
	g := &Guard{Format: DefaultFormat, OnReject: GuardReject}
	r.Guard = g
	r.at = map[string]position{} // for the route graph's errors (graph_view.go)
	if kv := f["dead_letter"]; kv != nil {
		r.at["dead_letter"] = position{kv.val.Line, kv.val.Column}
	}

	nameOK := false
	if kv := f["guard"]; kv == nil {
		l.errAt(root, "", "missing `guard`: name the guard (letters, digits, `.`, `_`, `-`), e.g. `guard: payments-shape`")
	} else if name, ok := l.scalar(kv, "guard"); ok {
		l.res.name, l.res.nameNode = name, position{kv.val.Line, kv.val.Column}
		r.at["route"] = l.res.nameNode
		if routeNameRe.MatchString(name) {
			nameOK = true
		} else {
			l.errAt(kv.val, name, "guard name may contain only letters, digits, `.`, `_` and `-` (at most 200)")
		}
		r.Name = name
	}

	topicOK := false
	if kv := f["topic"]; kv == nil {
		l.errAt(root, "", "missing `topic`: the topic whose produced records the guard checks, or a glob such as `payments.*`")
	} else if t, ok := l.guardTopic(kv); ok {
		g.Topic, topicOK = t, true
		l.res.guardTopic = t
	}

	if kv := f["format"]; kv != nil {
		if s, ok := l.readFormat(kv, "format", FormatJSON, FormatRaw, FormatAvro, FormatProtobuf); ok {
			g.Format = s
		}
	}

	onRejectOK := true
	if kv := f["on_reject"]; kv != nil {
		if s, ok := l.oneOf(kv, "on_reject", GuardReject, GuardDeadLetter); ok {
			g.OnReject = s
		} else {
			onRejectOK = false
		}
	}
	l.guardDeadLetter(f, r.Name, nameOK, topicOK, onRejectOK, g)

	if kv := f["checks"]; kv == nil {
		l.errAt(root, "", "missing `checks`: the conditions every produced record must meet, e.g. `checks: [valid_json]`")
	} else {
		l.guardChecks(kv, g)
	}
	l.guardRegistry(f, r)

	if len(l.errs) > 0 {
		return nil
	}
	r.Hash = l.hash(r)
	return r
}

// guardTopic reads `topic`: a Kafka topic name, or a glob in path.Match
// syntax over the topic alphabet.
func (l *loader) guardTopic(kv *keyVal) (string, bool) {
	t, ok := l.scalar(kv, "topic")
	if !ok {
		return "", false
	}
	if !isGlob(t) {
		if !topicNameRe.MatchString(t) || t == "." || t == ".." {
			l.errAt(kv.val, t, "`topic` is not a valid Kafka topic name: use letters, digits, `.`, `_` and `-` (at most 249), or a glob such as `payments.*`")
			return "", false
		}
		return t, true
	}
	if _, err := path.Match(t, ""); err != nil {
		l.errAt(kv.val, t, "`topic` is not a valid glob (%v): `*` matches any characters, `?` one character, `[abc]` or `[a-z]` one of a set, `[^abc]` one not in it, `\\` quotes the next character", err)
		return "", false
	}
	for _, c := range t {
		if !strings.ContainsRune(globChars+"]^", c) && !topicNameRe.MatchString(string(c)) {
			l.errAt(kv.val, t, "`topic` glob holds `%c`, which no Kafka topic name has: topic names use letters, digits, `.`, `_` and `-`", c)
			return "", false
		}
	}
	return t, true
}

// guardDeadLetter reads `dead_letter` and fills in the default.
func (l *loader) guardDeadLetter(f map[string]*keyVal, name string, nameOK, topicOK, onRejectOK bool, g *Guard) {
	kv := f["dead_letter"]
	if kv != nil {
		t, ok := l.topicName(kv, "dead_letter")
		switch {
		case !ok:
		case g.OnReject != GuardDeadLetter:
			if onRejectOK {
				l.errAt(kv.key, "dead_letter", "`dead_letter` applies only with `on_reject: dead_letter`; add `on_reject: dead_letter`, or remove `dead_letter` (with `on_reject: reject` nothing is copied)")
			}
		default:
			g.DeadLetter = t
			if topicOK && g.Matches(t) {
				l.errAt(kv.val, t, "dead_letter topic `%s` is matched by the guard's topic `%s`: the guard would check its own dead letters. Choose a topic the guard does not match", t, g.Topic)
			}
		}
		return
	}
	if g.OnReject != GuardDeadLetter || !nameOK {
		return
	}
	g.DeadLetter = name + DefaultGuardDeadLetterSuffix
	if topicOK && g.Matches(g.DeadLetter) {
		at := f["on_reject"]
		l.errAt(at.val, at.val.Value, "the default dead_letter topic `%s` is matched by the guard's topic `%s`: the guard would check its own dead letters. Set `dead_letter` to a topic the guard does not match", g.DeadLetter, g.Topic)
	}
}

// guardChecks reads the `checks` list.
func (l *loader) guardChecks(kv *keyVal, g *Guard) {
	v := kv.val
	if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!null" || v.Kind == yaml.SequenceNode && len(v.Content) == 0 {
		l.errAt(kv.key, "checks", "`checks` is empty; list at least one check, e.g. `- check: value.amount > 0`")
		return
	}
	if v.Kind != yaml.SequenceNode {
		l.errAt(v, "checks", "`checks` must be a list, each item `- valid_json` or `- check: CONDITION`")
		return
	}
	sc := &scope{shape: sourceShape(g.Format)}
	type first struct {
		line  int
		valid bool
	}
	seen := map[string]first{}
	for i, item := range v.Content {
		item = resolve(item)
		c, at, ok := l.guardCheck(i, item, sc)
		if !ok {
			continue
		}
		if prev, dup := seen[c.Name]; dup {
			if prev.valid && c.Cond == nil {
				l.errAt(at, ValidJSON, "`valid_json` is listed twice (first at line %d); keep one", prev.line)
			} else {
				l.errAt(at, c.Name, "check name `%s` is already used by the check at line %d; give each check its own `name`", shorten(c.Name), prev.line)
			}
			continue
		}
		if !l.registryCheckOK(g, c, at) {
			continue
		}
		seen[c.Name] = first{at.Line, c.Cond == nil}
		g.Checks = append(g.Checks, c)
	}
	g.Members = checkMembers(g)
}

// checkMembers names the top-level members of a JSON value that g's
// checks read, or nil when one of them reads the value whole (or the
// format is not json).
func checkMembers(g *Guard) jsoncodec.Fields {
	if g.Format != FormatJSON {
		return nil
	}
	want := jsoncodec.Fields{}
	for _, c := range g.Checks {
		if c.Cond == nil {
			continue // valid_json: the skip scanner validates what it skips
		}
		members, whole := c.Cond.ValueReads()
		if whole {
			return nil
		}
		for _, m := range members {
			want[m] = struct{}{}
		}
	}
	return want
}

// guardCheck reads item i of `checks`. at is the node that names the
// check (the built-in, the `name` value, or the expression), for errors
// about its name.
func (l *loader) guardCheck(i int, item *yaml.Node, sc *scope) (c GuardCheck, at *yaml.Node, ok bool) {
	usage := "`- valid_json` or `- check: CONDITION` (with an optional `message` and `name`)"
	switch item.Kind {
	case yaml.ScalarNode:
		switch {
		case item.Value == ValidJSON && item.Style == 0:
			return GuardCheck{Name: ValidJSON, Message: defaultCheckMessage(ValidJSON)}, item, true
		case item.Value == ValidJSON:
			l.errAt(item, item.Value, "`valid_json` is a built-in check: write it as a plain list item, `- valid_json`, without quotes or a tag")
		case item.ShortTag() == "!!null" || strings.TrimSpace(item.Value) == "":
			l.errAt(item, "", "check %d is empty; write %s", i+1, usage)
		case closest(item.Value, []string{ValidJSON}) != "":
			l.errAt(item, item.Value, "unknown check `%s`; did you mean `valid_json`?", item.Value)
		default:
			l.errAt(item, item.Value, "check %d must be %s; for a condition write `- check: %s`", i+1, usage, shorten(item.Value))
		}
		return c, nil, false
	case yaml.MappingNode:
	default:
		l.errAt(item, "", "check %d must be %s, not a %s", i+1, usage, kindName(item))
		return c, nil, false
	}
	if k := mappingKey(item, ValidJSON); k != nil {
		l.errAt(k, ValidJSON, "`valid_json` is a built-in check: write it as a plain list item, `- valid_json`, not as a mapping")
		return c, nil, false
	}
	n := len(l.errs)
	f := l.fields(item, guardCheckKeys, "check")
	x := f["check"]
	if x == nil {
		l.errAt(item, "", "check %d needs `check`: the condition a record must meet, e.g. `check: value.amount > 0`", i+1)
		return c, nil, false
	}
	if x.val.Kind == yaml.ScalarNode && x.val.Value == ValidJSON {
		l.errAt(x.val, ValidJSON, "`valid_json` is a built-in check: write it as a plain list item, `- valid_json`, not as `check: valid_json`")
		return c, nil, false
	}
	c.Cond = l.expr(x, "check", sc, exprBool)
	if c.Cond != nil {
		l.noOffset(x.val, c.Cond.Source)
	}
	c.Name, at = strings.TrimSpace(x.val.Value), x.val
	if nk := f["name"]; nk != nil {
		if name, good := l.scalar(nk, "name"); good {
			switch {
			case strings.ContainsAny(name, "\r\n") || len([]rune(name)) > maxCheckName:
				l.errAt(nk.val, name, "a check's `name` is one line of at most %d characters", maxCheckName)
			case name == ValidJSON:
				l.errAt(nk.val, name, "`valid_json` names the built-in check; give this check another `name`")
			default:
				c.Name, at = name, nk.val
			}
		}
	}
	c.Message = defaultCheckMessage(c.Name)
	if mk := f["message"]; mk != nil {
		if msg, good := l.scalar(mk, "message"); good {
			c.Message = msg
		}
	}
	if len(l.errs) > n || c.Cond == nil {
		return c, nil, false
	}
	return c, at, true
}

func defaultCheckMessage(name string) string { return fmt.Sprintf("check `%s` failed", name) }

// offsetFinder collects the identifiers `offset` of an expression.
type offsetFinder []ast.Node

func (o *offsetFinder) Visit(n *ast.Node) {
	if id, ok := (*n).(*ast.IdentifierNode); ok && id.Value == "offset" {
		*o = append(*o, id)
	}
}

// noOffset refuses `offset` in a check: a guard sees records as they are
// produced, before the broker gives them an offset.
func (l *loader) noOffset(n *yaml.Node, src string) {
	tree, err := parser.ParseWithConfig(src, aggConfig())
	if err != nil {
		return
	}
	var found offsetFinder
	ast.Walk(&tree.Node, &found)
	for _, id := range found {
		line, col := l.nodePos(n, src, id)
		l.errAtPos(line, col, src, "check reads `offset`, but a guard checks records as they are produced, before they have an offset")
	}
}

// guessGuard reads, from the lines of a file whose YAML does not parse,
// whether it is a guard file (a top-level `guard:` line) and its topic (a
// top-level `topic:` line holding a valid topic or glob; "" when none):
// a guard that does not load fails closed, so the proxy must know it is
// one even when the YAML is broken.
func guessGuard(lines []string) (guard bool, topic string) {
	for _, ln := range lines {
		k, v, ok := strings.Cut(strings.TrimRight(ln, "\r"), ":")
		if !ok || k != strings.TrimSpace(k) {
			continue // indented, or not a key
		}
		switch k {
		case "guard":
			guard = true
		case "topic":
			if i := strings.Index(v, " #"); i >= 0 {
				v = v[:i]
			}
			v = strings.Trim(strings.TrimSpace(v), `"'`)
			if topicNameRe.MatchString(v) || (isGlob(v) && validGlob(v)) {
				topic = v
			}
		}
	}
	if !guard {
		topic = ""
	}
	return guard, topic
}

// validGlob reports whether p is a path.Match pattern that compiles.
func validGlob(p string) bool {
	_, err := path.Match(p, "")
	return err == nil
}

// closedGuard is the stand-in put in force for a guard file with nothing
// valid to run (Guard.Closed): it refuses every record produced to its
// topic, all topics when the file does not say which.
func closedGuard(file, name, topic, contentHash string) *Route {
	if topic == "" {
		topic = "*"
	}
	if name == "" || !routeNameRe.MatchString(name) {
		name = strings.TrimSuffix(filepath.Base(file), filepath.Ext(file))
	}
	what := "its topic " + topic
	if topic == "*" {
		what = "every topic (the file does not say which topic it guards)"
	}
	// The message goes to producing clients: it names the guard, not what
	// is wrong in its file (that is on /routes and in the proxy's log).
	msg := fmt.Sprintf("guard `%s` does not load and has no valid version to keep, so it fails closed: records produced to %s are refused until its file is fixed (the proxy's /routes and log say what is wrong)", name, what)
	return &Route{Name: name, File: file, Hash: "closed:" + contentHash,
		Guard: &Guard{Topic: topic, Format: "raw", OnReject: GuardReject, Closed: msg}}
}
