package rules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rtproxy/rtproxy/operators"
)

const testSalt = "0123456789abcdef-test-salt"

// exampleView is the view of issue 28.
const exampleView = `view: payments.for-analytics
topic: payments
hash_salt_file: salt
steps:
  - filter: value.status != "test"
  - set:
      card: mask(value.card, 4)
      email: hash(value.email)
`

// viewDir writes files into a new rules directory (with a salt file).
func viewDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	write(t, filepath.Join(dir, "salt"), testSalt+"\n")
	for name, content := range files {
		write(t, filepath.Join(dir, name), content)
	}
	return dir
}

func loadViewText(t *testing.T, content string) *Route {
	t.Helper()
	dir := viewDir(t, map[string]string{"v.yaml": content})
	r, err := LoadFile(filepath.Join(dir, "v.yaml"))
	if err != nil {
		t.Fatalf("view refused: %v", err)
	}
	if r.View == nil {
		t.Fatal("loaded as a route or guard, not a view")
	}
	return r
}

// runView runs a view on one value and returns what the client gets.
func runView(t *testing.T, v *View, value string, null bool) (string, bool, error) {
	t.Helper()
	rec := &ViewRecord{Topic: v.Topic, Partition: 1, Offset: 7, Key: []byte("k"), Raw: []byte(value), Timestamp: 1700000000000}
	if null {
		rec.Raw = nil
	}
	out, keep, err := v.Run(rec, nil)
	if null && out != nil {
		t.Fatalf("a null value came out as %q", out)
	}
	return string(out), keep, err
}

func jsonEqual(t *testing.T, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("output %q is not JSON: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if !bytes.Equal(gb, wb) {
		t.Fatalf("got %s\nwant %s", got, want)
	}
}

func TestViewExample(t *testing.T) {
	r := loadViewText(t, exampleView)
	v := r.View
	if r.Name != "payments.for-analytics" || v.Topic != "payments" || r.InPlace() || v.Clients != nil || v.Format != FormatJSON || len(r.Steps) != 2 || !hex64.MatchString(r.Hash) {
		t.Fatalf("view = %+v %+v", r, v)
	}
	if got := r.ViewSummary(); got != "topic payments, every client, 2 steps" {
		t.Errorf("summary %q", got)
	}
	out, keep, err := runView(t, v, `{"status":"ok","card":"4111111111111111","email":"ann@example.com","amount":12.5,"note":"x"}`, false)
	if err != nil || !keep {
		t.Fatalf("keep %v err %v", keep, err)
	}
	want := `{"status":"ok","card":"************1111","email":"` + operators.HashString([]byte(testSalt), "ann@example.com") + `","amount":12.5,"note":"x"}`
	jsonEqual(t, out, want)
	if _, keep, err := runView(t, v, `{"status":"test","card":"1"}`, false); keep || err != nil {
		t.Fatalf("a test record: keep %v err %v, want filtered out", keep, err)
	}
	// Not JSON: an error (the proxy withholds the value), never the original.
	if out, keep, err := runView(t, v, `{"status":`, false); err == nil || keep || out != "" || !strings.Contains(err.Error(), "not valid JSON") {
		t.Fatalf("bad JSON: %q keep %v err %v", out, keep, err)
	}
	// set on a value that is not an object: an error too.
	_, _, err = runView(t, v, `{"status":"ok","card":{"n":1}}`, false)
	var ve *ViewError
	if !errors.As(err, &ve) || ve.Error() != "step 2 (set) failed: an expression failed on this record" || !strings.Contains(ve.Detail, "mask: argument is an object") {
		t.Fatalf("a card that is an object: err %v", err)
	}
	// A tombstone passes the filter and stays null.
	if _, keep, err := runView(t, v, "", true); !keep || err != nil {
		t.Fatalf("tombstone: keep %v err %v", keep, err)
	}
}

