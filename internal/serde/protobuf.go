package serde

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
)

// Protobuf messages become the JSON value tree (docs/RULES.md, "Avro and
// Protobuf"): a message is a map[string]any keyed by the fields' names in
// the .proto file. A field without presence (a proto3 scalar, a repeated
// field, a map) is always there, with its zero value when unset; a field
// with presence (a message, `optional`, a oneof member, proto2) is there
// only when set. Of a oneof, only the member that is set appears, under
// its own name. Numbers → float64; bool; string; bytes → base64 string;
// enum → its value's name (a number the schema does not name → float64);
// repeated → []any; map → map[string]any with the keys as text.
// Well-known types: Timestamp → epoch milliseconds (float64), Duration →
// milliseconds (float64), the wrappers → the wrapped value, Struct → a
// map, ListValue → a list, Value → the value it holds, Empty → {}.

// protoMaxDepth bounds message nesting (the runtime's own limit is 10000).
const protoMaxDepth = 1000

// compileProto compiles the .proto text main (schema id id) and the
// schemas it references into a file descriptor. A schema written as a
// base64 FileDescriptorProto (as some serializers register it) is read as
// such.
func compileProto(id int, main string, refs []reference) (protoreflect.FileDescriptor, error) {
	name := "rtproxy-schema-" + strconv.Itoa(id) + ".proto"
	srcs := map[string]string{name: main}
	for _, r := range refs {
		if strings.HasPrefix(r.name, "google/protobuf/") {
			// A well-known type: the built-in file (WithStandardImports)
			// is the same, and some serializers register a descriptor of
			// it that does not link (empty json_name on every field).
			continue
		}
		srcs[r.name] = r.schema
	}
	res := protocompile.ResolverFunc(func(path string) (protocompile.SearchResult, error) {
		text, ok := srcs[path]
		if !ok {
			return protocompile.SearchResult{}, fmt.Errorf("%s: not among the schema's references: %w", path, errNotFound)
		}
		if fdp := descriptorText(text); fdp != nil {
			fdp.Name = proto.String(path)
			return protocompile.SearchResult{Proto: fdp}, nil
		}
		return protocompile.SearchResult{Source: io.NopCloser(strings.NewReader(text))}, nil
	})
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(res)}
	files, err := c.Compile(context.Background(), name)
	if err != nil {
		return nil, fmt.Errorf("protobuf schema does not compile: %w", err)
	}
	return files[0], nil
}

var errNotFound = errors.New("file not found")

// descriptorText reads a schema written as a base64 FileDescriptorProto;
// nil when text is .proto source.
func descriptorText(text string) *descriptorpb.FileDescriptorProto {
	t := strings.TrimSpace(text)
	if t == "" || strings.ContainsAny(t, " \n\t;{") {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(t)
	if err != nil {
		return nil
	}
	fdp := &descriptorpb.FileDescriptorProto{}
	if proto.Unmarshal(b, fdp) != nil || (len(fdp.MessageType) == 0 && len(fdp.EnumType) == 0 && len(fdp.Dependency) == 0) {
		return nil
	}
	fillJSONNames(fdp.Extension)
	for _, m := range fdp.MessageType {
		fillMessageJSONNames(m)
	}
	return fdp
}

// fillMessageJSONNames gives every field of m (and of its nested messages)
// without a json_name protoc's default one. protoc's generated code (what
// confluent-kafka's ProtobufSerializer registers) leaves json_name out,
// some runtimes write it as "", and the linker reads a missing one as the
// custom name "" given to every field: "custom JSON name "" conflicts".
func fillMessageJSONNames(m *descriptorpb.DescriptorProto) {
	fillJSONNames(m.Field)
	fillJSONNames(m.Extension)
	for _, n := range m.NestedType {
		fillMessageJSONNames(n)
	}
}

func fillJSONNames(fs []*descriptorpb.FieldDescriptorProto) {
	for _, f := range fs {
		if f.GetJsonName() == "" {
			f.JsonName = proto.String(jsonCamelCase(f.GetName()))
		}
	}
}

// protoMessage is the message the indexes of a record's header name.
func protoMessage(fd protoreflect.FileDescriptor, idx []int) (protoreflect.MessageDescriptor, error) {
	if len(idx) == 0 {
		return nil, errors.New("no message indexes")
	}
	msgs := fd.Messages()
	var md protoreflect.MessageDescriptor
	for _, i := range idx {
		if i < 0 || i >= msgs.Len() {
			return nil, fmt.Errorf("message index %v: the schema has no such message", idx)
		}
		md = msgs.Get(i)
		msgs = md.Messages()
	}
	return md, nil
}

// protoIndexOf is the index path of md within its file.
func protoIndexOf(md protoreflect.MessageDescriptor) []int {
	var idx []int
	for d := protoreflect.Descriptor(md); ; {
		idx = append([]int{d.Index()}, idx...)
		p := d.Parent()
		if _, ok := p.(protoreflect.MessageDescriptor); !ok {
			break
		}
		d = p
	}
	return idx
}

func protoDecode(md protoreflect.MessageDescriptor, b []byte) (any, error) {
	return protoWireDecode(md, b)
}

// protoDecodeDynamic is protoDecode through a dynamicpb message: the
// reference the wire decoder (protowire.go) is checked against.
func protoDecodeDynamic(md protoreflect.MessageDescriptor, b []byte) (v any, err error) {
	defer func() {
		// dynamicpb's unmarshal panics on some malformed input (a map
		// entry whose key has the wrong wire type: "cannot convert nil to
		// map key", found by FuzzProtobufDecode); that is a bad record.
		if p := recover(); p != nil {
			v, err = nil, fmt.Errorf("protobuf: malformed message: %v", p)
		}
	}()
	m := dynamicpb.NewMessage(md)
	if err := (proto.UnmarshalOptions{DiscardUnknown: true, RecursionLimit: protoMaxDepth}).Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("protobuf: %w", err)
	}
	return protoMessageValue(m), nil
}

