package rules

import (
	"fmt"
	"sort"
	"strings"
)

// Error is one refusal of the analyzer (or a YAML syntax error), located in
// a rule file. Line and Col are 1-based; Col is 0 when only the line is
// known. Text is the offending text as written (may be empty).
type Error struct {
	File string
	Line int
	Col  int
	Text string
	Msg  string
}

// Error formats as "file:line:col: msg (near `text`)", the form editors and
// CI annotators understand.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Col > 0 {
			fmt.Fprintf(&b, ":%d", e.Col)
		}
	}
	b.WriteString(": ")
	b.WriteString(e.Msg)
	if e.Text != "" {
		b.WriteString(" (near `")
		b.WriteString(e.Text)
		b.WriteString("`)")
	}
	return b.String()
}

// ErrorList is every refusal found in one file (or one directory), in
// file, line and column order. LoadFile returns it when there is more than
// one error.
type ErrorList []*Error

// Error joins the errors one per line.
func (l ErrorList) Error() string {
	parts := make([]string, len(l))
	for i, e := range l {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "\n")
}

// Unwrap exposes the single errors to errors.Is / errors.As.
func (l ErrorList) Unwrap() []error {
	out := make([]error, len(l))
	for i, e := range l {
		out[i] = e
	}
	return out
}

func (l ErrorList) sort() {
	sort.SliceStable(l, func(i, j int) bool {
		a, b := l[i], l[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Col < b.Col
	})
}

// asError turns a list into the error LoadFile returns: nil, the single
// *Error, or the ErrorList.
func (l ErrorList) asError() error {
	switch len(l) {
	case 0:
		return nil
	case 1:
		return l[0]
	}
	l.sort()
	return l
}

// shorten keeps error text on one line and short enough to read.
func shorten(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = strings.TrimSpace(s[:i]) + " …"
	}
	const max = 60
	if r := []rune(s); len(r) > max {
		s = string(r[:max]) + "…"
	}
	return s
}

// closest returns the candidate nearest to s by edit distance, or "" when
// none is close enough to be a plausible typo.
func closest(s string, candidates []string) string {
	best, bestD := "", -1
	for _, c := range candidates {
		d := editDistance(strings.ToLower(s), c)
		if bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	limit := len(s) / 2
	if limit < 2 {
		limit = 2
	}
	if bestD < 0 || bestD > limit {
		return ""
	}
	return best
}

// editDistance is the Damerau (optimal string alignment) distance, so a
// swapped pair like `fliter` is one edit from `filter`.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}
