package yamlpos

import (
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestLocate: yaml.v3's scanner (1-based) and parser (0-based) lines both
// come out 1-based at the line of the mistake.
func TestLocate(t *testing.T) {
	for _, c := range []struct {
		src       string
		line, col int
	}{
		{"a: 1\nb: { c: 2\nd: 3\n", 2, 1},   // parser: flow mapping left open
		{"a:\n  - [1, 2\n  - 3\n", 2, 3},    // parser: flow sequence left open
		{"a: 1\nb: c: d\n", 2, 5},           // scanner: the second colon
		{"a:\n\t- 1\n", 2, 1},               // scanner: the tab
		{"a: 'open\n", 2, 1},                // scanner at the end of the input
		{"a: 1\n- b\n", 2, 1},               // parser: a sequence in a mapping
		{"a: [1,\n  2,\n  3\nb: 1\n", 4, 1}, // parser: where the missing comma is noticed
	} {
		var v yaml.Node
		err := yaml.Unmarshal([]byte(c.src), &v)
		if err == nil {
			t.Fatalf("%q parsed", c.src)
		}
		s := Locate(err, []byte(c.src))
		if s.Line != c.line || s.Col != c.col {
			t.Errorf("%q: %v at %d:%d, want %d:%d", c.src, err, s.Line, s.Col, c.line, c.col)
		}
		if strings.HasPrefix(s.Msg, "yaml:") || strings.HasPrefix(s.Msg, "line ") {
			t.Errorf("%q: message keeps yaml's prefix: %q", c.src, s.Msg)
		}
	}
}

// FuzzLocate: any YAML error of any input is placed inside the input (or
// at 1:x for an empty one), without a panic.
func FuzzLocate(f *testing.F) {
	for _, s := range []string{"a: {b: 1\n", "a:\n\t- 1\n", "a: b: c\n", "- [\n", "\xff: 1", "a: 'x", "%TAG ! x\n%TAG ! y\n---\na"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		var v yaml.Node
		err := yaml.Unmarshal([]byte(src), &v)
		if err == nil {
			return
		}
		lines := Lines([]byte(src))
		s := Locate(err, []byte(src))
		if s.Line < 1 || s.Line > len(lines) {
			t.Fatalf("%q: line %d of %d", src, s.Line, len(lines))
		}
		if s.Line <= len(lines) && (s.Col < 1 || s.Col > len([]rune(lines[s.Line-1]))+1) {
			t.Fatalf("%q: col %d of line %q", src, s.Col, lines[s.Line-1])
		}
	})
}
