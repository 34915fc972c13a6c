package rules

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// FuzzLoad feeds arbitrary bytes to the rule-file loader. No input may
// panic, and every outcome is either a complete route (or guard) or
// located errors. Seeds: testdata/fuzz/FuzzLoad plus the shipped examples.
func FuzzLoad(f *testing.F) {
	examples, _ := filepath.Glob("../examples/*/rules/*.yaml")
	more, _ := filepath.Glob("../examples/rules/*.yaml")
	for _, p := range append(examples, more...) {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	// HTTP sinks (sink_http.go), under an allow-list that lets their URL
	// and variables through, so the fuzzer reaches past the allow-list.
	f.Add([]byte("route: h\nsource: { topic: a }\nsink:\n  http:\n    url: http://fuzz.example/x\n    method: PUT\n    timeout: 2s\n    max_in_flight: 3\n    headers: { X-A: b, Authorization: { env: FUZZ_TOKEN, prefix: \"Bearer \" } }\n"))
	f.Add([]byte("route: h\nsource: { topic: a }\nsink: { http: { url: http://fuzz.example/x, headers: { Cookie: c } }, delivery: exactly_once }\n"))
	// Stream joins (operators/streamjoin.go): the `stream` and `within`
	// mappings, and the spec chosen by the `stream` key.
	f.Add([]byte("route: j\nsource: { topic: p, event_time: value.ts }\nsink: { topic: o }\nsteps:\n  - join: { stream: { topic: a, event_time: value.ts, format: json }, on: value.a, other: value.id, within: { before: 5m, after: 1m }, grace: 30s, kind: outer, as: auth }\n"))
	// Switch steps (switch.go): branches with topics, an HTTP sink, keys.
	f.Add([]byte("route: s\nsource: { topic: a }\nsteps:\n  - switch:\n      - when: value.x > 1\n        sink: { topic: b, key: value.k }\n      - when: value.y == \"z\"\n        sink: { http: { url: http://fuzz.example/y } }\n      - sink: { topic: c }\n"))
	f.Add([]byte("route: s\nsource: { topic: a }\nsink: { delivery: exactly_once }\nsteps:\n  - filter: value.x > 0\n  - switch: [ { when: value.x > 1, sink: { topic: b } }, { sink: { topic: c } } ]\n"))
	// Session windows (operators/session.go): their keys and the keys of
	// the other kinds they refuse.
	f.Add([]byte("route: s\nsource: { topic: a, event_time: value.ts }\nsink: { topic: b }\nsteps:\n  - window: { kind: session, gap: 30m, max_duration: 4h, key: value.u, emit: on_update, aggregate: { n: count(), p: count_distinct(value.p) } }\n"))
	f.Add([]byte("route: s\nsource: { topic: a }\nsink: { topic: b }\nsteps:\n  - window: { kind: session, gap: 1m, size: 1m, max_duration: 30s, aggregate: { n: count() } }\n"))
	dir := f.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "t.jsonl"), []byte(`{"id":"a","x":1}`+"\n"), 0o644); err != nil {
		f.Fatal(err)
	}
	path := filepath.Join(dir, "f.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		res := loadBytes(path, data, Options{Allow: &Allow{URLs: []string{"http://fuzz.example"}, EnvNames: []string{"FUZZ_*"}}})
		if (res.route == nil) == (len(res.errs) == 0) {
			t.Fatalf("route %v with %d errors", res.route != nil, len(res.errs))
		}
		for _, e := range res.errs {
			if e.File != path || e.Line < 1 || e.Msg == "" {
				t.Fatalf("unlocated error: %+v", e)
			}
			if strings.Contains(e.Msg, "internal error") {
				t.Fatalf("a parser panicked: %v", e)
			}
		}
		if r := res.route; r != nil && r.Guard != nil {
			checkFuzzedGuard(t, r)
		} else if r != nil && r.View != nil {
			if r.Name == "" || r.View.Topic == "" || (r.InPlace() && r.View.Clients == nil) || !hex64.MatchString(r.Hash) {
				t.Fatalf("incomplete view: %+v", r.View)
			}
		} else if r != nil {
			if h := r.Sink.HTTP; h != nil && (r.Sink.Topic != "" || h.URL == "" || h.Method == "" || h.Timeout <= 0 || h.MaxInFlight < 1 || r.Sink.ExactlyOnce()) {
				t.Fatalf("incomplete HTTP sink: %+v %+v", r.Sink, h)
			}
			if r.Name == "" || r.Source.Topic == "" || (r.Switch == nil && r.Sink.Target() == "") || r.Sink.Topic == r.Source.Topic || !hex64.MatchString(r.Hash) {
				t.Fatalf("incomplete route: %+v", r)
			}
			checkFuzzedSwitch(t, r)
			// Defaults are filled in here, never left to the pipeline.
			if r.Source.IdleTimeout <= 0 || r.CheckpointInterval <= 0 || r.Source.Format == "" || r.Source.Start == "" || r.DeadLetter == "" {
				t.Fatalf("route without its defaults: %+v", r)
			}
			for _, s := range r.Steps {
				if s.Build == nil || !hex64.MatchString(s.Fingerprint) {
					t.Fatalf("incomplete step %d: %+v", s.Index, s)
				}
			}
		}
	})
}

