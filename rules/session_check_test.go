package rules

import (
	"strings"
	"testing"
)

// TestSessionWindowChecks: what `rtproxy check` says of session windows'
// keys, each at its place in the file.
func TestSessionWindowChecks(t *testing.T) {
	cases := []struct{ name, window, want string }{
		{"no gap", "{ kind: session, key: value.u, aggregate: { n: count() } }",
			"r.yaml:7:5: window needs `gap`: the pause that ends a session, e.g. `gap: 30m` (near `window`)"},
		{"no size on tumbling", "{ kind: tumbling, aggregate: { n: count() } }",
			"r.yaml:7:5: window needs `size`: how long each window is, e.g. `size: 5m` (near `window`)"},
		{"size on a session", "{ kind: session, gap: 1m, size: 5m, aggregate: { n: count() } }",
			"r.yaml:7:39: `size` does not apply to session windows, which end after `gap` without records; remove it (near `size`)"},
		{"gap on tumbling", "{ kind: tumbling, size: 1m, gap: 5m, aggregate: { n: count() } }",
			"r.yaml:7:41: `gap` only applies to session windows; remove it or use `kind: session` (near `gap`)"},
		{"max_duration on sliding", "{ kind: sliding, size: 1m, slide: 10s, max_duration: 5m, aggregate: { n: count() } }",
			"r.yaml:7:52: `max_duration` only applies to session windows; remove it or use `kind: session` (near `max_duration`)"},
		{"max_duration under the gap", "{ kind: session, gap: 30m, max_duration: 10m, aggregate: { n: count() } }",
			"r.yaml:7:54: `max_duration` (10m0s) is shorter than `gap` (30m0s): no session could ever end by a pause; make it at least the gap (near `10m`)"},
		{"gap under a millisecond", "{ kind: session, gap: 500us, aggregate: { n: count() } }",
			"r.yaml:7:35: `window.gap` must be at least 1ms: event times are epoch milliseconds (near `500us`)"},
		{"unknown kind", "{ kind: hopping, size: 1m, aggregate: { n: count() } }",
			"r.yaml:7:21: `window.kind` must be one of tumbling, sliding, session (near `hopping`)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := loadErrors(t, map[string]string{"r.yaml": base + "steps:\n  - window: " + tc.window + "\n"})
			if strings.Join(got, "\n") != tc.want {
				t.Errorf("errors:\n got: %s\nwant: %s", strings.Join(got, "\n      "), tc.want)
			}
		})
	}
}

// TestSessionWindowWarnsWithoutMaxDuration: a session window without
// max_duration runs, with a warning; with one it is quiet.
func TestSessionWindowWarnsWithoutMaxDuration(t *testing.T) {
	for _, tc := range []struct {
		window string
		warns  bool
	}{
		{"{ kind: session, gap: 30m, key: value.u, aggregate: { n: count() } }", true},
		{"{ kind: session, gap: 30m, max_duration: 4h, key: value.u, aggregate: { n: count() } }", false},
	} {
		res := loadBytes("r.yaml", []byte(base+"steps:\n  - window: "+tc.window+"\n"), Options{})
		if len(res.errs) > 0 {
			t.Fatalf("%s: %v", tc.window, res.errs)
		}
		var warned bool
		for _, w := range res.warns {
			warned = warned || strings.Contains(w.Msg, "without `max_duration` never closes")
		}
		if warned != tc.warns {
			t.Errorf("%s: warned %v, want %v (%v)", tc.window, warned, tc.warns, res.warns)
		}
		built, err := res.route.Steps[0].Build(BuildEnv{})
		if err != nil {
			t.Fatal(err)
		}
		if built.Kind() != "window" {
			t.Errorf("built a %s", built.Kind())
		}
	}
}
