package rules

// `sink: { http: { ... } }`: a route whose outputs are HTTP requests, one
// per output, to an endpoint (pipeline/sink_http.go). Secrets in headers
// come from a file or an environment variable, never inline, and the URL,
// the files and the variables are confined by the proxy's allow-list
// (allow.go), as the schema registry's are.

import (
	"errors"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// HTTPSink is `sink.http`.
type HTTPSink struct {
	URL         string
	Method      string // POST (default), PUT or PATCH
	Headers     []HTTPHeader
	Timeout     time.Duration // one request; default DefaultHTTPTimeout
	MaxInFlight int           // requests at once over all partitions; default DefaultHTTPMaxInFlight
	CAFile      string        // PEM roots for https; empty: the system's
}

// HTTPHeader is one entry of `sink.http.headers`: a plain value, or a
// secret read from File or the environment variable Env, with Prefix
// (e.g. "Bearer ") before it.
type HTTPHeader struct {
	Name   string
	Value  string
	File   string
	Env    string
	Prefix string
}

// Defaults of `sink.http`.
const (
	DefaultHTTPMethod      = http.MethodPost
	DefaultHTTPTimeout     = 10 * time.Second
	DefaultHTTPMaxInFlight = 8
	// MaxHTTPMaxInFlight bounds max_in_flight: each request in flight is a
	// connection and a goroutine of the proxy.
	MaxHTTPMaxInFlight = 256
)

var httpSinkKeys = []string{"url", "method", "headers", "timeout", "max_in_flight", "ca_file"}

// secretHeaderRe are header names whose values are secrets
// (config.DefaultRedactHeaders): such a value must come from a file or an
// environment variable.
var secretHeaderRe = regexp.MustCompile(`(?i)auth|token|secret|passw|cookie|api[-_]?key|access[-_]?key|jwt|bearer|session|credential|signature|private`)

// reservedHTTPHeaders are set by the sink itself.
var reservedHTTPHeaders = []string{"Idempotency-Key", "Content-Length", "Host", "Transfer-Encoding", "Connection"}

func (l *loader) httpSink(kv *keyVal, s *Sink) {
	if !l.mapping(kv, "sink.http", "`http: { url: https://api.example.com/events }`") {
		return
	}
	f := l.fields(kv.val, httpSinkKeys, "sink.http")
	h := &HTTPSink{Method: DefaultHTTPMethod, Timeout: DefaultHTTPTimeout, MaxInFlight: DefaultHTTPMaxInFlight}
	s.HTTP = h
	allow := l.opts.Allow.In(l.dir)
	if x := f["url"]; x == nil {
		l.errAt(kv.key, "http", "missing `sink.http.url`, e.g. `url: https://api.example.com/events`")
	} else if s, ok := l.scalar(x, "sink.http.url"); ok {
		u, err := url.Parse(strings.TrimSpace(s))
		switch {
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
			l.errAt(x.val, s, "`sink.http.url` must be an http:// or https:// URL with a host")
		case u.User != nil:
			l.errAt(x.val, "", "`sink.http.url` holds credentials; send them in a header read from a file or an environment variable (`headers: { Authorization: { env: API_TOKEN, prefix: \"Bearer \" } }`)")
		default:
			h.URL = u.String()
			if err := allow.URL(h.URL); err != nil {
				l.errAt(x.val, s, "sink.http.url: %v", err)
			}
		}
	}
	if x := f["method"]; x != nil {
		if m, ok := l.oneOf(x, "sink.http.method", http.MethodPost, http.MethodPut, http.MethodPatch); ok {
			h.Method = m
		}
	}
	if x := f["timeout"]; x != nil {
		if d, ok := l.duration(x, "sink.http.timeout", false); ok {
			h.Timeout = d
		}
	}
	if x := f["max_in_flight"]; x != nil {
		if s, ok := l.scalar(x, "sink.http.max_in_flight"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 1 || n > MaxHTTPMaxInFlight {
				l.errAt(x.val, s, "`sink.http.max_in_flight` must be a whole number from 1 to %d", MaxHTTPMaxInFlight)
			} else {
				h.MaxInFlight = n
			}
		}
	}
	if x := f["ca_file"]; x != nil {
		if s, ok := l.scalar(x, "sink.http.ca_file"); ok {
			if !filepath.IsAbs(s) {
				s = filepath.Join(l.dir, s)
			}
			h.CAFile = s
			if err := allow.File(s); err != nil {
				l.errAt(x.val, x.val.Value, "sink.http.ca_file: %v", err)
			}
		}
	}
	if x := f["headers"]; x != nil {
		l.httpHeaders(x, h, allow)
	}
}

func (l *loader) httpHeaders(kv *keyVal, h *HTTPSink, allow *Allow) {
	if !l.mapping(kv, "sink.http.headers", "`headers: { Content-Type: application/json, Authorization: { env: API_TOKEN, prefix: \"Bearer \" } }`") {
		return
	}
	for i := 0; i+1 < len(kv.val.Content); i += 2 {
		k, v := resolve(kv.val.Content[i]), resolve(kv.val.Content[i+1])
		name := k.Value
		if k.Kind != yaml.ScalarNode || !validHeaderName(name) {
			l.errAt(k, name, "`%s` is not an HTTP header name (letters, digits and !#$%%&'*+-.^_`|~)", name)
			continue
		}
		for _, res := range reservedHTTPHeaders {
			if strings.EqualFold(res, name) {
				l.errAt(k, name, "the header %s is set by the sink itself; remove it", name)
			}
		}
		where := "sink.http.headers." + name
		hd := HTTPHeader{Name: http.CanonicalHeaderKey(name)}
		if v.Kind == yaml.MappingNode {
			f := l.fields(v, []string{"env", "file", "prefix"}, where)
			str := func(key string) string {
				if x := f[key]; x != nil {
					s, _ := l.scalar(x, where+"."+key)
					return s
				}
				return ""
			}
			hd.Env, hd.File, hd.Prefix = str("env"), str("file"), ""
			if x := f["prefix"]; x != nil && x.val.Kind == yaml.ScalarNode {
				hd.Prefix = x.val.Value // may end in a space ("Bearer ")
			}
			switch {
			case hd.Env == "" && hd.File == "":
				l.errAt(v, name, "`%s` needs `env` (an environment variable) or `file` (a file) holding the value", where)
			case hd.Env != "" && hd.File != "":
				l.errAt(v, name, "`%s` has env and file; use one", where)
			case hd.Env != "":
				if err := allow.Env(hd.Env); err != nil {
					l.errAt(f["env"].val, hd.Env, "%s.env: %v", where, err)
				}
			default:
				if !filepath.IsAbs(hd.File) {
					hd.File = filepath.Join(l.dir, hd.File)
				}
				if err := allow.File(hd.File); err != nil {
					l.errAt(f["file"].val, f["file"].val.Value, "%s.file: %v", where, err)
				}
			}
		} else {
			s, ok := l.scalar(&keyVal{key: k, val: v}, where)
			if !ok {
				continue
			}
			if secretHeaderRe.MatchString(name) {
				l.errAt(v, "", "the header %s carries a secret; read it from a file or an environment variable instead of writing it here, e.g. `%s: { env: API_TOKEN, prefix: \"Bearer \" }`", name, name)
				continue
			}
			if strings.ContainsAny(s, "\r\n") {
				l.errAt(v, "", "the value of header %s holds a line break", name)
				continue
			}
			hd.Value = s
		}
		h.Headers = append(h.Headers, hd)
	}
}

func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// errHTTPExactlyOnce is why `delivery: exactly_once` is refused for an HTTP
// sink.
var errHTTPExactlyOnce = errors.New("`sink.delivery: exactly_once` needs a topic sink: an HTTP endpoint cannot take part in a Kafka transaction. An HTTP sink delivers at least once, and every request carries an Idempotency-Key header, so the endpoint can drop a repeat")
