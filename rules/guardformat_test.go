package rules

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rtproxy/rtproxy/operators"
)

// Guards on Avro and Protobuf topics: the file loads with its registry and
// message indexes, and combinations that cannot work are refused.
func TestGuardRegistryFormats(t *testing.T) {
	dir := t.TempDir()
	fp := filepath.Join(dir, "g.yaml")
	write(t, fp, `guard: pay-avro
topic: pay.avro
format: avro
schema_registry: { url: "http://127.0.0.1:8081", timeout: 2s }
checks:
  - check: value.amount > 0
    name: positive
`)
	r, err := LoadFileWith(fp, Options{Allow: &Allow{URLs: []string{"http://127.0.0.1:8081"}}})
	if err != nil {
		t.Fatal(err)
	}
	g := r.Guard
	if g.Format != FormatAvro || g.MessageIndexes != "" {
		t.Errorf("format %q indexes %q, want avro and none", g.Format, g.MessageIndexes)
	}
	if r.SchemaRegistry == nil || r.SchemaRegistry.URL != "http://127.0.0.1:8081" || r.SchemaRegistry.Timeout.Seconds() != 2 {
		t.Errorf("schema_registry %+v", r.SchemaRegistry)
	}
	if !r.UsesRegistry() {
		t.Error("an avro guard does not report UsesRegistry")
	}
	if g.Members != nil {
		t.Errorf("members %v for an avro guard: the skip scanner is for JSON", g.Members)
	}

	p := loadGuardText(t, "guard: pb\ntopic: orders.pb\nformat: protobuf\nchecks:\n  - check: value.id != \"\"\n")
	if p.Guard.Format != FormatProtobuf || p.Guard.MessageIndexes != "zigzag" || p.SchemaRegistry != nil {
		t.Errorf("protobuf guard: format %q indexes %q registry %+v", p.Guard.Format, p.Guard.MessageIndexes, p.SchemaRegistry)
	}
	u := loadGuardText(t, "guard: pb\ntopic: orders.pb\nformat: protobuf\nmessage_indexes: unsigned\nchecks:\n  - check: value.id != \"\"\n")
	if u.Guard.MessageIndexes != "unsigned" {
		t.Errorf("message_indexes %q, want unsigned", u.Guard.MessageIndexes)
	}
}

func TestGuardRegistryFormatRefusals(t *testing.T) {
	const head = "guard: g\ntopic: t\n"
	cases := []struct {
		name, file, want string
	}{
		{"valid_json on avro", head + "format: avro\nchecks: [valid_json]\n",
			"r.yaml:4:10: `valid_json` checks JSON values; with `format: avro` every record is decoded with its schema, and one that does not decode fails the built-in check `decode`. Remove `valid_json` (near `valid_json`)"},
		{"check named decode", head + "format: protobuf\nchecks:\n  - check: value.a > 0\n    name: decode\n",
			"r.yaml:6:11: `decode` names the built-in check of `format: protobuf` (a record that does not decode); give this check another `name` (near `decode`)"},
		{"schema_registry on json", head + "schema_registry: { url: \"http://sr:8081\" }\nchecks: [valid_json]\n",
			"r.yaml:3:1: `schema_registry` is for `format: avro` or `format: protobuf`; this guard reads json values (near `schema_registry`)"},
		{"message_indexes on avro", head + "format: avro\nmessage_indexes: unsigned\nchecks:\n  - check: value.a > 0\n",
			"r.yaml:4:1: `message_indexes` is for `format: protobuf`; this guard reads avro values (near `message_indexes`)"},
		{"bad message_indexes", head + "format: protobuf\nmessage_indexes: varint\nchecks:\n  - check: value.a > 0\n",
			"r.yaml:4:18: `message_indexes` must be one of zigzag, unsigned (near `varint`)"},
		{"registry url with credentials", head + "format: avro\nschema_registry: { url: \"http://u:p@sr:8081\" }\nchecks:\n  - check: value.a > 0\n",
			"`schema_registry.url` holds credentials"},
		{"registry url not allowed", head + "format: avro\nschema_registry: { url: \"http://elsewhere:8081\" }\nchecks:\n  - check: value.a > 0\n",
			"schema_registry.url: the URL http://elsewhere:8081 is not allowed by the proxy's rules.allow"},
		{"registry env not allowed", head + "format: avro\nschema_registry: { url: \"http://sr:8081\", bearer_token_env: SR_TOKEN }\nchecks:\n  - check: value.a > 0\n",
			"schema_registry.bearer_token_env: the environment variable SR_TOKEN is not allowed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "r.yaml")
			write(t, p, c.file)
			_, err := LoadFile(p)
			if err == nil {
				t.Fatalf("loaded:\n%s", c.file)
			}
			if got := strings.ReplaceAll(err.Error(), dir+"/", ""); !strings.Contains(got, c.want) {
				t.Errorf("error:\n%s\nwant it to hold:\n%s", got, c.want)
			}
		})
	}
}

// rtproxy check (CheckPaths) takes a valid avro guard and refuses a bad
// combination.
func TestCheckPathsRegistryGuard(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"a.yaml": "guard: a\ntopic: pay.avro\nformat: avro\nchecks:\n  - check: value.amount > 0\n",
		"b.yaml": "guard: b\ntopic: pay.raw\nformat: raw\nmessage_indexes: zigzag\nchecks: [valid_json]\n",
	})
	var out bytes.Buffer
	if CheckPaths(&out, []string{dir}) {
		t.Error("CheckPaths accepted b.yaml")
	}
	want := "ok a.yaml (guard a: topic pay.avro, 1 check)\n" +
		"b.yaml:4:1: `message_indexes` is for `format: protobuf`; this guard reads raw values (near `message_indexes`)\n"
	if got := strings.ReplaceAll(out.String(), dir+"/", ""); got != want {
		t.Errorf("output:\n%s\nwant:\n%s", got, want)
	}
}

// CheckDecoded runs the checks on a value the caller decoded; Check on a
// registry format without a decoder fails closed with `decode`.
func TestGuardCheckDecoded(t *testing.T) {
	r := loadGuardText(t, "guard: g\ntopic: t\nformat: avro\nchecks:\n  - check: value.amount > 0\n    name: positive\n    message: amount must be positive\n")
	g := r.Guard
	var rec operators.Record
	if check, msg, ok := g.CheckDecoded(&rec, map[string]any{"amount": 3.0}); !ok {
		t.Errorf("good value failed %s: %s", check, msg)
	}
	if check, msg, ok := g.CheckDecoded(&rec, map[string]any{"amount": -1.0}); ok || check != "positive" || msg != "amount must be positive" {
		t.Errorf("bad value: %q %q %v", check, msg, ok)
	}
	rec.Raw = []byte{0, 0, 0, 0, 1, 2}
	if check, _, ok := g.Check(&rec); ok || check != GuardDecode {
		t.Errorf("Check without a decoder: %q %v, want %s", check, ok, GuardDecode)
	}
}
