package serde

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
)

// allocated is the bytes f allocates.
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

func zigzagLong(n int64) []byte { return binary.AppendVarint(nil, n) }

// TestAvroLengthsBoundedByTheRecord (issue 25 finding 5): a fixed, bytes
// or string longer than what is left of the record is refused before
// anything is allocated for it. The sizes here cost 100 MB and 1 MB
// before the bound; the 1e11 fixed of the finding runs only once the
// smaller one is bounded.
func TestAvroLengthsBoundedByTheRecord(t *testing.T) {
	check := func(name, schema string, body []byte) bool {
		t.Helper()
		s := fuzzSchema(t, sr.TypeAvro, schema)
		var err error
		n := allocated(func() { _, err = (&Decoder{format: Avro}).decode(s, body) })
		if err == nil || !strings.Contains(err.Error(), "left") {
			t.Errorf("%s: error %v, want one saying what is left of the record", name, err)
		}
		if n > 64<<10 {
			t.Errorf("%s: decoding %d bytes allocated %d bytes", name, len(body), n)
			return false
		}
		return true
	}
	if check("fixed 1e8", `{"type":"fixed","name":"F","size":100000000}`, []byte("xyz")) {
		check("fixed 1e11", `{"type":"fixed","name":"F","size":100000000000}`, []byte("xyz"))
	}
	check("string", `"string"`, append(zigzagLong(1_000_000), "abc"...))
	check("bytes", `"bytes"`, append(zigzagLong(1_000_000), "abc"...))
	check("string in a record", `{"type":"record","name":"R","fields":[{"name":"a","type":"string"},{"name":"b","type":"string"}]}`,
		append(append(zigzagLong(3), "abc"...), append(zigzagLong(900_000), "x"...)...))
	check("map key", `{"type":"map","values":"null"}`, append(zigzagLong(1), zigzagLong(1_000_000)...))
	check("decimal fixed", `{"type":"fixed","name":"D","size":50000000,"logicalType":"decimal","precision":4,"scale":2}`, []byte("ab"))
}

// TestAvroStringsBeyondOneMiB: a string longer than hamba's default cap
// (1 MiB) decodes when the record holds it.
func TestAvroStringsBeyondOneMiB(t *testing.T) {
	s := fuzzSchema(t, sr.TypeAvro, `"string"`)
	long := strings.Repeat("x", 2<<20)
	v, err := (&Decoder{format: Avro}).decode(s, append(zigzagLong(int64(len(long))), long...))
	if err != nil || v != long {
		t.Fatalf("2 MiB string: %v", err)
	}
}

