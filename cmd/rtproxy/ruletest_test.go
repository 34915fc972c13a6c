package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// TestTestCommand: `rtproxy test` runs the quickstart's tests, and its
// flags and exit codes are what its usage says.
func TestTestCommand(t *testing.T) {
	dir := filepath.Join("..", "..", "examples", "quickstart", "rules")
	var out, errb bytes.Buffer
	if code := realMain([]string{"test", "-v", dir}, &out, &errb); code != 0 {
		t.Fatalf("exit %d:\n%s%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "--- PASS: payments-risk/") {
		t.Errorf("no payments-risk test passed:\n%s", out.String())
	}

	out.Reset()
	if code := realMain([]string{"test", "--format=json", "--run", "bots", dir}, &out, &errb); code != 0 {
		t.Fatalf("json: exit %d:\n%s", code, out.String())
	}
	passed := 0
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var e struct{ Action, Test string }
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("not JSON: %q", l)
		}
		if e.Action == "pass" && strings.Contains(e.Test, "/") { // a test of a route (route/test), not the route
			passed++
			if !strings.Contains(e.Test, "bots") {
				t.Errorf("--run bots ran %q", e.Test)
			}
		}
	}
	if passed != 1 {
		t.Errorf("%d tests passed with --run bots, want 1:\n%s", passed, out.String())
	}

	for _, args := range [][]string{{"test"}, {"test", "--format", "xml", dir}, {"test", "--run", "(", dir}, {"test", "--nope", dir}} {
		errb.Reset()
		if code := realMain(args, &out, &errb); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
		if errb.Len() == 0 {
			t.Errorf("%q: nothing on stderr", args)
		}
	}
}
