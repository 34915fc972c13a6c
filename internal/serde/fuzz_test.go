package serde

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
)

// fuzzDecode decodes b (a whole framed value) with the schema s, as the
// registry would hand it for any id, and checks that the result is a
// value tree the JSON encoder writes, or a DecodeError.
func fuzzDecode(t *testing.T, f Format, s *Schema, b []byte) {
	id, rest, err := header(b)
	if err != nil {
		var de *DecodeError
		if !errors.As(err, &de) || de.HasID {
			t.Fatalf("bad header gave %v", err)
		}
		return
	}
	s.ID = id
	v, err := (&Decoder{format: f}).decode(s, rest)
	if err != nil {
		var de *DecodeError
		if !errors.As(err, &de) || de.ID != id {
			t.Fatalf("error is no DecodeError naming id %d: %v", id, err)
		}
		return
	}
	if _, err := jsoncodec.Append(nil, v); err != nil {
		t.Fatalf("decoded value does not encode as JSON: %v (%#v)", err, v)
	}
}

func fuzzSchema(t testing.TB, typ sr.SchemaType, text string, refs ...reference) *Schema {
	s, err := compile(1, sr.Schema{Schema: text, Type: typ}, refs)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func FuzzAvroDecode(f *testing.F) {
	text, err := os.ReadFile("testdata/payment.avsc")
	if err != nil {
		f.Fatal(err)
	}
	s := fuzzSchema(f, sr.TypeAvro, string(text))
	body, err := avro.Marshal(avro.MustParse(string(text)), samplePayment())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(frame(f, 1, nil, body))
	f.Add(frame(f, 1, nil, body[:10]))
	f.Add([]byte{0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) { fuzzDecode(t, Avro, s, b) })
}

func FuzzProtobufDecode(f *testing.F) {
	common, err := os.ReadFile("testdata/common.proto")
	if err != nil {
		f.Fatal(err)
	}
	text, err := os.ReadFile("testdata/payment.proto")
	if err != nil {
		f.Fatal(err)
	}
	s := fuzzSchema(f, sr.TypeProtobuf, string(text), reference{name: "common.proto", schema: string(common)})
	md := compileTestProto(f).Messages().ByName("Payment")
	msg := dynamicpb.NewMessage(md)
	if err := protojson.Unmarshal([]byte(samplePaymentProtoJSON), msg); err != nil {
		f.Fatal(err)
	}
	body, err := proto.Marshal(msg)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(frame(f, 1, protoIndexOf(md), body))
	f.Add(frame(f, 1, []int{1, 2}, body[:7]))
	f.Add([]byte{0, 0, 0, 0, 1, 0x7f})
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzDecode(t, Protobuf, s, b)
		// The wire decoder agrees with the runtime's dynamicpb message,
		// for every message of the file.
		for _, name := range []string{"Payment", "Other"} {
			md := s.proto.Messages().ByName(protoreflect.Name(name))
			got, gerr := protoWireDecode(md, b)
			want, werr := protoDecodeDynamic(md, b)
			if (gerr == nil) != (werr == nil) {
				t.Fatalf("%s: wire decoder error %v, dynamicpb error %v", name, gerr, werr)
			}
			if gerr == nil && fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("%s: wire decoder gives\n%v\ndynamicpb\n%v", name, got, want)
			}
		}
	})
}

