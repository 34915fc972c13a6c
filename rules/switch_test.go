package rules

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSwitchLoads(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"r.yaml": `route: by-size
source: { topic: payments }
sink: { delivery: exactly_once }
steps:
  - set: { big: value.amount > 1000 }
  - switch:
      - when: value.big
        sink: { topic: payments.large, key: value.account }
      - when: value.currency != "EUR"
        sink: { topic: payments.foreign }
      - sink: { topic: payments.rest }
`})
	r, err := LoadFile(filepath.Join(dir, "r.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Switch) != 3 || r.Sink.Topic != "" || !r.Sink.ExactlyOnce() {
		t.Fatalf("switch %+v sink %+v", r.Switch, r.Sink)
	}
	want := []string{"payments.large", "payments.foreign", "payments.rest"}
	if got := r.SinkTopics(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("sink topics %v, want %v", got, want)
	}
	for i, b := range r.Switch {
		if !b.Sink.ExactlyOnce() || b.Sink.Name != want[i] || b.Sink.Format != FormatJSON {
			t.Errorf("branch %d sink %+v", i, b.Sink)
		}
	}
	if r.Switch[0].Sink.Key == nil || r.Switch[1].Sink.Key != nil || r.Switch[2].When != nil {
		t.Errorf("keys/whens wrong: %+v", r.Switch)
	}
	if last := r.Steps[len(r.Steps)-1]; last.Kind != "switch" || last.Build == nil {
		t.Fatalf("last step %+v", last)
	}
	// A switch sink's changed condition changes the step's fingerprint.
	fp := r.Steps[1].Fingerprint
	writeFiles(t, dir, map[string]string{"r.yaml": strings.Replace(mustRead(t, filepath.Join(dir, "r.yaml")), "value.big", "value.big == true", 1)})
	r2, err := LoadFile(filepath.Join(dir, "r.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if r2.Steps[1].Fingerprint == fp {
		t.Error("fingerprint did not change with a branch's condition")
	}
}

func TestSwitchRefused(t *testing.T) {
	const head = "route: r\nsource: { topic: in }\n"
	for _, c := range []struct{ name, file, want string }{
		{"not last", head + "steps:\n  - switch: [ { sink: { topic: a } } ]\n  - filter: value.x > 1\n",
			"r.yaml:4:5: `switch` must be the last step"},
		{"default not last", head + "steps:\n  - switch:\n      - sink: { topic: a }\n      - when: value.x > 1\n        sink: { topic: b }\n",
			"r.yaml:5:9: switch branch 1 has no `when`: only the last branch may be the default"},
		{"top-level sink topic", head + "sink: { topic: out }\nsteps:\n  - switch: [ { sink: { topic: a } } ]\n",
			"r.yaml:3:9: this route ends with a `switch`, whose branches name the sinks; `sink.topic` belongs in a branch's `sink:`"},
		{"no sink without switch", head + "steps:\n  - filter: value.x > 1\n",
			"missing `sink`"},
		{"http exactly once", head + "sink: { delivery: exactly_once }\nsteps:\n  - switch: [ { when: value.x > 1, sink: { topic: a } }, { sink: { http: { url: \"http://h:1/x\" } } } ]\n",
			"r.yaml:5:68: switch branch 2: `sink.delivery: exactly_once` needs a topic sink"},
		{"same topic twice", head + "steps:\n  - switch: [ { when: value.x > 1, sink: { topic: a } }, { sink: { topic: a } } ]\n",
			"switch branches 1 and 2 both write topic `a`"},
		{"dead letter topic", head + "steps:\n  - switch: [ { sink: { topic: in.dlq } } ]\n",
			"switch branch 1 writes the dead-letter topic `in.dlq`"},
		{"source topic", head + "steps:\n  - switch: [ { sink: { topic: in } } ]\n",
			"sink topic is the source topic"},
		{"not a condition", head + "steps:\n  - switch: [ { when: value.x + 1, sink: { topic: a } } ]\n",
			"switch branch 1 when must be true or false"},
		{"empty", head + "steps:\n  - switch: []\n",
			"`switch` must be a list of branches"},
		{"no sink", head + "steps:\n  - switch: [ { when: value.x > 1 } ]\n",
			"switch branch 1 needs `sink`"},
		{"unknown branch key", head + "steps:\n  - switch: [ { wen: value.x > 1, sink: { topic: a } } ]\n",
			"unknown field `wen` in switch branch 1; did you mean `when`?"},
		{"delivery in branch", head + "steps:\n  - switch: [ { sink: { topic: a, delivery: exactly_once } } ]\n",
			"unknown field `delivery` in switch branch 1 sink"},
		{"schema after map", head + "steps:\n  - map: { a: value.a }\n  - switch: [ { sink: { topic: a, key: value.b } } ]\n",
			"reads `value.b`, but after the map at line 4 value has only the fields a"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := strings.Join(loadErrors(t, map[string]string{"r.yaml": c.file}), "\n")
			if !strings.Contains(got, c.want) {
				t.Errorf("errors:\n%s\nwant one containing %q", got, c.want)
			}
		})
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSwitchGraph: the route graph sees every branch's topic: a cycle
// through the second branch, and a branch writing another route's
// internal topic, are refused at the branch's topic.
func TestSwitchGraph(t *testing.T) {
	ok, out, dir := checkDir(t, map[string]string{
		"a.yaml": "route: a\nsource: { topic: pay }\nsteps:\n  - switch:\n      - when: value.x > 1\n        sink: { topic: pay.big }\n      - sink: { topic: pay.rest }\n",
		"b.yaml": "route: b\nsource: { topic: pay.rest }\nsink: { topic: pay }\n",
	})
	if ok {
		t.Fatalf("check accepted a cycle through a switch branch:\n%s", out)
	}
	want := filepath.Join(dir, "b.yaml") + ":3:16: the routes form a cycle: `pay.rest` → route `b` (" + filepath.Join(dir, "b.yaml") + ":3:16) writes `pay` → route `a` (" + filepath.Join(dir, "a.yaml") + ":7:24) writes `pay.rest`"
	if !strings.Contains(out, want) {
		t.Fatalf("want %q in:\n%s", want, out)
	}
	// The other order: the switch route closes the cycle, and the error
	// points at its branch.
	ok, out, dir = checkDir(t, map[string]string{
		"a.yaml": "route: a\nsource: { topic: pay.rest }\nsink: { topic: pay }\n",
		"b.yaml": "route: b\nsource: { topic: pay }\nsteps:\n  - switch:\n      - when: value.x > 1\n        sink: { topic: pay.big }\n      - sink: { topic: pay.rest }\n",
	})
	if want := filepath.Join(dir, "b.yaml") + ":7:24: the routes form a cycle"; ok || !strings.Contains(out, want) {
		t.Fatalf("want %q in:\n%s", want, out)
	}
	ok, out, dir = checkDir(t, map[string]string{
		"a.yaml": "route: agg\nsource: { topic: pay }\nsink: { topic: pay.agg }\nsteps:\n  - drop_duplicates: { key: value.id }\n",
		"b.yaml": "route: b\nsource: { topic: other }\nsteps:\n  - switch: [ { when: value.x > 1, sink: { topic: ok.out } }, { sink: { topic: agg.00-drop_duplicates.repartition } } ]\n",
	})
	if want := filepath.Join(dir, "b.yaml") + ":4:80: switch branch 2 sink.topic `agg.00-drop_duplicates.repartition` is an internal topic of route `agg`"; ok || !strings.Contains(out, want) {
		t.Fatalf("want %q in:\n%s", want, out)
	}
}
