package rules

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rtproxy/rtproxy/operators"
)

// checkDir writes files into a fresh directory and runs CheckPaths on it.
func checkDir(t *testing.T, files map[string]string) (bool, string, string) {
	t.Helper()
	dir := t.TempDir()
	writeFiles(t, dir, files)
	var out bytes.Buffer
	ok := CheckPaths(&out, []string{dir})
	return ok, out.String(), dir
}

// TestGraphSameGroup is finding 1 at `rtproxy check` and LoadDir: two
// routes in one consumer group are refused, the second file with a
// positioned error naming the first.
func TestGraphSameGroup(t *testing.T) {
	ok, out, dir := checkDir(t, map[string]string{
		"a.yaml": "route: a\nsource: { topic: pay, group: shared }\nsink: { topic: pay.a }\n",
		"b.yaml": "route: b\nsource:\n  topic: pay\n  group: shared\nsink: { topic: pay.b }\n",
	})
	if ok {
		t.Fatalf("check accepted two routes in one group:\n%s", out)
	}
	want := filepath.Join(dir, "b.yaml") + ":4:10: consumer group `shared` (source.group) is also the group of route `a` (its source.group at " + filepath.Join(dir, "a.yaml") + ":2:30)"
	if !strings.Contains(out, want) || !strings.Contains(out, "ok "+filepath.Join(dir, "a.yaml")) {
		t.Fatalf("check output lacks %q:\n%s", want, out)
	}
	routes, errs := LoadDir(dir)
	if len(routes) != 1 || routes[0].Name != "a" || len(errs) != 1 || !strings.Contains(errs[0].Error(), "`rtproxy state drop` of one deletes the other's group") {
		t.Fatalf("LoadDir: routes %v, errs %v", routes, errs)
	}
}

// TestGraphDefaultGroupCollides: a source.group equal to another route's
// default group (rtproxy.<route>) is the same group.
func TestGraphDefaultGroupCollides(t *testing.T) {
	ok, out, dir := checkDir(t, map[string]string{
		"a.yaml": "route: orders\nsource: { topic: o }\nsink: { topic: o.out }\n",
		"b.yaml": "route: other\nsource: { topic: o, group: rtproxy.orders }\nsink: { topic: o.other }\n",
	})
	want := filepath.Join(dir, "b.yaml") + ":2:28: consumer group `rtproxy.orders` (source.group) is also the group of route `orders` (its default group, route name at " + filepath.Join(dir, "a.yaml") + ":1:8)"
	if ok || !strings.Contains(out, want) {
		t.Fatalf("want %q:\n%s", want, out)
	}
	// The other way round: the default group is the one taken.
	ok, out, _ = checkDir(t, map[string]string{
		"a.yaml": "route: first\nsource: { topic: o, group: rtproxy.second }\nsink: { topic: o.out }\n",
		"b.yaml": "route: second\nsource: { topic: o }\nsink: { topic: o.other }\n",
	})
	if ok || !strings.Contains(out, "b.yaml:1:8: consumer group `rtproxy.second` (the default group (rtproxy.<route>)) is also the group of route `first`") {
		t.Fatalf("default group taken by source.group:\n%s", out)
	}
	// Distinct groups on one source are fine: each route reads it all.
	if ok, out, _ := checkDir(t, map[string]string{
		"a.yaml": "route: a\nsource: { topic: o }\nsink: { topic: o.a }\n",
		"b.yaml": "route: b\nsource: { topic: o }\nsink: { topic: o.b }\n",
	}); !ok {
		t.Fatalf("two routes reading one topic in their own groups refused:\n%s", out)
	}
}

