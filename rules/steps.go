package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
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

	"github.com/rtproxy/rtproxy/operators"
)

// compileExpr compiles src for the record environment (operators owns
// its shape) with the names bound by earlier joins.
func compileExpr(src string, bound []string, opts ...expr.Option) (*operators.Expr, error) {
	return operators.CompileExpr(src, bound, opts...)
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

func sourceShape(format string) shape {
	return shape{raw: format == "raw", origin: "format raw"}
}

func (s shape) has(f string) bool { return contains(s.fields, f) }

// scope is what an expression at one point of the steps sees.
type scope struct {
	bound []string // join `as` names in effect
	shape shape
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
	if kind == exprBool {
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
			if c := closest(name, names); c != "" {
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
	src := "source\x00" + r.Source.Format + "\x00" + r.Source.Watermark.String() + "\x00"
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
				spec, def := l.step(i, item, sc, r)
				if spec == nil {
					continue
				}
				fp = chain(fp, spec.Kind, def)
				spec.Fingerprint, spec.Def = fp, strings.ReplaceAll(def, "\x00", "; ")
				r.Steps = append(r.Steps, *spec)
			}
		}
	}
	l.sinkKey(r, sc)
}

// sinkKey compiles sink.key against what the last step emits.
func (l *loader) sinkKey(r *Route, sc *scope) {
	if k := l.sinkFields["key"]; k != nil {
		r.Sink.Key = l.expr(k, "sink.key", sc, exprAny)
	}
}

// step compiles one item of steps. It returns the spec and the canonical
// definition text its fingerprint hashes, or nil after reporting errors.
func (l *loader) step(i int, item *yaml.Node, sc *scope, r *Route) (*StepSpec, string) {
	if item.Kind != yaml.MappingNode || len(item.Content) == 0 {
		l.errAt(item, item.Value, "step %d must be one of %s, written `- filter: EXPR` or `- window: {...}`", i+1, strings.Join(stepKinds, ", "))
		return nil, ""
	}
	k, v := resolve(item.Content[0]), resolve(item.Content[1])
	if !contains(stepKinds, k.Value) {
		msg := fmt.Sprintf("unknown step `%s`", k.Value)
		if s := closest(k.Value, stepKinds); s != "" {
			msg += fmt.Sprintf("; did you mean `%s`?", s)
		} else {
			msg += "; steps are " + strings.Join(stepKinds, ", ")
		}
		l.errAt(k, k.Value, "%s", msg)
		return nil, ""
	}
	if len(item.Content) > 2 {
		extra := resolve(item.Content[2])
		l.errAt(extra, extra.Value, "a step holds exactly one operator; start `%s` on its own list item (`- %s: ...`)", extra.Value, extra.Value)
		return nil, ""
	}
	kv := &keyVal{key: k, val: v}
	spec := &StepSpec{Index: i, Kind: k.Value, Line: k.Line, Col: k.Column}
	n := len(l.errs)
	var def string
	switch k.Value {
	case "filter":
		def = l.filterStep(kv, sc, spec)
	case "set", "map":
		def = l.fieldsStep(kv, sc, spec)
	case "join":
		def = l.joinStep(kv, sc, spec, r)
	case "drop_duplicates":
		def = l.dedupStep(kv, sc, spec)
	case "window":
		def = l.windowStep(kv, sc, spec)
	}
	if len(l.errs) > n {
		return nil, ""
	}
	return spec, def
}

func (l *loader) filterStep(kv *keyVal, sc *scope, spec *StepSpec) string {
	pred := l.expr(kv, "filter", sc, exprBool)
	if pred == nil {
		return ""
	}
	spec.Build = func(BuildEnv) (operators.Step, error) { return operators.NewFilter(pred), nil }
	return canonical(pred.Source)
}

