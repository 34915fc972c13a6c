package rules

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/rtproxy/rtproxy/operators"
)

// exampleGuard is the guard file of the design, comments included. As
// written it gives `dead_letter` with `on_reject: reject`, which is
// refused; exampleGuardDL is the same file copying to its dead letter.
const exampleGuard = `guard: payments-shape          # name; unique across the rules directory together with route names
topic: payments                # a topic name, or a glob in path.Match syntax (e.g. ` + "`payments.*`" + `)
format: json                   # json (default) | raw : how ` + "`value`" + ` is decoded for the checks
on_reject: reject              # reject (default) | dead_letter
dead_letter: payments.rejected # only with on_reject: dead_letter; default "<guard name>.rejected"
checks:
  - valid_json                 # built-in: the value is valid JSON (useful with format: raw)
  - check: value.amount > 0
    message: amount must be positive
  - check: size <= 10240
    message: record larger than 10 KiB
    name: max-size             # optional; names the check in metrics and errors (default: the expression source)
`

var exampleGuardDL = strings.Replace(exampleGuard, "on_reject: reject        ", "on_reject: dead_letter   ", 1)

// loadGuardText loads content as one guard file and fails the test on
// any error.
func loadGuardText(t *testing.T, content string) *Route {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, "g.yaml")
	write(t, p, content)
	r, err := LoadFile(p)
	if err != nil {
		t.Fatalf("guard refused: %v", err)
	}
	if r.Guard == nil {
		t.Fatalf("loaded %s as a route, not a guard", p)
	}
	return r
}

func describeGuard(r *Route) string {
	g := r.Guard
	var b strings.Builder
	fmt.Fprintf(&b, "guard %s topic=%s format=%s on_reject=%s dead_letter=%s\n", r.Name, g.Topic, g.Format, g.OnReject, g.DeadLetter)
	for _, c := range g.Checks {
		src := "<built-in>"
		if c.Cond != nil {
			src = c.Cond.Source
		}
		fmt.Fprintf(&b, "check %q message=%q cond=%s\n", c.Name, c.Message, src)
	}
	return b.String()
}

func TestGuardExampleParses(t *testing.T) {
	r := loadGuardText(t, exampleGuardDL)
	want := "guard payments-shape topic=payments format=json on_reject=dead_letter dead_letter=payments.rejected\n" +
		"check \"valid_json\" message=\"check `valid_json` failed\" cond=<built-in>\n" +
		"check \"value.amount > 0\" message=\"amount must be positive\" cond=value.amount > 0\n" +
		"check \"max-size\" message=\"record larger than 10 KiB\" cond=size <= 10240\n"
	if got := describeGuard(r); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	if !filepath.IsAbs(r.File) || !hex64.MatchString(r.Hash) {
		t.Errorf("file %q hash %q: want an absolute path and a sha256", r.File, r.Hash)
	}
	if !reflect.DeepEqual(r.Source, Source{}) || r.Sink != (Sink{}) || len(r.Steps) != 0 || r.DeadLetter != "" || len(r.Tables) != 0 {
		t.Errorf("a guard's route fields must be empty: %+v", r)
	}

	// The design's example as written pairs dead_letter with on_reject:
	// reject, which is refused.
	got := loadErrors(t, map[string]string{"r.yaml": exampleGuard})
	want1 := "r.yaml:5:1: `dead_letter` applies only with `on_reject: dead_letter`; add `on_reject: dead_letter`, or remove `dead_letter` (with `on_reject: reject` nothing is copied) (near `dead_letter`)"
	if len(got) != 1 || got[0] != want1 {
		t.Errorf("example as written: %q\nwant %q", got, want1)
	}
}

func TestGuardDefaults(t *testing.T) {
	r := loadGuardText(t, "guard: orders-ok\ntopic: orders\nchecks:\n  - check: value.id != nil\n")
	want := "guard orders-ok topic=orders format=json on_reject=reject dead_letter=\n" +
		"check \"value.id != nil\" message=\"check `value.id != nil` failed\" cond=value.id != nil\n"
	if got := describeGuard(r); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	r = loadGuardText(t, "guard: orders-ok\ntopic: orders.*\non_reject: dead_letter\nformat: raw\nchecks: [valid_json]\n")
	want = "guard orders-ok topic=orders.* format=raw on_reject=dead_letter dead_letter=orders-ok.rejected\n" +
		"check \"valid_json\" message=\"check `valid_json` failed\" cond=<built-in>\n"
	if got := describeGuard(r); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	// A check written in block form is named by its source, trimmed.
	r = loadGuardText(t, "guard: g\ntopic: t\nchecks:\n  - check: |\n      value.a > 0\n        && value.b > 0\n")
	if n := r.Guard.Checks[0].Name; n != "value.a > 0\n  && value.b > 0" {
		t.Errorf("block check name %q", n)
	}
}

