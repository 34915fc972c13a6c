package rules

// Guards on Avro and Protobuf topics (`format: avro | protobuf`): the
// values are in the Confluent wire format, decoded with their schemas from
// a schema registry (the guard file's `schema_registry:`, else the
// proxy's). rules reads and validates the file; the decoding is the
// caller's (cmd/rtproxy holds the registry clients), which hands the value
// tree to CheckDecoded.

import (
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/rtproxy/rtproxy/internal/serde"
	"github.com/rtproxy/rtproxy/operators"
)

// GuardDecode is the built-in check of a guard with format avro or
// protobuf: the value is in the Confluent wire format, its schema id is
// known to the registry, and its bytes decode with that schema. It is not
// listed in `checks`; it runs before them.
const GuardDecode = "decode"

// CheckDecoded runs g's checks on one produced record r (set as for
// Check) whose value the caller decoded into value (the value tree a route
// would see; nil for a null value). It is Check for the registry formats,
// whose decoding needs a registry client rules does not hold.
func (g *Guard) CheckDecoded(r *operators.Record, value any) (check, message string, ok bool) {
	if g.Closed != "" {
		return GuardInvalid, g.Closed, false
	}
	cur := -1
	defer func() {
		if p := recover(); p != nil {
			check, message, ok = GuardDecode, fmt.Sprintf("internal error while checking the record: %v", p), false
			if cur >= 0 {
				check = g.Checks[cur].Name
			}
		}
	}()
	r.ResetEnv()
	r.Value = value
	return g.runChecks(r, &cur)
}

// RegistryConfig is the schema registry r reads values through: its rule
// file's `schema_registry:`, else proxy (the proxy's). The bounds and
// their counters are always the proxy's: a rule file cannot raise them.
func (r *Route) RegistryConfig(proxy serde.Config) serde.Config {
	s := r.SchemaRegistry
	if s == nil {
		return proxy
	}
	timeout := s.Timeout
	if timeout == 0 {
		timeout = proxy.Timeout
	}
	return serde.Config{URL: s.URL, BasicAuthFile: s.BasicAuthFile, BasicAuthEnv: s.BasicAuthEnv,
		BearerTokenFile: s.BearerTokenFile, BearerTokenEnv: s.BearerTokenEnv, CAFile: s.CAFile, Timeout: timeout,
		Limits: proxy.Limits, Metrics: proxy.Metrics}
}

// guardRegistry reads a guard file's `schema_registry` and
// `message_indexes`, which only the registry formats take.
func (l *loader) guardRegistry(f map[string]*keyVal, r *Route) {
	g := r.Guard
	registry := g.Format.Registry()
	if kv := f["schema_registry"]; kv != nil {
		if !registry {
			l.errAt(kv.key, "schema_registry", "`schema_registry` is for `format: avro` or `format: protobuf`; this guard reads %s values", g.Format)
		} else {
			l.schemaRegistry(kv, r)
		}
	}
	kv := f["message_indexes"]
	switch {
	case kv != nil && g.Format != FormatProtobuf:
		l.errAt(kv.key, "message_indexes", "`message_indexes` is for `format: protobuf`; this guard reads %s values", g.Format)
	case kv != nil:
		if s, ok := l.oneOf(kv, "message_indexes", "zigzag", "unsigned"); ok {
			g.MessageIndexes = s
		}
	case g.Format == FormatProtobuf:
		g.MessageIndexes = "zigzag"
	}
}

// registryCheckOK refuses, in a guard with a registry format, the checks
// that cannot mean anything there: `valid_json` (the values are not JSON;
// the built-in decode check stands in for it), and a check named `decode`
// (the built-in's name, which a failure must name unambiguously).
func (l *loader) registryCheckOK(g *Guard, c GuardCheck, at *yaml.Node) bool {
	if !g.Format.Registry() {
		return true
	}
	switch {
	case c.Cond == nil:
		l.errAt(at, ValidJSON, "`valid_json` checks JSON values; with `format: %s` every record is decoded with its schema, and one that does not decode fails the built-in check `%s`. Remove `valid_json`", g.Format, GuardDecode)
		return false
	case c.Name == GuardDecode:
		l.errAt(at, GuardDecode, "`%s` names the built-in check of `format: %s` (a record that does not decode); give this check another `name`", GuardDecode, g.Format)
		return false
	}
	return true
}
