package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/builtin"
	"github.com/expr-lang/expr/conf"
	"github.com/expr-lang/expr/file"
	"github.com/expr-lang/expr/parser"
	"gopkg.in/yaml.v3"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/operators"
)

// compileExpr compiles src for the record environment (operators owns
// its shape) with the names bound by earlier joins.
func compileExpr(src string, bound []string, opts ...expr.Option) (*operators.Expr, error) {
	return operators.CompileExpr(src, bound, opts...)
}

// noteReads adds what e reads of `value` to the route's source reads when
// e sees the value as the source gave it (with set's members on top):
// not yet replaced by a map or a window, and JSON.
func (l *loader) noteReads(e *operators.Expr, sc *scope) {
	for _, name := range sc.bound {
		members, whole := e.BoundReads(name)
		if members != nil || whole {
			if l.boundReads == nil {
				l.boundReads = map[string]*readSet{}
			}
			l.boundReads[name] = l.boundReads[name].add(members, whole)
		}
	}
	if sc.other {
		// A stream join's second input (its `other`, `stream.event_time`).
		members, whole := e.ValueReads()
		l.otherReads = l.otherReads.add(members, whole)
		return
	}
	if sc.shape.known || sc.shape.raw {
		return
	}
	members, whole := e.ValueReads()
	if whole {
		l.srcReads.whole = true
	}
	if l.srcReads.members == nil {
		l.srcReads.members = map[string]bool{}
	}
	for _, m := range members {
		l.srcReads.members[m] = true
	}
}

// readSet is what expressions read of one value: members, or whole.
type readSet struct {
	members map[string]bool
	whole   bool
}

func (s *readSet) add(members []string, whole bool) *readSet {
	if s == nil {
		s = &readSet{members: map[string]bool{}}
	}
	s.whole = s.whole || whole
	for _, m := range members {
		s.members[m] = true
	}
	return s
}

// streamMembers sets each stream join's StreamInput.Members: the members
// of its stream's records that its `other` and `stream.event_time` read
// and the later expressions read through its `as`; nil (decode whole)
// when one of them reads the value whole, or the stream is raw.
func (l *loader) streamMembers(r *Route) {
	for _, sj := range l.streamJoins {
		in := r.Steps[sj.step].Input
		if in == nil || in.Format == string(FormatRaw) {
			continue
		}
		fields := jsoncodec.Fields{}
		whole := false
		for _, s := range []*readSet{sj.other, l.boundReads[sj.as]} {
			if s == nil {
				continue
			}
			whole = whole || s.whole
			for m := range s.members {
				fields[m] = struct{}{}
			}
		}
		if !whole {
			in.Members = fields
		}
	}
}

// streamJoinReads is what a stream join's own expressions read of its
// stream (other), and the name it binds.
type streamJoinReads struct {
	step  int // index in Route.Steps
	as    string
	other *readSet
}

// exprKeywords cannot be bound as a join name: the expression parser reads
// them as operators or literals.
var exprKeywords = []string{"in", "and", "or", "not", "matches", "contains", "startsWith", "endsWith",
	"nil", "true", "false", "let", "if", "else", "_"}

// shape is what the analyzer knows about `value` at one point of the
// steps: nothing (any JSON), a string (format raw), or exactly a set of
// fields (after map or window, and set on top of those).
type shape struct {
	raw    bool
	known  bool
	fields []string
	origin string // "the map at line 12", for messages
}

func sourceShape(format Format) shape {
	return shape{raw: format == FormatRaw, origin: "format raw"}
}

func (s shape) has(f string) bool { return contains(s.fields, f) }

// scope is what an expression at one point of the steps sees.
type scope struct {
	bound []string // join `as` names in effect
	shape shape
	// other: the expression reads a stream join's second input, not the
	// route's records (otherScope).
	other bool
	// fan is how many records or window updates the steps so far can make
	// of one source record (Plan.FanOut multiplied), and fanFrom the steps
	// that multiply it, for the warning.
	fan     int64
	fanFrom []string
	// fanSteps are the compiled steps' fan-outs, in the order of
	// Route.Steps (fanOutAfter).
	fanSteps []fanStep
}

// fanStep is what one step does to the fan-out (operators.Plan).
type fanStep struct {
	n     int64
	ends  bool
	exact bool // n is what every record costs (Plan.FanOutExact)
}

type exprKind int

const (
	exprAny exprKind = iota
	exprBool
)

// expr compiles the expression written in kv's value for `what`.
func (l *loader) expr(kv *keyVal, what string, sc *scope, kind exprKind) *operators.Expr {
	if kv.val.Kind != yaml.ScalarNode {
		hint := ""
		if kv.val.Kind == yaml.MappingNode {
			hint = "; if the expression contains `: `, quote it or write it in block form (`" + kv.key.Value + ": |` and the expression on the next line)"
		}
		l.errAt(kv.val, kv.key.Value, "`%s` must be an expression (text), not a %s%s", what, kindName(kv.val), hint)
		return nil
	}
	return l.exprNode(kv.val, kv.key, what, sc, kind)
}