// fieldsStep compiles set and map: a mapping of field name to expression.
func (l *loader) fieldsStep(kv *keyVal, sc *scope, spec *StepSpec) string {
	kind := kv.key.Value
	if kv.val.Kind != yaml.MappingNode || len(kv.val.Content) == 0 {
		l.errAt(kv.val, kind, "`%s` must be a mapping of field names to expressions, e.g. `%s: { amount: value.amount }`", kind, kind)
		return ""
	}
	var fields []operators.Field
	var names []string
	var def strings.Builder
	for i := 0; i+1 < len(kv.val.Content); i += 2 {
		fk, fv := resolve(kv.val.Content[i]), resolve(kv.val.Content[i+1])
		if fk.Kind != yaml.ScalarNode || fk.Value == "" {
			l.errAt(fk, "", "a field name in `%s` must be plain text", kind)
			continue
		}
		if contains(names, fk.Value) {
			l.errAt(fk, fk.Value, "field `%s` is written twice in this `%s`; keep one", fk.Value, kind)
			continue
		}
		names = append(names, fk.Value)
		e := l.expr(&keyVal{key: fk, val: fv}, kind+" "+fk.Value, sc, exprAny)
		if e == nil {
			continue
		}
		fields = append(fields, operators.Field{Name: fk.Value, Expr: e})
		fmt.Fprintf(&def, "%s=%s\x00", fk.Value, canonical(e.Source))
	}
	line := kv.key.Line
	if kind == "map" {
		sc.shape = shape{known: true, fields: names, origin: fmt.Sprintf("the map at line %d", line)}
		spec.Build = func(BuildEnv) (operators.Step, error) { return operators.NewMap(fields), nil }
	} else {
		if sc.shape.known {
			merged := append([]string{}, sc.shape.fields...)
			for _, n := range names {
				if !contains(merged, n) {
					merged = append(merged, n)
				}
			}
			sc.shape = shape{known: true, fields: merged, origin: fmt.Sprintf("the set at line %d", line)}
		} else if sc.shape.raw {
			l.errAt(kv.key, kind, "`set` adds fields to a JSON object, but with `format: raw` value is a string; use `map` to build an object, or `format: json`")
		}
		spec.Build = func(BuildEnv) (operators.Step, error) { return operators.NewSet(fields), nil }
	}
	return def.String()
}

func (l *loader) joinStep(kv *keyVal, sc *scope, spec *StepSpec, r *Route) string {
	if !l.mapping(kv, "join", "`join: { table: merchants, on: value.merchant_id, as: merchant }`") {
		return ""
	}
	f := l.fields(kv.val, joinKeys, "join")
	t := f["table"]
	if t == nil {
		l.errAt(kv.key, "join", "join needs `table`: the name of a table under `tables:`")
		return ""
	}
	table, ok := l.scalar(t, "join.table")
	if !ok {
		return ""
	}
	if _, defined := r.Tables[table]; !defined {
		names := make([]string, 0, len(r.Tables))
		for n := range r.Tables {
			names = append(names, n)
		}
		sort.Strings(names)
		msg := fmt.Sprintf("join to undefined table `%s`", table)
		if c := closest(table, names); c != "" {
			msg += fmt.Sprintf("; did you mean `%s`?", c)
		} else if len(names) > 0 {
			msg += "; defined tables: " + strings.Join(names, ", ")
		} else {
			msg += "; define it under `tables:` (`" + table + ": { file: " + table + ".jsonl, key: id }`)"
		}
		l.errAt(t.val, table, "%s", msg)
	}
	as := table
	if a := f["as"]; a != nil {
		s, ok := l.scalar(a, "join.as")
		if !ok {
			return ""
		}
		as = s
		switch {
		case contains(builtinNames, as):
			l.errAt(a.val, as, "join `as: %s` would hide the built-in `%s`; choose another name, e.g. `%s_row`", as, as, as)
		case contains(sc.bound, as):
			l.errAt(a.val, as, "join `as: %s` is already bound by an earlier join; choose another name", as)
		case !identifierRe.MatchString(as):
			l.errAt(a.val, as, "join `as` must be a name expressions can use: letters, digits and `_`, not starting with a digit")
		case contains(exprKeywords, as):
			l.errAt(a.val, as, "join `as: %s` is an expression keyword; choose another name", as)
		default:
			if _, isBuiltin := builtin.Index[as]; isBuiltin {
				l.errAt(a.val, as, "join `as: %s` would hide the expr-lang function `%s`; choose another name", as, as)
			}
		}
	} else if !identifierRe.MatchString(as) || contains(builtinNames, as) || contains(sc.bound, as) || contains(exprKeywords, as) {
		l.errAt(kv.key, table, "join needs `as`: table `%s` cannot be used as a name in expressions", table)
	}
	missing := operators.MissingKeep
	missingText := DefaultJoinMissing
	if m := f["missing"]; m != nil {
		s, ok := l.oneOf(m, "join.missing", "keep", "drop", "dead_letter")
		if !ok {
			return ""
		}
		missingText = s
		switch s {
		case "drop":
			missing = operators.MissingDrop
		case "dead_letter":
			missing = operators.MissingDeadLetter
		}
	}
	o := f["on"]
	if o == nil {
		l.errAt(kv.key, "join", "join needs `on`: the expression whose value is looked up in the table, e.g. `on: value.merchant_id`")
		return ""
	}
	on := l.expr(o, "join.on", sc, exprAny)
	if on == nil {
		return ""
	}
	sc.bound = append(append([]string{}, sc.bound...), as)
	spec.Table = table
	spec.Build = func(env BuildEnv) (operators.Step, error) {
		tb := env.Tables[table]
		if tb == nil {
			return nil, fmt.Errorf("join step %d: table %q is not available", spec.Index, table)
		}
		return operators.NewJoin(tb, on, as, missing), nil
	}
	// The table's definition as written (not its content, not its absolute
	// path): a table edit or a moved rules directory keeps downstream state.
	return fmt.Sprintf("table=%s {%s} on=%s as=%s missing=%s", table, l.tableDefs[table], canonical(on.Source), as, missingText)
}