// TestGraphCycle is finding 2: a cycle across files is refused and named.
func TestGraphCycle(t *testing.T) {
	ok, out, dir := checkDir(t, map[string]string{
		"x.yaml": "route: x\nsource: { topic: loop.x }\nsink: { topic: loop.y }\nsteps:\n  - explode: { each: value.items, as: item }\n",
		"y.yaml": "route: y\nsource: { topic: loop.y }\nsink: { topic: loop.x }\n",
	})
	want := filepath.Join(dir, "y.yaml") + ":3:16: the routes form a cycle: `loop.y` → route `y` (" + filepath.Join(dir, "y.yaml") + ":3:16) writes `loop.x` → route `x` (" + filepath.Join(dir, "x.yaml") + ":3:16) writes `loop.y`, the source of this route"
	if ok || !strings.Contains(out, want) {
		t.Fatalf("want %q:\n%s", want, out)
	}
	// Three routes, and a cycle closed by dead letters.
	ok, out, _ = checkDir(t, map[string]string{
		"1.yaml": "route: r1\nsource: { topic: t1 }\nsink: { topic: t2 }\n",
		"2.yaml": "route: r2\nsource: { topic: t2 }\nsink: { topic: t3 }\n",
		"3.yaml": "route: r3\nsource: { topic: t3 }\nsink: { topic: t3.out }\ndead_letter: t1\n",
	})
	if ok || !strings.Contains(out, "3.yaml:4:14: the routes form a cycle: `t3` → route `r3`") || !strings.Contains(out, "dead-letters to `t1` → route `r1`") || !strings.Contains(out, "dead letters count") {
		t.Fatalf("three-route cycle through dead letters:\n%s", out)
	}
	// A chain and a diamond are no cycle.
	if ok, out, _ := checkDir(t, map[string]string{
		"1.yaml": "route: r1\nsource: { topic: t1 }\nsink: { topic: t2 }\n",
		"2.yaml": "route: r2\nsource: { topic: t1 }\nsink: { topic: t3 }\n",
		"3.yaml": "route: r3\nsource: { topic: t2 }\nsink: { topic: t4 }\n",
		"4.yaml": "route: r4\nsource: { topic: t3 }\nsink: { topic: t4 }\n",
	}); !ok {
		t.Fatalf("a diamond refused:\n%s", out)
	}
}

// TestGraphCycleBruteForce compares the incremental cycle check with a
// brute-force reference: on random route sets over a few topics, a set is
// accepted whole exactly when its topic graph has no cycle, and the
// accepted part never has one.
func TestGraphCycleBruteForce(t *testing.T) {
	seed := uint64(1)
	rnd := func(n int) int {
		seed ^= seed << 13
		seed ^= seed >> 7
		seed ^= seed << 17
		return int(seed % uint64(n))
	}
	hasCycle := func(routes []*Route) bool {
		// Floyd-Warshall-style reachability over 5 topics.
		var reach [5][5]bool
		idx := func(s string) int { return int(s[1] - '0') }
		for _, r := range routes {
			for _, o := range r.outputs() {
				if len(o.topic) != 2 {
					continue // t0.dlq: read by no route
				}
				reach[idx(r.Source.Topic)][idx(o.topic)] = true
			}
		}
		for k := range 5 {
			for i := range 5 {
				for j := range 5 {
					reach[i][j] = reach[i][j] || (reach[i][k] && reach[k][j])
				}
			}
		}
		for i := range 5 {
			if reach[i][i] {
				return true
			}
		}
		return false
	}
	for trial := range 3000 {
		n := 1 + rnd(5)
		var routes []*Route
		for i := range n {
			src := rnd(5)
			sink := (src + 1 + rnd(4)) % 5
			r := &Route{Name: fmt.Sprintf("r%d", i), File: fmt.Sprintf("r%d.yaml", i), at: map[string]position{}}
			r.Source.Topic, r.Sink.Topic = fmt.Sprintf("t%d", src), fmt.Sprintf("t%d", sink)
			r.DeadLetter = r.Source.Topic + ".dlq"
			if rnd(4) == 0 {
				if d := (src + 1 + rnd(4)) % 5; d != sink {
					r.DeadLetter = fmt.Sprintf("t%d", d)
				}
			}
			routes = append(routes, r)
		}
		g := newGraph()
		var accepted []*Route
		refused := false
		for _, r := range routes {
			if errs := g.check(r); len(errs) > 0 {
				refused = true
				continue
			}
			g.add(r)
			accepted = append(accepted, r)
		}
		if hasCycle(accepted) {
			t.Fatalf("trial %d: the accepted routes hold a cycle", trial)
		}
		if refused != hasCycle(routes) {
			t.Fatalf("trial %d: refused=%v but the whole set has a cycle=%v", trial, refused, hasCycle(routes))
		}
	}
}

