package rules

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSourceFormatsAndSchemaRegistry(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"avro.yaml": `route: a
source: { topic: in, format: avro }
sink: { topic: out }
schema_registry:
  url: http://registry:8081
  bearer_token_file: secrets/token
  ca_file: /etc/ca.pem
  timeout: 3s
steps:
  - filter: value.amount > 10
`,
		"proto.yaml": "route: p\nsource: { topic: in, format: protobuf }\nsink: { topic: out }\n",
	})
	r, err := LoadFileWith(filepath.Join(dir, "avro.yaml"), Options{Allow: &Allow{URLs: []string{"http://registry:8081"}, Files: []string{"/etc/ca.pem"}}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Source.Format != FormatAvro || !r.UsesRegistry() {
		t.Fatalf("format %q", r.Source.Format)
	}
	want := SchemaRegistry{URL: "http://registry:8081", BearerTokenFile: filepath.Join(dir, "secrets/token"), CAFile: "/etc/ca.pem", Timeout: 3 * time.Second}
	if r.SchemaRegistry == nil || *r.SchemaRegistry != want {
		t.Fatalf("schema_registry %+v, want %+v", r.SchemaRegistry, want)
	}
	p, err := LoadFile(filepath.Join(dir, "proto.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Source.Format != FormatProtobuf || p.SchemaRegistry != nil {
		t.Fatalf("protobuf route: %q %+v", p.Source.Format, p.SchemaRegistry)
	}
}

func TestSchemaRegistryRefusals(t *testing.T) {
	base := "route: a\nsource: { topic: in, format: avro }\nsink: { topic: out }\n"
	for name, c := range map[string]struct{ body, want string }{
		"format":      {"route: a\nsource: { topic: in, format: avr }\nsink: { topic: out }\n", "`source.format` must be one of json, raw, avro, protobuf; did you mean `avro`?"},
		"no url":      {base + "schema_registry: { ca_file: x }\n", "missing `schema_registry.url`"},
		"scheme":      {base + "schema_registry: { url: registry:8081 }\n", "must start with http:// or https://"},
		"inline cred": {base + "schema_registry: { url: \"http://u:p@r:8081\" }\n", "holds credentials"},
		"password":    {base + "schema_registry: { url: \"http://r\", password: x }\n", "unknown field `password` in schema_registry"},
		"two auths":   {base + "schema_registry: { url: \"http://r\", basic_auth_env: A, bearer_token_env: B }\n", "basic auth and a bearer token; use one"},
		"not a map":   {base + "schema_registry: http://r\n", "`schema_registry` must be a mapping"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"r.yaml": c.body})
			_, err := LoadFile(filepath.Join(dir, "r.yaml"))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
}

const outAvsc = `{"type":"record","name":"Out","fields":[
	{"name":"id","type":"string"},
	{"name":"amount","type":"double"},
	{"name":"note","type":["null","string"],"default":null}]}`

const outProto = `syntax = "proto3";
message Row { string key = 1; int64 window_start = 2; int64 window_end = 3; double n = 4; }
`

func TestSinkFormatChecksTheOutputSchema(t *testing.T) {
	head := "route: a\nsource: { topic: in }\n"
	for name, c := range map[string]struct{ body, want string }{
		"fits": {head + "sink: { topic: out, format: avro, schema: out.avsc }\nsteps:\n  - map: { id: value.id, amount: value.n }\n", ""},
		"fits a window row": {head + "sink: { topic: out, format: protobuf, schema: row.proto, message: Row }\nsteps:\n" +
			"  - window: { kind: tumbling, size: 1m, key: value.k, aggregate: { n: count() } }\n", ""},
		"latest version, nothing to check": {head + "sink: { topic: out, format: avro, subject: out-v }\nsteps:\n  - map: { colour: value.c }\n", ""},
		"unknown field": {head + "sink: { topic: out, format: avro, schema: out.avsc }\nsteps:\n  - map: { id: value.id, amount: value.n, colour: value.c }\n",
			"the output does not fit sink.schema out.avsc: field `colour` is not in record Out"},
		"required field not written": {head + "sink: { topic: out, format: avro, schema: out.avsc }\nsteps:\n  - map: { id: value.id }\n",
			"record Out needs field `amount` (it has no default), which is not written"},
		"window row field": {head + "sink: { topic: out, format: protobuf, schema: row.proto }\nsteps:\n" +
			"  - window: { kind: tumbling, size: 1m, key: value.k, aggregate: { total: sum(value.x) } }\n", "field `total` is not in message Row"},
		"schema does not parse": {head + "sink: { topic: out, format: avro, schema: bad.avsc }\n", "sink.schema bad.avsc: the Avro schema does not parse"},
		"subject with json":     {head + "sink: { topic: out, subject: s }\n", "`sink.subject` is for `sink.format: avro` or `protobuf`"},
		"message with avro":     {head + "sink: { topic: out, format: avro, message: M }\n", "`sink.message` names a Protobuf message"},
		"missing schema file":   {head + "sink: { topic: out, format: avro, schema: none.avsc }\n", "sink.schema cannot be read"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"r.yaml": c.body, "out.avsc": outAvsc, "row.proto": outProto, "bad.avsc": `{"type":`})
			r, err := LoadFile(filepath.Join(dir, "r.yaml"))
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if r.Sink.Subject == "" || !r.UsesRegistry() {
					t.Fatalf("sink %+v", r.Sink)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
}

// TestMessageIndexes: source.message_indexes and sink.message_indexes take
// zigzag (the default for protobuf) or unsigned, with protobuf only.
func TestMessageIndexes(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"out.proto": "syntax = \"proto3\";\nmessage Out { string id = 1; }\n",
		"old.yaml":  "route: o\nsource: { topic: in, format: protobuf, message_indexes: unsigned }\nsink: { topic: out, format: protobuf, schema: out.proto, message_indexes: unsigned }\n",
		"def.yaml":  "route: d\nsource: { topic: in, format: protobuf }\nsink: { topic: out, format: protobuf, schema: out.proto }\n",
	})
	o, err := LoadFile(filepath.Join(dir, "old.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if o.Source.MessageIndexes != "unsigned" || o.Sink.MessageIndexes != "unsigned" {
		t.Errorf("old: %q %q", o.Source.MessageIndexes, o.Sink.MessageIndexes)
	}
	d, err := LoadFile(filepath.Join(dir, "def.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if d.Source.MessageIndexes != "zigzag" || d.Sink.MessageIndexes != "zigzag" {
		t.Errorf("default: %q %q", d.Source.MessageIndexes, d.Sink.MessageIndexes)
	}
	for name, c := range map[string]struct{ body, want string }{
		"avro source": {"route: a\nsource: { topic: in, format: avro, message_indexes: unsigned }\nsink: { topic: out }\n", "`source.message_indexes` is for `source.format: protobuf`"},
		"json sink":   {"route: a\nsource: { topic: in }\nsink: { topic: out, message_indexes: zigzag }\n", "`sink.message_indexes` is for `sink.format: protobuf`"},
		"bad value":   {"route: a\nsource: { topic: in, format: protobuf, message_indexes: signed }\nsink: { topic: out }\n", "`source.message_indexes` must be one of zigzag, unsigned"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"r.yaml": c.body})
			_, err := LoadFile(filepath.Join(dir, "r.yaml"))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want %q", err, c.want)
			}
		})
	}
}