// TestProtobufLengthsBoundedByTheRecord: a length-delimited field that
// claims more than the record holds is refused without allocating it
// (protowire checks every length against what is left).
func TestProtobufLengthsBoundedByTheRecord(t *testing.T) {
	s := fuzzSchema(t, sr.TypeProtobuf, "syntax = \"proto3\";\nmessage M { bytes b = 1; string s = 2; repeated int64 p = 3; map<string, string> m = 4; M sub = 5; }\n")
	if _, err := (&Decoder{format: Protobuf}).decode(s, []byte{0}); err != nil { // the descriptor's cache, built once
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{
		"bytes":  append([]byte{0, 0x0a}, binary.AppendUvarint(nil, 1e11)...),
		"string": append([]byte{0, 0x12}, binary.AppendUvarint(nil, 1e9)...),
		"packed": append([]byte{0, 0x1a}, binary.AppendUvarint(nil, 1e9)...),
		"map":    append([]byte{0, 0x22}, binary.AppendUvarint(nil, 1e9)...),
		"sub":    append([]byte{0, 0x2a}, binary.AppendUvarint(nil, 1e9)...),
	} {
		var err error
		n := allocated(func() { _, err = (&Decoder{format: Protobuf}).decode(s, append(body, "xyz"...)) })
		if err == nil || n > 64<<10 {
			t.Errorf("%s: error %v, %d bytes allocated", name, err, n)
		}
	}
}

// hostileRegistry answers GET /schemas/ids/N with answers[N] (a function
// writing the whole response) and counts the requests per id.
type hostileRegistry struct {
	answers map[string]func(w http.ResponseWriter)
	mu      sync.Mutex
	hits    map[string]int
}

func (h *hostileRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.hits[r.URL.Path]++
	h.mu.Unlock()
	if a := h.answers[r.URL.Path]; a != nil {
		a(w)
		return
	}
	// A chain of subjects, each referencing the next: /subjects/cN/versions/1.
	var n int
	if _, err := fmt.Sscanf(r.URL.Path, "/subjects/c%d/versions/1", &n); err == nil {
		next := fmt.Sprintf("c%d", n+1)
		b, _ := json.Marshal(map[string]any{"subject": fmt.Sprintf("c%d", n), "version": 1, "id": 1000 + n, "schemaType": "PROTOBUF",
			"schema":     fmt.Sprintf("syntax = \"proto3\";\nimport \"%s.proto\";\nmessage C%d {}\n", next, n),
			"references": []sr.SchemaReference{{Name: next + ".proto", Subject: next, Version: 1}}})
		w.Write(b)
		return
	}
	w.WriteHeader(http.StatusNotFound)
	w.Write([]byte(`{"error_code":40403,"message":"Schema not found"}`))
}

func schemaAnswer(typ, schema string, refs ...sr.SchemaReference) func(w http.ResponseWriter) {
	b, _ := json.Marshal(map[string]any{"schema": schema, "schemaType": typ, "references": refs})
	return func(w http.ResponseWriter) { w.Write(b) }
}

// TestRegistryBounds (issue 25 finding 6): answers and schemas over a bound
// are refused before they are read whole or parsed, as decode errors
// naming the bound; the refusal is cached and counted.
func TestRegistryBounds(t *testing.T) {
	nested := func(n int) string {
		return "syntax = \"proto3\";\n" + strings.Repeat("message M {\n", n) + strings.Repeat("}\n", n)
	}
	avroDeep := strings.Repeat(`{"type":"array","items":`, 100) + `"int"` + strings.Repeat("}", 100)
	h := &hostileRegistry{hits: map[string]int{}, answers: map[string]func(http.ResponseWriter){
		// 64 MiB, streamed without a Content-Length.
		"/schemas/ids/1": func(w http.ResponseWriter) {
			w.Write([]byte(`{"schema":"`))
			chunk := bytes.Repeat([]byte("x"), 1<<20)
			for range 64 {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
			w.Write([]byte(`"}`))
		},
		// 2 GB announced, nothing sent.
		"/schemas/ids/2": func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", "2000000000")
			w.WriteHeader(200)
		},
		"/schemas/ids/3": schemaAnswer("PROTOBUF", nested(300)),
		"/schemas/ids/4": schemaAnswer("PROTOBUF", nested(30000)), // 360 KB of text under the size bound
		"/schemas/ids/5": schemaAnswer("AVRO", avroDeep),
		"/schemas/ids/6": schemaAnswer("AVRO", `{"type":"record","name":"R","fields":[{"name":"s","type":"string","doc":"`+strings.Repeat("y", 600<<10)+`"}]}`),
		"/schemas/ids/7": schemaAnswer("PROTOBUF", "syntax = \"proto3\";\nmessage M {}\n", refsN(70)...),
		"/schemas/ids/8": schemaAnswer("PROTOBUF", asDescriptorNested(t, 200)),
		"/schemas/ids/9": schemaAnswer("AVRO", `{"type":"fixed","name":"F","size":100000000000}`),
		// References without end: c0 → c1 → c2 → …
		"/schemas/ids/10": schemaAnswer("PROTOBUF", "syntax = \"proto3\";\nimport \"c0.proto\";\n", sr.SchemaReference{Name: "c0.proto", Subject: "c0", Version: 1}),
	}}
	srv := httptest.NewServer(h)
	defer srv.Close()
	preg := prometheus.NewRegistry()
	met, err := NewMetrics(preg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRegistry(Config{URL: srv.URL, Limits: Limits{MaxResponseBytes: 4 << 20, MaxSchemaBytes: 512 << 10}, Metrics: met}, os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	for id, bound := range map[int]string{1: "max_response_bytes", 2: "max_response_bytes", 3: "max_schema_depth", 4: "max_schema_depth",
		5: "max_schema_depth", 6: "max_schema_bytes", 7: "max_references", 8: "max_schema_depth", 10: "max_references"} {
		var err error
		n := allocated(func() { _, err = r.Schema(context.Background(), id) })
		var de *DecodeError
		if !errors.As(err, &de) || !IsBound(err) || !strings.Contains(err.Error(), "schema_registry."+bound) {
			t.Errorf("id %d: %v, want a decode error naming %s", id, err, bound)
		}
		if n > 24<<20 {
			t.Errorf("id %d: refusing it allocated %d MB", id, n>>20)
		}
		// Cached: asked once.
		if _, err2 := r.Schema(context.Background(), id); err2 == nil || !r.Cached(id) {
			t.Errorf("id %d: refusal not cached (%v)", id, err2)
		}
		if got := h.hits[fmt.Sprintf("/schemas/ids/%d", id)]; got != 1 {
			t.Errorf("id %d: asked %d times", id, got)
		}
	}
	// The chain was followed as far as the bound, no further.
	chain := 0
	for p, n := range h.hits {
		if strings.HasPrefix(p, "/subjects/c") {
			chain += n
		}
	}
	if chain != DefaultMaxReferences {
		t.Errorf("followed %d references of the endless chain, want %d", chain, DefaultMaxReferences)
	}
	for bound, want := range map[string]float64{"max_response_bytes": 2, "max_schema_depth": 4, "max_schema_bytes": 1, "max_references": 2} {
		var m dto.Metric
		if err := met.refused.WithLabelValues(bound).Write(&m); err != nil {
			t.Fatal(err)
		}
		if got := m.GetCounter().GetValue(); got != want {
			t.Errorf("rtproxy_schema_registry_refused_total{bound=%q} = %v, want %v", bound, got, want)
		}
	}
	// The hostile fixed compiles (its size costs nothing until a record
	// claims it) and its record is a dead letter, not an allocation.
	d := NewDecoder(r, Avro)
	var derr error
	if n := allocated(func() { _, derr = d.Decode(context.Background(), []byte("\x00\x00\x00\x00\x09xyz")) }); n > 1<<20 || derr == nil {
		t.Errorf("fixed 1e11: %v, %d bytes allocated", derr, n)
	}
}

func refsN(n int) []sr.SchemaReference {
	out := make([]sr.SchemaReference, n)
	for i := range out {
		out[i] = sr.SchemaReference{Name: fmt.Sprintf("r%d.proto", i), Subject: fmt.Sprintf("r%d", i), Version: 1}
	}
	return out
}

// asDescriptorNested is a base64 FileDescriptorProto of n nested messages.
func asDescriptorNested(t *testing.T, n int) string {
	m := &descriptorpb.DescriptorProto{Name: proto.String("M0")}
	top := m
	for i := 1; i < n; i++ {
		c := &descriptorpb.DescriptorProto{Name: proto.String(fmt.Sprintf("M%d", i))}
		m.NestedType = []*descriptorpb.DescriptorProto{c}
		m = c
	}
	b, err := proto.Marshal(&descriptorpb.FileDescriptorProto{Name: proto.String("n.proto"), Syntax: proto.String("proto3"), MessageType: []*descriptorpb.DescriptorProto{top}})
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}
