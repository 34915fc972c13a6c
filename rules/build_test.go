package rules

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rtproxy/rtproxy/operators"
)

// collect is an Emitter that keeps what a step chain produces.
type collect struct {
	out  []*operators.Record
	dead []string
}

func (c *collect) Emit(r *operators.Record) { c.out = append(c.out, r) }
func (c *collect) DeadLetter(r *operators.Record, reason operators.Reason, err error) {
	c.dead = append(c.dead, fmt.Sprintf("%s: %v", reason, err))
}

// chainEmitter passes what step i emits to step i+1.
type chainEmitter struct {
	steps []operators.Step
	i     int
	final *collect
}

func (c *chainEmitter) Emit(r *operators.Record) {
	if c.i+1 >= len(c.steps) {
		c.final.Emit(r)
		return
	}
	c.steps[c.i+1].Process(r, &chainEmitter{steps: c.steps, i: c.i + 1, final: c.final})
}
func (c *chainEmitter) DeadLetter(r *operators.Record, reason operators.Reason, err error) {
	c.final.DeadLetter(r, reason, err)
}

func buildSteps(t *testing.T, r *Route) []operators.Step {
	t.Helper()
	tables := map[string]operators.Table{}
	for n, ts := range r.Tables {
		if ts.Table != nil {
			tables[n] = ts.Table
		}
	}
	var steps []operators.Step
	for _, s := range r.Steps {
		st, err := s.Build(BuildEnv{KV: operators.NewMemKV(), Tables: tables})
		if err != nil {
			t.Fatalf("build step %d %s: %v", s.Index, s.Kind, err)
		}
		if st.Kind() != s.Kind {
			t.Fatalf("step %d built a %s, spec says %s", s.Index, st.Kind(), s.Kind)
		}
		steps = append(steps, st)
	}
	return steps
}

