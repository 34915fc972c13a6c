package rules

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/rtproxy/rtproxy/operators"
)

// traitVariants are rule files beyond each kind's own example whose keys
// change what the step is: a trait that depends on a key (drop_duplicates
// follows the watermark only with a ttl) is checked both ways.
var traitVariants = map[string][]string{
	"drop_duplicates": {
		"steps:\n  - drop_duplicates: { key: value.id }\n",
		"steps:\n  - drop_duplicates: { key: value.id, ttl: 1m }\n",
	},
	"window": {
		"steps:\n  - window: { kind: tumbling, size: 1m, aggregate: { n: count() } }\n",
		"steps:\n  - window: { kind: sliding, size: 2m, slide: 1m, key: value.k, emit: on_update, aggregate: { n: count() } }\n",
		"steps:\n  - window: { kind: session, gap: 30m, max_duration: 4h, key: value.k, aggregate: { n: count() } }\n",
	},
	"map":     {"steps:\n  - map: { a: value.x }\n"},
	"set":     {"steps:\n  - set: { a: value.x }\n"},
	"filter":  {"steps:\n  - filter: value.x > 1\n"},
	"explode": {"steps:\n  - explode: { each: value.xs, as: x }\n"},
	"drop":    {"steps:\n  - drop: [a, b]\n", "steps:\n  - drop: a\n"},
	"join":    {"tables:\n  t: { topic: t }\nsteps:\n  - join: { table: t, on: key, missing: dead_letter }\n"},
	// A variant that starts with its own `sink:` replaces the default one.
	"switch":      {"sink: { delivery: exactly_once }\nsteps:\n  - switch: [ { when: value.x > 1, sink: { topic: a } }, { sink: { topic: b } } ]\n"},
	"join-stream": {"steps:\n  - join: { stream: { topic: s }, on: key, other: key, within: { after: 1m }, grace: 0s, kind: outer, as: s }\n"},
}

// TestTraitsMatchTheBuiltSteps: for every declared step kind, the traits
// its Compile declares are the interfaces the step it builds implements,
// in its example and in the variants above. The pipeline cuts segments,
// sends watermarks, snapshots and journals by the traits alone, so a step
// whose traits drifted from what it implements would run in the wrong
// place.
func TestTraitsMatchTheBuiltSteps(t *testing.T) {
	checked := map[string]int{}
	for _, s := range operators.Specs() {
		files := []string{s.Example}
		for _, v := range traitVariants[s.ID()] {
			sink := "sink: { topic: out }\n"
			if strings.HasPrefix(v, "sink:") {
				sink = ""
			}
			files = append(files, "route: variant\nsource: { topic: in, event_time: value.ts }\n"+sink+v)
		}
		if len(traitVariants[s.ID()]) == 0 {
			t.Errorf("%s: no trait variants: add the rule files whose keys change what the step is", s.Kind)
		}
		for i, src := range files {
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"r.yaml": src})
			r, err := LoadFile(filepath.Join(dir, "r.yaml"))
			if err != nil {
				t.Errorf("%s file %d refused: %v", s.Kind, i, err)
				continue
			}
			tables := map[string]operators.Table{}
			for name := range r.Tables {
				tables[name] = operators.NewMapTable()
			}
			for _, st := range r.Steps {
				step, err := st.Build(BuildEnv{KV: operators.NewMemKV(), Tables: tables})
				if err != nil {
					t.Errorf("%s file %d step %d: %v", s.Kind, i, st.Index, err)
					continue
				}
				if err := operators.CheckTraits(st.Traits, step); err != nil {
					t.Errorf("%s file %d step %d: %v", s.Kind, i, st.Index, err)
				}
				if st.Traits.Keyed && s.Kind == st.Kind && s.KeyedBy == "" {
					t.Errorf("%s: keyed, but its spec names no KeyedBy key for the docs", s.Kind)
				}
				checked[st.Kind]++
			}
		}
	}
	for _, s := range operators.Specs() {
		if checked[s.Kind] == 0 {
			t.Errorf("%s: no step of this kind was checked", s.Kind)
		}
	}
}

// TestTraitsDeclared pins what each kind declares where the pipeline's
// behaviour depends on it.
func TestTraitsDeclared(t *testing.T) {
	for _, c := range []struct {
		src  string
		want operators.Traits
	}{
		{"- filter: value.x > 1", operators.Traits{}},
		{"- set: { a: 1 }", operators.Traits{Value: operators.ValueMerged}},
		{"- map: { a: 1 }", operators.Traits{Value: operators.ValueReplaced}},
		{"- explode: { each: value.xs, as: x }", operators.Traits{}},
		{"- drop_duplicates: { key: value.id }", operators.Traits{Keyed: true}},
		{"- drop_duplicates: { key: value.id, ttl: 1h }", operators.Traits{Keyed: true, Timed: true}},
		{"- join: { stream: { topic: s }, on: key, other: key, within: { after: 1m }, grace: 1s, as: s }",
			operators.Traits{Keyed: true, Timed: true, Absorbing: true, TwoInputs: true, HoldsWatermark: 1000}},
		{"- join: { stream: { topic: s }, on: key, other: key, within: { before: 5m, after: 1m }, grace: 1s, kind: left, as: s }",
			operators.Traits{Keyed: true, Timed: true, Absorbing: true, TwoInputs: true, HoldsWatermark: 61_000}},
		{"- join: { stream: { topic: s }, on: key, other: key, within: { before: 5m, after: 1m }, grace: 1s, kind: outer, as: s }",
			operators.Traits{Keyed: true, Timed: true, Absorbing: true, TwoInputs: true, HoldsWatermark: 301_000}},
		{"- window: { kind: tumbling, size: 1m, aggregate: { n: count() } }",
			operators.Traits{Keyed: true, Timed: true, Stateful: true, Absorbing: true, Closes: true, Value: operators.ValueReplaced}},
	} {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{"r.yaml": "route: r\nsource: { topic: in }\nsink: { topic: out }\nsteps:\n  " + c.src + "\n"})
		r, err := LoadFile(filepath.Join(dir, "r.yaml"))
		if err != nil {
			t.Fatalf("%s: %v", c.src, err)
		}
		if got := r.Steps[0].Traits; got != c.want {
			t.Errorf("%s: traits %+v, want %+v", strings.TrimPrefix(c.src, "- "), got, c.want)
		}
	}
}
