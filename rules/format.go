package rules

import (
	"path/filepath"
	"strings"
	"time"
)

// Value formats read through a schema registry (`source.format`).
const (
	FormatAvro     = "avro"
	FormatProtobuf = "protobuf"
)

// UsesRegistry reports whether the route reads or writes values through a
// schema registry.
func (r *Route) UsesRegistry() bool {
	return r.Source.Format == FormatAvro || r.Source.Format == FormatProtobuf
}

// SchemaRegistry is a rule file's `schema_registry:` block: how to reach
// the registry, with secrets named by file or environment variable, never
// written inline. Relative file paths are relative to the rule file.
type SchemaRegistry struct {
	URL             string
	BasicAuthFile   string // holds "user:password"
	BasicAuthEnv    string // an environment variable holding "user:password"
	BearerTokenFile string
	BearerTokenEnv  string
	CAFile          string
	Timeout         time.Duration // 0: the pipeline's default
}

var registryKeys = []string{"url", "basic_auth_file", "basic_auth_env", "bearer_token_file", "bearer_token_env", "ca_file", "timeout"}

func (l *loader) schemaRegistry(kv *keyVal, r *Route) {
	if kv == nil {
		return
	}
	if !l.mapping(kv, "schema_registry", "`schema_registry: { url: http://registry:8081 }`") {
		return
	}
	f := l.fields(kv.val, registryKeys, "schema_registry")
	sr := &SchemaRegistry{}
	str := func(key string, path bool) string {
		x := f[key]
		if x == nil {
			return ""
		}
		s, ok := l.scalar(x, "schema_registry."+key)
		if !ok {
			return ""
		}
		if path && s != "" && !filepath.IsAbs(s) {
			s = filepath.Join(l.dir, s)
		}
		return s
	}
	if f["url"] == nil {
		l.errAt(kv.key, "schema_registry", "missing `schema_registry.url`, e.g. `url: http://registry:8081`")
	}
	sr.URL = str("url", false)
	for _, u := range strings.Split(sr.URL, ",") {
		u = strings.TrimSpace(u)
		if sr.URL != "" && !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			l.errAt(f["url"].val, sr.URL, "`schema_registry.url` must start with http:// or https://")
			break
		}
		if i := strings.Index(u, "://"); i >= 0 && strings.Contains(u[i+3:], "@") {
			l.errAt(f["url"].val, "", "`schema_registry.url` holds credentials; name a file (`basic_auth_file`) or an environment variable (`basic_auth_env`) instead")
			break
		}
	}
	sr.BasicAuthFile = str("basic_auth_file", true)
	sr.BasicAuthEnv = str("basic_auth_env", false)
	sr.BearerTokenFile = str("bearer_token_file", true)
	sr.BearerTokenEnv = str("bearer_token_env", false)
	sr.CAFile = str("ca_file", true)
	if x := f["timeout"]; x != nil {
		if d, ok := l.duration(x, "schema_registry.timeout", false); ok {
			sr.Timeout = d
		}
	}
	basic := sr.BasicAuthFile != "" || sr.BasicAuthEnv != ""
	bearer := sr.BearerTokenFile != "" || sr.BearerTokenEnv != ""
	switch {
	case basic && bearer:
		l.errAt(kv.key, "schema_registry", "schema_registry has basic auth and a bearer token; use one")
	case sr.BasicAuthFile != "" && sr.BasicAuthEnv != "":
		l.errAt(f["basic_auth_env"].key, "basic_auth_env", "schema_registry has basic_auth_file and basic_auth_env; use one")
	case sr.BearerTokenFile != "" && sr.BearerTokenEnv != "":
		l.errAt(f["bearer_token_env"].key, "bearer_token_env", "schema_registry has bearer_token_file and bearer_token_env; use one")
	}
	r.SchemaRegistry = sr
}
