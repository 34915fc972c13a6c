package rules

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rtproxy/rtproxy/internal/serde"
)

// Format is a value format: `source.format`, `sink.format` and a guard's
// `format`. The loader reads the name once (readFormat); everything after
// it compares these constants, never a name.
type Format string

// The value formats. The string is the name a rule file writes.
const (
	FormatJSON     Format = "json"     // a JSON document, decoded into the value tree
	FormatRaw      Format = "raw"      // the bytes as they are: value is their string
	FormatAvro     Format = "avro"     // Avro in the Confluent wire format, through a schema registry
	FormatProtobuf Format = "protobuf" // Protobuf in the Confluent wire format, through a schema registry
)

// Registry reports whether values of the format are read and written
// through a schema registry.
func (f Format) Registry() bool { return f == FormatAvro || f == FormatProtobuf }

// Serde is the format for internal/serde; only for a Registry format.
func (f Format) Serde() serde.Format { return serde.Format(f) }

// readFormat reads the format key x, one of allowed.
func (l *loader) readFormat(x *keyVal, what string, allowed ...Format) (Format, bool) {
	names := make([]string, len(allowed))
	for i, f := range allowed {
		names[i] = string(f)
	}
	s, ok := l.oneOf(x, what, names...)
	return Format(s), ok
}

// UsesRegistry reports whether the route reads or writes values through a
// schema registry (a guard: checks values of a registry format): its
// source, a stream join's second topic, or a sink.
func (r *Route) UsesRegistry() bool {
	if r.Guard != nil {
		return r.Guard.Format.Registry()
	}
	if r.Source.Format.Registry() {
		return true
	}
	for i := range r.Steps {
		if in := r.Steps[i].Input; in != nil && Format(in.Format).Registry() {
			return true
		}
	}
	for _, s := range r.Sinks() {
		if s.Format.Registry() {
			return true
		}
	}
	return false
}

// sinkFormat reads sink.format, sink.subject, sink.schema and
// sink.message of s (the route's sink, or a switch branch's).
func (l *loader) sinkFormat(f map[string]*keyVal, s *Sink) {
	s.Format = FormatJSON
	if x := f["format"]; x != nil {
		if v, ok := l.readFormat(x, "sink.format", FormatJSON, FormatAvro, FormatProtobuf); ok {
			s.Format = v
		}
	}
	registry := s.Format.Registry()
	for _, k := range []string{"subject", "schema", "message"} {
		if x := f[k]; x != nil && !registry {
			l.errAt(x.key, k, "`sink.%s` is for `sink.format: avro` or `protobuf`; the sink writes JSON", k)
		}
	}
	if x := f["message"]; x != nil && s.Format == FormatAvro {
		l.errAt(x.key, "message", "`sink.message` names a Protobuf message; the sink writes Avro")
	}
	s.MessageIndexes = l.messageIndexes(f["message_indexes"], "sink", s.Format)
	if !registry {
		return
	}
	s.Subject = s.Topic + "-value"
	if x := f["subject"]; x != nil {
		if v, ok := l.scalar(x, "sink.subject"); ok {
			s.Subject = v
		}
	}
	if x := f["message"]; x != nil {
		if v, ok := l.scalar(x, "sink.message"); ok {
			s.Message = v
		}
	}
	x := f["schema"]
	if x == nil {
		return // the subject's latest version, looked up when the route starts
	}
	p, ok := l.scalar(x, "sink.schema")
	if !ok {
		return
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(l.dir, p)
	}
	if err := tableFileAllowed(l.dir, l.opts.TablesDir, p); err != nil {
		l.errAt(x.val, x.val.Value, "sink.schema: %s", strings.ReplaceAll(err.Error(), "table file", "schema file"))
		return
	}
	b, err := os.ReadFile(p)
	if err != nil {
		l.errAt(x.val, x.val.Value, "sink.schema cannot be read: %v", unwrapPathError(err))
		return
	}
	if err := serde.CheckSchema(s.Format.Serde(), string(b), s.Message); err != nil {
		l.errAt(x.val, x.val.Value, "sink.schema %s: %v", filepath.Base(p), err)
		return
	}
	s.SchemaFile, s.Schema = p, string(b)
	l.res.tableFiles = append(l.res.tableFiles, p) // watched and hashed like a table file
}

// messageIndexes reads source.message_indexes or sink.message_indexes
// (block is "source" or "sink"), which only a Protobuf format takes:
// "zigzag" (the default) or "unsigned" (serde.IndexEncoding).
func (l *loader) messageIndexes(x *keyVal, block string, format Format) string {
	if x == nil {
		if format == FormatProtobuf {
			return "zigzag"
		}
		return ""
	}
	if format != FormatProtobuf {
		l.errAt(x.key, "message_indexes", "`%s.message_indexes` is for `%s.format: protobuf`", block, block)
		return ""
	}
	s, ok := l.oneOf(x, block+".message_indexes", "zigzag", "unsigned")
	if !ok {
		return ""
	}
	return s
}

// checkSinkSchema refuses, when the fields the last step writes are known
// (a map, a window row) and an output schema is given, fields that do not
// fit it: the route's sink's, or each switch branch's.
func (l *loader) checkSinkSchema(r *Route, sc *scope) {
	if !sc.shape.known {
		return
	}
	check := func(s *Sink, f map[string]*keyVal) {
		if s.Schema == "" || f["schema"] == nil {
			return
		}
		problems, err := serde.CheckFields(s.Format.Serde(), s.Schema, s.Message, sc.shape.fields)
		if err != nil || len(problems) == 0 {
			return // a schema that does not parse was refused already
		}
		x := f["schema"]
		l.errAt(x.val, x.val.Value, "the output does not fit sink.schema %s: %s (the fields come from %s)",
			filepath.Base(s.SchemaFile), strings.Join(problems, "; "), sc.shape.origin)
	}
	if r.Switch == nil {
		check(&r.Sink, l.sinkFields)
		return
	}
	for i := range r.Switch {
		if i < len(l.branchFields) {
			check(&r.Switch[i].Sink, l.branchFields[i])
		}
	}
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
	l.allowRegistry(f, sr)
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

// allowRegistry refuses a schema_registry block that names an environment
// variable, a file or a URL the proxy's allow-list (Options.Allow) does not
// hold: the proxy would read the secret and send it to the URL.
func (l *loader) allowRegistry(f map[string]*keyVal, sr *SchemaRegistry) {
	allow := l.opts.Allow.In(l.dir)
	if sr.URL != "" {
		for _, u := range strings.Split(sr.URL, ",") {
			if u = strings.TrimSpace(u); u == "" {
				continue
			}
			if err := allow.URL(u); err != nil && errors.Is(err, ErrNotAllowed) {
				l.errAt(f["url"].val, sr.URL, "schema_registry.url: %v", err)
				break
			}
		}
	}
	for _, k := range []struct {
		key string
		val string
	}{{"basic_auth_env", sr.BasicAuthEnv}, {"bearer_token_env", sr.BearerTokenEnv}} {
		if k.val == "" {
			continue
		}
		if err := allow.Env(k.val); err != nil {
			l.errAt(f[k.key].val, k.val, "schema_registry.%s: %v", k.key, err)
		}
	}
	for _, k := range []struct {
		key string
		val string
	}{{"basic_auth_file", sr.BasicAuthFile}, {"bearer_token_file", sr.BearerTokenFile}, {"ca_file", sr.CAFile}} {
		if k.val == "" {
			continue
		}
		if err := allow.File(k.val); err != nil {
			l.errAt(f[k.key].val, f[k.key].val.Value, "schema_registry.%s: %v", k.key, err)
		}
	}
}
