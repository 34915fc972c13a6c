package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rtproxy/rtproxy/internal/yamlbudget"
)

// EnvPrefix starts every environment variable the proxy reads.
const EnvPrefix = "RTPROXY_"

// Key describes one leaf setting: its dotted YAML path, its environment
// variable and its Go type. Keys are derived from the Config struct, so a
// field added there is at once a YAML key and an environment variable.
type Key struct {
	Path  string // "tls.upstream.ca_file"
	Env   string // "RTPROXY_TLS_UPSTREAM_CA_FILE"
	Type  string // "string", "int", "bool", "duration", "list"
	index []int
}

var (
	durationType = reflect.TypeOf(time.Duration(0))
	configType   = reflect.TypeOf(Config{})
	keys         = collectKeys(configType, "", nil)
	keysByPath   = func() map[string]Key {
		m := make(map[string]Key, len(keys))
		for _, k := range keys {
			m[k.Path] = k
		}
		return m
	}()
)

// Keys lists every leaf setting in struct order.
func Keys() []Key { return append([]Key(nil), keys...) }

func collectKeys(t reflect.Type, prefix string, index []int) []Key {
	var out []Key
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := yamlName(f)
		if name == "" {
			continue
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		idx := append(append([]int(nil), index...), i)
		if f.Type.Kind() == reflect.Struct && f.Type != durationType {
			out = append(out, collectKeys(f.Type, path, idx)...)
			continue
		}
		out = append(out, Key{
			Path:  path,
			Env:   EnvPrefix + strings.ToUpper(strings.ReplaceAll(path, ".", "_")),
			Type:  typeName(f.Type),
			index: idx,
		})
	}
	return out
}

func yamlName(f reflect.StructField) string {
	tag := f.Tag.Get("yaml")
	name, _, _ := strings.Cut(tag, ",")
	if name == "-" {
		return ""
	}
	return name
}

func typeName(t reflect.Type) string {
	switch {
	case t == durationType:
		return "duration"
	case t.Kind() == reflect.String:
		return "string"
	case t.Kind() == reflect.Bool:
		return "bool"
	case t.Kind() == reflect.Int, t.Kind() == reflect.Int32, t.Kind() == reflect.Int64:
		return "int"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		return "list"
	}
	panic("config: unsupported field type " + t.String())
}

// Set assigns one setting from its text form, the way flags and environment
// variables give it: lists are comma-separated, durations are Go durations
// ("10s"), booleans are strconv.ParseBool forms.
func (c *Config) Set(path, value string) error {
	k, ok := keysByPath[path]
	if !ok {
		return fmt.Errorf("unknown setting %q", path)
	}
	if k.Type == "list" {
		var items []string
		for _, s := range strings.Split(value, ",") {
			if s = strings.TrimSpace(s); s != "" {
				items = append(items, s)
			}
		}
		reflect.ValueOf(c).Elem().FieldByIndex(k.index).Set(reflect.ValueOf(items))
		return nil
	}
	return setScalar(reflect.ValueOf(c).Elem().FieldByIndex(k.index), k.Type, value)
}

func setScalar(v reflect.Value, typ, s string) error {
	switch typ {
	case "string":
		v.SetString(s)
	case "bool":
		b, err := strconv.ParseBool(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("%q is not a boolean (true/false)", s)
		}
		v.SetBool(b)
	case "int":
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, v.Type().Bits())
		if err != nil {
			return fmt.Errorf("%q is not an integer", s)
		}
		v.SetInt(n)
	case "duration":
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("%q is not a duration (like 10s, 1m30s)", s)
		}
		v.SetInt(int64(d))
	default:
		return fmt.Errorf("cannot set a %s from text", typ)
	}
	return nil
}

// ApplyEnv applies every RTPROXY_* variable that lookup finds (pass
// os.LookupEnv). A set but empty variable counts as set: RTPROXY_UPSTREAM=""
// clears the upstream list.
func (c *Config) ApplyEnv(lookup func(string) (string, bool)) error {
	var errs []error
	for _, k := range keys {
		v, ok := lookup(k.Env)
		if !ok {
			continue
		}
		if err := c.Set(k.Path, v); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", k.Env, err))
		}
	}
	return errors.Join(errs...)
}

