package serde

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
)

// A registry is trusted to say what a schema is, not to be small: its
// answers and the schemas in them are bounded before anything is parsed
// (docs/SECURITY.md, docs/OPERATIONS.md "schema_registry"). A schema over a
// bound is refused like one that does not compile: its records are dead
// letters (reason decode) naming the bound, the refusal is cached like any
// other (negTTL), and the bound's counter moves.
const (
	DefaultMaxResponseBytes = 8 << 20 // one registry answer
	DefaultMaxSchemaBytes   = 1 << 20 // a schema's text and all its references'
	DefaultMaxSchemaDepth   = 64      // nesting of { and [ in its text
	DefaultMaxReferences    = 64      // references, counted through the whole tree
)

// Bound names (the config keys under schema_registry, the metric's label).
const (
	boundResponse   = "max_response_bytes"
	boundSchemaSize = "max_schema_bytes"
	boundDepth      = "max_schema_depth"
	boundRefs       = "max_references"
)

// Limits are the bounds of one registry client; zero fields take the
// defaults.
type Limits struct {
	MaxResponseBytes int64
	MaxSchemaBytes   int
	MaxSchemaDepth   int
	MaxReferences    int
}

func (l Limits) withDefaults() Limits {
	if l.MaxResponseBytes <= 0 {
		l.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if l.MaxSchemaBytes <= 0 {
		l.MaxSchemaBytes = DefaultMaxSchemaBytes
	}
	if l.MaxSchemaDepth <= 0 {
		l.MaxSchemaDepth = DefaultMaxSchemaDepth
	}
	if l.MaxReferences <= 0 {
		l.MaxReferences = DefaultMaxReferences
	}
	return l
}

// Metrics count the registry answers and schemas refused for a bound.
// Register once per Prometheus registry and share it between registries.
type Metrics struct {
	refused *prometheus.CounterVec // bound
}

// NewMetrics registers the serde collectors on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{refused: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rtproxy_schema_registry_refused_total",
		Help: "Registry answers and schemas refused for a bound (max_response_bytes, max_schema_bytes, max_schema_depth, max_references); their records are dead letters.",
	}, []string{"bound"})}
	for _, b := range []string{boundResponse, boundSchemaSize, boundDepth, boundRefs} {
		m.refused.WithLabelValues(b)
	}
	if err := reg.Register(m.refused); err != nil {
		return nil, fmt.Errorf("serde metrics: %w", err)
	}
	return m, nil
}

func (m *Metrics) trip(bound string) {
	if m != nil {
		m.refused.WithLabelValues(bound).Inc()
	}
}

// BoundError is a registry answer or a schema refused for a bound.
type BoundError struct {
	Bound string // the schema_registry config key
	Msg   string
}

func (e *BoundError) Error() string {
	return fmt.Sprintf("%s (schema_registry.%s)", e.Msg, e.Bound)
}

// IsBound reports whether err is a refusal for a bound.
func IsBound(err error) bool {
	var b *BoundError
	return errors.As(err, &b)
}

// limitTransport refuses registry answers larger than max: by their
// Content-Length before a byte is read, else while reading.
type limitTransport struct {
	rt  http.RoundTripper
	max int64
	m   *Metrics
}

func (t *limitTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.ContentLength > t.max {
		resp.Body.Close()
		t.m.trip(boundResponse)
		return nil, &BoundError{Bound: boundResponse, Msg: fmt.Sprintf("the registry's answer is %d bytes, more than %d", resp.ContentLength, t.max)}
	}
	resp.Body = &limitBody{rc: resp.Body, left: t.max, max: t.max, m: t.m}
	return resp, nil
}

type limitBody struct {
	rc   io.ReadCloser
	left int64
	max  int64
	m    *Metrics
	err  error
}

