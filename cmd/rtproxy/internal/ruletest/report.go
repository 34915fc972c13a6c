package ruletest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/rtproxy/rtproxy/rules"
)

// Options are the flags of `rtproxy test`.
type Options struct {
	Verbose bool           // print every test, as go test -v
	JSON    bool           // go test -json style events, one per line
	Run     *regexp.Regexp // run only tests whose route/name matches
	Rules   rules.Options  // what the loader needs (tables_dir)
}

// Exit codes of `rtproxy test`.
const (
	ExitPass      = 0
	ExitFail      = 1
	ExitMalformed = 2
)

// event is one line of --format json, shaped exactly as `go test -json`
// (cmd/test2json's TestEvent) writes it: Package is the test file; Test is
// route/test, absent for the file's own events; Elapsed only on pass, fail
// and skip; Output only on output events. As with go test -json, the
// Output fields of all output events, concatenated, are the report that
// `rtproxy test -v` prints.
type event struct {
	Time    time.Time `json:"Time"`
	Action  string    `json:"Action"`
	Package string    `json:"Package,omitempty"`
	Test    string    `json:"Test,omitempty"`
	Elapsed *float64  `json:"Elapsed,omitempty"`
	Output  *string   `json:"Output,omitempty"`
}

type reporter struct {
	w    io.Writer
	o    Options
	enc  *json.Encoder
	file string
}

// emit reports action (start, run, pass, fail, skip, or output alone) of
// test ("" for the file) with the text output that goes with it. In JSON
// the output is an output event of its own, before the action's event, as
// test2json writes a test's "--- PASS" line before its pass event.
func (r *reporter) emit(action, test, output string, elapsed *time.Duration) {
	if !r.o.JSON {
		io.WriteString(r.w, output)
		return
	}
	now := time.Now()
	if action == "run" || action == "start" {
		// run and start come before the output they announce.
		r.enc.Encode(event{Time: now, Action: action, Package: r.file, Test: test})
		action = "output"
	}
	if output != "" {
		out := output
		r.enc.Encode(event{Time: now, Action: "output", Package: r.file, Test: test, Output: &out})
	}
	if action == "output" {
		return
	}
	e := event{Time: now, Action: action, Package: r.file, Test: test}
	var s float64
	if elapsed != nil {
		s = elapsed.Seconds()
	}
	e.Elapsed = &s // test2json sets it on every pass, fail and skip
	r.enc.Encode(e)
}

// failFile reports a path that cannot be read: in JSON, a package of its
// own that starts and fails.
func (r *reporter) failFile(path, output string) {
	r.file = path
	r.emit("start", "", "", nil)
	var zero time.Duration
	r.emit("fail", "", output, &zero)
}

// skipFile reports a path that has no tests to run: in JSON, a package of
// its own that starts and is skipped, as go test -json reports a package
// with no test files.
func (r *reporter) skipFile(path, output string) {
	r.file = path
	r.emit("start", "", "", nil)
	var zero time.Duration
	r.emit("skip", "", output, &zero)
}

// Main runs the tests of every path (test files, rule files whose test file
// is beside them, directories) and writes the report to w. It returns the
// exit code: 0 when every test passed, 1 when one failed, 2 when a test
// file is malformed or a path cannot be read.
func Main(w io.Writer, paths []string, o Options) int {
	rep := &reporter{w: w, o: o, enc: json.NewEncoder(w)}
	files, code := testFiles(rep, paths)
	if len(files) == 0 && code == ExitPass && !o.JSON {
		// (In JSON every path was already reported skipped.)
		rep.emit("output", "", "no test files (*.test.yaml) found\n", nil)
	}
	for _, tf := range files {
		if c := runFile(rep, tf); c > code {
			code = c
		}
	}
	return code
}

// testFiles expands paths into test files, sorted and without repeats.
func testFiles(rep *reporter, paths []string) ([]string, int) {
	code := ExitPass
	seen := map[string]bool{}
	var out []string
	add := func(p string) {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			rep.failFile(p, fmt.Sprintf("%s: %v\n", p, err))
			code = ExitMalformed
			continue
		}
		switch {
		case fi.IsDir():
			entries, err := os.ReadDir(p)
			if err != nil {
				rep.failFile(p, fmt.Sprintf("%s: %v\n", p, err))
				code = ExitMalformed
				continue
			}
			n := 0
			for _, e := range entries {
				if !e.IsDir() && !strings.HasPrefix(e.Name(), ".") && IsTestFile(e.Name()) {
					add(filepath.Join(p, e.Name()))
					n++
				}
			}
			if n == 0 {
				rep.skipFile(p, fmt.Sprintf("?   \t%s\t[no test files]\n", p))
			}
		case IsTestFile(p):
			add(p)
		default:
			// A rule file: its tests are beside it.
			base := strings.TrimSuffix(p, filepath.Ext(p))
			found := false
			for _, ext := range []string{Suffix, ".test.yml"} {
				if _, err := os.Stat(base + ext); err == nil {
					add(base + ext)
					found = true
				}
			}
			if !found {
				rep.skipFile(p, fmt.Sprintf("?   \t%s\t[no test file %s]\n", p, filepath.Base(base)+Suffix))
			}
		}
	}
	sort.Strings(out)
	return out, code
}

