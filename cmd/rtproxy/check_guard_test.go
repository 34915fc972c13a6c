package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `rtproxy check` lints guard files with route files, says which files
// are guards, and refuses a guard as it refuses a route.
func TestCheckGuardFiles(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"copy.yaml": "route: copy\nsource: { topic: a }\nsink: { topic: a.out }\n",
		"shape.yaml": "guard: payments-shape\ntopic: 'payments.*'\non_reject: dead_letter\ndead_letter: rejected.payments\nchecks:\n" +
			"  - valid_json\n  - check: value.amount > 0\n    message: amount must be positive\n  - check: size <= 10240\n    name: max-size\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out, errOut bytes.Buffer
	if code := cmdCheck([]string{dir}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d:\n%s%s", code, out.String(), errOut.String())
	}
	want := "ok copy.yaml\nok shape.yaml (guard payments-shape: topic payments.*, 3 checks)\n"
	if got := strings.ReplaceAll(out.String(), dir+string(filepath.Separator), ""); got != want {
		t.Errorf("output:\n%s\nwant:\n%s", got, want)
	}

	bad := filepath.Join(dir, "zbad.yaml")
	if err := os.WriteFile(bad, []byte("guard: copy\ntopic: b\nchecks:\n  - check: value.n + 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := cmdCheck([]string{dir}, &out, &errOut); code != 1 {
		t.Fatalf("exit %d for a bad guard:\n%s", code, out.String())
	}
	got := strings.ReplaceAll(out.String(), dir+string(filepath.Separator), "")
	for _, w := range []string{
		"zbad.yaml:1:8: guard name `copy` is already used by the route at copy.yaml:1:8",
		"zbad.yaml:4:12: check must be true or false, but `value.n + 1` always gives a number or a string",
		"ok shape.yaml (guard payments-shape: topic payments.*, 3 checks)",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("output lacks %q:\n%s", w, got)
		}
	}
}

// `rtproxy check` takes Avro and Protobuf guards and refuses the
// combinations that cannot work: valid_json on a registry format, a
// schema_registry on a JSON guard, message_indexes on Avro, and a
// registry URL the allow-list does not hold.
func TestCheckRegistryGuardFiles(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"a.yaml": "guard: pay-avro\ntopic: pay.avro\nformat: avro\nchecks:\n  - check: value.amount > 0\n",
		"b.yaml": "guard: order-pb\ntopic: orders.pb\nformat: protobuf\nmessage_indexes: unsigned\nchecks:\n  - check: value.id != \"\"\n",
		"c.yaml": "guard: c\ntopic: c\nformat: avro\nchecks: [valid_json]\n",
		"d.yaml": "guard: d\ntopic: d\nschema_registry: { url: \"http://sr:8081\" }\nchecks: [valid_json]\n",
		"e.yaml": "guard: e\ntopic: e\nformat: avro\nmessage_indexes: zigzag\nchecks:\n  - check: value.a > 0\n",
		"f.yaml": "guard: f\ntopic: f\nformat: protobuf\nschema_registry: { url: \"http://elsewhere:8081\" }\nchecks:\n  - check: value.a > 0\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out, errOut bytes.Buffer
	if code := cmdCheck([]string{dir}, &out, &errOut); code != 1 {
		t.Fatalf("exit %d, want 1:\n%s%s", code, out.String(), errOut.String())
	}
	got := strings.ReplaceAll(out.String(), dir+string(filepath.Separator), "")
	for _, w := range []string{
		"ok a.yaml (guard pay-avro: topic pay.avro, 1 check)",
		"ok b.yaml (guard order-pb: topic orders.pb, 1 check)",
		"c.yaml:4:10: `valid_json` checks JSON values; with `format: avro`",
		"d.yaml:3:1: `schema_registry` is for `format: avro` or `format: protobuf`",
		"e.yaml:4:1: `message_indexes` is for `format: protobuf`; this guard reads avro values",
		"f.yaml:4:25: schema_registry.url: the URL http://elsewhere:8081 is not allowed by the proxy's rules.allow",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("output lacks %q:\n%s", w, got)
		}
	}
}