func TestGuardRefusals(t *testing.T) {
	const ok = "guard: g\ntopic: t\n"
	cases := []struct {
		name, file string
		want       []string
	}{
		{"a route key", ok + "checks: [valid_json]\nsink: out\n",
			[]string{"r.yaml:4:1: unknown field `sink` in guard file; known fields: guard, topic, format, on_reject, dead_letter, checks, schema_registry, message_indexes (near `sink`)"}},
		{"unknown key", ok + "checks: [valid_json]\nformt: raw\n",
			[]string{"r.yaml:4:1: unknown field `formt` in guard file; did you mean `format`? (near `formt`)"}},
		{"unknown key in a check", ok + "checks:\n  - check: value.a > 0\n    mesage: x\n",
			[]string{"r.yaml:5:5: unknown field `mesage` in check; did you mean `message`? (near `mesage`)"}},
		{"missing guard", "topic: t\nchecks: [valid_json]\n",
			[]string{"r.yaml:1:1: missing `guard`: name the guard (letters, digits, `.`, `_`, `-`), e.g. `guard: payments-shape`"}},
		{"empty guard", "guard:\ntopic: t\nchecks: [valid_json]\n",
			[]string{"r.yaml:1:1: `guard` is empty; give it a value (near `guard`)"}},
		{"bad guard name", "guard: g h\ntopic: t\nchecks: [valid_json]\n",
			[]string{"r.yaml:1:8: guard name may contain only letters, digits, `.`, `_` and `-` (at most 200) (near `g h`)"}},
		{"missing topic", "guard: g\nchecks: [valid_json]\n",
			[]string{"r.yaml:1:1: missing `topic`: the topic whose produced records the guard checks, or a glob such as `payments.*`"}},
		{"missing checks", ok,
			[]string{"r.yaml:1:1: missing `checks`: the conditions every produced record must meet, e.g. `checks: [valid_json]`"}},
		{"empty checks list", ok + "checks: []\n",
			[]string{"r.yaml:3:1: `checks` is empty; list at least one check, e.g. `- check: value.amount > 0` (near `checks`)"}},
		{"null checks", ok + "checks:\n",
			[]string{"r.yaml:3:1: `checks` is empty; list at least one check, e.g. `- check: value.amount > 0` (near `checks`)"}},
		{"checks not a list", ok + "checks: valid_json\n",
			[]string{"r.yaml:3:9: `checks` must be a list, each item `- valid_json` or `- check: CONDITION` (near `checks`)"}},
		{"bad glob", "guard: g\ntopic: payments.[a-\nchecks: [valid_json]\n",
			[]string{"r.yaml:2:8: `topic` is not a valid glob (syntax error in pattern): `*` matches any characters, `?` one character, `[abc]` or `[a-z]` one of a set, `[^abc]` one not in it, `\\` quotes the next character (near `payments.[a-`)"}},
		{"glob with a character no topic has", "guard: g\ntopic: pay ments*\nchecks: [valid_json]\n",
			[]string{"r.yaml:2:8: `topic` glob holds ` `, which no Kafka topic name has: topic names use letters, digits, `.`, `_` and `-` (near `pay ments*`)"}},
		{"bad topic name", "guard: g\ntopic: pay/ments\nchecks: [valid_json]\n",
			[]string{"r.yaml:2:8: `topic` is not a valid Kafka topic name: use letters, digits, `.`, `_` and `-` (at most 249), or a glob such as `payments.*` (near `pay/ments`)"}},
		{"bad format", ok + "format: xml\nchecks: [valid_json]\n",
			[]string{"r.yaml:3:9: `format` must be one of json, raw, avro, protobuf (near `xml`)"}},
		{"bad on_reject", ok + "on_reject: deadletter\nchecks: [valid_json]\n",
			[]string{"r.yaml:3:12: `on_reject` must be one of reject, dead_letter; did you mean `dead_letter`? (near `deadletter`)"}},
		{"bad on_reject with dead_letter says it once", ok + "on_reject: drop\ndead_letter: t.dlq\nchecks: [valid_json]\n",
			[]string{"r.yaml:3:12: `on_reject` must be one of reject, dead_letter (near `drop`)"}},
		{"dead_letter without on_reject", ok + "dead_letter: t.dlq\nchecks: [valid_json]\n",
			[]string{"r.yaml:3:1: `dead_letter` applies only with `on_reject: dead_letter`; add `on_reject: dead_letter`, or remove `dead_letter` (with `on_reject: reject` nothing is copied) (near `dead_letter`)"}},
		{"dead_letter is the topic", ok + "on_reject: dead_letter\ndead_letter: t\nchecks: [valid_json]\n",
			[]string{"r.yaml:4:14: dead_letter topic `t` is matched by the guard's topic `t`: the guard would check its own dead letters. Choose a topic the guard does not match (near `t`)"}},
		{"dead_letter matched by the glob", "guard: g\ntopic: t.*\non_reject: dead_letter\ndead_letter: t.dlq\nchecks: [valid_json]\n",
			[]string{"r.yaml:4:14: dead_letter topic `t.dlq` is matched by the guard's topic `t.*`: the guard would check its own dead letters. Choose a topic the guard does not match (near `t.dlq`)"}},
		{"default dead_letter matched by the glob", "guard: t.x\ntopic: t.*\non_reject: dead_letter\nchecks: [valid_json]\n",
			[]string{"r.yaml:3:12: the default dead_letter topic `t.x.rejected` is matched by the guard's topic `t.*`: the guard would check its own dead letters. Set `dead_letter` to a topic the guard does not match (near `dead_letter`)"}},
		{"bad dead_letter name", ok + "on_reject: dead_letter\ndead_letter: a b\nchecks: [valid_json]\n",
			[]string{"r.yaml:4:14: `dead_letter` is not a valid Kafka topic name: use letters, digits, `.`, `_` and `-` (at most 249) (near `a b`)"}},
		{"check does not compile", ok + "checks:\n  - check: value.amount > 0 && valu.ok\n",
			[]string{"r.yaml:4:32: check does not compile: unknown name valu; did you mean `value`? (near `value.amount > 0 && valu.ok`)"}},
		{"check never boolean", ok + "checks:\n  - check: size + 1\n",
			[]string{"r.yaml:4:12: check must be true or false, but `size + 1` always gives a number or a string; write a condition such as `value.amount > 0` (near `size + 1`)"}},
		{"check of a known non-boolean type", ok + "checks:\n  - check: len(key)\n",
			[]string{"r.yaml:4:12: check must be true or false (expected bool, but got int); write a condition such as `value.amount > 0` (near `len(key)`)"}},
		{"check without check", ok + "checks:\n  - message: x\n",
			[]string{"r.yaml:4:5: check 1 needs `check`: the condition a record must meet, e.g. `check: value.amount > 0`"}},
		{"a bare condition", ok + "checks:\n  - valid_json\n  - value.amount > 0\n",
			[]string{"r.yaml:5:5: check 2 must be `- valid_json` or `- check: CONDITION` (with an optional `message` and `name`); for a condition write `- check: value.amount > 0` (near `value.amount > 0`)"}},
		{"empty check", ok + "checks:\n  -\n",
			[]string{"r.yaml:4:4: check 1 is empty; write `- valid_json` or `- check: CONDITION` (with an optional `message` and `name`)"}},
		{"a list as a check", ok + "checks:\n  - [a]\n",
			[]string{"r.yaml:4:5: check 1 must be `- valid_json` or `- check: CONDITION` (with an optional `message` and `name`), not a list"}},
		{"valid_json quoted", ok + "checks:\n  - \"valid_json\"\n",
			[]string{"r.yaml:4:5: `valid_json` is a built-in check: write it as a plain list item, `- valid_json`, without quotes or a tag (near `valid_json`)"}},
		{"valid_json tagged", ok + "checks:\n  - !!str valid_json\n",
			[]string{"r.yaml:4:5: `valid_json` is a built-in check: write it as a plain list item, `- valid_json`, without quotes or a tag (near `valid_json`)"}},
		{"valid_json as a mapping", ok + "checks:\n  - valid_json: true\n",
			[]string{"r.yaml:4:5: `valid_json` is a built-in check: write it as a plain list item, `- valid_json`, not as a mapping (near `valid_json`)"}},
		{"valid_json as a condition", ok + "checks:\n  - check: valid_json\n    message: not JSON\n",
			[]string{"r.yaml:4:12: `valid_json` is a built-in check: write it as a plain list item, `- valid_json`, not as `check: valid_json` (near `valid_json`)"}},
		{"valid_json misspelt", ok + "checks:\n  - valid-json\n",
			[]string{"r.yaml:4:5: unknown check `valid-json`; did you mean `valid_json`? (near `valid-json`)"}},
		{"duplicate given names", ok + "checks:\n  - check: value.a > 0\n    name: positive\n  - check: value.b > 0\n    name: positive\n",
			[]string{"r.yaml:7:11: check name `positive` is already used by the check at line 5; give each check its own `name` (near `positive`)"}},
		{"duplicate default names", ok + "checks:\n  - check: value.a > 0\n  - check: value.a > 0\n    message: again\n",
			[]string{"r.yaml:5:12: check name `value.a > 0` is already used by the check at line 4; give each check its own `name` (near `value.a > 0`)"}},
		{"a given name equal to a default name", ok + "checks:\n  - check: value.a > 0\n  - check: value.b > 0\n    name: value.a > 0\n",
			[]string{"r.yaml:6:11: check name `value.a > 0` is already used by the check at line 4; give each check its own `name` (near `value.a > 0`)"}},
		{"valid_json twice", ok + "checks:\n  - valid_json\n  - valid_json\n",
			[]string{"r.yaml:5:5: `valid_json` is listed twice (first at line 4); keep one (near `valid_json`)"}},
		{"a check named valid_json", ok + "checks:\n  - check: value.a > 0\n    name: valid_json\n",
			[]string{"r.yaml:5:11: `valid_json` names the built-in check; give this check another `name` (near `valid_json`)"}},
		{"a check reads offset", ok + "checks:\n  - check: key != \"\" && offset > 0\n",
			[]string{"r.yaml:4:25: check reads `offset`, but a guard checks records as they are produced, before they have an offset (near `key != \"\" && offset > 0`)"}},
		{"raw has no fields", ok + "format: raw\nchecks:\n  - check: value.a > 0\n",
			[]string{"r.yaml:5:18: check reads `value.a`, but with `format: raw` value is a string; use `format: json` or work on the string (near `value.a > 0`)"}},
		{"route and guard in one file", "route: r\nguard: g\ntopic: t\nchecks: [valid_json]\n",
			[]string{"r.yaml:2:1: a rule file is either a route (`route:`) or a guard (`guard:`), not both; put the guard in a file of its own (near `guard`)"}},
		{"several problems at once", "guard: g\ntopic: '['\non_reject: copy\nchecks:\n  - check: value.a +\n  - valid_jsn\n",
			[]string{
				"r.yaml:2:8: `topic` is not a valid glob (syntax error in pattern): `*` matches any characters, `?` one character, `[abc]` or `[a-z]` one of a set, `[^abc]` one not in it, `\\` quotes the next character (near `[`)",
				"r.yaml:3:12: `on_reject` must be one of reject, dead_letter (near `copy`)",
				"r.yaml:5:20: check does not compile: unexpected token EOF (near `value.a +`)",
				"r.yaml:6:5: unknown check `valid_jsn`; did you mean `valid_json`? (near `valid_jsn`)",
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := loadErrors(t, map[string]string{"r.yaml": tc.file})
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// produced is a record as the proxy hands it to Check.
func produced(topic, value string) *operators.Record {
	r := &operators.Record{Topic: topic, Partition: 2, Key: []byte("k1"), Timestamp: 1700000000000,
		Headers: []operators.Header{{Key: "source", Value: []byte("web")}}}
	if value != "<null>" {
		r.Raw = []byte(value)
	}
	return r
}

func TestGuardCheck(t *testing.T) {
	type want struct{ check, message string }
	pass := want{}
	cases := []struct {
		name   string
		guard  string
		values map[string]want
	}{
		{"json", exampleGuardDL, map[string]want{
			`{"amount": 12.5}`: pass,
			`{"amount": 0}`:    {"value.amount > 0", "amount must be positive"},
			`{"amount": 1, "pad": "` + strings.Repeat("x", 10240) + `"}`: {"max-size", "record larger than 10 KiB"},
			`{"amount": `:        {"valid_json", "value is not valid JSON: unexpected end of JSON input at offset 11"},
			``:                   {"valid_json", "value is not valid JSON: unexpected end of JSON input at offset 0"},
			`{"currency": "EU"}`: {"value.amount > 0", "value.amount > 0: invalid operation: <nil> > int (1:14)"},
			`<null>`:             {"value.amount > 0", "value.amount > 0: cannot fetch amount from <nil> (1:7)"},
		}},
		{"json without valid_json listed", "guard: g\ntopic: t\nchecks:\n  - check: value == nil || value.ok == true\n", map[string]want{
			`{"ok": true}`:  pass,
			`{"ok": false}`: {"value == nil || value.ok == true", "check `value == nil || value.ok == true` failed"},
			`not json`:      {"valid_json", "value is not valid JSON: invalid literal, want null at offset 0"},
			`<null>`:        pass, // a tombstone: value is nil
		}},
		{"raw", "guard: g\ntopic: t\nformat: raw\nchecks:\n  - check: value startsWith \"GET \"\n    name: method\n  - valid_json\n", map[string]want{
			`GET /`:   {"valid_json", "value is not valid JSON: invalid character 'G' looking for beginning of value at offset 0"},
			`POST /`:  {"method", "check `method` failed"},
			`<null>`:  {"method", "check `method` failed"},
			`"GET /"`: {"method", "check `method` failed"},
		}},
		{"raw valid_json first", "guard: g\ntopic: t\nformat: raw\nchecks:\n  - valid_json\n  - check: size < 10\n", map[string]want{
			`[1,2]`:               pass,
			`[1,2`:                {"valid_json", "value is not valid JSON: unexpected end of JSON input at offset 4"},
			`[1,2,3,4,5,6,7,8,9]`: {"size < 10", "check `size < 10` failed"},
			`<null>`:              pass, // nothing to decode, size 0
		}},
		{"the record environment", "guard: g\ntopic: 'p.*'\nchecks:\n" +
			"  - check: key == \"k1\" && headers[\"source\"] == \"web\" && topic == \"p.eu\" && partition == 2 && timestamp == 1700000000000\n    name: env\n" +
			"  - check: size == 2\n    name: size\n", map[string]want{
			`{}`:  pass,
			`[ ]`: {"size", "check `size` failed"},
		}},
		{"a result that is not a bool", "guard: g\ntopic: t\nchecks:\n  - check: value.flag\n", map[string]want{
			`{"flag": true}`: pass,
			`{"flag": 1}`:    {"value.flag", "value.flag: result is float64 (1), not true or false"},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := loadGuardText(t, tc.guard).Guard
			for v, w := range tc.values {
				topic := "t"
				if strings.Contains(tc.guard, "p.*") {
					topic = "p.eu"
				} else if strings.Contains(tc.guard, "payments") {
					topic = "payments"
				}
				check, msg, ok := g.Check(produced(topic, v))
				if ok != (w == pass) || check != w.check || msg != w.message {
					t.Errorf("value %.40q: got (%q, %q, %v), want (%q, %q, %v)", v, check, msg, ok, w.check, w.message, w == pass)
				}
			}
		})
	}
}

// A Record reused for another record is checked as that record.
func TestGuardCheckReusedRecord(t *testing.T) {
	g := loadGuardText(t, "guard: g\ntopic: t\nchecks:\n  - check: key == \"b\"\n").Guard
	r := produced("t", `{}`)
	r.Key = []byte("a")
	if _, _, ok := g.Check(r); ok {
		t.Fatal("key a passed")
	}
	r.Key = []byte("b")
	if c, m, ok := g.Check(r); !ok {
		t.Fatalf("key b failed: %s: %s", c, m)
	}
}

func TestGuardCheckConcurrent(t *testing.T) {
	g := loadGuardText(t, exampleGuardDL).Guard
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				amount := (w+i)%3 - 1 // -1, 0, 1
				_, _, ok := g.Check(produced("payments", fmt.Sprintf(`{"amount": %d, "i": %d}`, amount, i)))
				if ok != (amount > 0) {
					errs <- fmt.Sprintf("amount %d: ok %v", amount, ok)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestGuardMatches(t *testing.T) {
	cases := []struct {
		topic string
		yes   []string
		no    []string
	}{
		{"payments", []string{"payments"}, []string{"payments.eu", "payment", "Payments", ""}},
		{"payments.*", []string{"payments.eu", "payments.", "payments.eu.v2"}, []string{"payments", "paymentsXeu", "x.payments.eu"}},
		{"payments-?", []string{"payments-1", "payments-a"}, []string{"payments-", "payments-12"}},
		{"orders.[a-c]*", []string{"orders.a", "orders.beta"}, []string{"orders.d", "orders."}},
		{"orders.[^a]", []string{"orders.b"}, []string{"orders.a", "orders.bb"}},
		{`lit\*`, []string{"lit*"}, []string{"lit", "litx"}},
		{"*", []string{"anything", "a.b-c_d"}, nil},
	}
	for _, tc := range cases {
		g := &Guard{Topic: tc.topic}
		for _, x := range tc.yes {
			if !g.Matches(x) {
				t.Errorf("%q does not match %q", tc.topic, x)
			}
		}
		for _, x := range tc.no {
			if g.Matches(x) {
				t.Errorf("%q matches %q", tc.topic, x)
			}
		}
	}
	// Every topic of the table loads as a guard topic.
	for _, tc := range cases {
		if tc.topic == `lit\*` {
			continue // `*` is no topic character, but the glob is valid
		}
		loadGuardText(t, fmt.Sprintf("guard: g\ntopic: '%s'\nchecks: [valid_json]\n", tc.topic))
	}
}

func TestLoadDirGuardsAlongsideRoutes(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"a-route.yaml": "route: copy\nsource: { topic: a }\nsink: { topic: a.out }\n",
		"b-guard.yaml": exampleGuardDL,
		"c-guard.yml":  "guard: orders-shape\ntopic: orders.*\nchecks: [valid_json]\n",
	})
	routes, errs := LoadDir(dir)
	if len(errs) != 0 {
		t.Fatalf("errors: %v", errs)
	}
	var got []string
	for _, r := range routes {
		kind := "route"
		if r.Guard != nil {
			kind = "guard on " + r.Guard.Topic
		}
		got = append(got, r.Name+" ("+kind+")")
	}
	if s := strings.Join(got, ", "); s != "copy (route), payments-shape (guard on payments), orders-shape (guard on orders.*)" {
		t.Errorf("LoadDir = %s", s)
	}
}

func TestGuardAndRouteShareNames(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"a.yaml": "route: payments-shape\nsource: { topic: a }\nsink: { topic: a.out }\n",
		"b.yaml": exampleGuardDL,
		"c.yaml": "guard: c\ntopic: c\nchecks: [valid_json]\n",
		"d.yaml": "# two guards\nguard: c\ntopic: d\nchecks: [valid_json]\n",
		"e.yaml": "route: c\nsource: { topic: e }\nsink: { topic: e.out }\n",
	})
	routes, errs := LoadDir(dir)
	if len(routes) != 2 || routes[0].Name != "payments-shape" || routes[0].Guard != nil || routes[1].Name != "c" || routes[1].Guard == nil {
		t.Errorf("routes %v: want a.yaml's route and c.yaml's guard", routes)
	}
	var got []string
	for _, e := range errs {
		got = append(got, strings.ReplaceAll(e.Error(), dir+"/", ""))
	}
	want := []string{
		"b.yaml:1:8: guard name `payments-shape` is already used by the route at a.yaml:1:8; route and guard names must be unique in the rules directory, rename one of them (near `payments-shape`)",
		"d.yaml:2:8: guard name `c` is already used by the guard at c.yaml:1:8; route and guard names must be unique in the rules directory, rename one of them (near `c`)",
		"e.yaml:1:8: route name `c` is already used by the guard at c.yaml:1:8; route and guard names must be unique in the rules directory, rename one of them (near `c`)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// The watcher refuses the same way.
	h := startWatch(t, dir)
	a := h.next()
	got = got[:0]
	for _, e := range a.errs {
		got = append(got, strings.ReplaceAll(e.Error(), dir+"/", ""))
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("watcher errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// b.yaml and d.yaml are guards with nothing in force: they fail closed
	// on their topics (a stand-in guard each, Guard.Closed).
	closed := map[string]string{}
	for _, r := range a.routes {
		if r.Guard != nil && r.Guard.Closed != "" {
			closed[filepath.Base(r.File)] = r.Guard.Topic
		}
	}
	if len(a.routes) != 4 || metricValue(h.w.routes) != 1 || closed["b.yaml"] != "payments" || closed["d.yaml"] != "d" {
		t.Errorf("watcher: %d routes, gauge %v, closed %v: want a route, a guard and two closed guards, the gauge counting the route only", len(a.routes), metricValue(h.w.routes), closed)
	}
}

func TestCheckPathsGuard(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"a.yaml": "route: a\nsource: { topic: a }\nsink: { topic: a.out }\n",
		"b.yaml": exampleGuardDL,
		"c.yaml": "guard: c\ntopic: 'c.*'\nchecks: [valid_json]\n",
		"d.yaml": "guard: a\ntopic: d\nchecks:\n  - check: valu.x\n",
	})
	var out bytes.Buffer
	if CheckPaths(&out, []string{dir}) {
		t.Error("CheckPaths accepted d.yaml")
	}
	want := strings.Join([]string{
		"ok a.yaml",
		"ok b.yaml (guard payments-shape: topic payments, 3 checks)",
		"ok c.yaml (guard c: topic c.*, 1 check)",
		"d.yaml:1:8: guard name `a` is already used by the route at a.yaml:1:8; route and guard names must be unique in the rules directory, rename one of them (near `a`)",
		"d.yaml:4:12: check does not compile: unknown name valu; did you mean `value`? (near `valu.x`)",
		"",
	}, "\n")
	if got := strings.ReplaceAll(out.String(), dir+"/", ""); got != want {
		t.Errorf("output:\n%s\nwant:\n%s", got, want)
	}
}

// guardNames is what a watcher applied: each guard as name[topic:checks].
func guardNames(a applied) string {
	var parts []string
	for _, r := range a.routes {
		if g := r.Guard; g != nil {
			var names []string
			for _, c := range g.Checks {
				names = append(names, c.Name)
			}
			parts = append(parts, fmt.Sprintf("%s[%s:%s]", r.Name, g.Topic, strings.Join(names, ",")))
		}
	}
	return strings.Join(parts, " ")
}

func TestWatchGuardHotReload(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "shape.yaml")
	v1 := "guard: shape\ntopic: orders\nchecks:\n  - check: value.total > 0\n    name: positive\n"
	write(t, p, v1)
	write(t, filepath.Join(dir, "copy.yaml"), rule("copy", "true"))
	h := startWatch(t, dir)
	first := h.next()
	if got := guardNames(first); got != "shape[orders:positive]" || len(first.routes) != 2 || len(first.errs) != 0 {
		t.Fatalf("initial = %q (%d routes, errors %v)", got, len(first.routes), first.errs)
	}

	// An edit applies the new version.
	write(t, p, "guard: shape\ntopic: orders.*\nchecks:\n  - valid_json\n  - check: value.total > 0\n    name: positive\n")
	second := h.next()
	if got := guardNames(second); got != "shape[orders.*:valid_json,positive]" || len(second.errs) != 0 {
		t.Fatalf("after edit = %q, errors %v", got, second.errs)
	}
	var g *Guard
	for _, r := range second.routes {
		if r.Guard != nil {
			g = r.Guard
		}
	}
	if _, _, ok := g.Check(produced("orders.eu", `{"total": 0}`)); ok {
		t.Error("the new version does not reject total 0")
	}

	// A broken edit keeps the last good version, with the error.
	write(t, p, "guard: shape\ntopic: orders.*\nchecks:\n  - check: value.total >\n")
	third := h.next()
	if got := guardNames(third); got != "shape[orders.*:valid_json,positive]" {
		t.Fatalf("after a broken edit = %q, want the last good version", got)
	}
	want := p + ":4:24: check does not compile: unexpected token EOF (near `value.total >`)"
	if len(third.errs) != 1 || third.errs[0].Error() != want {
		t.Fatalf("errors %v\nwant %s", third.errs, want)
	}
	for _, r := range third.routes {
		if r.Guard != nil && r.Hash != second.routes[0].Hash && r.Hash != second.routes[1].Hash {
			t.Error("the guard kept is not the last good version")
		}
	}
	if h.metric("error") != 1 {
		t.Errorf("error reloads %v, want 1", h.metric("error"))
	}

	// Deleting the file removes the guard.
	must(t, os.Remove(p))
	if got := h.next(); guardNames(got) != "" || len(got.routes) != 1 || len(got.errs) != 0 {
		t.Fatalf("after delete: guards %q, %d routes, errors %v", guardNames(got), len(got.routes), got.errs)
	}
}

// BenchmarkGuardCheck: a 1 KiB JSON record through a guard of two checks,
// as the produce path runs it.
func BenchmarkGuardCheck(b *testing.B) {
	dir := b.TempDir()
	p := filepath.Join(dir, "g.yaml")
	if err := os.WriteFile(p, []byte("guard: g\ntopic: payments\nchecks:\n"+
		"  - check: value.amount > 0 && value.currency in [\"EUR\", \"USD\"]\n    name: amount\n"+
		"  - check: size <= 10240\n    name: max-size\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	r, err := LoadFile(p)
	if err != nil {
		b.Fatal(err)
	}
	g := r.Guard
	value := benchValue(1024)
	rec := produced("payments", string(value))
	if _, m, ok := g.Check(rec); !ok {
		b.Fatalf("the benchmark record fails: %s", m)
	}
	b.SetBytes(int64(len(value)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rec := operators.Record{Topic: "payments", Partition: 1, Key: []byte("user-42"), Raw: value, Timestamp: 1700000000000}
		if _, _, ok := g.Check(&rec); !ok {
			b.Fatal("failed")
		}
	}
}

// benchValue is a JSON payment object of about n bytes.
func benchValue(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"txn_id": "t-000123", "amount": 42.5, "currency": "EUR", "merchant_id": "m-17", "user_id": "u-99", "items": [`)
	for i := 0; b.Len() < n-40; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, `{"sku": "sku-%04d", "qty": %d}`, i, i%5+1)
	}
	b.WriteString(`], "status": "ok"}`)
	return b.Bytes()
}

// TestGuardMembers: a JSON guard decodes only the members its checks read,
// and a check reading `value` whole decodes it whole. Every verdict and
// message is what a whole decode gives, for valid values, values that
// are not JSON, and non-objects.
func TestGuardMembers(t *testing.T) {
	cases := []struct {
		guard   string
		members []string // nil: decoded whole
	}{
		{exampleGuardDL, []string{"amount"}},
		{"guard: g\ntopic: t\nchecks:\n  - valid_json\n  - check: size < 100\n", []string{}},
		{"guard: g\ntopic: t\nchecks:\n  - check: value.card.country in ['DE', 'FR'] && value.amount < 10\n", []string{"amount", "card"}},
		{"guard: g\ntopic: t\nchecks:\n  - check: value == nil || value.ok == true\n", nil},
		{"guard: g\ntopic: t\nchecks:\n  - check: len(value) > 1\n", nil},
		{"guard: g\ntopic: t\nchecks:\n  - check: value[headers['f']] != nil\n", nil},
		{"guard: g\ntopic: t\nformat: raw\nchecks:\n  - check: len(value) < 10\n", nil},
	}
	values := []string{
		`{"amount": 12.5, "card": {"country": "DE"}, "pad": "` + strings.Repeat("y", 300) + `"}`,
		`{"amount": 0}`, `{"amount": 5, "card": {"country": "US"}}`, `{"ok": true, "amount": 1}`,
		`{"amount": 1, "junk": [1, 2, {"a": tru}]}`, `{"amount": 1, "s": "\u00e9\ud83d\ude00"}`,
		`{"amount": 1, "s": "bad \x escape"}`, `{"amount": 1, "n": 1e400}`, `{"amount": 1, "n": 01}`,
		`{"amount": 1,}`, `{"amount": 1} trailing`, `[1, 2]`, `"str"`, `42`, `null`, `<null>`,
		`{"amount": 1, "card": {"country": "DE"}, "dup": 1, "dup": 2}`, `{`, ``, " \t{\"amount\":3}\n",
	}
	for i, tc := range cases {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			g := loadGuardText(t, tc.guard).Guard
			if (g.Members == nil) != (tc.members == nil) {
				t.Fatalf("Members %v, want %v", g.Members, tc.members)
			}
			for _, m := range tc.members {
				if _, ok := g.Members[m]; !ok || len(g.Members) != len(tc.members) {
					t.Fatalf("Members %v, want %v", g.Members, tc.members)
				}
			}
			whole := *g
			whole.Members = nil
			for _, v := range values {
				c1, m1, ok1 := g.Check(produced("t", v))
				c2, m2, ok2 := whole.Check(produced("t", v))
				if c1 != c2 || m1 != m2 || ok1 != ok2 {
					t.Errorf("value %.60q: in part (%q, %q, %v), whole (%q, %q, %v)", v, c1, m1, ok1, c2, m2, ok2)
				}
			}
		})
	}
}

// FuzzGuardMembers: a guard decoding only the members its checks read
// gives every value the verdict and message of a whole decode.
func FuzzGuardMembers(f *testing.F) {
	for _, s := range []string{`{"amount": 1, "card": {"country": "DE"}}`, `{"amount": 0, "x": [1, {"y": null}]}`,
		`{"amount": 1, "n": 1e400}`, `{"amount": "1"}`, `[]`, `{`, `{"card": {"country": "FR"}, "amount": 3.5e0}`} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	p := filepath.Join(dir, "g.yaml")
	if err := os.WriteFile(p, []byte("guard: g\ntopic: t\nchecks:\n  - check: value.amount > 0 && value.card?.country != 'US'\n  - check: size < 4096\n"), 0o600); err != nil {
		f.Fatal(err)
	}
	r, err := LoadFile(p)
	if err != nil {
		f.Fatal(err)
	}
	g := r.Guard
	if g.Members == nil {
		f.Fatal("the guard decodes whole")
	}
	whole := *g
	whole.Members = nil
	f.Fuzz(func(t *testing.T, v []byte) {
		r1 := &operators.Record{Topic: "t", Raw: v}
		r2 := &operators.Record{Topic: "t", Raw: v}
		c1, m1, ok1 := g.Check(r1)
		c2, m2, ok2 := whole.Check(r2)
		if c1 != c2 || m1 != m2 || ok1 != ok2 {
			t.Fatalf("value %q: in part (%q, %q, %v), whole (%q, %q, %v)", v, c1, m1, ok1, c2, m2, ok2)
		}
	})
}