// exprNode compiles the scalar n; keyNode locates "empty" errors.
func (l *loader) exprNode(n, keyNode *yaml.Node, what string, sc *scope, kind exprKind) *operators.Expr {
	src := n.Value
	if n.ShortTag() == "!!null" || strings.TrimSpace(src) == "" {
		at := keyNode
		if at == nil {
			at = n
		}
		l.errAt(at, at.Value, "`%s` needs an expression", what)
		return nil
	}
	if !l.checkTree(n, src, what, sc, false) {
		return nil
	}
	e, err := compileExpr(src, sc.bound)
	if err != nil {
		l.exprError(n, src, what, sc, err)
		return nil
	}
	l.noteReads(e, sc)
	if e.UsesHash() && !l.hashOK {
		l.noHash(n, src)
		return nil
	}
	if l.overBudget(n, src, what, e) {
		return nil
	}
	if kind == exprBool {
		if part, gives := neverBool(src); gives != "" {
			l.errAt(n, src, "%s must be true or false, but `%s` always gives %s; write a condition such as `value.amount > 0`", what, shorten(part), gives)
			return nil
		}
		if _, err := compileExpr(src, sc.bound, expr.AsBool()); err != nil {
			msg := err.Error()
			var fe *file.Error
			if errors.As(err, &fe) {
				msg = fe.Message
			}
			l.errAt(n, src, "%s must be true or false (%s); write a condition such as `value.amount > 0`", what, msg)
			return nil
		}
	}
	return e
}

// neverBool reports an expression whose value can never be true or false,
// whatever the record holds: arithmetic, string concatenation, a literal
// number, string, list or map. It returns the offending part and what it
// gives; gives is "" when the expression may be a condition. expr's own
// type check cannot see it: a member of value has no type until run time.
func neverBool(src string) (part, gives string) {
	tree, err := parser.ParseWithConfig(src, aggConfig())
	if err != nil {
		return "", ""
	}
	node := tree.Node
	switch x := node.(type) {
	case *ast.BinaryNode:
		switch x.Operator {
		case "+":
			return x.String(), "a number or a string"
		case "-", "*", "/", "%", "**", "^":
			return x.String(), "a number"
		case "..":
			return x.String(), "a list"
		}
	case *ast.UnaryNode:
		if x.Operator == "-" || x.Operator == "+" {
			return x.String(), "a number"
		}
	case *ast.IntegerNode, *ast.FloatNode:
		return x.String(), "a number"
	case *ast.StringNode:
		return x.String(), "a string"
	case *ast.ArrayNode:
		return x.String(), "a list"
	case *ast.MapNode:
		return x.String(), "a map"
	}
	return "", ""
}

