package ruletest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func run(t *testing.T, o Options, paths ...string) (int, string) {
	t.Helper()
	var out bytes.Buffer
	code := Main(&out, paths, o)
	return code, out.String()
}

// TestQuickstartExamples runs the tests shipped with the quickstart rules.
func TestQuickstartExamples(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "..", "examples", "quickstart", "rules")
	code, out := run(t, Options{Verbose: true}, dir)
	if code != ExitPass {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, f := range []string{"access-log-errors", "clicks-per-minute", "payments-risk"} {
		if !strings.Contains(out, "ok  \t"+filepath.Join(dir, f+".test.yaml")) {
			t.Errorf("%s.test.yaml did not run:\n%s", f, out)
		}
	}
	if n := strings.Count(out, "--- PASS: "); n < 8 {
		t.Errorf("%d tests passed, want at least 8:\n%s", n, out)
	}
}

const counter = `route: counter
source: { topic: clicks, event_time: value.ts, watermark: 1s, idle_timeout: 5s }
sink: { topic: clicks.out }
steps:
  - filter: value.page != "/health"
  - window: { kind: tumbling, size: 10s, key: value.page, aggregate: { n: count() }, emit: on_close }
`

// TestFailureReport: a wrong expectation fails with the test file's line,
// a field-by-field difference and both records; exit code 1.
func TestFailureReport(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"counter.yaml": counter,
		"counter.test.yaml": `tests:
  - name: counts
    input:
      - value: {page: /a, ts: 1000}
      - value: {page: /a, ts: 2000}
      - value: {page: /health, ts: 2500}
      - advance: {watermark: 10000}
    expect:
      sink:
        - key: /a
          value: {key: /a, n: 3, window_start: 0, window_end: 10000}
  - name: passes
    input:
      - value: {page: /b, ts: 1000}
      - advance: {watermark: 10000}
    expect:
      sink:
        - {key: /b, value: {key: /b, n: 1, window_start: 0, window_end: 10000}, window: {start: 0, end: 10000}}
  - name: unexpected dead letter
    input:
      - value: '{"page": '
    expect:
      sink: []
`})
	code, out := run(t, Options{}, dir)
	if code != ExitFail {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	tf := filepath.Join(dir, "counter.test.yaml")
	for _, want := range []string{
		"--- FAIL: counter/counts",
		tf + ":10: sink record 1 differs:",
		"value.n: want 3, got 2",
		`got:  {key: "/a", value: {"key":"/a","n":2,"window_end":10000,"window_start":0}, window: [1970-01-01T00:00:00Z, 1970-01-01T00:00:10Z), timestamp: 9999}`,
		"--- FAIL: counter/unexpected dead letter",
		"expect.dead_letters is not given, so none are expected, but the route wrote 1:",
		`reason: "decode"`,
		"FAIL\t" + tf,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "counter/passes") {
		t.Errorf("a passing test is reported without -v:\n%s", out)
	}

	// --run picks the passing test only.
	code, out = run(t, Options{Run: regexp.MustCompile("passes$")}, tf)
	if code != ExitPass {
		t.Fatalf("--run passes: exit %d:\n%s", code, out)
	}
}

// TestOrderAny: order: any matches as a set; strict order does not.
func TestOrderAny(t *testing.T) {
	dir := t.TempDir()
	test := func(order string) string {
		return `tests:
  - name: two windows
    input:
      - value: {page: /a, ts: 1000}
      - value: {page: /b, ts: 1000}
      - advance: {watermark: 10000}
    expect:
      order: ` + order + `
      sink:
        - {key: /b}
        - {key: /a}
`
	}
	writeFiles(t, dir, map[string]string{"counter.yaml": counter, "counter.test.yaml": test("any")})
	if code, out := run(t, Options{}, dir); code != ExitPass {
		t.Fatalf("order any: exit %d:\n%s", code, out)
	}
	writeFiles(t, dir, map[string]string{"counter.test.yaml": test("strict")})
	code, out := run(t, Options{}, dir)
	if code != ExitFail || !strings.Contains(out, `key: want "/b", got "/a"`) {
		t.Fatalf("order strict: exit %d:\n%s", code, out)
	}
}

