package pipeline

// Error text without record values. An expression's runtime error carries
// the values it failed on (`invalid operation: int(4111-1111-1111-1111 CVV
// 123)`), and so do decode errors and panics. The dead-letter record keeps
// the full text in its rtproxy-error header: it goes to the dead-letter
// topic, which is data. Everything shown to people (the status page,
// /routes, the logs) gets the text of shownError instead, unless
// admin.show_records (Config.RecentValues) says record contents may be
// shown.

import (
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/rtproxy/rtproxy/operators"
)

// hiddenMark replaces what was taken out of an error text.
const hiddenMark = "‹hidden›"

// hiddenNote ends an error text that had record values taken out.
const hiddenNote = " (record values hidden: admin.show_records is off)"

// Bounds of the scrub: it runs on the dead-letter path, so its work per
// record is bounded whatever the record holds.
const (
	scrubMaxLeaves   = 2048
	scrubMinLeaf     = 3    // shorter values are not searched for (they match words)
	scrubMaxLeafLen  = 4096 // a longer value is searched for by its first bytes
	scrubMaxTextSize = 4096 // error text beyond this is cut before the scrub
)

// shownError is err as people may see it (the status page, /routes, the
// logs): the full text with admin.show_records, else without the values of
// rec (nil: none known) and without the message of any expression error in
// it (the part that renders values).
func (r *route) shownError(err error, rec *operators.Record) string {
	if err == nil {
		return ""
	}
	return r.shownText(err.Error(), rec)
}

// shownText is shownError of a text.
func (r *route) shownText(s string, rec *operators.Record) string {
	if r.m.cfg.RecentValues {
		return s
	}
	return scrubText(s, recordLeaves(rec))
}

// exprErrRe finds the position and snippet expr appends to a runtime
// error: "MESSAGE (LINE:COL)\n | SOURCE LINE\n | ...^".
var exprErrRe = regexp.MustCompile(` \((\d+):(\d+)\)\n \| ([^\n]*)\n \| \.*\^`)

// scrubText takes record values out of an error text: the message of
// every expression error in it is cut before its first value-like part
// (a quote, bracket, parenthesis or digit), and every leaf (a value of the
// record) is replaced wherever it occurs.
func scrubText(s string, leaves []string) string {
	if len(s) > scrubMaxTextSize {
		s = clip([]byte(s), scrubMaxTextSize) + "…"
	}
	changed := false
	var b strings.Builder
	rest := s
	for {
		loc := exprErrRe.FindStringSubmatchIndex(rest)
		if loc == nil {
			break
		}
		head := rest[:loc[0]]
		src := rest[loc[6]:loc[7]]
		// The message starts after "SOURCE: " (operators.Expr prefixes
		// its source), else at the start of its line.
		start := strings.LastIndex(head, strings.TrimSpace(src)+": ")
		if start >= 0 {
			start += len(strings.TrimSpace(src)) + 2
		} else {
			start = strings.LastIndexByte(head, '\n') + 1
		}
		msg := head[start:]
		cut := cutMessage(msg)
		if cut != msg {
			changed = true
		}
		b.WriteString(head[:start])
		b.WriteString(cut)
		b.WriteString(rest[loc[0]:loc[1]])
		rest = rest[loc[1]:]
	}
	b.WriteString(rest)
	out := b.String()
	if len(leaves) > 0 {
		for _, l := range leaves {
			if strings.Contains(out, l) {
				out = strings.ReplaceAll(out, l, hiddenMark)
				changed = true
			}
		}
	}
	if changed {
		out += hiddenNote
	}
	return out
}

// cutMessage keeps the words of an expression error message up to its
// first value-like part: `invalid operation: int(4111…)` becomes
// `invalid operation: int(‹hidden›)`.
func cutMessage(m string) string {
	i := strings.IndexAny(m, "\"'`([{<0123456789")
	if i < 0 {
		return m
	}
	out := m[:i]
	switch m[i] {
	case '(':
		return out + "(" + hiddenMark + ")"
	case '[':
		return out + "[" + hiddenMark + "]"
	case '{':
		return out + "{" + hiddenMark + "}"
	}
	return out + hiddenMark
}

// recordLeaves are the values of rec worth searching an error text for:
// its key, header values, and every string and number of its decoded
// value (or, not decoded, the words of its raw bytes), longest first.
func recordLeaves(rec *operators.Record) []string {
	if rec == nil {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	add := func(s string) {
		if len(s) < scrubMinLeaf || len(out) >= scrubMaxLeaves {
			return
		}
		if len(s) > scrubMaxLeafLen {
			s = s[:scrubMaxLeafLen]
		}
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	addWords := func(b []byte) {
		add(string(b))
		for _, w := range strings.FieldsFunc(string(b[:min(len(b), 64<<10)]), func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' || r == '@' || r == '+' || r >= 0x80)
		}) {
			add(w)
		}
	}
	add(string(rec.Key))
	for _, h := range rec.Headers {
		add(string(h.Value))
	}
	if rec.Value != nil {
		var walk func(v any, depth int)
		walk = func(v any, depth int) {
			if depth > 64 || len(out) >= scrubMaxLeaves {
				return
			}
			switch x := v.(type) {
			case string:
				add(x)
			case float64:
				add(strconv.FormatFloat(x, 'f', -1, 64))
				add(strconv.FormatFloat(x, 'g', -1, 64))
			case int64:
				add(strconv.FormatInt(x, 10))
			case int:
				add(strconv.Itoa(x))
			case []byte:
				add(string(x))
			case map[string]any:
				for _, e := range x {
					walk(e, depth+1)
				}
			case []any:
				for _, e := range x {
					walk(e, depth+1)
				}
			}
		}
		walk(rec.Value, 0)
	}
	if rec.Value == nil && rec.Raw != nil {
		// Not decoded (a decode error, a raw route): its words. A decoded
		// value's words would include its field names, which the rules
		// name too.
		addWords(rec.Raw)
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}
