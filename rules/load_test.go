package rules

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/rtproxy/rtproxy/operators"
)

var update = flag.Bool("update", false, "rewrite golden files")

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// describe prints everything a Route holds in a stable form (paths
// relative to dir, fingerprints shortened).
func describe(r *Route, dir string) string {
	var b strings.Builder
	rel := func(p string) string { return strings.TrimPrefix(p, dir+string(filepath.Separator)) }
	exprText := func(e *operators.Expr) string {
		if e == nil {
			return "<none>"
		}
		return e.Source
	}
	fmt.Fprintf(&b, "route: %s\nfile: %s\n", r.Name, rel(r.File))
	fmt.Fprintf(&b, "source: topic=%s format=%s event_time=%s watermark=%s idle_timeout=%s start=%s\n",
		r.Source.Topic, r.Source.Format, exprText(r.Source.EventTime), r.Source.Watermark, r.Source.IdleTimeout, r.Source.Start)
	fmt.Fprintf(&b, "sink: topic=%s key=%s\n", r.Sink.Topic, exprText(r.Sink.Key))
	fmt.Fprintf(&b, "dead_letter: %s\ncheckpoint_interval: %s\n", r.DeadLetter, r.CheckpointInterval)
	names := make([]string, 0, len(r.Tables))
	for n := range r.Tables {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t := r.Tables[n]
		fmt.Fprintf(&b, "table %s: file=%s key=%s topic=%s loaded=%v\n", t.Name, rel(t.File), t.Key, t.Topic, t.Table != nil)
	}
	for _, s := range r.Steps {
		fmt.Fprintf(&b, "step %d %s at %d:%d table=%q fingerprint=%s…\n", s.Index, s.Kind, s.Line, s.Col, s.Table, s.Fingerprint[:12])
	}
	return b.String()
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	p := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs:\n--- got\n%s--- want\n%s", name, got, want)
	}
}

func TestDefaultsGolden(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"minimal.yaml": "route: minimal\nsource: { topic: in }\nsink: { topic: out }\n",
		"full.yaml": `route: payments-risk
source:
  topic: payments
  format: json
  event_time: value.ts
  watermark: 10s
  idle_timeout: 1m
  start: latest
sink:
  topic: payments.risk
  key: value.key
dead_letter: payments.bad
checkpoint_interval: 2s
tables:
  merchants: { file: tables/merchants.csv, key: merchant_id }
  countries: { topic: countries }
steps:
  - filter: value.amount > 0 && value.status != "test"
  - drop_duplicates: { key: value.txn_id, ttl: 1h }
  - join: { table: merchants, on: value.merchant_id, as: merchant, missing: dead_letter }
  - set:
      risk: value.amount / (merchant?.avg_amount ?? 1.0)
  - map: { user_id: value.user_id, amount: value.amount, risk: value.risk }
  - window:
      kind: sliding
      size: 5m
      slide: 1m
      key: value.user_id
      aggregate: { n: count(), total: sum(value.amount), top: max(value.risk), mean: avg(value.amount) }
      emit: on_update
  - filter: value.n >= 3
`,
		"tables/merchants.csv": "merchant_id,avg_amount\nm1,10\n",
	})
	for _, name := range []string{"minimal", "full"} {
		r, err := LoadFile(filepath.Join(dir, name+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		golden(t, name+".golden", describe(r, dir))
	}
}

func TestLoadDirDuplicateNamesNameBothFiles(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"a.yaml":                 "route: same\nsource: { topic: a }\nsink: { topic: a.out }\n",
		"b.yml":                  "# b\nroute: same\nsource: { topic: b }\nsink: { topic: b.out }\n",
		"c.yaml":                 "route: other\nsource: { topic: c }\nsink: { topic: c.out }\n",
		".hidden.yaml":           "route: hidden\n",
		"notes.txt":              "not a rule",
		"sub/ignored.yaml":       "route: sub\n",
		"..2026_01_01/dup.yaml":  "route: dup\n",
		"tables/countries.jsonl": "{}\n",
	})
	routes, errs := LoadDir(dir)
	var names []string
	for _, r := range routes {
		names = append(names, r.Name)
	}
	if got := strings.Join(names, ","); got != "same,other" {
		t.Errorf("routes = %s, want same,other (a.yaml keeps the name, c.yaml loads)", got)
	}
	want := fmt.Sprintf("%s:2:8: route name `same` is already used by %s:1:8; route names must be unique in the rules directory, rename one of them (near `same`)",
		filepath.Join(dir, "b.yml"), filepath.Join(dir, "a.yaml"))
	if len(errs) != 1 || errs[0].Error() != want {
		t.Errorf("errs = %v\nwant %s", errs, want)
	}
}