func ruleKind(r *rules.Route) string {
	if r.View != nil {
		return "view"
	}
	return "route"
}

// runFile runs one test file's tests.
func runFile(rep *reporter, path string) int {
	rep.file = path
	start := time.Now()
	rep.emit("start", "", "", nil)
	f, err := Load(path)
	if err != nil {
		rep.emit("output", "", err.Error()+"\n", nil)
		el := time.Since(start)
		rep.emit("fail", "", fmt.Sprintf("FAIL\t%s\t[malformed test file]\n", path), &el)
		return ExitMalformed
	}
	rulePath := RuleFileFor(path)
	def, err := rules.LoadFileWith(rulePath, rep.o.Rules)
	if err == nil && def.Guard != nil {
		err = fmt.Errorf("%s is a guard file; rtproxy test runs routes and views", rulePath)
	}
	if err == nil && f.Route != "" && (f.Route != def.Name || def.View != nil) {
		err = fmt.Errorf("%s: the test file is for route %q, but %s holds %s %q", path, f.Route, rulePath, ruleKind(def), def.Name)
	}
	if err == nil && f.View != "" && (f.View != def.Name || def.View == nil) {
		err = fmt.Errorf("%s: the test file is for view %q, but %s holds %s %q", path, f.View, rulePath, ruleKind(def), def.Name)
	}
	if err != nil {
		rep.emit("output", "", fmt.Sprintf("%s: cannot load the route under test:\n%s\n", path, indent(err.Error())), nil)
		el := time.Since(start)
		rep.emit("fail", "", fmt.Sprintf("FAIL\t%s\t%.3fs\n", path, el.Seconds()), &el)
		return ExitFail
	}
	// The route is the parent test and each test of the file a subtest
	// (route/test), as go test reports TestX and TestX/case: consumers of
	// go test -json expect a subtest's parent to run and end around it.
	parent := def.Name
	var parentStart time.Time
	failed, ran := 0, 0
	for _, t := range f.Tests {
		name := def.Name + "/" + t.Name
		if rep.o.Run != nil && !rep.o.Run.MatchString(name) {
			continue
		}
		if ran == 0 {
			parentStart = time.Now()
			if rep.o.Verbose || rep.o.JSON {
				rep.emit("run", parent, fmt.Sprintf("=== RUN   %s\n", parent), nil)
			}
		}
		ran++
		if rep.o.Verbose || rep.o.JSON {
			rep.emit("run", name, fmt.Sprintf("=== RUN   %s\n", name), nil)
		}
		res := Run(f, t, def)
		var out strings.Builder
		for _, fl := range res.Failures {
			out.WriteString(indent(fl) + "\n")
		}
		if len(res.Failures) > 0 {
			failed++
			rep.emit("output", name, fmt.Sprintf("--- FAIL: %s (%.2fs)\n", name, res.Elapsed.Seconds()), nil)
			rep.emit("output", name, out.String(), nil)
			rep.emit("fail", name, "", &res.Elapsed)
			continue
		}
		if rep.o.Verbose || rep.o.JSON {
			rep.emit("output", name, fmt.Sprintf("--- PASS: %s (%.2fs)\n", name, res.Elapsed.Seconds()), nil)
		}
		rep.emit("pass", name, "", &res.Elapsed)
	}
	if ran > 0 {
		pel := time.Since(parentStart)
		switch {
		case failed > 0:
			rep.emit("fail", parent, fmt.Sprintf("--- FAIL: %s (%.2fs)\n", parent, pel.Seconds()), &pel)
		case rep.o.Verbose || rep.o.JSON:
			rep.emit("pass", parent, fmt.Sprintf("--- PASS: %s (%.2fs)\n", parent, pel.Seconds()), &pel)
		default:
			rep.emit("pass", parent, "", &pel)
		}
	}
	el := time.Since(start)
	switch {
	case failed > 0:
		rep.emit("fail", "", fmt.Sprintf("FAIL\t%s\t%.3fs\n", path, el.Seconds()), &el)
		return ExitFail
	case ran == 0:
		rep.emit("skip", "", fmt.Sprintf("ok  \t%s\t%.3fs [no tests to run]\n", path, el.Seconds()), &el)
	default:
		rep.emit("pass", "", fmt.Sprintf("ok  \t%s\t%.3fs\n", path, el.Seconds()), &el)
	}
	return ExitPass
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}