func (l *loader) dedupStep(kv *keyVal, sc *scope, spec *StepSpec) string {
	if !l.mapping(kv, "drop_duplicates", "`drop_duplicates: { key: value.txn_id, ttl: 1h }`") {
		return ""
	}
	f := l.fields(kv.val, dedupKeys, "drop_duplicates")
	k := f["key"]
	if k == nil {
		l.errAt(kv.key, "drop_duplicates", "drop_duplicates needs `key`: the expression that identifies a duplicate, e.g. `key: value.txn_id`")
		return ""
	}
	var ttl time.Duration
	if t := f["ttl"]; t != nil {
		d, ok := l.duration(t, "drop_duplicates.ttl", false)
		if !ok {
			return ""
		}
		ttl = d
	}
	key := l.expr(k, "drop_duplicates.key", sc, exprAny)
	if key == nil {
		return ""
	}
	spec.Build = func(env BuildEnv) (operators.Step, error) {
		return operators.NewDropDuplicates(key, ttl, env.KV), nil
	}
	return fmt.Sprintf("key=%s ttl=%s", canonical(key.Source), ttl)
}

func (l *loader) windowStep(kv *keyVal, sc *scope, spec *StepSpec) string {
	if !l.mapping(kv, "window", "`window: { kind: tumbling, size: 1m, key: value.user_id, aggregate: { n: count() } }`") {
		return ""
	}
	f := l.fields(kv.val, windowKeys, "window")
	ws := operators.WindowSpec{}
	ok := true
	// refused: the keys refused while parsing (missing where required, or
	// not a kind or a duration), whose values ValidateWindow then sees as
	// empty. Its problems with them are already reported.
	refused := map[string]bool{}
	if k := f["kind"]; k == nil {
		l.errAt(kv.key, "window", "window needs `kind`: tumbling or sliding")
		refused["kind"] = true
	} else if s, good := l.oneOf(k, "window.kind", operators.WindowKinds...); good {
		ws.Kind = s
	} else {
		refused["kind"] = true
	}
	if s := f["size"]; s == nil {
		l.errAt(kv.key, "window", "window needs `size`: how long each window is, e.g. `size: 5m`")
		refused["size"] = true
	} else if d, good := l.duration(s, "window.size", false); good {
		ws.Size = d
	} else {
		refused["size"] = true
	}
	slide := f["slide"]
	if slide != nil {
		if d, good := l.duration(slide, "window.slide", false); good {
			ws.Slide = d
		} else {
			refused["slide"] = true
		}
	}
	// The values are checked by operators.ValidateWindow, the check the
	// step runs itself: what passes here cannot fail it at run time.
	var problems operators.WindowErrors
	errors.As(operators.ValidateWindow(ws.Kind, ws.Size, ws.Slide), &problems)
	for _, p := range problems {
		ok = false
		if refused[p.Key] {
			continue
		}
		if x := f[p.Key]; x != nil {
			l.errAt(x.val, x.val.Value, "%s", p.Rule)
		} else {
			l.errAt(kv.key, "window", "%s", p.Rule)
		}
	}
	if len(refused) > 0 {
		ok = false
	}
	// Which keys a kind takes is the rule file's business: the step
	// ignores a tumbling window's slide, a rule file may not write one.
	if ok && ws.Kind == "tumbling" && slide != nil {
		l.errAt(slide.key, "slide", "`slide` only applies to sliding windows; remove it or use `kind: sliding`")
		ok = false
	}
	emit := DefaultWindowEmit
	if e := f["emit"]; e != nil {
		if s, good := l.oneOf(e, "window.emit", "on_close", "on_update"); good {
			emit = s
		} else {
			ok = false
		}
	}
	ws.EmitOnUpdate = emit == "on_update"
	keySrc := `""`
	if k := f["key"]; k != nil {
		ws.Key = l.expr(k, "window.key", sc, exprAny)
		if ws.Key == nil {
			ok = false
		} else {
			keySrc = ws.Key.Source
		}
	}
	// No key: one window for the whole stream (operators.WindowSpec, Key nil).
	a := f["aggregate"]
	if a == nil {
		l.errAt(kv.key, "window", "window needs `aggregate`: the values each window computes, e.g. `aggregate: { n: count(), total: sum(value.amount) }`")
		return ""
	}
	if !l.mapping(a, "window.aggregate", "`aggregate: { n: count(), total: sum(value.amount) }`") {
		return ""
	}
	var def strings.Builder
	fmt.Fprintf(&def, "kind=%s size=%s slide=%s key=%s emit=%s", ws.Kind, ws.Size, ws.Slide, canonical(keySrc), emit)
	rowFields := []string{"key", "window_start", "window_end"}
	for i := 0; i+1 < len(a.val.Content); i += 2 {
		nk, nv := resolve(a.val.Content[i]), resolve(a.val.Content[i+1])
		if nk.Kind != yaml.ScalarNode || nk.Value == "" {
			l.errAt(nk, "", "an aggregate needs a plain name")
			ok = false
			continue
		}
		if contains(rowFields, nk.Value) {
			what := "written twice"
			if contains([]string{"key", "window_start", "window_end"}, nk.Value) {
				what = "a field every window row has"
			}
			l.errAt(nk, nk.Value, "aggregate name `%s` is %s; choose another name", nk.Value, what)
			ok = false
			continue
		}
		agg, good := l.aggregate(nk, nv, sc)
		if !good {
			ok = false
			continue
		}
		rowFields = append(rowFields, nk.Value)
		ws.Aggregates = append(ws.Aggregates, agg)
		arg := ""
		if agg.Arg != nil {
			arg = canonical(agg.Arg.Source)
		}
		fmt.Fprintf(&def, "\x00%s=%s(%s)", agg.Name, agg.Func, arg)
	}
	if !ok {
		return ""
	}
	// Steps after a window see its rows: exactly these fields, and no join
	// names (a row is not any one record).
	sc.shape = shape{known: true, fields: rowFields, origin: fmt.Sprintf("the window at line %d", kv.key.Line)}
	sc.bound = nil
	spec.Build = func(BuildEnv) (operators.Step, error) { return operators.NewWindow(ws), nil }
	return def.String()
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
	agg.Arg = arg
	return agg, true
}