// TestCompiledRouteRuns builds every step of a loaded route and pushes
// records through it: the compiled expressions, the join table and the
// window all do what the rule file says.
func TestCompiledRouteRuns(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"r.yaml": `route: run
source: { topic: payments }
sink: { topic: payments.out }
tables:
  merchants: { file: merchants.jsonl, key: merchant_id }
steps:
  - filter: value.amount > 0
  - drop_duplicates: { key: value.txn_id }
  - join: { table: merchants, on: value.merchant_id, as: merchant, missing: dead_letter }
  - set:
      risk: value.amount / merchant.avg_amount
  - map:
      user: value.user
      risk: value.risk
  - window:
      kind: tumbling
      size: 1m
      key: value.user
      aggregate:
        n: count()
        top: max(value.risk)
`,
		"merchants.jsonl": `{"merchant_id": "m1", "avg_amount": 10}` + "\n",
	})
	r, err := LoadFile(filepath.Join(dir, "r.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	steps := buildSteps(t, r)
	final := &collect{}
	rec := func(off int64, v map[string]any) {
		steps[0].Process(&operators.Record{Topic: "payments", Offset: off, Value: v, Timestamp: 1000 + off, EventTime: 1000 + off}, &chainEmitter{steps: steps, final: final})
	}
	rec(0, map[string]any{"amount": 50.0, "txn_id": "t1", "merchant_id": "m1", "user": "u1"})
	rec(1, map[string]any{"amount": 50.0, "txn_id": "t1", "merchant_id": "m1", "user": "u1"})  // duplicate
	rec(2, map[string]any{"amount": -5.0, "txn_id": "t2", "merchant_id": "m1", "user": "u1"})  // filtered
	rec(3, map[string]any{"amount": 20.0, "txn_id": "t3", "merchant_id": "zz", "user": "u1"})  // no merchant
	rec(4, map[string]any{"amount": 120.0, "txn_id": "t4", "merchant_id": "m1", "user": "u1"}) // risk 12
	if len(final.out) != 0 {
		t.Fatalf("window emitted before it closed: %d rows", len(final.out))
	}
	if len(final.dead) != 1 || !strings.HasPrefix(final.dead[0], "missing: ") {
		t.Fatalf("dead letters = %q, want one `missing` for merchant zz", final.dead)
	}
	win := steps[len(steps)-1].(operators.Timed)
	win.Advance(60_000, &chainEmitter{steps: steps, i: len(steps) - 1, final: final})
	if len(final.out) != 1 {
		t.Fatalf("rows = %d, want 1", len(final.out))
	}
	v := final.out[0].Value.(map[string]any)
	if fmt.Sprintf("%v %v %v %v %v", v["key"], v["window_start"], v["window_end"], v["n"], v["top"]) != "u1 0 60000 2 12" {
		t.Errorf("window row = %v, want key u1, [0,60000), n 2, top 12", v)
	}
}

// TestFingerprints pins the fingerprint rule: a step's fingerprint changes
// when it or anything before it (including source.event_time, format and
// watermark) changes, and only then.
func TestFingerprints(t *testing.T) {
	const tmpl = `route: fp
source:
  topic: in
  event_time: %s
  idle_timeout: %s
sink: { topic: %s }
tables:
  m: { file: m.jsonl, key: id }
steps:
  - filter: %s
  - join: { table: m, on: value.m, as: row }
  - drop_duplicates: { key: value.id, ttl: 1h }
  - window: { kind: tumbling, size: 1m, key: value.u, aggregate: { n: %s } }
`
	dir := t.TempDir()
	load := func(et, idle, sink, filter, agg, table string) *Route {
		t.Helper()
		writeFiles(t, dir, map[string]string{
			"r.yaml":  fmt.Sprintf(tmpl, et, idle, sink, filter, agg),
			"m.jsonl": table,
		})
		r, err := LoadFile(filepath.Join(dir, "r.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	fps := func(r *Route) []string {
		var out []string
		for _, s := range r.Steps {
			out = append(out, s.Fingerprint)
		}
		return out
	}
	// same reports, per step, whether b's fingerprint equals a's.
	same := func(a, b *Route) string {
		fa, fb := fps(a), fps(b)
		var s []string
		for i := range fa {
			if fa[i] == fb[i] {
				s = append(s, "same")
			} else {
				s = append(s, "new")
			}
		}
		return strings.Join(s, " ")
	}
	const row = `{"id":"m1","x":1}` + "\n"
	base := load("value.ts", "30s", "out", "value.a > 1", "count()", row)
	cases := []struct {
		name     string
		r        *Route
		want     string
		hashSame bool
	}{
		{"re-spaced filter", load("value.ts", "30s", "out", "value.a>1", "count()", row), "same same same same", false},
		{"idle_timeout and sink are not step context", load("value.ts", "1m", "out2", "value.a > 1", "count()", row), "same same same same", false},
		{"table content is not step context", load("value.ts", "30s", "out", "value.a > 1", "count()", `{"id":"m1","x":2}`+"\n"), "same same same same", false},
		{"a changed filter changes every later step", load("value.ts", "30s", "out", "value.a > 2", "count()", row), "new new new new", false},
		{"a changed window changes only the window", load("value.ts", "30s", "out", "value.a > 1", "sum(value.x)", row), "same same same new", false},
		{"event_time feeds every step", load("value.t2", "30s", "out", "value.a > 1", "count()", row), "new new new new", false},
		{"nothing changed", load("value.ts", "30s", "out", "value.a > 1", "count()", row), "same same same same", true},
	}
	for _, c := range cases {
		if got := same(base, c.r); got != c.want {
			t.Errorf("%s: fingerprints %s, want %s", c.name, got, c.want)
		}
		if (base.Hash == c.r.Hash) != c.hashSame {
			t.Errorf("%s: hash equal = %v, want %v", c.name, base.Hash == c.r.Hash, c.hashSame)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "r.yaml")); err != nil {
		t.Fatal(err)
	}
}
