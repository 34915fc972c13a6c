package rules

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/rtproxy/rtproxy/operators"
)

// TestSpecExamples loads every step kind's own example through the
// analyzer and builds its steps, so no example the generated reference
// shows can be refused or fail to build.
func TestSpecExamples(t *testing.T) {
	specs := operators.Specs()
	if len(specs) < 7 {
		t.Fatalf("%d step kinds declared", len(specs))
	}
	for _, s := range specs {
		dir := t.TempDir()
		p := filepath.Join(dir, s.ID()+".yaml")
		writeFiles(t, dir, map[string]string{s.ID() + ".yaml": s.Example})
		r, err := LoadFile(p)
		if err != nil {
			t.Errorf("%s: its example is refused:\n%v", s.Kind, err)
			continue
		}
		seen := false
		for _, st := range r.Steps {
			seen = seen || st.Kind == s.Kind
			tables := map[string]operators.Table{}
			for name := range r.Tables {
				tables[name] = operators.NewMapTable()
			}
			if _, err := st.Build(BuildEnv{KV: operators.NewMemKV(), Tables: tables}); err != nil {
				t.Errorf("%s: example step %d (%s) does not build: %v", s.Kind, st.Index, st.Kind, err)
			}
		}
		if !seen {
			t.Errorf("%s: its example has no %s step", s.Kind, s.Kind)
		}
		if s.Summary == "" || s.Usage == "" {
			t.Errorf("%s: no summary or usage", s.Kind)
		}
		keys := s.Keys
		if s.Body != nil {
			keys = []operators.Key{*s.Body}
		}
		for _, k := range keys {
			if k.Doc == "" || k.Type.String() == "" {
				t.Errorf("%s.%s: no doc or unknown type", s.Kind, k.Name)
			}
			if k.Required && s.Body == nil && k.Needs == "" {
				t.Errorf("%s.%s: required, but no Needs text for the message when it is missing", s.Kind, k.Name)
			}
		}
	}
}

// TestExplodeAnalyzer: explode binds its name for the steps after it and
// not before, refuses names that would hide another, and needs both keys.
func TestExplodeAnalyzer(t *testing.T) {
	for _, tc := range []struct {
		name, steps string
		want        []string
	}{
		{"binds for later steps", "  - explode: { each: value.lines, as: line }\n  - map: { sku: line.sku, order: value.id }\n", nil},
		{"not for earlier steps", "  - set: { sku: line.sku }\n  - explode: { each: value.lines, as: line }\n",
			[]string{"r.yaml:7:17: set sku does not compile: unknown name line; an expression sees key, value, headers, timestamp, topic, partition, offset, size (near `line.sku`)"}},
		{"a window after it forgets it", "  - explode: { each: value.lines, as: line }\n  - window: { kind: tumbling, size: 1m, aggregate: { n: count() } }\n  - filter: line != nil\n",
			[]string{"r.yaml:9:13: filter does not compile: unknown name line; an expression sees key, value, headers, timestamp, topic, partition, offset, size (near `line != nil`)"}},
		{"needs each", "  - explode: { as: line }\n",
			[]string{"r.yaml:7:5: explode needs `each`: the expression that gives the list, e.g. `each: value.items` (near `explode`)"}},
		{"needs as", "  - explode: { each: value.lines }\n",
			[]string{"r.yaml:7:5: explode needs `as`: the name each element is bound under, e.g. `as: item` (near `explode`)"}},
		{"as may not hide value", "  - explode: { each: value.lines, as: value }\n",
			[]string{"r.yaml:7:39: explode `as: value` would hide the built-in `value`; choose another name, e.g. `value_row` (near `value`)"}},
		{"as may not repeat a join's name", "  - join: { table: t, on: key, as: line }\n  - explode: { each: value.lines, as: line }\n",
			[]string{"r.yaml:10:39: explode `as: line` is already bound by an earlier step; choose another name (near `line`)"}},
		{"unknown key", "  - explode: { each: value.lines, as: line, into: x }\n",
			[]string{"r.yaml:7:45: unknown field `into` in explode; known fields: each, as (near `into`)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := base
			if strings.Contains(tc.steps, "join") {
				file += "tables:\n  t: { topic: t }\n"
			}
			got := loadErrors(t, map[string]string{"r.yaml": file + "steps:\n" + tc.steps})
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("errors:\n got: %s\nwant: %s", strings.Join(got, "\n      "), strings.Join(tc.want, "\n      "))
			}
		})
	}
}