// TestMalformed: a malformed test file is exit 2, with file:line:col.
func TestMalformed(t *testing.T) {
	cases := []struct{ name, body, want string }{
		{"yaml", "tests: [\n", "not valid YAML"},
		{"no tests", "route: counter\n", "no `tests:`"},
		{"unknown key", "tests:\n  - name: x\n    inputs: []\n", `3:5: unknown key "inputs" in a test`},
		{"no expect", "tests:\n  - name: x\n    input: [{value: 1}]\n", "2:5: a test needs `expect`"},
		{"bad advance", "tests:\n  - name: x\n    input: [{advance: {idle: soon}}]\n    expect: {}\n", "advance.idle must be a positive duration"},
		{"both advances", "tests:\n  - name: x\n    input: [{advance: {idle: 1s, watermark: 5}}]\n    expect: {}\n", "advance takes one of"},
		{"bad time", "tests:\n  - name: x\n    input: [{value: 1, timestamp: yesterday}]\n    expect: {}\n", "3:35: timestamp must be epoch milliseconds or an RFC 3339 time"},
		{"no value", "tests:\n  - name: x\n    input: [{key: k}]\n    expect: {}\n", "an input record needs a `value`"},
		{"duplicate name", "tests:\n  - name: x\n    input: [{value: 1}]\n    expect: {}\n  - name: x\n    input: [{value: 1}]\n    expect: {}\n", "already used at line 2"},
		{"bad order", "tests:\n  - name: x\n    input: [{value: 1}]\n    expect: {order: random}\n", "order must be `strict`"},
		{"window in dead letters", "tests:\n  - name: x\n    input: [{value: 1}]\n    expect: {dead_letters: [{window: {start: 0, end: 1}}]}\n", `unknown key "window"`},
		{"partition out of range", "tests:\n  - name: x\n    partitions: 2\n    input: [{value: 1, partition: 2}]\n    expect: {}\n", "partition 2, but the test has partitions: 2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"counter.yaml": counter, "counter.test.yaml": c.body})
			code, out := run(t, Options{}, dir)
			if code != ExitMalformed {
				t.Fatalf("exit %d, want 2:\n%s", code, out)
			}
			if !strings.Contains(out, c.want) || !strings.Contains(out, filepath.Join(dir, "counter.test.yaml")+":") {
				t.Fatalf("the report lacks %q with the file's name:\n%s", c.want, out)
			}
		})
	}
}

// TestRouteProblems: a test of a rule file that does not load, or of
// another route, fails (exit 1) and says why.
func TestRouteProblems(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"broken.yaml":       "route: broken\nsource: {topic: a}\nsink: {topic: b}\nsteps:\n  - fliter: true\n",
		"broken.test.yaml":  "tests:\n  - name: x\n    input: [{value: 1}]\n    expect: {}\n",
		"counter.yaml":      counter,
		"counter.test.yaml": "route: other\ntests:\n  - name: x\n    input: [{value: 1}]\n    expect: {}\n",
	})
	code, out := run(t, Options{}, dir)
	if code != ExitFail {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	for _, want := range []string{"unknown step `fliter`", `the test file is for route "other"`} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
	if code, out := run(t, Options{}, filepath.Join(dir, "missing.test.yaml")); code != ExitMalformed {
		t.Errorf("a missing path: exit %d:\n%s", code, out)
	}
	// A rule file named on the command line runs its test file.
	code, out = run(t, Options{Verbose: true}, filepath.Join(dir, "counter.yaml"))
	if code != ExitFail || !strings.Contains(out, "counter.test.yaml") {
		t.Errorf("a rule file as the path: exit %d:\n%s", code, out)
	}
}

