package pipeline

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtproxy/rtproxy/rules"
)

// Rule errors show next to the route of their file, or on their own for a
// file that never compiled, and clear with the next call.
func TestStatusRuleErrors(t *testing.T) {
	m, err := New(testConfig(Config{Seeds: []string{"127.0.0.1:1"}, StateDir: t.TempDir(), Registerer: prometheus.NewRegistry()}))
	if err != nil {
		t.Fatal(err)
	}
	defer m.closeState()
	d := newRouteDef("pay", "h", "in", "out")
	m.Apply([]*rules.Route{d}) // before Run: desired, not started
	m.mu.Lock()
	m.mu.stopped[d.Name] = d // as after a delete
	m.mu.Unlock()
	m.SetRuleErrors([]error{
		&rules.Error{File: d.File, Line: 3, Col: 5, Msg: "unknown step fliter"},
		fmt.Errorf("wrapped: %w", rules.ErrorList{{File: "/rules/new.yaml", Line: 1, Col: 1, Msg: "bad"}}),
		errors.New("no file"),
	})
	b, _ := json.Marshal(m.Status())
	var st []RouteStatus
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if len(st) != 3 {
		t.Fatalf("status has %d entries, want 3 (route, new.yaml, file-less error): %s", len(st), b)
	}
	byFile := map[string]RouteStatus{}
	for _, s := range st {
		byFile[s.File] = s
	}
	if s := byFile[d.File]; s.Name != "pay" || s.State != "stopped" || !strings.Contains(s.RuleError, "unknown step fliter") {
		t.Errorf("route entry: %+v", s)
	}
	if s := byFile["/rules/new.yaml"]; s.State != "error" || !strings.Contains(s.RuleError, "bad") {
		t.Errorf("new.yaml entry: %+v", s)
	}
	m.SetRuleErrors(nil)
	for _, s := range m.Routes() {
		if s.RuleError != "" {
			t.Errorf("rule error not cleared: %+v", s)
		}
	}
}