// TestViewDropRemovesUndecodedMembers: a view whose expressions read one
// member decodes the value in part; a dropped member must not come back
// from the raw bytes when the value is spliced back together.
func TestViewDropRemovesUndecodedMembers(t *testing.T) {
	r := loadViewText(t, "view: p.v\ntopic: p\nsteps:\n  - set:\n      card: mask(value.card, 2)\n  - drop: [email, ssn]\n")
	out, keep, err := runView(t, r.View, `{"card":"1234","email":"a@b","ssn":"078-05-1120","other":{"x":[1,2]}}`, false)
	if err != nil || !keep {
		t.Fatalf("keep %v err %v", keep, err)
	}
	jsonEqual(t, out, `{"card":"**34","other":{"x":[1,2]}}`)
	// Without drop the view decodes only what it reads, and keeps the rest
	// as it was (bytes spliced back).
	r = loadViewText(t, "view: p.v\ntopic: p\nsteps:\n  - set:\n      card: mask(value.card, 2)\n")
	if r.View.Members == nil {
		t.Fatal("a view reading one member decodes whole")
	}
	out, _, _ = runView(t, r.View, `{"card":"1234","email":"a@b"}`, false)
	jsonEqual(t, out, `{"card":"**34","email":"a@b"}`)
}

func TestViewInPlaceAndClients(t *testing.T) {
	r := loadViewText(t, `view: payments
topic: payments
clients:
  client_id: ["analytics-*", "bi"]
  principal: ["User:analyst?"]
  tls_subject: "CN=reports,*"
steps:
  - map: { id: value.id, amount: value.amount }
`)
	if !r.InPlace() {
		t.Fatal("a view named as its topic is not in place")
	}
	for _, c := range []struct {
		m    ViewClientMatch
		want bool
	}{
		{ViewClientMatch{ClientID: "analytics-eu"}, true},
		{ViewClientMatch{ClientID: "analytics-"}, true},
		{ViewClientMatch{ClientID: "bi"}, true},
		{ViewClientMatch{ClientID: "bix"}, false},
		{ViewClientMatch{ClientID: "payments-consumer"}, false},
		{ViewClientMatch{ClientID: ""}, false},
		{ViewClientMatch{ClientID: "x", Principal: "User:analyst1"}, true},
		{ViewClientMatch{ClientID: "x", Principal: "User:analyst12"}, false},
		{ViewClientMatch{ClientID: "x", TLSSubject: "CN=reports,O=Acme/Unit"}, true},
		{ViewClientMatch{ClientID: "x", TLSSubject: "CN=other"}, false},
	} {
		if got := r.View.AppliesTo(c.m); got != c.want {
			t.Errorf("AppliesTo(%+v) = %v, want %v", c.m, got, c.want)
		}
	}
	out, _, err := runView(t, r.View, `{"id":"p1","amount":3,"card":"4111"}`, false)
	if err != nil {
		t.Fatal(err)
	}
	jsonEqual(t, out, `{"id":"p1","amount":3}`)
}

func TestViewRawFormat(t *testing.T) {
	r := loadViewText(t, "view: logs.masked\ntopic: logs\nformat: raw\nsteps:\n  - filter: value startsWith \"GET\"\n  - map:\n      line: mask(value, 3)\n")
	out, keep, err := runView(t, r.View, "GET /x", false)
	if err != nil || !keep {
		t.Fatal(keep, err)
	}
	jsonEqual(t, out, `{"line":"*** /x"}`)
	if _, keep, _ := runView(t, r.View, "POST /x", false); keep {
		t.Fatal("POST passed the filter")
	}
	// A raw view without steps passes the bytes as they are (an alias).
	r = loadViewText(t, "view: logs.alias\ntopic: logs\nformat: raw\n")
	if out, keep, err := runView(t, r.View, "\xff\x00bin", false); out != "\xff\x00bin" || !keep || err != nil {
		t.Fatalf("alias: %q %v %v", out, keep, err)
	}
}

// TestViewRawEmptyValueStaysEmpty: a raw view passes an empty value (not
// a null) as an empty value, with or without a buffer to build it in: a
// null is a tombstone on a compacted topic, so an empty value turned null
// would delete its key for the view's clients.
func TestViewRawEmptyValueStaysEmpty(t *testing.T) {
	for _, text := range []string{
		"view: logs.alias\ntopic: logs\nformat: raw\n",
		"view: logs.empty\ntopic: logs\nformat: raw\nsteps:\n  - filter: value == \"\"\n",
	} {
		r := loadViewText(t, text)
		for _, dst := range [][]byte{nil, make([]byte, 0, 8)} {
			rec := &ViewRecord{Topic: "logs", Raw: []byte{}}
			out, keep, err := r.View.Run(rec, dst)
			if err != nil || !keep || out == nil || len(out) != 0 {
				t.Errorf("%q, dst cap %d: %q (nil %v) %v %v, want an empty value", text, cap(dst), out, out == nil, keep, err)
			}
		}
	}
}