// TestJSONFormat: --format json is one go test -json event per line.
func TestJSONFormat(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"counter.yaml": counter,
		"counter.test.yaml": `tests:
  - name: good
    input: [{value: {page: /a, ts: 1}}]
    expect: {sink: []}
  - name: bad
    input: [{value: {page: /a, ts: 1}}, {advance: {watermark: 10000}}]
    expect: {sink: []}
`})
	code, out := run(t, Options{JSON: true}, dir)
	if code != ExitFail {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	actions := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("not JSON: %q: %v", sc.Text(), err)
		}
		if e.Package != filepath.Join(dir, "counter.test.yaml") {
			t.Errorf("event for package %q", e.Package)
		}
		if e.Action == "pass" || e.Action == "fail" {
			actions[e.Test] = e.Action
			if e.Elapsed == nil {
				t.Errorf("%s %q without Elapsed", e.Action, e.Test)
			}
		}
	}
	want := map[string]string{"counter/good": "pass", "counter/bad": "fail", "": "fail"}
	for k, v := range want {
		if actions[k] != v {
			t.Errorf("%q: %q, want %q (all: %v)", k, actions[k], v, actions)
		}
	}
}

// TestDocsTestFiles runs every test file shown in docs/RULES.md against
// the rule file of the same name shown before it.
func TestDocsTestFiles(t *testing.T) {
	const doc = "../../../../docs/RULES.md"
	src, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	marker := regexp.MustCompile("(?m)^<!-- (rule-file|test-file|file): (\\S+) -->\n```[a-z]*\n")
	dir := t.TempDir()
	ran := 0
	for _, m := range marker.FindAllSubmatchIndex(src, -1) {
		kind, name := string(src[m[2]:m[3]]), string(src[m[4]:m[5]])
		body := string(src[m[1]:])
		body = body[:strings.Index(body, "```")]
		writeFiles(t, dir, map[string]string{name: body})
		if kind != "test-file" {
			continue
		}
		ran++
		if code, out := run(t, Options{Verbose: true}, filepath.Join(dir, name)); code != ExitPass {
			t.Errorf("%s: %s (exit %d):\n%s", doc, name, code, out)
		}
	}
	if ran == 0 {
		t.Fatal("docs/RULES.md shows no test file")
	}
	// The tests of the page's other examples live in testdata/docs, so that
	// the page stays about the rules; each runs against the example of its
	// name.
	extra, _ := filepath.Glob(filepath.Join("testdata", "docs", "*.test.yaml"))
	for _, p := range extra {
		name := filepath.Base(p)
		rule := strings.TrimSuffix(name, Suffix) + ".yaml"
		if _, err := os.Stat(filepath.Join(dir, rule)); err != nil {
			t.Errorf("%s: docs/RULES.md shows no rule file %s", p, rule)
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		writeFiles(t, dir, map[string]string{name: string(b)})
		if code, out := run(t, Options{Verbose: true}, filepath.Join(dir, name)); code != ExitPass {
			t.Errorf("%s (exit %d):\n%s", p, code, out)
		}
	}
}

// FuzzParse: no test file makes the parser panic, and what it accepts has
// tests with names.
func FuzzParse(f *testing.F) {
	seeds, _ := filepath.Glob(filepath.Join("testdata", "*.test.yaml"))
	docs, _ := filepath.Glob(filepath.Join("testdata", "docs", "*.test.yaml"))
	seeds = append(seeds, docs...)
	quick, _ := filepath.Glob(filepath.Join("..", "..", "..", "..", "examples", "quickstart", "rules", "*.test.yaml"))
	for _, p := range append(seeds, quick...) {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := Parse("fuzz.test.yaml", b)
		if err != nil {
			if file != nil {
				t.Fatal("a file and an error")
			}
			return
		}
		for _, tc := range file.Tests {
			if tc.Name == "" {
				t.Fatal("a test without a name was accepted")
			}
		}
	})
}