func TestLoadDirFollowsConfigMapSymlinks(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"..2026_11_29_09_00_00.1/route.yaml":      "route: cm\nsource: { topic: in }\nsink: { topic: out }\ntables:\n  m: { file: merchants.jsonl, key: id }\n",
		"..2026_11_29_09_00_00.1/merchants.jsonl": "{\"id\":\"m1\"}\n",
	})
	must(t, os.Symlink("..2026_11_29_09_00_00.1", filepath.Join(dir, "..data")))
	must(t, os.Symlink("..data/route.yaml", filepath.Join(dir, "route.yaml")))
	must(t, os.Symlink("..data/merchants.jsonl", filepath.Join(dir, "merchants.jsonl")))
	routes, errs := LoadDir(dir)
	if len(errs) != 0 || len(routes) != 1 {
		t.Fatalf("routes %d errs %v, want exactly the one route of route.yaml", len(routes), errs)
	}
	if routes[0].Name != "cm" || routes[0].Tables["m"].Table.(*operators.FileTable).Len() != 1 {
		t.Errorf("route %s, table rows: want cm with 1 row", routes[0].Name)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestCheckPaths(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"good/a.yaml": "route: a\nsource: { topic: a }\nsink: { topic: a.out }\n",
		"good/b.yaml": "route: b\nsource: { topic: b }\nsink: { topic: b.out }\n",
		"bad/c.yaml":  "route: c\nsource: { topic: c }\nsink: { topic: c }\nsteps:\n  - fliter: true\n",
		"bad/a2.yaml": "route: a\nsource: { topic: x }\nsink: { topic: y }\n",
		"empty/x.txt": "",
	})
	var out bytes.Buffer
	if !CheckPaths(&out, []string{filepath.Join(dir, "good")}) {
		t.Errorf("good directory refused:\n%s", out.String())
	}
	wantGood := fmt.Sprintf("ok %s\nok %s\n", filepath.Join(dir, "good", "a.yaml"), filepath.Join(dir, "good", "b.yaml"))
	if out.String() != wantGood {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), wantGood)
	}

	out.Reset()
	ok := CheckPaths(&out, []string{filepath.Join(dir, "good"), filepath.Join(dir, "bad", "c.yaml"), filepath.Join(dir, "bad", "a2.yaml"), filepath.Join(dir, "empty"), filepath.Join(dir, "missing.yaml")})
	if ok {
		t.Error("CheckPaths accepted bad files")
	}
	got := strings.ReplaceAll(out.String(), dir+"/", "")
	want := strings.Join([]string{
		"empty: no rule files (*.yaml, *.yml) in this directory",
		"missing.yaml: no such file or directory",
		"ok good/a.yaml",
		"ok good/b.yaml",
		"bad/c.yaml:3:16: sink topic is the source topic; the route would read its own output forever. Write results to another topic, e.g. `c.out` (near `c`)",
		"bad/c.yaml:5:5: unknown step `fliter`; did you mean `filter`? (near `fliter`)",
		"bad/a2.yaml:1:8: route name `a` is already used by good/a.yaml:1:8; route names must be unique in the rules directory, rename one of them (near `a`)",
		"",
	}, "\n")
	if got != want {
		t.Errorf("output:\n%s\nwant:\n%s", got, want)
	}
}

// An invalid file claims no route name when loading: the valid file with
// the same name runs.
func TestLoadDirInvalidFileClaimsNoName(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"a.yaml": "route: same\nsource: { topic: a }\nsink: { topic: a }\n",
		"b.yaml": "route: same\nsource: { topic: b }\nsink: { topic: b.out }\n",
	})
	routes, errs := LoadDir(dir)
	if len(routes) != 1 || routes[0].Source.Topic != "b" || len(errs) != 1 || !strings.Contains(errs[0].Error(), "a.yaml:3:16: sink topic is the source topic") {
		t.Fatalf("routes %d errs %v: want b.yaml's route and a.yaml's own error", len(routes), errs)
	}
}