// TestGraphInternalTopics: no route reads or writes another route's
// repartition or changelog topic.
func TestGraphInternalTopics(t *testing.T) {
	win := "route: agg\nsource: { topic: clicks }\nsink: { topic: clicks.per-user }\nsteps:\n  - window: { kind: tumbling, size: 1m, key: value.user, aggregate: { n: count() } }\n"
	for name, c := range map[string]struct{ body, want string }{
		"sink":        {"route: evil\nsource: { topic: x }\nsink: { topic: agg.00-window.changelog }\n", "evil.yaml:3:16: sink.topic `agg.00-window.changelog` is an internal topic of route `agg`"},
		"dead_letter": {"route: evil\nsource: { topic: x }\nsink: { topic: y }\ndead_letter: agg.00-window.repartition\n", "evil.yaml:4:14: dead_letter `agg.00-window.repartition` is an internal topic of route `agg`"},
		"source":      {"route: evil\nsource: { topic: agg.00-window.changelog }\nsink: { topic: y }\n", "evil.yaml:2:18: source.topic `agg.00-window.changelog` is an internal topic of route `agg`"},
		"own":         {"route: evil\nsource: { topic: x }\nsink: { topic: evil.01-drop_duplicates.changelog }\n", "is an internal topic of this route"},
	} {
		t.Run(name, func(t *testing.T) {
			ok, out, _ := checkDir(t, map[string]string{"agg.yaml": win, "evil.yaml": c.body})
			if ok || !strings.Contains(out, c.want) {
				t.Fatalf("want %q:\n%s", c.want, out)
			}
		})
	}
	// A route named so that its internal topics would be another's sink.
	ok, out, _ := checkDir(t, map[string]string{
		"a.yaml": "route: a\nsource: { topic: x }\nsink: { topic: b.00-window.changelog }\n",
		"b.yaml": win[:len("route: ")] + "b" + win[len("route: agg"):],
	})
	if ok || !strings.Contains(out, "b.yaml:1:8: route `b` would own internal topics named `b.NN-<step>.repartition|changelog`, and route `a`") {
		t.Fatalf("a route whose internal topic is taken:\n%s", out)
	}
}

// TestWatchGraphRefusesNewcomer is findings 1 and 2 at run time: a file
// that joins a running route's group, or closes a cycle, is refused with
// an error naming the running route's file; the running route keeps
// running, and fixing the file lets it in.
func TestWatchGraphRefusesNewcomer(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "z.yaml"), "route: z\nsource: { topic: pay, group: g }\nsink: { topic: pay.z }\n")
	h := startWatch(t, dir)
	if got := h.next().summary(); got != "z[]" {
		t.Fatalf("initial %q", got)
	}
	// a.yaml sorts first, but z runs: z keeps the group.
	write(t, filepath.Join(dir, "a.yaml"), "route: a\nsource: { topic: pay, group: g }\nsink: { topic: pay.a }\n")
	got := h.next().summary()
	want := "z[] | " + filepath.Join(dir, "a.yaml") + ":2:30: consumer group `g` (source.group) is also the group of route `z` (its source.group at " + filepath.Join(dir, "z.yaml") + ":2:30)"
	if !strings.HasPrefix(got, want) {
		t.Fatalf("after a.yaml joined z's group:\n got %q\nwant %q", got, want)
	}
	write(t, filepath.Join(dir, "a.yaml"), "route: a\nsource: { topic: pay.z }\nsink: { topic: pay }\n")
	got = h.next().summary()
	if !strings.HasPrefix(got, "z[] | "+filepath.Join(dir, "a.yaml")+":3:16: the routes form a cycle: `pay.z` → route `a`") {
		t.Fatalf("after a.yaml closed a cycle: %q", got)
	}
	write(t, filepath.Join(dir, "a.yaml"), "route: a\nsource: { topic: pay.z }\nsink: { topic: pay.done }\n")
	if got := h.next().summary(); got != "a[] z[]" {
		t.Fatalf("after the fix: %q", got)
	}
	// An edit of a running route that would close a cycle keeps its
	// previous version running.
	write(t, filepath.Join(dir, "a.yaml"), "route: a\nsource: { topic: pay.z }\nsink: { topic: pay }\n")
	a := h.next()
	if len(a.routes) != 2 || a.routes[0].Sink.Topic != "pay.done" || len(a.errs) != 1 || !strings.Contains(a.errs[0].Error(), "cycle") {
		t.Fatalf("an edit into a cycle: %s", a.summary())
	}
}