// TestViewRefused: what check refuses in a view file, each at its place.
func TestViewRefused(t *testing.T) {
	cases := []struct {
		name, file, want string
	}{
		{"window", "view: a.v\ntopic: a\nsteps:\n  - window: { size: 1m, aggregate: { n: count() } }\n", "v.yaml:4:5: a view runs per-record steps only (filter, set, map, drop): `window` keeps state"},
		{"explode", "view: a.v\ntopic: a\nsteps:\n  - explode: value.items\n", "v.yaml:4:5: a view runs per-record steps only (filter, set, map, drop): `explode` makes several records"},
		{"dedup", "view: a.v\ntopic: a\nsteps:\n  - filter: true\n  - drop_duplicates: { key: value.id, within: 1m }\n", "v.yaml:5:5: a view runs per-record steps only (filter, set, map, drop): `drop_duplicates`"},
		{"join", "view: a.v\ntopic: a\nsteps:\n  - join: { table: t, on: value.id }\n", "v.yaml:4:5: a view runs per-record steps only (filter, set, map, drop): `join` reads a table"},
		{"in place without clients", "view: a\ntopic: a\nsteps:\n  - filter: true\n", "v.yaml:1:7: view `a` is in place (its name is its topic), so it must name the clients"},
		{"in place without steps", "view: a\ntopic: a\nclients: { client_id: [x] }\n", "v.yaml:1:7: in-place view `a` has no `steps`"},
		{"hash without salt", "view: a.v\ntopic: a\nsteps:\n  - set: { e: hash(value.e) }\n", "v.yaml:4:15: hash() needs a salt, and this view has no `hash_salt_file`"},
		{"short salt", "view: a.v\ntopic: a\nhash_salt_file: short\n", "holds 5 bytes, fewer than 16"},
		{"salt missing", "view: a.v\ntopic: a\nhash_salt_file: nope\n", "v.yaml:3:17: hash_salt_file: cannot read"},
		{"salt outside", "view: a.v\ntopic: a\nhash_salt_file: /etc/hostname\n", "is outside the rules directory and not allowed by the proxy's rules.allow"},
		{"avro", "view: a.v\ntopic: a\nformat: avro\n", "v.yaml:3:9: a view reads format json or raw"},
		{"bad name", "view: a/b\ntopic: a\n", "v.yaml:1:7: `view` is not a valid Kafka topic name"},
		{"no topic", "view: a.v\n", "v.yaml:1:1: missing `topic`"},
		{"empty clients", "view: a.v\ntopic: a\nclients: {}\n", "`clients` names no client"},
		{"clients not a list", "view: a.v\ntopic: a\nclients: { client_id: {x: 1} }\n", "`clients.client_id` must be a list"},
		{"unknown client key", "view: a.v\ntopic: a\nclients: { client: [x] }\n", "unknown field `client` in clients; did you mean `client_id`?"},
		{"unknown key", "view: a.v\ntopic: a\nstep: []\n", "unknown field `step` in view file; did you mean `steps`?"},
		{"view and route", "view: a.v\nroute: r\ntopic: a\n", "not two of them"},
		{"drop raw", "view: a.v\ntopic: a\nformat: raw\nsteps:\n  - drop: [x]\n", "`drop` removes fields of a JSON object, but with `format: raw`"},
		{"drop empty", "view: a.v\ntopic: a\nsteps:\n  - drop: []\n", "`drop` must be a list of field names"},
		{"drop twice", "view: a.v\ntopic: a\nsteps:\n  - drop: [x, x]\n", "field `x` is listed twice"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := viewDir(t, map[string]string{"v.yaml": c.file, "short": "12345\n"})
			_, err := LoadFile(filepath.Join(dir, "v.yaml"))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err:\n%v\nwant one containing:\n%s", err, c.want)
			}
		})
	}
}

