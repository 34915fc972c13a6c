package serde

import (
	"errors"
	"fmt"
	"os"
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