// TestWatchGuardInvalidAtStartFailsClosed is finding 13 at the watcher: a
// guard file that does not load and has no valid version is put in force
// as a closed guard that refuses every record of its topic (every topic
// when its YAML does not even parse to say which); once fixed, the real
// guard replaces it. A guard whose edit is invalid keeps its valid version.
func TestWatchGuardInvalidAtStartFailsClosed(t *testing.T) {
	dir := t.TempDir()
	bad := "guard: pay-shape\ntopic: payments\nchecks:\n  - check: value.amount >\n"
	write(t, filepath.Join(dir, "g.yaml"), bad)
	write(t, filepath.Join(dir, "broken.yaml"), "guard: broken\nchecks: [valid_json\n")
	h := startWatch(t, dir)
	a := h.next()
	closed := map[string]*Guard{}
	for _, r := range a.routes {
		if r.Guard != nil {
			closed[r.Name] = r.Guard
		}
	}
	g := closed["pay-shape"]
	if g == nil || g.Closed == "" || !g.Matches("payments") || g.Matches("orders") {
		t.Fatalf("g.yaml: %+v (%s)", g, a.summary())
	}
	if check, msg, ok := g.Check(&operators.Record{Topic: "payments", Raw: []byte(`{"amount":5}`)}); ok || check != GuardInvalid || !strings.Contains(msg, "guard `pay-shape` does not load") {
		t.Fatalf("closed guard check: %v %q %q", ok, check, msg)
	}
	if b := closed["broken"]; b == nil || !b.Matches("anything.at.all") || !strings.Contains(b.Closed, "every topic") {
		t.Fatalf("broken.yaml (YAML does not parse): %+v", b)
	}
	if len(a.errs) != 2 {
		t.Fatalf("the files' errors are reported as before: %v", a.errs)
	}
	// Fixed: the real guard, open for good records.
	write(t, filepath.Join(dir, "g.yaml"), "guard: pay-shape\ntopic: payments\nchecks:\n  - check: value.amount > 0\n")
	a = h.next()
	var real *Guard
	for _, r := range a.routes {
		if r.Name == "pay-shape" {
			real = r.Guard
		}
	}
	if real == nil || real.Closed != "" {
		t.Fatalf("after the fix: %s", a.summary())
	}
	if _, _, ok := real.Check(&operators.Record{Topic: "payments", Raw: []byte(`{"amount":5}`)}); !ok {
		t.Fatal("the fixed guard refuses a good record")
	}
	// Broken again: the valid version keeps running (a reload, not a start).
	write(t, filepath.Join(dir, "g.yaml"), bad)
	a = h.next()
	for _, r := range a.routes {
		if r.Name == "pay-shape" && (r.Guard.Closed != "" || r.Guard != real) {
			t.Fatalf("an invalid edit replaced the running guard: %+v", r.Guard)
		}
	}
	// A route file that does not load is no guard: nothing is closed for it.
	write(t, filepath.Join(dir, "r.yaml"), "route: r\nsource: { topic: a\n")
	a = h.next()
	for _, r := range a.routes {
		if r.Guard != nil && r.Guard.Closed != "" && r.Name != "broken" {
			t.Fatalf("a closed guard for %s", r.File)
		}
	}
}

// TestGraphStreamJoinInputs: a stream join's second topic is an input of
// its route like the source: a cycle through it is refused, and a switch
// branch may not write it (the join would read its own outputs).
func TestGraphStreamJoinInputs(t *testing.T) {
	join := "  - join: { stream: { topic: auths, event_time: value.ts }, on: value.a, other: value.id, within: { before: 5m, after: 1m }, grace: 30s, as: auth }\n"
	// x joins `auths`; y reads x's sink and writes `auths`: a cycle.
	ok, out, _ := checkDir(t, map[string]string{
		"x.yaml": "route: x\nsource: { topic: pays, event_time: value.ts }\nsink: { topic: matched }\nsteps:\n" + join,
		"y.yaml": "route: y\nsource: { topic: matched }\nsink: { topic: auths }\n",
	})
	if ok || !strings.Contains(out, "the routes form a cycle: `matched` → route `y`") || !strings.Contains(out, "writes `auths` → route `x`") {
		t.Fatalf("a cycle through a stream join's second topic was not refused:\n%s", out)
	}
	// The same with the writer of `auths` accepted first: the join's
	// route is refused, the cycle walked from its second topic.
	ok, out, _ = checkDir(t, map[string]string{
		"a.yaml": "route: y\nsource: { topic: matched }\nsink: { topic: auths }\n",
		"x.yaml": "route: x\nsource: { topic: pays, event_time: value.ts }\nsink: { topic: matched }\nsteps:\n" + join,
	})
	if ok || !strings.Contains(out, "the routes form a cycle: `auths` → route `x`") || !strings.Contains(out, "the second topic a stream join of this route reads") {
		t.Fatalf("a cycle into a stream join's second topic was not refused:\n%s", out)
	}
	// A switch branch writing the stream topic.
	ok, out, _ = checkDir(t, map[string]string{
		"x.yaml": "route: x\nsource: { topic: pays, event_time: value.ts }\nsteps:\n" + join +
			"  - switch: [ { when: value.amount > 1, sink: { topic: auths } }, { sink: { topic: rest } } ]\n",
	})
	if ok || !strings.Contains(out, "`auths` is the second topic a stream join of this route reads") {
		t.Fatalf("a switch branch writing the stream topic was not refused:\n%s", out)
	}
	// Reading the same second topic from two routes is fine.
	if ok, out, _ := checkDir(t, map[string]string{
		"x.yaml": "route: x\nsource: { topic: pays, event_time: value.ts }\nsink: { topic: m1 }\nsteps:\n" + join,
		"y.yaml": "route: y\nsource: { topic: pays2, event_time: value.ts }\nsink: { topic: m2 }\nsteps:\n" + join,
	}); !ok {
		t.Fatalf("two routes joining one stream refused:\n%s", out)
	}
}
