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
	r, err := LoadFile(filepath.Join(dir, "avro.yaml"))
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