// fuzzRecords are produced records every fuzzed guard checks: Check must
// not panic on any of them.
var fuzzRecords = []string{`{"amount": 1, "currency": "EUR"}`, `{"amount": null}`, `[1, 2]`, `"s"`, `{`, ``, "\xff", `<null>`}

// checkFuzzedGuard checks that a loaded guard is complete and runs.
func checkFuzzedGuard(t *testing.T, r *Route) {
	g := r.Guard
	if r.Name == "" || !hex64.MatchString(r.Hash) || r.Source.Topic != "" || r.Sink.Topic != "" || len(r.Steps) != 0 {
		t.Fatalf("incomplete guard: %+v", r)
	}
	if g.Topic == "" || (g.Format != "json" && g.Format != "raw") || len(g.Checks) == 0 {
		t.Fatalf("guard without its defaults: %+v", g)
	}
	switch g.OnReject {
	case GuardReject:
		if g.DeadLetter != "" {
			t.Fatalf("guard that rejects has a dead letter: %+v", g)
		}
	case GuardDeadLetter:
		if g.DeadLetter == "" || g.Matches(g.DeadLetter) {
			t.Fatalf("guard with a bad dead letter: %+v", g)
		}
	default:
		t.Fatalf("guard with on_reject %q", g.OnReject)
	}
	names := map[string]bool{}
	for _, c := range g.Checks {
		if c.Name == "" || c.Message == "" || names[c.Name] || (c.Cond == nil) != (c.Name == ValidJSON) {
			t.Fatalf("bad check %+v in %+v", c, g)
		}
		names[c.Name] = true
	}
	for _, v := range fuzzRecords {
		check, msg, ok := g.Check(produced("t", v))
		if !ok && (check == "" || msg == "" || strings.Contains(msg, "internal error")) {
			t.Fatalf("check of %q: (%q, %q)", v, check, msg)
		}
	}
}

// checkFuzzedSwitch: a route with a switch has it last, a sink per branch
// (none of them the source, the dead-letter topic or another branch's
// topic), a default only last, no top-level sink target, and no HTTP
// branch when exactly once.
func checkFuzzedSwitch(t *testing.T, r *Route) {
	if r.Switch == nil {
		return
	}
	if n := len(r.Steps); n == 0 || r.Steps[n-1].Kind != "switch" || r.Sink.Target() != "" {
		t.Fatalf("switch route: last step %v, top-level sink %+v", r.Steps, r.Sink)
	}
	seen := map[string]bool{}
	for i, b := range r.Switch {
		s := b.Sink
		if s.Target() == "" || s.Name == "" || s.Topic == r.Source.Topic || (s.Topic != "" && (seen[s.Topic] || s.Topic == r.DeadLetter)) ||
			(b.When == nil && i != len(r.Switch)-1) || (s.HTTP != nil && r.Sink.ExactlyOnce()) || s.Delivery != r.Sink.Delivery {
			t.Fatalf("switch branch %d: %+v", i+1, b)
		}
		seen[s.Topic] = true
	}
}