// FuzzEncode: any JSON value encodes with the payment schemas without
// panicking, and what encodes decodes again.
func FuzzEncode(f *testing.F) {
	avsc, err := os.ReadFile("testdata/payment.avsc")
	if err != nil {
		f.Fatal(err)
	}
	common, _ := os.ReadFile("testdata/common.proto")
	text, _ := os.ReadFile("testdata/payment.proto")
	as := fuzzSchema(f, sr.TypeAvro, string(avsc))
	ps := fuzzSchema(f, sr.TypeProtobuf, string(text), reference{name: "common.proto", schema: string(common)})
	md, err := pickMessage(ps.proto, "rtproxy.test.Payment")
	if err != nil {
		f.Fatal(err)
	}
	encs := []*Encoder{
		{format: Avro, s: as},
		{format: Protobuf, s: ps, md: md, index: protoIndexOf(md)},
	}
	f.Add([]byte(samplePaymentJSON))
	f.Add([]byte(samplePaymentProtoTree))
	f.Add([]byte(`{"id":"x","extra":{"k":[1,2,{"a":null}]},"ts":-1e300,"price":1e400}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := jsoncodec.Decode(b)
		if err != nil {
			return
		}
		for _, e := range encs {
			out, err := e.Encode(v)
			if err != nil {
				var ee *EncodeError
				if !errors.As(err, &ee) {
					t.Fatalf("%s: error is no EncodeError: %v", e.format, err)
				}
				continue
			}
			_, rest, _ := header(out)
			if _, err := (&Decoder{format: e.format}).decode(e.s, rest); err != nil {
				t.Fatalf("%s: encoded %s, which does not decode: %v", e.format, b, err)
			}
		}
	})
}

// FuzzAvroReaderAgainstHamba: the Avro reader of this package (every
// length bounded by what is left of the record) accepts exactly the
// records hamba/avro's generic reader reads whole, with the payment schema
// and with a fixed larger than any record; for the fixed, it allocates no
// more than the record.
func FuzzAvroReaderAgainstHamba(f *testing.F) {
	text, err := os.ReadFile("testdata/payment.avsc")
	if err != nil {
		f.Fatal(err)
	}
	// hamba's generic reader has no null type: the payment without its
	// null field (which takes no bytes: the records are the same).
	noNull := strings.Replace(string(text), `,
    {"name": "nothing", "type": "null"}`, "", 1)
	if noNull == string(text) {
		f.Fatal("the payment schema's null field moved")
	}
	schemas := []avro.Schema{avro.MustParse(noNull), avro.MustParse(`{"type":"record","name":"B","fields":[{"name":"b","type":"bytes"},{"name":"s","type":"string"},{"name":"f","type":{"type":"fixed","name":"F","size":100000}}]}`)}
	body, err := avro.Marshal(schemas[0], samplePayment())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(body)
	f.Add(body[:len(body)-3])
	f.Add([]byte{0x02, 'a', 0x80, 0x80, 0x80, 0x80, 0x10})
	f.Add([]byte{0xfe, 0xff, 0xff, 0xff, 0x0f, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, s := range schemas {
			_, err := avroDecode(s, b)
			if err != nil && strings.Contains(err.Error(), "items is more than the record") {
				// hamba reads such a block item by item, past the end of
				// the record, for as many as it claims: no reference.
				continue
			}
			r := avro.NewReader(nil, 0).Reset(b)
			r.ReadNext(s)
			hambaErr := r.Error
			whole := false
			if hambaErr == nil {
				r.Peek() // io.EOF when nothing is left
				whole = r.Error != nil
			}
			if (err == nil) != (hambaErr == nil && whole) {
				t.Fatalf("%s: ours %v, hamba %v (read whole: %v)", s.Type(), err, hambaErr, whole)
			}
		}
	})
}

// FuzzMessageIndexes: any bytes read as indexes in either encoding without
// panicking, at most maxIndexes of them, none negative; what is written
// reads back.
func FuzzMessageIndexes(f *testing.F) {
	f.Add([]byte{0}, uint8(0))
	f.Add([]byte{2, 2, 4}, uint8(0))
	f.Add([]byte{1, 1}, uint8(1))
	f.Add([]byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, uint8(1))
	f.Fuzz(func(t *testing.T, b []byte, e uint8) {
		enc := IndexEncoding(e % 2)
		idx, rest, err := readIndexes(b, enc)
		if err != nil {
			return
		}
		if len(idx) == 0 || len(idx) > maxIndexes || len(rest) > len(b) {
			t.Fatalf("%q: %v, rest %d of %d", b, idx, len(rest), len(b))
		}
		for _, i := range idx {
			if i < 0 {
				t.Fatalf("%q: negative index in %v", b, idx)
			}
		}
		w := appendIndexes(nil, idx, enc)
		back, tail, err := readIndexes(append(w, rest...), enc)
		if err != nil || !equalInts(back, idx) || len(tail) != len(rest) {
			t.Fatalf("%v written as %q read back as %v, %v", idx, w, back, err)
		}
	})
}

// FuzzSchemaDepth: the pre-scan's depth of a JSON text is the depth
// encoding/json finds in it (counted the same way: objects and arrays),
// and the .proto pre-scan never panics and stops at its limit.
func FuzzSchemaDepth(f *testing.F) {
	f.Add(`{"type":"record","fields":[{"name":"a","type":{"type":"array","items":"int"}}]}`)
	f.Add(`["a\"[{",{"b":[[[]]]}]`)
	f.Add("syntax = \"proto3\";\nmessage A { message B { string x = 1 [json_name = \"{\"]; } // {\n /* { */ }\n")
	f.Add(strings.Repeat("[", 100))
	f.Fuzz(func(t *testing.T, s string) {
		if d := protoTextDepth(s, 16); d > 17 {
			t.Fatalf("protoTextDepth went to %d past its limit 16", d)
		}
		var v any
		if json.Unmarshal([]byte(s), &v) != nil {
			jsonDepth(s, 64)
			return
		}
		want := treeDepth(v)
		if got := jsonDepth(s, 1<<30); got != want {
			t.Fatalf("jsonDepth(%q) = %d, encoding/json's tree is %d deep", s, got, want)
		}
	})
}

func treeDepth(v any) int {
	d := 0
	switch x := v.(type) {
	case map[string]any:
		for _, e := range x {
			d = max(d, treeDepth(e))
		}
		return d + 1
	case []any:
		for _, e := range x {
			d = max(d, treeDepth(e))
		}
		return d + 1
	}
	return 0
}

// FuzzCompileSchema: whatever text a registry answers with, within the
// bounds, compiling it as Avro or as Protobuf gives a schema or an error,
// never a panic (a panic in a parser would take the process down).
func FuzzCompileSchema(f *testing.F) {
	avsc, _ := os.ReadFile("testdata/payment.avsc")
	proto, _ := os.ReadFile("testdata/payment.proto")
	common, _ := os.ReadFile("testdata/common.proto")
	f.Add(string(avsc), false)
	f.Add(string(common), true)
	f.Add(string(proto), true)
	f.Add(`{"type":"fixed","name":"F","size":-1}`, false)
	f.Add(`{"type":"record","name":"R","fields":[{"name":"a","type":"R"}]}`, false)
	f.Add("syntax = \"proto3\";\nmessage M { map<string, M> m = 1; oneof o { int32 a = 2; } }\n", true)
	f.Add("CgxhLnByb3RvIgMKAU0=", true)
	lim := Limits{}.withDefaults()
	f.Fuzz(func(t *testing.T, text string, isProto bool) {
		typ := sr.TypeAvro
		if isProto {
			typ = sr.TypeProtobuf
		}
		if checkSchemaBounds(lim, nil, typ, text, nil) != nil {
			return
		}
		compile(1, sr.Schema{Schema: text, Type: typ}, []reference{{name: "common.proto", schema: string(common)}})
	})
}