func protoMessageValue(m protoreflect.Message) any {
	md := m.Descriptor()
	if v, ok := wellKnown(m, md); ok {
		return v
	}
	fields := md.Fields()
	out := make(map[string]any, fields.Len())
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.HasPresence() && !m.Has(fd) {
			continue
		}
		out[string(fd.Name())] = protoFieldValue(fd, m.Get(fd))
	}
	return out
}

func protoFieldValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	switch {
	case fd.IsList():
		l := v.List()
		out := make([]any, l.Len())
		for i := range l.Len() {
			out[i] = protoScalar(fd, l.Get(i))
		}
		return out
	case fd.IsMap():
		mp := v.Map()
		out := make(map[string]any, mp.Len())
		vd := fd.MapValue()
		mp.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
			out[k.String()] = protoScalar(vd, v)
			return true
		})
		return out
	}
	return protoScalar(fd, v)
}

func protoScalar(fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return v.Bool()
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return jsoncodec.BoxNumber(float64(v.Int()))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return jsoncodec.BoxNumber(float64(v.Uint()))
	case protoreflect.FloatKind:
		return float32To64(float32(v.Float()))
	case protoreflect.DoubleKind:
		return v.Float()
	case protoreflect.StringKind:
		return v.String()
	case protoreflect.BytesKind:
		return base64.StdEncoding.EncodeToString(v.Bytes())
	case protoreflect.EnumKind:
		n := v.Enum()
		if ev := fd.Enum().Values().ByNumber(n); ev != nil {
			if fd.Enum().FullName() == "google.protobuf.NullValue" {
				return nil
			}
			return string(ev.Name())
		}
		return float64(n)
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return protoMessageValue(v.Message())
	}
	return nil
}

// wellKnown is the value of a well-known type's message.
func wellKnown(m protoreflect.Message, md protoreflect.MessageDescriptor) (any, bool) {
	if md.ParentFile().Package() != "google.protobuf" {
		return nil, false
	}
	f := md.Fields()
	switch md.Name() {
	case "Timestamp", "Duration":
		s, n := m.Get(f.ByName("seconds")).Int(), m.Get(f.ByName("nanos")).Int()
		return float64(s)*1000 + float64(n)/1e6, true
	case "DoubleValue", "FloatValue", "Int64Value", "UInt64Value", "Int32Value", "UInt32Value", "BoolValue", "StringValue", "BytesValue":
		fd := f.ByName("value")
		return protoScalar(fd, m.Get(fd)), true
	case "Struct":
		fd := f.ByName("fields")
		return protoFieldValue(fd, m.Get(fd)), true
	case "ListValue":
		fd := f.ByName("values")
		return protoFieldValue(fd, m.Get(fd)), true
	case "Value":
		od := md.Oneofs().ByName("kind")
		fd := m.WhichOneof(od)
		if fd == nil {
			return nil, true
		}
		return protoScalar(fd, m.Get(fd)), true
	}
	return nil, false
}

// jsonCamelCase is the JSON name protoc gives a field that has none of its
// own: underscores dropped, the letter after one upper-cased.
func jsonCamelCase(s string) string {
	b := make([]byte, 0, len(s))
	up := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_':
			up = true
		case up && 'a' <= c && c <= 'z':
			b = append(b, c-'a'+'A')
			up = false
		default:
			b = append(b, c)
			up = false
		}
	}
	return string(b)
}
