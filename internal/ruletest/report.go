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

// event is one line of --format json, in the shape of `go test -json`
// (Package is the test file).
type event struct {
	Time    time.Time `json:"Time"`
	Action  string    `json:"Action"`
	Package string    `json:"Package"`
	Test    string    `json:"Test,omitempty"`
	Elapsed *float64  `json:"Elapsed,omitempty"`
	Output  string    `json:"Output,omitempty"`
}

type reporter struct {
	w    io.Writer
	o    Options
	enc  *json.Encoder
	file string
}

func (r *reporter) emit(action, test, output string, elapsed *time.Duration) {
	if !r.o.JSON {
		io.WriteString(r.w, output)
		return
	}
	e := event{Time: time.Now(), Action: action, Package: r.file, Test: test, Output: output}
	if elapsed != nil {
		s := elapsed.Seconds()
		e.Elapsed = &s
	}
	r.enc.Encode(e)
}

// Main runs the tests of every path (test files, rule files whose test file
// is beside them, directories) and writes the report to w. It returns the
// exit code: 0 when every test passed, 1 when one failed, 2 when a test
// file is malformed or a path cannot be read.
func Main(w io.Writer, paths []string, o Options) int {
	rep := &reporter{w: w, o: o, enc: json.NewEncoder(w)}
	files, code := testFiles(rep, paths)
	if len(files) == 0 && code == ExitPass {
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
			rep.file = p
			rep.emit("output", "", fmt.Sprintf("%s: %v\n", p, err), nil)
			code = ExitMalformed
			continue
		}
		switch {
		case fi.IsDir():
			entries, err := os.ReadDir(p)
			if err != nil {
				rep.file = p
				rep.emit("output", "", fmt.Sprintf("%s: %v\n", p, err), nil)
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
				rep.file = p
				rep.emit("output", "", fmt.Sprintf("?   \t%s\t[no test files]\n", p), nil)
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
				rep.file = p
				rep.emit("output", "", fmt.Sprintf("?   \t%s\t[no test file %s]\n", p, filepath.Base(base)+Suffix), nil)
			}
		}
	}
	sort.Strings(out)
	return out, code
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
		err = fmt.Errorf("%s is a guard file; rtproxy test runs routes", rulePath)
	}
	if err == nil && f.Route != "" && f.Route != def.Name {
		err = fmt.Errorf("%s: the test file is for route %q, but %s holds route %q", path, f.Route, rulePath, def.Name)
	}
	if err != nil {
		rep.emit("output", "", fmt.Sprintf("%s: cannot load the route under test:\n%s\n", path, indent(err.Error())), nil)
		el := time.Since(start)
		rep.emit("fail", "", fmt.Sprintf("FAIL\t%s\t%.3fs\n", path, el.Seconds()), &el)
		return ExitFail
	}
	failed, ran := 0, 0
	for _, t := range f.Tests {
		name := def.Name + "/" + t.Name
		if rep.o.Run != nil && !rep.o.Run.MatchString(name) {
			continue
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