func (b *limitBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.left <= 0 {
		// One byte more than allowed says the answer is too large.
		var one [1]byte
		n, err := b.rc.Read(one[:])
		if n > 0 {
			b.m.trip(boundResponse)
			b.err = &BoundError{Bound: boundResponse, Msg: fmt.Sprintf("the registry's answer is more than %d bytes", b.max)}
			return 0, b.err
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *limitBody) Close() error { return b.rc.Close() }

// checkSchemaBounds refuses, before any parser sees them, a schema whose
// text and references' together are larger than the limit, or nested
// deeper. The depth is counted on the text: JSON brackets for Avro, braces
// for .proto source (outside strings and comments), nested messages for a
// base64 FileDescriptorProto.
func checkSchemaBounds(lim Limits, m *Metrics, typ sr.SchemaType, main string, refs []reference) error {
	total := len(main)
	for _, r := range refs {
		total += len(r.schema)
	}
	if total > lim.MaxSchemaBytes {
		m.trip(boundSchemaSize)
		return &BoundError{Bound: boundSchemaSize, Msg: fmt.Sprintf("the schema and its references are %d bytes, more than %d", total, lim.MaxSchemaBytes)}
	}
	texts := append([]reference{{name: "the schema", schema: main}}, refs...)
	for _, r := range texts {
		var d int
		if typ == sr.TypeProtobuf {
			d = protoTextDepth(r.schema, lim.MaxSchemaDepth)
		} else {
			d = jsonDepth(r.schema, lim.MaxSchemaDepth)
		}
		if d > lim.MaxSchemaDepth {
			m.trip(boundDepth)
			return &BoundError{Bound: boundDepth, Msg: fmt.Sprintf("%s is nested deeper than %d", r.name, lim.MaxSchemaDepth)}
		}
	}
	return nil
}

// jsonDepth is the deepest nesting of [ and { in JSON text, counting
// stops once it passes limit.
func jsonDepth(s string, limit int) int {
	depth, deepest, inStr := 0, 0, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if inStr {
			switch c {
			case '\\':
				i++
			case '"':
				inStr = false
			}
			continue
		}
		switch c {
		case '"':
			inStr = true
		case '{', '[':
			depth++
			if depth > deepest {
				deepest = depth
				if deepest > limit {
					return deepest
				}
			}
		case '}', ']':
			depth--
		}
	}
	return deepest
}

// protoTextDepth is the deepest nesting of a schema's .proto text (braces
// outside strings and comments; < > of aggregate options count too), or,
// for a base64 FileDescriptorProto, of its messages.
func protoTextDepth(s string, limit int) int {
	if t := strings.TrimSpace(s); t != "" && !strings.ContainsAny(t, " \n\t;{") {
		if b, err := base64.StdEncoding.DecodeString(t); err == nil {
			return descriptorDepth(b, limit)
		}
	}
	depth, deepest := 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"', '\'':
			for i++; i < len(s) && s[i] != c && s[i] != '\n'; i++ {
				if s[i] == '\\' {
					i++
				}
			}
		case '/':
			if i+1 < len(s) && s[i+1] == '/' {
				for i < len(s) && s[i] != '\n' {
					i++
				}
			} else if i+1 < len(s) && s[i+1] == '*' {
				end := strings.Index(s[i+2:], "*/")
				if end < 0 {
					return deepest
				}
				i += end + 3
			}
		case '{', '<', '[':
			depth++
			if depth > deepest {
				deepest = depth
				if deepest > limit {
					return deepest
				}
			}
		case '}', '>', ']':
			depth--
		}
	}
	return deepest
}

// descriptorDepth is the deepest nesting of messages in the serialized
// FileDescriptorProto b; more than limit when it cannot be read within a
// recursion limit a little above limit.
func descriptorDepth(b []byte, limit int) int {
	fdp := &descriptorpb.FileDescriptorProto{}
	if err := (proto.UnmarshalOptions{RecursionLimit: limit + 8}).Unmarshal(b, fdp); err != nil {
		if strings.Contains(err.Error(), "recursion") {
			return limit + 1
		}
		return 0 // not a descriptor: the compiler says what it is
	}
	var walk func(ms []*descriptorpb.DescriptorProto, d int) int
	walk = func(ms []*descriptorpb.DescriptorProto, d int) int {
		deepest := d - 1
		for _, m := range ms {
			deepest = max(deepest, d, walk(m.NestedType, d+1))
		}
		return deepest
	}
	return walk(fdp.MessageType, 1)
}
