package serde

import (
	"encoding/base64"
	"os"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// asProtocWritesIt is the base64 FileDescriptorProto of fd as protoc's
// generated code carries it (and confluent-kafka's ProtobufSerializer
// registers it): without json_name on any field.
func asProtocWritesIt(t testing.TB, fd protoreflect.FileDescriptor) string {
	t.Helper()
	fdp := protodesc.ToFileDescriptorProto(fd)
	var strip func(ms []*descriptorpb.DescriptorProto)
	strip = func(ms []*descriptorpb.DescriptorProto) {
		for _, m := range ms {
			for _, f := range m.Field {
				f.JsonName = nil
			}
			strip(m.NestedType)
		}
	}
	strip(fdp.MessageType)
	b, err := proto.Marshal(fdp)
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}

// TestProtobufDescriptorsWithoutJSONNames: the schema and a reference
// registered as protoc's descriptors (no json_name), with the well-known
// types registered as descriptors too, compile and decode.
func TestProtobufDescriptorsWithoutJSONNames(t *testing.T) {
	fd := compileTestProto(t)
	main := asProtocWritesIt(t, fd)
	common := asProtocWritesIt(t, fd.Imports().Get(0).FileDescriptor)
	ts := asProtocWritesIt(t, timestamppb.File_google_protobuf_timestamp_proto)
	s, err := compile(3, sr.Schema{Schema: main, Type: sr.TypeProtobuf}, []reference{
		{name: "common.proto", schema: common},
		{name: "google/protobuf/timestamp.proto", schema: ts},
	})
	if err != nil {
		t.Fatalf("protoc's descriptor does not compile: %v", err)
	}
	md := s.proto.Messages().ByName("Payment")
	m := dynamicpb.NewMessage(md)
	m.Set(md.Fields().ByName("id"), protoreflect.ValueOfString("p1"))
	m.Set(md.Fields().ByName("cents"), protoreflect.ValueOfInt64(7))
	body, _ := proto.Marshal(m)
	v, err := (&Decoder{format: Protobuf}).decode(s, append(appendIndexes(nil, protoIndexOf(md), IndexesZigzag), body...))
	if err != nil {
		t.Fatal(err)
	}
	if got := v.(map[string]any); got["id"] != "p1" || got["cents"] != 7.0 {
		t.Errorf("decoded %v", got)
	}
	// The JSON names are protoc's defaults.
	if n := md.Fields().ByName("amount").JSONName(); n != "amount" {
		t.Errorf("json name %q", n)
	}
	if n := s.proto.Messages().ByName("Payment").Fields().ByName("card").JSONName(); n != "card" {
		t.Errorf("json name %q", n)
	}
}

func TestJSONCamelCase(t *testing.T) {
	for in, want := range map[string]string{"user_id": "userId", "txn_id": "txnId", "a__b": "aB", "_x": "X", "x_": "x", "already": "already", "foo_bar_9": "fooBar9", "x_1y": "x1y"} {
		if got := jsonCamelCase(in); got != want {
			t.Errorf("jsonCamelCase(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestMessageIndexEncodings: the zigzag indexes of the current clients
// (with the 0 shortcut) and the unsigned ones of confluent-kafka ≤ 1.7
// (use.deprecated.format) read and write as the clients do.
func TestMessageIndexEncodings(t *testing.T) {
	for _, c := range []struct {
		idx      []int
		enc      IndexEncoding
		wire     string
		misreads bool // read with the other encoding, it fails or names another path
	}{
		{[]int{0}, IndexesZigzag, "\x00", false},
		{[]int{0}, IndexesUnsigned, "\x00", false},
		{[]int{1}, IndexesZigzag, "\x02\x02", true},
		{[]int{1}, IndexesUnsigned, "\x01\x01", true},
		{[]int{1, 0}, IndexesUnsigned, "\x02\x01\x00", true},
		{[]int{2, 70}, IndexesZigzag, "\x04\x04\x8c\x01", true},
		{[]int{0, 0}, IndexesUnsigned, "\x02\x00\x00", true},
	} {
		b := appendIndexes(nil, c.idx, c.enc)
		if string(b) != c.wire {
			t.Errorf("%v %s: wrote %q, want %q", c.idx, c.enc, b, c.wire)
		}
		got, rest, err := readIndexes(append(b, 0x0a), c.enc)
		if err != nil || !equalInts(got, c.idx) || string(rest) != "\x0a" {
			t.Errorf("%v %s: read %v rest %q err %v", c.idx, c.enc, got, rest, err)
		}
		other := IndexesUnsigned
		if c.enc == IndexesUnsigned {
			other = IndexesZigzag
		}
		got, rest, err = readIndexes(append(b, 0x0a), other)
		if c.misreads == (err == nil && equalInts(got, c.idx) && string(rest) == "\x0a") {
			t.Errorf("%v %s read as %s: %v rest %q err %v", c.idx, c.enc, other, got, rest, err)
		}
	}
	for _, bad := range []string{"", "\x80", "\x03", "\x02", "\x7e"} {
		if _, _, err := readIndexes([]byte(bad), IndexesZigzag); err == nil {
			t.Errorf("zigzag %q: no error", bad)
		}
	}
	for _, bad := range []string{"", "\x80", "\x7f\x00", "\x01"} {
		if _, _, err := readIndexes([]byte(bad), IndexesUnsigned); err == nil {
			t.Errorf("unsigned %q: no error", bad)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestUnsignedIndexesDecode: a record of the second message written by
// confluent-kafka 1.7 (unsigned indexes) decodes with IndexesUnsigned and
// is refused, with a hint, with the default.
func TestUnsignedIndexesDecode(t *testing.T) {
	common, _ := os.ReadFile("testdata/common.proto")
	text, _ := os.ReadFile("testdata/payment.proto")
	s := fuzzSchema(t, sr.TypeProtobuf, string(text), reference{name: "common.proto", schema: string(common)})
	md := s.proto.Messages().ByName("Payment")
	m := dynamicpb.NewMessage(md)
	m.Set(md.Fields().ByName("id"), protoreflect.ValueOfString("p9"))
	body, _ := proto.Marshal(m)
	rest := append(appendIndexes(nil, protoIndexOf(md), IndexesUnsigned), body...)
	d := &Decoder{format: Protobuf, indexes: IndexesUnsigned}
	v, err := d.decode(s, rest)
	if err != nil || v.(map[string]any)["id"] != "p9" {
		t.Fatalf("unsigned: %v %v", v, err)
	}
	_, err = (&Decoder{format: Protobuf}).decode(s, rest)
	if err == nil || !strings.Contains(err.Error(), "message_indexes: unsigned") {
		t.Errorf("zigzag reading unsigned indexes: %v", err)
	}
}