// TestHashOnlyInViews: a route or guard cannot call hash(): there is no
// salt to key it with.
func TestHashOnlyInViews(t *testing.T) {
	dir := viewDir(t, map[string]string{
		"r.yaml": "route: r\nsource: { topic: a }\nsink: { topic: b }\nsteps:\n  - set: { e: hash(value.e) }\n",
		"g.yaml": "guard: g\ntopic: a\nchecks:\n  - check: hash(value.e) != \"\"\n",
	})
	for _, f := range []string{"r.yaml", "g.yaml"} {
		_, err := LoadFile(filepath.Join(dir, f))
		if err == nil || !strings.Contains(err.Error(), "hash() is keyed with a view's salt") {
			t.Errorf("%s: err %v", f, err)
		}
	}
	// mask is fine anywhere.
	write(t, filepath.Join(dir, "m.yaml"), "route: m\nsource: { topic: a }\nsink: { topic: b }\nsteps:\n  - set:\n      c: mask(value.c, 4)\n  - drop: [e]\n")
	if _, err := LoadFile(filepath.Join(dir, "m.yaml")); err != nil {
		t.Fatal(err)
	}
}

// TestViewSaltAllowed: a salt outside the rules directory loads when
// rules.allow.files lists it, and a new salt changes the view's hash.
func TestViewSaltAllowed(t *testing.T) {
	secrets := t.TempDir()
	salt := filepath.Join(secrets, "salt")
	write(t, salt, testSalt)
	dir := viewDir(t, map[string]string{"v.yaml": "view: a.v\ntopic: a\nhash_salt_file: " + salt + "\nsteps:\n  - set: { e: hash(value.e) }\n"})
	o := Options{Allow: &Allow{Files: []string{secrets}}}
	r, err := LoadFileWith(filepath.Join(dir, "v.yaml"), o)
	if err != nil {
		t.Fatal(err)
	}
	write(t, salt, testSalt+"-rotated")
	r2, err := LoadFileWith(filepath.Join(dir, "v.yaml"), o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Hash == r2.Hash {
		t.Fatal("a new salt does not change the view's hash: it would not reload")
	}
	a, _, _ := runView(t, r.View, `{"e":"x"}`, false)
	b, _, _ := runView(t, r2.View, `{"e":"x"}`, false)
	if a == b {
		t.Fatal("two salts hash alike")
	}
}

// TestViewGraph: names and topics across the files of a directory.
func TestViewGraph(t *testing.T) {
	cases := []struct {
		name  string
		files map[string]string
		want  string // an error of b.yaml; "" none
	}{
		{"virtual name is a route's sink", map[string]string{
			"a.yaml": "route: r\nsource: { topic: in }\nsink: { topic: out }\n",
			"b.yaml": "view: out\ntopic: in\n",
		}, "b.yaml:1:7: view name `out` is a real topic: route `r`"},
		{"route writes a virtual name", map[string]string{
			"a.yaml": "view: shadow\ntopic: in\n",
			"b.yaml": "route: r\nsource: { topic: in }\nsink: { topic: shadow }\n",
		}, "b.yaml:3:16: sink.topic `shadow` is the virtual name of view `shadow`"},
		{"two views of one name", map[string]string{
			"a.yaml": "view: p\ntopic: p\nclients: { client_id: [a] }\nsteps: [ { filter: true } ]\n",
			"b.yaml": "view: p\ntopic: p\nclients: { client_id: [b] }\nsteps: [ { filter: true } ]\n",
		}, "b.yaml:1:7: view name `p` is already used by the view at"},
		{"views do not chain", map[string]string{
			"a.yaml": "view: p.v\ntopic: p\n",
			"b.yaml": "view: p.vv\ntopic: p.v\n",
		}, "b.yaml:2:8: `topic` `p.v` is the virtual name of view `p.v`"},
		{"a virtual name hides another view's topic", map[string]string{
			"a.yaml": "view: q.v\ntopic: p\n",
			"b.yaml": "view: p\ntopic: x\n",
		}, "b.yaml:1:7: view name `p` is the topic view `q.v`"},
		{"a virtual name is a route's internal topic", map[string]string{
			"a.yaml": "route: r\nsource: { topic: in }\nsink: { topic: out }\nsteps:\n  - drop_duplicates: { key: value.id, ttl: 1h }\n",
			"b.yaml": "view: r.00-drop_duplicates.changelog\ntopic: in\n",
		}, "b.yaml:1:7: view name `r.00-drop_duplicates.changelog` is an internal topic of route `r`"},
		{"a virtual name is a guard's dead letters", map[string]string{
			"a.yaml": "guard: g\ntopic: in\non_reject: dead_letter\nchecks: [valid_json]\n",
			"b.yaml": "view: g.rejected\ntopic: in\n",
		}, "b.yaml:1:7: view name `g.rejected` is the dead-letter topic guard `g`"},
		{"a guard's dead letters are a virtual name", map[string]string{
			"a.yaml": "view: shadow\ntopic: in\n",
			"b.yaml": "guard: g\ntopic: in\non_reject: dead_letter\ndead_letter: shadow\nchecks: [valid_json]\n",
		}, "b.yaml:4:14: dead_letter `shadow` is the virtual name of view `shadow`"},
		{"a route and a view may share a name", map[string]string{
			"a.yaml": "route: payments\nsource: { topic: in }\nsink: { topic: out }\n",
			"b.yaml": "view: payments\ntopic: payments\nclients: { client_id: [a] }\nsteps: [ { filter: true } ]\n",
		}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := viewDir(t, c.files)
			routes, errs := LoadDir(dir)
			var got []string
			for _, e := range errs {
				got = append(got, strings.TrimPrefix(e.Error(), dir+"/"))
			}
			if c.want == "" {
				if len(errs) != 0 || len(routes) != 2 {
					t.Fatalf("errors %v, %d routes", got, len(routes))
				}
				return
			}
			if len(got) != 1 || !strings.HasPrefix(got[0], c.want) {
				t.Fatalf("errors %q\nwant one starting %q", got, c.want)
			}
			if len(routes) != 1 || !strings.HasSuffix(routes[0].File, "a.yaml") {
				t.Fatalf("the first file does not keep running: %d routes", len(routes))
			}
			var out bytes.Buffer
			if CheckPaths(&out, []string{dir}) || !strings.Contains(out.String(), c.want) {
				t.Fatalf("check:\n%s", out.String())
			}
		})
	}
}

