// Package yamlpos locates yaml.v3 syntax errors in their source. yaml.v3
// reports a syntax error with a line only, counted from 1 by its scanner
// and from 0 by its parser (the line of the construct being parsed), and
// no column. Rule files (`rtproxy check`, `run`) and test files (`rtproxy
// test`) report one position for one mistake through Locate.
package yamlpos

import (
	"regexp"
	"strconv"
	"strings"
)

// parserProblems are the messages of yaml.v3's parser (as opposed to its
// scanner), whose line numbers are 0-based.
var parserProblems = []string{
	"did not find expected ',' or ']'",
	"did not find expected ',' or '}'",
	"did not find expected '-' indicator",
	"did not find expected <document start>",
	"did not find expected <stream-start>",
	"did not find expected key",
	"did not find expected node content",
	"found duplicate %TAG directive",
	"found duplicate %YAML directive",
	"found incompatible YAML document",
	"found undefined tag handle",
}

var lineRe = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// Syntax is a syntax error placed in its source.
type Syntax struct {
	Line, Col int    // 1-based; Col counts characters
	Msg       string // yaml's message without its "yaml: line N: " prefix
	Text      string // the source line (without its line break), "" past the end
}

// Locate places err, a syntax error of yaml.v3 decoding src. Lines are
// counted as YAML counts them (a "\r\n", "\r" or "\n" ends one). The line is yaml's, made 1-based for parser
// errors (at least 1); the column is that of the first non-blank character
// of the line; for "mapping values are not allowed", of the colon that is
// not allowed; for a character that cannot start a token, of the first
// tab of the indentation.
func Locate(err error, src []byte) Syntax {
	lines := Lines(src)
	msg := err.Error()
	line := 0
	if m := lineRe.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	// A missing line (the error is at the end of the input) is line 0 too.
	for _, p := range parserProblems {
		if strings.HasPrefix(msg, p) {
			line++
			break
		}
	}
	if line == 0 {
		line = 1
	}
	if line > len(lines) && len(lines) > 0 {
		line = len(lines)
	}
	s := Syntax{Line: line, Msg: msg}
	if line <= len(lines) {
		text := lines[line-1]
		s.Text = text
		s.Col = len([]rune(text)) - len([]rune(strings.TrimLeft(text, " \t"))) + 1
		if strings.Contains(msg, "cannot start any token") {
			// A tab in the indentation is the character (yaml says no more).
			indent := text[:len(text)-len(strings.TrimLeft(text, " \t"))]
			if i := strings.IndexByte(indent, '\t'); i >= 0 {
				s.Col = i + 1
			}
		}
		if strings.Contains(msg, "mapping values are not allowed") {
			// The first ": " ends the key; the second is the offending one.
			if i := strings.Index(text, ": "); i >= 0 {
				if j := strings.Index(text[i+2:], ":"); j >= 0 {
					s.Col = len([]rune(text[:i+2+j])) + 1
				}
			}
		}
	}
	return s
}

// Lines splits src into lines as YAML counts them: "\r\n", "\r" and "\n"
// each end one. The last line is what follows the last break ("" after a
// final break).
func Lines(src []byte) []string {
	var out []string
	start := 0
	for i := 0; i < len(src); i++ {
		switch src[i] {
		case '\n':
			out = append(out, string(src[start:i]))
			start = i + 1
		case '\r':
			out = append(out, string(src[start:i]))
			if i+1 < len(src) && src[i+1] == '\n' {
				i++
			}
			start = i + 1
		}
	}
	return append(out, string(src[start:]))
}