// exprError reports a compile error at the file position of the error
// inside the expression.
func (l *loader) exprError(n *yaml.Node, src, what string, sc *scope, err error) {
	msg := err.Error()
	line, col := n.Line, n.Column
	var fe *file.Error
	if errors.As(err, &fe) {
		msg = fe.Message
		line, col = l.exprPos(n, fe.Line, fe.Column)
		if name, ok := strings.CutPrefix(msg, "unknown name "); ok {
			names := append(append([]string{}, builtinNames...), sc.bound...)
			// A short name two edits away is no likely typo: `line` is
			// not `size`.
			if c := closest(name, names); c != "" && (len(c) > 4 || editDistance(strings.ToLower(name), c) <= 1) {
				msg += fmt.Sprintf("; did you mean `%s`?", c)
			} else {
				msg += "; an expression sees " + strings.Join(names, ", ")
			}
		}
	}
	if n.LineComment != "" && n.Style&(yaml.LiteralStyle|yaml.FoldedStyle|yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 {
		msg += fmt.Sprintf("; YAML read `%s` as a comment, so quote the expression or use the block form", shorten(n.LineComment))
	}
	l.errAtPos(line, col, src, "%s does not compile: %s", what, msg)
}

// exprPos maps a position inside an expression (line 1-based, column
// 0-based, as expr reports them) to the rule file. Exact for plain and
// quoted one-line scalars and for literal blocks; for folded blocks and
// multi-line flow scalars it is the first line of the expression.
func (l *loader) exprPos(n *yaml.Node, eLine, eCol int) (int, int) {
	if eLine < 1 {
		eLine = 1
	}
	switch {
	case n.Style&yaml.LiteralStyle != 0:
		// Columns inside a literal block count from the block's
		// indentation, which its first line sets.
		return n.Line + eLine, l.indent(n.Line+1) + eCol + 1
	case n.Style&yaml.FoldedStyle != 0:
		line := n.Line + 1
		return line, l.indent(line) + 1
	case strings.Contains(n.Value, "\n") || eLine > 1:
		return n.Line, n.Column
	case n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0:
		return n.Line, n.Column + 1 + eCol
	}
	return n.Line, n.Column + eCol
}

func (l *loader) indent(line int) int {
	if line < 1 || line > len(l.lines) {
		return 0
	}
	s := l.lines[line-1]
	return len(s) - len(strings.TrimLeft(s, " "))
}

// aggConfig parses aggregate names as plain calls, so `count()` and
// `avg(x)` reach the analyzer as calls instead of failing to parse as
// expr-lang builtins.
func aggConfig() *conf.Config {
	c := conf.New(map[string]any{})
	for _, fn := range operators.AggregateFuncs() {
		c.Functions[string(fn)] = &builtin.Function{Name: string(fn)}
	}
	return c
}

// isAggregateCall reports whether a call has the shape of an aggregate
// (operators.AggregateFuncs): one that expr-lang does not have as a
// builtin (avg, count_distinct) in any form, the others (count, sum, min,
// max, first, last) with their own number of arguments. Other arities
// (max(a, b), sum(list, #)) stay expr-lang builtins.
func isAggregateCall(c *ast.CallNode) (string, bool) {
	id, ok := c.Callee.(*ast.IdentifierNode)
	if !ok {
		return "", false
	}
	arity := operators.AggFunc(id.Value).Arity()
	if arity < 0 {
		return "", false
	}
	if _, isBuiltin := builtin.Index[id.Value]; !isBuiltin {
		return id.Value, true
	}
	return id.Value, len(c.Arguments) == arity
}

// treeVisitor collects what checkTree refuses.
type treeVisitor struct {
	aggs    []ast.Node
	members []*ast.MemberNode
}

func (v *treeVisitor) Visit(n *ast.Node) {
	switch x := (*n).(type) {
	case *ast.CallNode:
		if _, ok := isAggregateCall(x); ok {
			v.aggs = append(v.aggs, x)
		}
	case *ast.MemberNode:
		if id, ok := x.Node.(*ast.IdentifierNode); ok && id.Value == "value" {
			if _, ok := x.Property.(*ast.StringNode); ok {
				v.members = append(v.members, x)
			}
		}
	}
}

// checkTree refuses an aggregate call outside window.aggregate and a field
// of `value` that the record cannot have at this point. A source that does
// not parse is left to the compiler, which reports it precisely.
func (l *loader) checkTree(n *yaml.Node, src, what string, sc *scope, inAggregate bool) bool {
	tree, err := parser.ParseWithConfig(src, aggConfig())
	if err != nil {
		return true
	}
	v := &treeVisitor{}
	ast.Walk(&tree.Node, v)
	ok := true
	if !inAggregate {
		for _, a := range v.aggs {
			name, _ := isAggregateCall(a.(*ast.CallNode))
			line, col := l.nodePos(n, src, a)
			l.errAtPos(line, col, src, "%s uses the aggregate `%s(...)`, which only works inside `window.aggregate`; aggregate in a window step, or use an expr-lang function here", what, name)
			ok = false
		}
	}
	for _, m := range v.members {
		field := m.Property.(*ast.StringNode).Value
		line, col := l.nodePos(n, src, m)
		switch {
		case sc.shape.known && !sc.shape.has(field):
			l.errAtPos(line, col, src, "%s reads `value.%s`, but after %s value has only the fields %s", what, field, sc.shape.origin, strings.Join(sc.shape.fields, ", "))
			ok = false
		case !sc.shape.known && sc.shape.raw:
			l.errAtPos(line, col, src, "%s reads `value.%s`, but with `format: raw` value is a string; use `format: json` or work on the string", what, field)
			ok = false
		}
	}
	return ok
}

// nodePos is the file position of an AST node of the expression in n.
func (l *loader) nodePos(n *yaml.Node, src string, a ast.Node) (int, int) {
	from := a.Location().From
	line, col := 1, 0
	for i, r := range []rune(src) {
		if i == from {
			break
		}
		if r == '\n' {
			line++
			col = 0
		} else {
			col++
		}
	}
	return l.exprPos(n, line, col)
}

// canonical is the expression in a normal form (expr's printer), so
// re-indenting or re-spacing it does not change a fingerprint.
func canonical(src string) string {
	tree, err := parser.ParseWithConfig(src, aggConfig())
	if err != nil {
		return strings.TrimSpace(src)
	}
	return tree.Node.String()
}

// fingerprint chains: each step's fingerprint hashes the previous one, so
// a change anywhere upstream changes every step after it.
func chain(prev, kind, def string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s", prev, kind, def)
	return hex.EncodeToString(h.Sum(nil))
}

func (l *loader) steps(kv *keyVal, r *Route) {
	src := "source\x00" + string(r.Source.Format) + "\x00" + r.Source.Watermark.String() + "\x00"
	if r.Source.EventTime != nil {
		src += canonical(r.Source.EventTime.Source)
	}
	fp := chain("", "source", src)
	sc := &scope{shape: sourceShape(r.Source.Format)}

	if kv != nil {
		if kv.val.Kind != yaml.SequenceNode {
			if !(kv.val.Kind == yaml.ScalarNode && kv.val.ShortTag() == "!!null") {
				l.errAt(kv.val, "steps", "`steps` must be a list, each item one step (`- filter: ...`)")
			}
		} else {
			for i, item := range kv.val.Content {
				item = resolve(item)
				l.otherReads = nil
				spec, def := l.step(i, item, sc, r)
				if spec == nil {
					continue
				}
				fp = chain(fp, spec.Kind, def)
				spec.Fingerprint, spec.Def = fp, strings.ReplaceAll(def, "\x00", "; ")
				r.Steps = append(r.Steps, *spec)
				if spec.Input != nil && len(sc.bound) > 0 {
					l.streamJoins = append(l.streamJoins, streamJoinReads{step: len(r.Steps) - 1,
						as: sc.bound[len(sc.bound)-1], other: l.otherReads})
				}
			}
		}
	}
	l.checkSwitch(kv)
	fanOutAfter(r, sc)
	l.sinkKey(r, sc)
	// A sink that encodes Avro or Protobuf builds its output from the
	// whole value, so such a route decodes its source whole.
	jsonSinks := true
	for _, s := range r.Sinks() {
		jsonSinks = jsonSinks && (s.Format == "" || s.Format == FormatJSON)
	}
	l.streamMembers(r)
	if r.Source.Format == FormatJSON && !l.srcReads.whole && jsonSinks {
		r.Source.Members = slices.Sorted(maps.Keys(l.srcReads.members))
		r.Source.DecodeMembers = true
	}
	l.checkSinkSchema(r, sc)
}

// sinkKey compiles sink.key against what the last step emits.
func (l *loader) sinkKey(r *Route, sc *scope) {
	if k := l.sinkFields["key"]; k != nil {
		r.Sink.Key = l.expr(k, "sink.key", sc, exprAny)
	}
}

// step compiles one item of steps through its kind's operators.Spec. It
// returns the step and the canonical definition text its fingerprint
// hashes, or nil after reporting errors.
func (l *loader) step(i int, item *yaml.Node, sc *scope, r *Route) (*StepSpec, string) {
	kinds := operators.StepKinds()
	if item.Kind != yaml.MappingNode || len(item.Content) == 0 {
		l.errAt(item, item.Value, "step %d must be one of %s, written `- filter: EXPR` or `- window: {...}`", i+1, strings.Join(kinds, ", "))
		return nil, ""
	}
	k, v := resolve(item.Content[0]), resolve(item.Content[1])
	spec := operators.SpecOf(k.Value)
	if form := stepForm(k.Value, v); form != "" {
		spec = operators.SpecForm(k.Value, form)
	}
	if spec == nil {
		msg := fmt.Sprintf("unknown step `%s`", k.Value)
		if s := closest(k.Value, kinds); s != "" {
			msg += fmt.Sprintf("; did you mean `%s`?", s)
		} else {
			msg += "; steps are " + strings.Join(kinds, ", ")
		}
		l.errAt(k, k.Value, "%s", msg)
		return nil, ""
	}
	if len(item.Content) > 2 {
		extra := resolve(item.Content[2])
		l.errAt(extra, extra.Value, "a step holds exactly one operator; start `%s` on its own list item (`- %s: ...`)", extra.Value, extra.Value)
		return nil, ""
	}
	st := &StepSpec{Index: i, Kind: k.Value, Line: k.Line, Col: k.Column}
	p := &stepParse{l: l, spec: spec, step: &keyVal{key: k, val: v}, sc: sc, r: r,
		args: operators.NewArgs(), given: map[string]*keyVal{}, entries: map[string]map[string]*yaml.Node{}, refused: map[string]bool{}}
	n := len(l.errs)
	plan := p.compile()
	if plan == nil || len(l.errs) > n {
		return nil, ""
	}
	def := p.def()
	p.apply(plan, st)
	p.warn(plan.Warnings)
	p.fanOut(plan, st)
	if len(l.errs) > n {
		return nil, ""
	}
	return st, def
}

// stepForm is the Form of kind's spec that the mapping v selects by
// holding its key (`join: { stream: ... }`), or "".
func stepForm(kind string, v *yaml.Node) string {
	if v.Kind != yaml.MappingNode {
		return ""
	}
	for _, form := range operators.FormsOf(kind) {
		for i := 0; i+1 < len(v.Content); i += 2 {
			if resolve(v.Content[i]).Value == form {
				return form
			}
		}
	}
	return ""
}

// stepParse is one step on its way through its Spec: the values read so
// far, where each was written, and which keys were refused (their
// problems are reported; Compile's view of them is not).
type stepParse struct {
	l    *loader
	spec *operators.Spec
	step *keyVal // `kind: value`
	sc   *scope
	r    *Route

	args    *operators.Args
	given   map[string]*keyVal               // key -> where the file wrote it
	entries map[string]map[string]*yaml.Node // mapping-valued key -> entry name -> its name node
	refused map[string]bool
}

// compile reads every key of the step, fills in defaults, and runs the
// Spec's Compile, reporting each problem at its place in the file.
func (p *stepParse) compile() *operators.Plan {
	l, kind := p.l, p.spec.Kind
	if b := p.spec.Body; b != nil {
		p.given[b.Name] = p.step
		if !p.read(b, p.step, kind) {
			return nil
		}
	} else {
		if !l.mapping(p.step, kind, p.spec.Usage) {
			return nil
		}
		f := l.fields(p.step.val, p.spec.KeyNames(), kind)
		for i := range p.spec.Keys {
			key := &p.spec.Keys[i]
			x := f[key.Name]
			switch {
			case x != nil:
				p.given[key.Name] = x
				if !p.read(key, x, kind+"."+key.Name) {
					p.refused[key.Name] = true
				}
			case key.Required:
				l.errAt(p.step.key, kind, "%s needs `%s`: %s", kind, key.Name, key.Needs)
				p.refused[key.Name] = true
			case key.Default != "":
				p.args.Set(key.Name, p.defaultValue(key), false)
			}
		}
		for i := range p.spec.Keys {
			if key := &p.spec.Keys[i]; f[key.Name] == nil && key.DefaultFrom != "" {
				p.defaultFrom(key)
			}
		}
	}
	plan, err := p.spec.Compile(p.args)
	if err != nil {
		p.report(err)
		return nil
	}
	if len(p.refused) > 0 {
		return nil
	}
	return plan
}

// defaultValue is a key's Default as its type reads it.
func (p *stepParse) defaultValue(key *operators.Key) any {
	if key.Type == operators.TypeDuration {
		d, err := time.ParseDuration(key.Default)
		if err != nil {
			panic(fmt.Sprintf("rules: step %s: default of %s: %v", p.spec.Kind, key.Name, err))
		}
		return d
	}
	return key.Default
}

// defaultFrom gives key the value of the key it defaults to (join `as`:
// the table's name), when that value is a name expressions can use.
func (p *stepParse) defaultFrom(key *operators.Key) {
	if p.refused[key.DefaultFrom] {
		p.refused[key.Name] = true
		return
	}
	s := p.args.String(key.DefaultFrom)
	if key.Type == operators.TypeName && p.nameProblem(s) != "" {
		p.l.errAt(p.step.key, s, "%s needs `%s`: %s `%s` cannot be used as a name in expressions", p.spec.Kind, key.Name, key.DefaultFrom, s)
		p.refused[key.Name] = true
		return
	}
	p.args.Set(key.Name, s, false)
}

// read parses one written key by its type into args. what names it in
// messages ("window.size", or "filter" for a step's body).
func (p *stepParse) read(key *operators.Key, x *keyVal, what string) bool {
	l := p.l
	var v any
	switch key.Type {
	case operators.TypeExpr, operators.TypeCondition:
		kind := exprAny
		if key.Type == operators.TypeCondition {
			kind = exprBool
		}
		sc := p.sc
		if key.OtherSide {
			sc = otherScope()
		}
		e := l.expr(x, what, sc, kind)
		if e == nil {
			return false
		}
		v = e
	case operators.TypeStream:
		in, ok := p.stream(x, what)
		if !ok {
			return false
		}
		v = in
	case operators.TypeInterval:
		iv, ok := p.interval(x, what)
		if !ok {
			return false
		}
		v = iv
	case operators.TypeDuration:
		d, ok := l.duration(x, what, key.ZeroOK)
		if !ok {
			return false
		}
		v = d
	case operators.TypeEnum:
		s, ok := l.oneOf(x, what, key.Choices...)
		if !ok {
			return false
		}
		v = s
	case operators.TypeName:
		s, ok := l.scalar(x, what)
		if !ok {
			return false
		}
		if msg := p.nameProblem(s); msg != "" {
			l.errAt(x.val, s, "%s `%s: %s` %s", p.spec.Kind, key.Name, s, msg)
			return false
		}
		v = s
	case operators.TypeTable:
		s, ok := l.scalar(x, what)
		if !ok || !p.tableDefined(x, s) {
			return false
		}
		v = s
	case operators.TypeFields:
		fields, ok := p.fields(x)
		if !ok {
			return false
		}
		v = fields
	case operators.TypeFieldNames:
		names, ok := p.fieldNames(x, what)
		if !ok {
			return false
		}
		v = names
	case operators.TypeAggregates:
		aggs, ok := p.aggregates(x, what)
		if !ok {
			return false
		}
		v = aggs
	case operators.TypeBranches:
		bs, ok := p.branches(x, what)
		if !ok {
			return false
		}
		v = bs
	default:
		panic(fmt.Sprintf("rules: step %s key %s: type %d has no parser", p.spec.Kind, key.Name, key.Type))
	}
	p.args.Set(key.Name, v, true)
	return true
}

// nameProblem says why s cannot be bound as a name later expressions see,
// or "".
func (p *stepParse) nameProblem(s string) string {
	switch {
	case contains(builtinNames, s):
		return fmt.Sprintf("would hide the built-in `%s`; choose another name, e.g. `%s_row`", s, s)
	case contains(p.sc.bound, s):
		return "is already bound by an earlier step; choose another name"
	case !identifierRe.MatchString(s):
		return "must be a name expressions can use: letters, digits and `_`, not starting with a digit"
	case contains(exprKeywords, s):
		return "is an expression keyword; choose another name"
	}
	if _, isBuiltin := builtin.Index[s]; isBuiltin {
		return fmt.Sprintf("would hide the expr-lang function `%s`; choose another name", s)
	}
	return ""
}

// tableDefined refuses a table name that `tables:` does not define.
func (p *stepParse) tableDefined(x *keyVal, table string) bool {
	if _, ok := p.r.Tables[table]; ok {
		return true
	}
	names := make([]string, 0, len(p.r.Tables))
	for n := range p.r.Tables {
		names = append(names, n)
	}
	sort.Strings(names)
	msg := fmt.Sprintf("%s to undefined table `%s`", p.spec.Kind, table)
	if c := closest(table, names); c != "" {
		msg += fmt.Sprintf("; did you mean `%s`?", c)
	} else if len(names) > 0 {
		msg += "; defined tables: " + strings.Join(names, ", ")
	} else {
		msg += "; define it under `tables:` (`" + table + ": { file: " + table + ".jsonl, key: id }`)"
	}
	p.l.errAt(x.val, table, "%s", msg)
	return false
}

// fields reads a mapping of field names to expressions (set, map).
func (p *stepParse) fields(x *keyVal) ([]operators.Field, bool) {
	l, name := p.l, x.key.Value
	if x.val.Kind != yaml.MappingNode || len(x.val.Content) == 0 {
		l.errAt(x.val, name, "`%s` must be a mapping of field names to expressions, e.g. `%s: { amount: value.amount }`", name, name)
		return nil, false
	}
	var fields []operators.Field
	var names []string
	ok := true
	for i := 0; i+1 < len(x.val.Content); i += 2 {
		fk, fv := resolve(x.val.Content[i]), resolve(x.val.Content[i+1])
		if fk.Kind != yaml.ScalarNode || fk.Value == "" {
			l.errAt(fk, "", "a field name in `%s` must be plain text", name)
			ok = false
			continue
		}
		if contains(names, fk.Value) {
			l.errAt(fk, fk.Value, "field `%s` is written twice in this `%s`; keep one", fk.Value, name)
			ok = false
			continue
		}
		names = append(names, fk.Value)
		e := l.expr(&keyVal{key: fk, val: fv}, name+" "+fk.Value, p.sc, exprAny)
		if e == nil {
			ok = false
			continue
		}
		fields = append(fields, operators.Field{Name: fk.Value, Expr: e})
	}
	return fields, ok
}

// fieldNames reads a list of field names (drop): at least one, each
// plain text, none twice. A single name may be written without the list.
func (p *stepParse) fieldNames(x *keyVal, what string) ([]string, bool) {
	l := p.l
	usage := "a list of field names, e.g. `" + x.key.Value + ": [email, phone]`"
	items := x.val.Content
	switch {
	case x.val.Kind == yaml.ScalarNode && x.val.ShortTag() != "!!null" && strings.TrimSpace(x.val.Value) != "":
		items = []*yaml.Node{x.val}
	case x.val.Kind != yaml.SequenceNode || len(x.val.Content) == 0:
		l.errAt(x.val, what, "`%s` must be %s", what, usage)
		return nil, false
	}
	var names []string
	ok := true
	for _, it := range items {
		it = resolve(it)
		if it.Kind != yaml.ScalarNode || strings.TrimSpace(it.Value) == "" || it.ShortTag() == "!!null" {
			l.errAt(it, "", "each entry of `%s` is a field name (plain text); `%s` must be %s", what, what, usage)
			ok = false
			continue
		}
		if contains(names, it.Value) {
			l.errAt(it, it.Value, "field `%s` is listed twice in this `%s`; keep one", it.Value, what)
			ok = false
			continue
		}
		names = append(names, it.Value)
	}
	return names, ok
}

// aggregates reads a mapping of names to aggregate calls.
func (p *stepParse) aggregates(x *keyVal, what string) ([]operators.Aggregate, bool) {
	l := p.l
	if !l.mapping(x, what, "`"+x.key.Value+": { n: count(), total: sum(value.amount) }`") {
		return nil, false
	}
	var aggs []operators.Aggregate
	names := map[string]*yaml.Node{}
	p.entries[x.key.Value] = names
	ok := true
	for i := 0; i+1 < len(x.val.Content); i += 2 {
		nk, nv := resolve(x.val.Content[i]), resolve(x.val.Content[i+1])
		if nk.Kind != yaml.ScalarNode || nk.Value == "" {
			l.errAt(nk, "", "an aggregate needs a plain name")
			ok = false
			continue
		}
		if names[nk.Value] != nil {
			l.errAt(nk, nk.Value, "aggregate name `%s` is written twice; choose another name", nk.Value)
			ok = false
			continue
		}
		names[nk.Value] = nk
		agg, good := l.aggregate(nk, nv, p.sc)
		if !good {
			ok = false
			continue
		}
		aggs = append(aggs, agg)
	}
	return aggs, ok
}

// report attaches each problem Compile found to the place of its key: the
// entry's name, the key's name or value, or the step when the key is not
// written. Problems with a key already refused are not repeated.
func (p *stepParse) report(err error) {
	l, kind := p.l, p.spec.Kind
	var list operators.KeyErrors
	if !errors.As(err, &list) {
		var one *operators.KeyError
		if !errors.As(err, &one) {
			l.errAt(p.step.key, kind, "%s: %v", kind, err)
			return
		}
		list = operators.KeyErrors{one}
	}
	for _, e := range list {
		if p.refused[e.Key] {
			continue
		}
		n, text := p.place(e)
		l.errAt(n, text, "%s", e.Msg)
	}
}

// warn reports the plan's warnings, each at the place of its key.
func (p *stepParse) warn(list operators.KeyErrors) {
	for _, e := range list {
		n, text := p.place(e)
		p.l.warnAt(n, text, "%s", e.Msg)
	}
}

// place is where in the file a KeyError belongs: the entry's name, the
// key's name or value, or the step when the key is not written.
func (p *stepParse) place(e *operators.KeyError) (*yaml.Node, string) {
	x := p.given[e.Key]
	switch {
	case e.Key == "" || x == nil:
		return p.step.key, p.spec.Kind
	case e.Entry != "" && p.entries[e.Key][e.Entry] != nil:
		n := p.entries[e.Key][e.Entry]
		return n, n.Value
	case e.AtName:
		return x.key, x.key.Value
	}
	return x.val, x.val.Value
}

// apply records what the plan does on the step and on what later steps
// see.
func (p *stepParse) apply(plan *operators.Plan, st *StepSpec) {
	sc, kind, line := p.sc, p.spec.Kind, p.step.key.Line
	switch plan.Value {
	case operators.ValueReplaced:
		sc.shape = shape{known: true, fields: plan.Fields, origin: fmt.Sprintf("the %s at line %d", kind, line)}
	case operators.ValueMerged:
		if sc.shape.known {
			merged := append([]string{}, sc.shape.fields...)
			for _, n := range plan.Fields {
				if !contains(merged, n) {
					merged = append(merged, n)
				}
			}
			sc.shape = shape{known: true, fields: merged, origin: fmt.Sprintf("the %s at line %d", kind, line)}
		} else if sc.shape.raw {
			p.l.errAt(p.step.key, kind, "`%s` adds fields to a JSON object, but with `format: raw` value is a string; use `map` to build an object, or `format: json`", kind)
		}
	case operators.ValueDropped:
		switch {
		case sc.shape.known:
			var kept []string
			for _, f := range sc.shape.fields {
				if !contains(plan.Fields, f) {
					kept = append(kept, f)
				}
			}
			sc.shape = shape{known: true, fields: kept, origin: fmt.Sprintf("the %s at line %d", kind, line)}
		case sc.shape.raw:
			p.l.errAt(p.step.key, kind, "`%s` removes fields of a JSON object, but with `format: raw` value is a string; use `map` to build an object, or `format: json`", kind)
		default:
			// A member decoded in part would be spliced back from the raw
			// bytes (jsoncodec.SpliceMembers): a value with members dropped
			// is decoded whole.
			p.l.srcReads.whole = true
		}
	}
	if plan.ClearsNames {
		sc.bound = nil
	}
	if plan.Binds != "" {
		sc.bound = append(append([]string{}, sc.bound...), plan.Binds)
	}
	st.Table = plan.Table
	st.Input = plan.Input
	st.Traits = plan.Traits
	st.Build = plan.New
}

// def is the step's definition in canonical form, what its fingerprint
// hashes: the body, or each key in declared order (`key=value`, space
// separated, aggregates as `\x00name=func(arg)`). A key not given reads as
// its zero value, so adding an optional key to a Spec keeps every
// fingerprint of rule files that do not write it... as long as the zero
// value's text does not change.
func (p *stepParse) def() string {
	if b := p.spec.Body; b != nil {
		return p.value(b)
	}
	var d strings.Builder
	for i := range p.spec.Keys {
		key := &p.spec.Keys[i]
		if key.Type == operators.TypeAggregates {
			for _, agg := range p.args.Aggregates(key.Name) {
				arg := ""
				if agg.Arg != nil {
					arg = canonical(agg.Arg.Source)
				}
				fmt.Fprintf(&d, "\x00%s=%s(%s)", agg.Name, agg.Func, arg)
			}
			continue
		}
		if key.FingerprintOmitsAbsent && p.given[key.Name] == nil {
			continue
		}
		if d.Len() > 0 {
			d.WriteByte(' ')
		}
		fmt.Fprintf(&d, "%s=%s", key.Name, p.value(key))
	}
	return d.String()
}

// value is one key's value in canonical form.
func (p *stepParse) value(key *operators.Key) string {
	switch key.Type {
	case operators.TypeExpr, operators.TypeCondition:
		if e := p.args.Expr(key.Name); e != nil {
			return canonical(e.Source)
		}
		return canonical(`""`)
	case operators.TypeDuration:
		return p.args.Duration(key.Name).String()
	case operators.TypeStream:
		in := p.args.Stream(key.Name)
		et := ""
		if in.EventTime != nil {
			et = canonical(in.EventTime.Source)
		}
		if in.MessageIndexes != "" {
			return fmt.Sprintf("{topic=%s event_time=%s format=%s message_indexes=%s}", in.Topic, et, in.Format, in.MessageIndexes)
		}
		return fmt.Sprintf("{topic=%s event_time=%s format=%s}", in.Topic, et, in.Format)
	case operators.TypeInterval:
		iv := p.args.Interval(key.Name)
		return fmt.Sprintf("{before=%s after=%s}", iv.Before, iv.After)
	case operators.TypeTable:
		// The table's definition as written (not its content, not its
		// absolute path): a table edit or a moved rules directory keeps
		// downstream state.
		t := p.args.String(key.Name)
		return fmt.Sprintf("%s {%s}", t, p.l.tableDefs[t])
	case operators.TypeFields:
		var d strings.Builder
		for _, f := range p.args.Fields(key.Name) {
			fmt.Fprintf(&d, "%s=%s\x00", f.Name, canonical(f.Expr.Source))
		}
		return d.String()
	case operators.TypeBranches:
		return p.branchesDef()
	case operators.TypeFieldNames:
		return strings.Join(p.args.Names(key.Name), "\x00")
	}
	return p.args.String(key.Name)
}

// aggregateUsage lists the aggregate functions as a rule file writes
// them: "count(), sum(x), … or count_distinct(x)".
func aggregateUsage() string {
	fns := operators.AggregateFuncs()
	usage := make([]string, len(fns))
	for i, fn := range fns {
		usage[i] = fn.Usage()
	}
	return strings.Join(usage[:len(usage)-1], ", ") + " or " + usage[len(usage)-1]
}

// aggregate compiles one `name: func(arg)` entry of window.aggregate.
func (l *loader) aggregate(nk, nv *yaml.Node, sc *scope) (operators.Aggregate, bool) {
	what := "aggregate " + nk.Value
	if nv.Kind != yaml.ScalarNode || strings.TrimSpace(nv.Value) == "" {
		l.errAt(nv, nk.Value, "%s must be one aggregate call: %s", what, aggregateUsage())
		return operators.Aggregate{}, false
	}
	src := strings.TrimSpace(nv.Value)
	tree, err := parser.ParseWithConfig(src, aggConfig())
	if err != nil {
		var fe *file.Error
		msg := err.Error()
		line, col := nv.Line, nv.Column
		if errors.As(err, &fe) {
			msg = fe.Message
			line, col = l.exprPos(nv, fe.Line, fe.Column)
		}
		l.errAtPos(line, col, src, "%s does not compile: %s", what, msg)
		return operators.Aggregate{}, false
	}
	call, isCall := tree.Node.(*ast.CallNode)
	var name string
	if isCall {
		if id, ok := call.Callee.(*ast.IdentifierNode); ok {
			name = id.Value
		}
	}
	arity := operators.AggFunc(name).Arity()
	if !isCall || arity < 0 {
		l.errAt(nv, src, "%s must be exactly one aggregate call, such as `count()` or `sum(value.amount)`; compute around it in a later step (`set`/`map` after the window)", what)
		return operators.Aggregate{}, false
	}
	if len(call.Arguments) != arity {
		if arity == 0 {
			l.errAt(nv, src, "%s: `count()` takes no argument; to count distinct values use `count_distinct(x)`", what)
		} else {
			l.errAt(nv, src, "%s: `%s` takes exactly one argument, e.g. `%s(value.amount)`", what, name, name)
		}
		return operators.Aggregate{}, false
	}
	agg := operators.Aggregate{Name: nk.Value, Func: operators.AggFunc(name)}
	if arity == 0 {
		return agg, true
	}
	open := strings.IndexByte(src, '(')
	close := strings.LastIndexByte(src, ')')
	if open < 0 || close <= open {
		l.errAt(nv, src, "%s must be exactly one aggregate call, such as `sum(value.amount)`", what)
		return operators.Aggregate{}, false
	}
	argSrc := src[open+1 : close]
	inner := &yaml.Node{Kind: yaml.ScalarNode, Value: argSrc, Line: nv.Line, Column: nv.Column + len([]rune(src[:open+1])), Style: nv.Style}
	if nv.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0 || strings.Contains(nv.Value, "\n") {
		inner.Column = nv.Column
	}
	if !l.checkTree(inner, argSrc, what, sc, false) {
		return operators.Aggregate{}, false
	}
	arg, err := compileExpr(argSrc, sc.bound)
	if err != nil {
		l.exprError(inner, argSrc, what, sc, err)
		return operators.Aggregate{}, false
	}
	l.noteReads(arg, sc)
	agg.Arg = arg
	return agg, true
}

// fanOut multiplies the fan-out of the steps so far by this step's and
// warns when one source record can then cause more records or window
// updates than the fan-out budget (limits.max_fanout): `explode` of a long
// list before a sliding window of many windows per record, or two
// explodes. At run time such a record becomes a dead letter with reason
// `budget` (operators/budget.go); the check says so before.
func (p *stepParse) fanOut(plan *operators.Plan, st *StepSpec) {
	sc := p.sc
	if sc.fan < 1 {
		sc.fan = 1
	}
	sc.fanSteps = append(sc.fanSteps, fanStep{n: plan.FanOut, ends: plan.EndsFanOut, exact: plan.FanOutExact})
	n := plan.FanOut
	if n > 1 {
		total := sc.fan * n
		if n != 0 && total/n != sc.fan || total < 0 {
			total = 1<<63 - 1
		}
		if limit := operators.CurrentLimits().FanOut; sc.fan > 1 && total > limit {
			what := plan.FanOutUnit
			if what == "" {
				what = "records"
			}
			p.l.warnAt(p.step.key, p.spec.Kind, "after %s, this %s can make up to %d %s of each record it gets: up to %s per source record, more than the fan-out budget of %d (limits.max_fanout); a source record over it becomes a dead letter with reason `budget`. Keep the lists short, or make the slide larger",
				strings.Join(sc.fanFrom, " and "), st.Kind, n, what, fanText(total), limit)
		}
		sc.fan = total
		sc.fanFrom = append(sc.fanFrom, fmt.Sprintf("`%s` at line %d (up to %d each)", st.Kind, st.Line, n))
	}
	if plan.EndsFanOut {
		sc.fan, sc.fanFrom = 1, nil
	}
}

func fanText(n int64) string {
	if n == 1<<63-1 {
		return "more than 9.2e18"
	}
	return fmt.Sprintf("%d", n)
}

// fanOutAfter tells each explode the window updates each of its copies
// causes in the steps after it (the sliding windows up to the first that
// emits on close, multiplied), so that it charges them to the fan-out
// budget before making a copy: a record that would go over is one dead
// letter, refused whole, instead of windows updated by part of it.
func fanOutAfter(r *Route, sc *scope) {
	if len(sc.fanSteps) != len(r.Steps) {
		return // a step was refused: the route does not run
	}
	for i, f := range sc.fanSteps {
		if f.n <= 1 || f.exact {
			continue // only a fan-out that depends on the record is told
		}
		after := int64(1)
		for _, g := range sc.fanSteps[i+1:] {
			if g.exact && g.n > 1 {
				if after > (1<<62)/g.n {
					after = 1 << 62
				} else {
					after *= g.n
				}
			}
			if g.ends {
				break
			}
		}
		if after <= 1 {
			continue
		}
		build := r.Steps[i].Build
		r.Steps[i].Build = func(env operators.BuildEnv) (operators.Step, error) {
			s, err := build(env)
			if fs, ok := s.(operators.FanOutSetter); ok && err == nil {
				fs.SetFanOutAfter(after)
			}
			return s, err
		}
	}
}

// otherScope is what an expression on a stream join's second input sees:
// that topic's records as they come (JSON), no names bound. What it reads
// is not the source's, so it adds nothing to the source's reads.
func otherScope() *scope {
	return &scope{shape: shape{raw: false, origin: "the stream"}, other: true}
}

// streamKeys are the keys of a stream join's `stream:`.
var streamKeys = []string{"topic", "event_time", "format", "message_indexes"}

// stream reads a stream join's `stream: { topic, event_time, format }`.
func (p *stepParse) stream(x *keyVal, what string) (operators.StreamInput, bool) {
	l := p.l
	in := operators.StreamInput{Format: string(FormatJSON)}
	if !l.mapping(x, what, "`stream: { topic: authorizations, event_time: value.ts }`") {
		return in, false
	}
	f := l.fields(x.val, streamKeys, what)
	ok := true
	if t := f["topic"]; t == nil {
		l.errAt(x.key, what, "missing `%s.topic`: the second topic the join reads", what)
		ok = false
	} else if name, good := l.topicName(t, what+".topic"); good {
		in.Topic = name
		switch name {
		case p.r.Source.Topic:
			l.errAt(t.val, name, "`%s.topic` is the route's source topic; a stream join reads a second topic", what)
			ok = false
		case p.r.Sink.Topic, p.r.DeadLetter:
			l.errAt(t.val, name, "`%s.topic` is where the route writes; reading it would feed the join its own outputs", what)
			ok = false
		}
	} else {
		ok = false
	}
	if fm := f["format"]; fm != nil {
		s, good := l.readFormat(fm, what+".format", FormatJSON, FormatRaw, FormatAvro, FormatProtobuf)
		ok = ok && good
		in.Format = string(s)
	}
	nerr := len(l.errs)
	in.MessageIndexes = l.messageIndexes(f["message_indexes"], what, Format(in.Format))
	ok = ok && len(l.errs) == nerr
	if et := f["event_time"]; et != nil {
		sc := otherScope()
		if in.Format == string(FormatRaw) {
			sc.shape.raw = true
		}
		e := l.expr(et, what+".event_time", sc, exprAny)
		ok = ok && e != nil
		in.EventTime = e
	}
	return in, ok
}

// interval reads `within: { before: D, after: D }`; a missing bound is 0.
func (p *stepParse) interval(x *keyVal, what string) (operators.Interval, bool) {
	l := p.l
	var iv operators.Interval
	if !l.mapping(x, what, "`within: { before: 5m, after: 1m }`") {
		return iv, false
	}
	f := l.fields(x.val, []string{"before", "after"}, what)
	ok := true
	if b := f["before"]; b != nil {
		d, good := l.duration(b, what+".before", true)
		ok = ok && good
		iv.Before = d
	}
	if a := f["after"]; a != nil {
		d, good := l.duration(a, what+".after", true)
		ok = ok && good
		iv.After = d
	}
	if ok && f["before"] == nil && f["after"] == nil {
		l.errAt(x.key, x.key.Value, "`%s` needs `before` or `after` (or both), e.g. `within: { before: 5m, after: 1m }`", what)
		ok = false
	}
	return iv, ok
}
