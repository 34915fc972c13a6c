package ruletest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/rtproxy/rtproxy/rules"
)

// TestSyntaxErrorPositionAsCheck: one YAML mistake is reported at one
// line and column, in a test file by `rtproxy test` and in a rule file by
// `rtproxy check`, and that is where the mistake is written.
func TestSyntaxErrorPositionAsCheck(t *testing.T) {
	cases := []struct {
		name     string
		prefix   string // lines before the broken one (4 of them: it is line 5)
		broken   string
		want     string // line:col
		ruleHead string
	}{
		{"flow mapping left open", "", "  - { value: 2", "5:3", ""},
		{"mapping value not allowed", "", "  - value: a: b", "5:13", ""},
		{"tab indentation", "", "\t- value: 1", "5:1", ""},
		{"flow sequence left open", "", "  - [1, 2", "5:3", ""},
	}
	re := regexp.MustCompile(`:(\d+:\d+): `)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			test := "tests:\n  - name: x\n    input:\n      - { value: 1 }\n" + c.broken + "\n    expect: { sink: [] }\n"
			rule := "route: a\nsource: { topic: in }\nsink: { topic: out }\nsteps:\n" + c.broken + "\n  - filter: true\n"
			if err := os.WriteFile(filepath.Join(dir, "a.test.yaml"), []byte(test), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(rule), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Load(filepath.Join(dir, "a.test.yaml"))
			if err == nil {
				t.Fatal("the broken test file loaded")
			}
			var out bytes.Buffer
			if rules.CheckPaths(&out, []string{filepath.Join(dir, "a.yaml")}) {
				t.Fatal("check passed the broken rule file")
			}
			tm, cm := re.FindStringSubmatch(err.Error()), re.FindStringSubmatch(out.String())
			if tm == nil || cm == nil {
				t.Fatalf("no position: test %q, check %q", err, out.String())
			}
			if tm[1] != c.want || cm[1] != c.want {
				t.Fatalf("test file at %s, rule file at %s; want both at %s\n%s\n%s", tm[1], cm[1], c.want, err, out.String())
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("a.test.yaml:%s: not valid YAML", c.want)) {
				t.Errorf("test file error: %s", err)
			}
		})
	}
}
