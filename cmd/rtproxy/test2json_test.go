package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

// gotestsumVersion is the gotestsum that reads `rtproxy test --format json`
// as the consumer of go test -json it is; .ci/deps.sh fetches the same
// version through the Go module proxy.
const gotestsumVersion = "gotest.tools/gotestsum@v1.13.0"

// test2jsonEvent is cmd/test2json's TestEvent, field for field.
type test2jsonEvent struct {
	Time        *time.Time `json:",omitempty"`
	Action      string
	Package     string   `json:",omitempty"`
	Test        string   `json:",omitempty"`
	Elapsed     *float64 `json:",omitempty"`
	Output      *string  `json:",omitempty"`
	FailedBuild string   `json:",omitempty"`
}

func ruleTestProject(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range map[string]string{
		"rules/big.yaml": "route: big\nsource: { topic: orders }\nsink: { topic: orders.big }\nsteps:\n  - filter: value.amount > 100\n",
		"rules/big.test.yaml": "tests:\n  - name: keeps big\n    input:\n      - { value: { amount: 500 } }\n    expect:\n      sink:\n        - { value: { amount: 500 } }\n" +
			"  - name: wrong on purpose\n    input:\n      - { value: { amount: 5 } }\n    expect:\n      sink:\n        - { value: { amount: 5 } }\n",
		"rules/plain.yaml": "route: plain\nsource: { topic: a }\nsink: { topic: b }\n",
		"empty/README":     "no tests here\n",
	} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestRuleTestJSONIsTest2JSON: `rtproxy test --format json` is the event
// stream of go test -json: each line decodes as test2json's TestEvent with
// no other field; every package (test file) starts with a start event;
// Output is on output events only, Elapsed on pass, fail and skip only; and
// the Output fields concatenated are exactly the -v text report.
func TestRuleTestJSONIsTest2JSON(t *testing.T) {
	dir := ruleTestProject(t)
	args := []string{"test", "--format", "json", "rules/", "empty", "rules/plain.yaml"}
	code, out := runIn(t, dir, args...)
	if code != 1 {
		t.Fatalf("exit %d, want 1 (a test fails):\n%s", code, out)
	}
	started := map[string]bool{}
	var concat strings.Builder
	final := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var e test2jsonEvent
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil {
			t.Fatalf("not a test2json event: %q: %v", sc.Text(), err)
		}
		if e.Time == nil || e.Package == "" {
			t.Errorf("no Time or Package: %s", sc.Text())
		}
		switch e.Action {
		case "start":
			if started[e.Package] || e.Test != "" {
				t.Errorf("start twice, or for a test: %s", sc.Text())
			}
			started[e.Package] = true
		case "run", "pass", "fail", "skip", "output":
		default:
			t.Errorf("action %q is not one of test2json's: %s", e.Action, sc.Text())
		}
		if !started[e.Package] {
			t.Errorf("an event before its package's start: %s", sc.Text())
		}
		if (e.Output != nil) != (e.Action == "output") {
			t.Errorf("Output on a %s event, or an output event without it: %s", e.Action, sc.Text())
		}
		isEnd := e.Action == "pass" || e.Action == "fail" || e.Action == "skip"
		if (e.Elapsed != nil) != isEnd {
			t.Errorf("Elapsed on a %s event, or a pass/fail/skip without it: %s", e.Action, sc.Text())
		}
		if e.Output != nil {
			concat.WriteString(*e.Output)
		}
		if isEnd {
			final[e.Package+"|"+e.Test] = e.Action
		}
	}
	for k, want := range map[string]string{
		"rules/big.test.yaml|big":                  "fail",
		"rules/big.test.yaml|big/keeps big":        "pass",
		"rules/big.test.yaml|big/wrong on purpose": "fail",
		"rules/big.test.yaml|":                     "fail",
		"empty|":                                   "skip",
		"rules/plain.yaml|":                        "skip",
	} {
		if final[k] != want {
			t.Errorf("%s ended %q, want %q (all: %v)", k, final[k], want, final)
		}
	}
	// The output events are the -v report, timings aside.
	_, text := runIn(t, dir, append([]string{"test", "-v"}, args[3:]...)...)
	times := regexp.MustCompile(`[0-9]+\.[0-9]+s`)
	if a, b := times.ReplaceAllString(concat.String(), "T"), times.ReplaceAllString(text, "T"); a != b {
		t.Errorf("the output events concatenated:\n%s\nare not the -v report:\n%s", a, b)
	}
}

// TestRuleTestJSONWithGotestsum feeds `rtproxy test --format json` to
// gotestsum, a consumer of go test -json, with --raw-command: it must see
// the route as the parent test and the file's two tests as its subtests,
// one passed and one failed, report the failure with its explanation, and
// write them to its JUnit file.
func TestRuleTestJSONWithGotestsum(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	ver := exec.Command(goBin, "run", gotestsumVersion, "--version")
	ver.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	if b, err := ver.CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("gotestsum does not run (.ci/deps.sh fetches %s): %v\n%s", gotestsumVersion, err, b)
		}
		t.Skipf("gotestsum not available (%v): %s", err, b)
	}
	dir := ruleTestProject(t)
	bin := rtproxyBinary(t)
	junit := filepath.Join(t.TempDir(), "junit.xml")
	cmd := exec.Command(goBin, "run", gotestsumVersion, "--format", "standard-verbose", "--junitfile", junit,
		"--raw-command", "--", bin, "test", "--format", "json", "rules/")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	cmd.SysProcAttr = testkit.ChildAttr()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("gotestsum: %v, want exit 1 (one test fails)\n%s", err, out.String())
	}
	for _, want := range []string{
		"=== RUN   big/keeps big", "--- PASS: big/keeps big",
		"--- FAIL: big/wrong on purpose", "sink record 1 was expected but not written",
		"--- FAIL: big (", "DONE 3 tests, 2 failures",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("gotestsum's report lacks %q:\n%s", want, out.String())
		}
	}
	b, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var suites struct {
		Suites []struct {
			Name     string `xml:"name,attr"`
			Tests    int    `xml:"tests,attr"`
			Failures int    `xml:"failures,attr"`
			Cases    []struct {
				Name    string    `xml:"name,attr"`
				Failure *struct{} `xml:"failure"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(b, &suites); err != nil {
		t.Fatalf("junit: %v\n%s", err, b)
	}
	var got []string
	for _, s := range suites.Suites {
		if s.Name != "rules/big.test.yaml" || s.Tests != 3 || s.Failures != 2 {
			t.Errorf("suite %s: %d tests, %d failures; want rules/big.test.yaml, 3, 2", s.Name, s.Tests, s.Failures)
		}
		for _, c := range s.Cases {
			got = append(got, c.Name+map[bool]string{true: " FAIL", false: " ok"}[c.Failure != nil])
		}
	}
	sort.Strings(got)
	if strings.Join(got, ",") != "big FAIL,big/keeps big ok,big/wrong on purpose FAIL" {
		t.Errorf("junit cases %v\n%s", got, b)
	}
}