// pathKeys are the settings that name files or directories. A relative one
// written in a config file is relative to that file's directory, so a config
// works the same from any working directory; from a flag or the environment
// it stays relative to the working directory, as a shell user expects.
var pathKeys = map[string]bool{
	"rules_dir": true, "state_dir": true,
	"tls.client.cert_file": true, "tls.client.key_file": true, "tls.client.client_ca_file": true,
	"tls.upstream.ca_file": true, "tls.upstream.cert_file": true, "tls.upstream.key_file": true,
	"schema_registry.basic_auth_file": true, "schema_registry.bearer_token_file": true, "schema_registry.ca_file": true,
}

// LoadFile overlays the YAML file at path onto c. Relative paths in it are
// resolved against the file's directory.
func (c *Config) LoadFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	set, err := c.parse(path, data)
	if err != nil {
		return err
	}
	base := filepath.Dir(path)
	for _, k := range set {
		if !pathKeys[k] {
			continue
		}
		v := reflect.ValueOf(c).Elem().FieldByIndex(keysByPath[k].index)
		if p := v.String(); p != "" && !filepath.IsAbs(p) {
			v.SetString(filepath.Join(base, p))
		}
	}
	return nil
}

// Parse overlays a YAML document onto c. Keys absent from the document keep
// their current value; a null value also keeps it. Unknown keys, values of
// the wrong type and duplicate keys are errors that start with
// "name:line:col:". On error c may be partly updated; callers discard it.
func (c *Config) Parse(name string, data []byte) error {
	_, err := c.parse(name, data)
	return err
}

// parse is Parse that also reports the setting paths the document set.
func (c *Config) parse(name string, data []byte) (set []string, err error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil // an empty file changes nothing
		}
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, fmt.Errorf("%s:%d:%d: a config file holds one YAML document; found a second", name, extra.Line, extra.Column)
	} else if !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	if err := yamlbudget.Check(&doc); err != nil {
		return nil, fmt.Errorf("%s:%v", name, err)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return nil, nil
		}
		root = root.Content[0]
	}
	p := parser{name: name}
	p.mapping(root, reflect.ValueOf(c).Elem(), "")
	return p.set, errors.Join(p.errs...)
}

type parser struct {
	name string
	errs []error
	set  []string // setting paths given a (non-null) value
}

func (p *parser) errorf(n *yaml.Node, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s:%d:%d: %s", p.name, n.Line, n.Column, fmt.Sprintf(format, args...)))
}

func deref(n *yaml.Node) *yaml.Node {
	// One level is all a YAML alias can be: anchors name a node, not an alias.
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		return n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return "a scalar"
	}
	return "something else"
}

// mapping walks a YAML mapping against struct v, whose dotted path is prefix.
func (p *parser) mapping(n *yaml.Node, v reflect.Value, prefix string) {
	n = deref(n)
	if isNull(n) {
		return
	}
	what := prefix
	if what == "" {
		what = "the config"
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(n, "%s must be a mapping of keys, got %s", what, kindName(n))
		return
	}
	t := v.Type()
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := deref(n.Content[i]), n.Content[i+1]
		if kn.Kind != yaml.ScalarNode {
			p.errorf(kn, "keys must be plain names, got %s", kindName(kn))
			continue
		}
		key := kn.Value
		path := key
		if prefix != "" {
			path = prefix + "." + key
		}
		if line, dup := seen[key]; dup {
			p.errorf(kn, "key %q appears twice (first on line %d)", path, line)
			continue
		}
		seen[key] = kn.Line
		field, ok := fieldByYAML(t, key)
		if !ok {
			p.errorf(kn, "unknown key %q (known in %s: %s)", path, what, strings.Join(yamlNames(t), ", "))
			continue
		}
		fv := v.FieldByIndex(field.Index)
		if field.Type.Kind() == reflect.Struct && field.Type != durationType {
			p.mapping(vn, fv, path)
			continue
		}
		p.leaf(vn, fv, keysByPath[path])
	}
}