func TestCheckPrintsViews(t *testing.T) {
	dir := viewDir(t, map[string]string{"v.yaml": exampleView})
	var out bytes.Buffer
	if !CheckPaths(&out, []string{dir}) {
		t.Fatal(out.String())
	}
	want := "ok " + filepath.Join(dir, "v.yaml") + " (view payments.for-analytics: topic payments, every client, 2 steps)\n"
	if out.String() != want {
		t.Fatalf("check said %q, want %q", out.String(), want)
	}
}

// TestWatchViewInvalidFailsClosed: an in-place view whose file does not
// load, with no valid version, stands in closed: every record is an
// error for every client, so nobody gets the originals it should mask.
// Fixed, it applies; broken again, its last good version keeps running.
func TestWatchViewInvalidFailsClosed(t *testing.T) {
	dir := viewDir(t, nil)
	p := filepath.Join(dir, "v.yaml")
	write(t, p, "view: payments\ntopic: payments\nclients: { client_id: [analytics] }\nsteps:\n  - set:\n      card: mask(value.card 4)\n")
	h := startWatch(t, dir)
	first := h.next()
	if len(first.routes) != 1 || first.routes[0].View == nil || first.routes[0].View.Closed == "" || len(first.errs) != 1 {
		t.Fatalf("initial: %d routes, errors %v", len(first.routes), first.errs)
	}
	cv := first.routes[0]
	if cv.Name != "payments" || cv.View.Topic != "payments" || !cv.View.AppliesTo(ViewClientMatch{ClientID: "anyone"}) {
		t.Fatalf("closed view %+v", cv.View)
	}
	if _, _, err := runView(t, cv.View, `{"card":"4111"}`, false); err == nil || !strings.Contains(err.Error(), "fails closed") {
		t.Fatalf("a closed view passed a record: %v", err)
	}
	write(t, p, "view: payments\ntopic: payments\nclients: { client_id: [analytics] }\nsteps:\n  - set:\n      card: mask(value.card, 4)\n")
	second := h.next()
	if len(second.routes) != 1 || second.routes[0].View.Closed != "" || len(second.errs) != 0 {
		t.Fatalf("fixed: %d routes, errors %v", len(second.routes), second.errs)
	}
	write(t, p, "view: payments\ntopic: [\n")
	third := h.next()
	if len(third.routes) != 1 || third.routes[0] != second.routes[0] || len(third.errs) != 1 {
		t.Fatalf("broken again: %d routes, errors %v", len(third.routes), third.errs)
	}
	// YAML that does not parse, in a new file: still recognised as a view.
	write(t, filepath.Join(dir, "w.yaml"), "view: orders.v\ntopic: orders\nsteps: [\n")
	fourth := h.next()
	closed := 0
	for _, r := range fourth.routes {
		if r.View != nil && r.View.Closed != "" && r.Name == "orders.v" && r.View.Topic == "orders" {
			closed++
		}
	}
	if closed != 1 {
		t.Fatalf("a new view file that does not parse does not fail closed: %d routes", len(fourth.routes))
	}
}