func (p *parser) leaf(n *yaml.Node, v reflect.Value, k Key) {
	n = deref(n)
	if isNull(n) {
		return
	}
	if k.Type == "list" {
		var items []string
		switch n.Kind {
		case yaml.SequenceNode:
			for _, it := range n.Content {
				it = deref(it)
				if it.Kind != yaml.ScalarNode || isNull(it) {
					p.errorf(it, "%s: each entry must be a string, got %s", k.Path, kindName(it))
					return
				}
				items = append(items, it.Value)
			}
		case yaml.ScalarNode:
			// A single "a:1,b:2" string is accepted like the flag form.
			for _, s := range strings.Split(n.Value, ",") {
				if s = strings.TrimSpace(s); s != "" {
					items = append(items, s)
				}
			}
		default:
			p.errorf(n, "%s must be a list of strings, got %s", k.Path, kindName(n))
			return
		}
		v.Set(reflect.ValueOf(items))
		p.set = append(p.set, k.Path)
		return
	}
	if n.Kind != yaml.ScalarNode {
		p.errorf(n, "%s must be a %s, got %s", k.Path, k.Type, kindName(n))
		return
	}
	if err := setScalar(v, k.Type, n.Value); err != nil {
		p.errorf(n, "%s: %v", k.Path, err)
		return
	}
	p.set = append(p.set, k.Path)
}

func fieldByYAML(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		if f := t.Field(i); yamlName(f) == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func yamlNames(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		if n := yamlName(t.Field(i)); n != "" {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// YAML renders c as a config file that Parse reads back to the same value.
func (c *Config) YAML() []byte {
	var b strings.Builder
	var walk func(v reflect.Value, t reflect.Type, indent string)
	walk = func(v reflect.Value, t reflect.Type, indent string) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name := yamlName(f)
			if name == "" {
				continue
			}
			fv := v.Field(i)
			if f.Type.Kind() == reflect.Struct && f.Type != durationType {
				fmt.Fprintf(&b, "%s%s:\n", indent, name)
				walk(fv, f.Type, indent+"  ")
				continue
			}
			switch typeName(f.Type) {
			case "list":
				if fv.Len() == 0 {
					fmt.Fprintf(&b, "%s%s: []\n", indent, name)
					continue
				}
				fmt.Fprintf(&b, "%s%s:\n", indent, name)
				for j := 0; j < fv.Len(); j++ {
					fmt.Fprintf(&b, "%s  - %s\n", indent, strconv.Quote(fv.Index(j).String()))
				}
			case "string":
				fmt.Fprintf(&b, "%s%s: %s\n", indent, name, strconv.Quote(fv.String()))
			case "duration":
				fmt.Fprintf(&b, "%s%s: %s\n", indent, name, time.Duration(fv.Int()))
			default:
				fmt.Fprintf(&b, "%s%s: %v\n", indent, name, fv.Interface())
			}
		}
	}
	walk(reflect.ValueOf(c).Elem(), configType, "")
	return []byte(b.String())
}

// Resolve builds the effective configuration with the agreed precedence:
// flags > environment > file > defaults. file may be empty (no file); flags
// maps setting paths ("listen", "rules_dir") to their text values and holds
// only the flags the user actually gave. The result is validated.
func Resolve(file string, lookup func(string) (string, bool), flags map[string]string) (*Config, error) {
	c := Default()
	if file != "" {
		if err := c.LoadFile(file); err != nil {
			return nil, err
		}
	}
	if lookup != nil {
		if err := c.ApplyEnv(lookup); err != nil {
			return nil, err
		}
	}
	paths := make([]string, 0, len(flags))
	for p := range flags {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var errs []error
	for _, p := range paths {
		if err := c.Set(p, flags[p]); err != nil {
			errs = append(errs, fmt.Errorf("flag for %s: %w", p, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// UnknownEnv lists the RTPROXY_* names in environ (os.Environ form) that are
// no setting, so a typo such as RTPROXY_LISTN is reported instead of quietly
// ignored. extra names variables read elsewhere (RTPROXY_CONFIG).
func UnknownEnv(environ []string, extra ...string) []string {
	known := map[string]bool{}
	for _, k := range keys {
		known[k.Env] = true
	}
	for _, e := range extra {
		known[e] = true
	}
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, EnvPrefix) && !known[name] {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}