// globReference is globMatch by path.Match, for inputs without `/`, `[`
// and `\` (which path.Match treats specially).
func globReference(p, s string) bool {
	ok, _ := path.Match(p, s)
	return ok
}

func FuzzGlobMatch(f *testing.F) {
	for _, s := range [][2]string{{"analytics-*", "analytics-eu"}, {"*", ""}, {"a?c", "abc"}, {"*a*b*", "xaxxb"}, {"?", "é"}, {"**", "x"}, {"a*", "b"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, p, s string) {
		if len(p) > 64 || len(s) > 256 {
			return
		}
		got := globMatch(p, s)
		if !strings.ContainsAny(p+s, `/[\`) {
			if want := globReference(p, s); got != want {
				t.Fatalf("globMatch(%q, %q) = %v, path.Match says %v", p, s, got, want)
			}
		}
	})
}

// FuzzViewFile feeds arbitrary view files to the loader: no panic, and
// either a complete view or located errors. A view that loads runs on
// arbitrary values without panicking, and its errors withhold the value.
func FuzzViewFile(f *testing.F) {
	f.Add([]byte(exampleView), []byte(`{"status":"ok","card":"4111","email":"a"}`))
	f.Add([]byte("view: p\ntopic: p\nclients: { client_id: [a*], principal: [\"User:*\"], tls_subject: x }\nsteps:\n  - drop: [a]\n"), []byte(`{"a":1}`))
	f.Add([]byte("view: p.raw\ntopic: p\nformat: raw\nsteps:\n  - map:\n      m: mask(value, 2)\n"), []byte("hello"))
	f.Add([]byte("view: p.v\ntopic: p\nsteps:\n  - window: { size: 1m }\n"), []byte(`{}`))
	f.Add([]byte("view: [\n"), []byte(``))
	dir := f.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "salt"), []byte(testSalt), 0o644); err != nil {
		f.Fatal(err)
	}
	p := filepath.Join(dir, "v.yaml")
	f.Fuzz(func(t *testing.T, file, value []byte) {
		res := loadBytes(p, file, Options{})
		if (res.route == nil) == (len(res.errs) == 0) {
			t.Fatalf("route %v with %d errors", res.route != nil, len(res.errs))
		}
		for _, e := range res.errs {
			if e.Line < 1 || e.Msg == "" || strings.Contains(e.Msg, "internal error") {
				t.Fatalf("bad error: %+v", e)
			}
		}
		r := res.route
		if r == nil || r.View == nil {
			return
		}
		v := r.View
		if r.Name == "" || v.Topic == "" || (r.InPlace() && v.Clients == nil) || !hex64.MatchString(r.Hash) || len(v.steps) != len(r.Steps) {
			t.Fatalf("incomplete view %+v", v)
		}
		for _, s := range r.Steps {
			if !contains(allowedViewSteps, s.Kind) {
				t.Fatalf("a view runs a %s step", s.Kind)
			}
		}
		out, keep, err := v.Run(&ViewRecord{Topic: v.Topic, Raw: value}, nil)
		if err != nil && (keep || out != nil) {
			t.Fatalf("an error with a value: %q", out)
		}
	})
}

// BenchmarkViewRun: the view shape (a filter and one masked field)
// on the 1 KiB payment, as the fetch path runs it per record.
func BenchmarkViewRun(b *testing.B) {
	dir := b.TempDir()
	p := filepath.Join(dir, "v.yaml")
	if err := os.WriteFile(p, []byte("view: payments.v\ntopic: payments\nsteps:\n  - filter: value.status != \"test\"\n  - set:\n      user_id: mask(value.user_id, 2)\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	r, err := LoadFile(p)
	if err != nil {
		b.Fatal(err)
	}
	value := benchValue(1024)
	b.SetBytes(int64(len(value)))
	b.ReportAllocs()
	var dst []byte
	for i := 0; i < b.N; i++ {
		rec := ViewRecord{Topic: "payments", Partition: 1, Offset: int64(i), Key: []byte("k"), Raw: value, Timestamp: 1700000000000}
		out, keep, err := r.View.Run(&rec, dst[:0])
		if err != nil || !keep {
			b.Fatal(err)
		}
		dst = out
	}
}

// TestViewRunConcurrent: one view serves many fetches at once (each with
// its own record); every goroutine gets what a lone run gives. Meaningful
// under -race.
func TestViewRunConcurrent(t *testing.T) {
	r := loadViewText(t, exampleView)
	values := make([]string, 64)
	want := make([]string, len(values))
	for i := range values {
		values[i] = fmt.Sprintf(`{"status":%q,"card":"4111%012d","email":"u%d@example.com","n":%d}`, []string{"ok", "test"}[i%2], i, i, i)
		out, _, _ := runView(t, r.View, values[i], false)
		want[i] = out
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rep := 0; rep < 20; rep++ {
				for i, v := range values {
					rec := &ViewRecord{Topic: "payments", Raw: []byte(v)}
					out, _, err := r.View.Run(rec, nil)
					if err != nil || string(out) != want[i] {
						t.Errorf("record %d: %q %v, want %q", i, out, err, want[i])
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}

// TestWatchViewSaltRotates: writing a new salt reloads the view that names
// it, with no edit of the view file.
func TestWatchViewSaltRotates(t *testing.T) {
	dir := viewDir(t, map[string]string{"v.yaml": exampleView})
	h := startWatch(t, dir)
	first := h.next()
	if len(first.routes) != 1 || len(first.errs) != 0 {
		t.Fatalf("initial: %d routes, errors %v", len(first.routes), first.errs)
	}
	before, _, _ := runView(t, first.routes[0].View, `{"status":"ok","card":"1","email":"a@b"}`, false)
	write(t, filepath.Join(dir, "salt"), "a-new-salt-of-enough-bytes\n")
	second := h.next()
	if len(second.routes) != 1 || second.routes[0].Hash == first.routes[0].Hash {
		t.Fatal("the new salt did not reload the view")
	}
	after, _, _ := runView(t, second.routes[0].View, `{"status":"ok","card":"1","email":"a@b"}`, false)
	if before == after || !strings.Contains(after, operators.HashString([]byte("a-new-salt-of-enough-bytes"), "a@b")) {
		t.Fatalf("after rotation %s (before %s)", after, before)
	}
}

// TestViewErrorsHoldNoValues: the error of a record a view cannot process
// goes to the very client that must not see the record's values (the
// placeholder's rtproxy-view-error header), so it says what failed and
// where, never what the record holds.
func TestViewErrorsHoldNoValues(t *testing.T) {
	secret := "4111-1111-1111-1234"
	for _, c := range []struct {
		name, view, value, want string
	}{
		{"an expression fails on the value", "view: p.v\ntopic: p\nsteps:\n  - set:\n      n: int(value.card)\n", `{"card":"` + secret + `"}`,
			"step 1 (set) failed: an expression failed on this record"},
		{"a filter fails", "view: p.v\ntopic: p\nsteps:\n  - filter: value.card + 1 > 2\n", `{"card":"` + secret + `"}`,
			"step 1 (filter) failed: an expression failed on this record"},
		{"the value is not JSON", "view: p.v\ntopic: p\nsteps:\n  - drop: [x]\n", `{"card":` + secret + `}`,
			"the value is not valid JSON"},
		{"mask of an object", "view: p.v\ntopic: p\nsteps:\n  - set:\n      card: mask(value.card, 4)\n", `{"card":{"n":"` + secret + `"}}`,
			"step 1 (set) failed: an expression failed on this record"},
		{"a budget", "view: p.v\ntopic: p\nsteps:\n  - set:\n      s: repeat(value.card, 100000000)\n", `{"card":"` + secret + `"}`,
			"step 1 (set) failed: over a per-record budget (limits.expr_memory_bytes)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := loadViewText(t, c.view)
			_, _, err := runView(t, r.View, c.value, false)
			if err == nil {
				t.Fatal("no error")
			}
			if strings.Contains(err.Error(), "4111") || strings.Contains(err.Error(), "1234") {
				t.Fatalf("the error shows the record: %v", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q, want it to say %q", err, c.want)
			}
		})
	}
}

// TestViewClientListBounds: a client list is bounded in entries and in the
// length of each.
func TestViewClientListBounds(t *testing.T) {
	many := make([]string, maxViewClients+1)
	for i := range many {
		many[i] = fmt.Sprintf("c%d", i)
	}
	for _, c := range []struct{ list, want string }{
		{"[" + strings.Join(many, ", ") + "]", fmt.Sprintf("lists %d entries, more than %d", maxViewClients+1, maxViewClients)},
		{"[" + strings.Repeat("x", maxClientEntry+1) + "]", fmt.Sprintf("one line of at most %d bytes", maxClientEntry)},
		{"[a, a]", "`a` is listed twice"},
	} {
		dir := viewDir(t, map[string]string{"v.yaml": "view: p\ntopic: p\nclients: { client_id: " + c.list + " }\nsteps: [ { drop: [x] } ]\n"})
		_, err := LoadFile(filepath.Join(dir, "v.yaml"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("err %v, want %q", err, c.want)
		}
	}
	many[maxViewClients] = ""
	dir := viewDir(t, map[string]string{"v.yaml": "view: p\ntopic: p\nclients: { client_id: [" + strings.Join(many[:maxViewClients], ", ") + "] }\nsteps: [ { drop: [x] } ]\n"})
	if _, err := LoadFile(filepath.Join(dir, "v.yaml")); err != nil {
		t.Fatalf("%d entries refused: %v", maxViewClients, err)
	}
}

// A json view over values in the Confluent wire format (Avro, Protobuf or
// JSON Schema written through a schema registry) never passes them
// through: each is an error whose message names the format and the schema
// id, and holds none of the value's bytes.
func TestViewConfluentWireFormat(t *testing.T) {
	v := loadViewText(t, exampleView).View
	card := "4111111111111111"
	frame := func(id byte, body ...byte) string { return string(append([]byte{0, 0, 0, 1, id}, body...)) }
	avroString := func(s string) []byte { return append([]byte{byte(2 * len(s))}, s...) }
	avro := frame(7, append(avroString("ok"), avroString(card)...)...)                     // record {status, card}
	proto := frame(8, append([]byte{0, 0x0a, byte(len(card))}, card...)...)                // message index 0, field 1
	jsonSchema := frame(9, []byte(`{"status":"ok","card":"`+card+`","email":"a@b.c"}`)...) // JSON Schema's framing
	for name, c := range map[string]struct {
		value string
		id    int
	}{"avro": {avro, 256 + 7}, "protobuf": {proto, 256 + 8}, "json schema": {jsonSchema, 256 + 9}} {
		out, keep, err := runView(t, v, c.value, false)
		var ve *ViewError
		if !errors.As(err, &ve) || keep || out != "" {
			t.Errorf("%s: out %q keep %v err %v, want an error", name, out, keep, err)
			continue
		}
		want := fmt.Sprintf("Confluent wire format (schema id %d", c.id)
		if !strings.Contains(ve.Error(), want) || !strings.HasPrefix(ve.Error(), "the value is not valid JSON") {
			t.Errorf("%s: %q, want it to name %q", name, ve.Error(), want)
		}
		if strings.Contains(ve.Error(), "4111") {
			t.Errorf("%s: the message shows the value: %q", name, ve.Error())
		}
	}
	// Not framed, not JSON: the plain message.
	if _, _, err := runView(t, v, "\x00ab", false); err == nil || err.Error() != "the value is not valid JSON" {
		t.Errorf("a short value starting with 0: %v", err)
	}
}
