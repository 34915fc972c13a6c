package serde

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
)

// Protobuf decoding reads the wire format with protowire, led by the
// compiled descriptor, straight into the value tree: dynamicpb builds a
// message first and the tree from it, which costs four times the JSON
// path on the benchmark payment. The result is the same tree
// (protoMessageValue of the dynamicpb message; FuzzProtobufDecode checks
// they agree), with the runtime's rules: the last value of a scalar wins,
// repeated occurrences of a message merge, a field whose wire type is not
// its own is unknown and skipped, proto3 strings must be UTF-8, proto2
// required fields must be there.

// pmsg is what decoding needs of one message descriptor, built once.
type pmsg struct {
	md     protoreflect.MessageDescriptor
	fields []*pfield // by number below len(byNum), else in byMap
	byMap  map[protowire.Number]*pfield
	all    []*pfield
	wk     string // the well-known type's name, or ""
	utf8   bool   // strings are checked (proto3)
	req    []*pfield
}

type pfield struct {
	fd    protoreflect.FieldDescriptor
	name  string
	kind  protoreflect.Kind
	list  bool
	isMap bool
	oneof protoreflect.OneofDescriptor // a real oneof
	pres  bool                         // has presence: absent unless set
	msg   *pmsg                        // message and group fields (a map: its entry)
	zero  any                          // the value when absent without presence
}

// pmsgs caches pmsg by descriptor; descriptors live as long as the schema
// that holds them. Only complete plans are stored: a task decoding the
// first record of a schema while another builds its plan either finds the
// plan whole or builds its own (a plan stored before its fields were
// filled in, for recursive messages, let a concurrent decode skip every
// field as unknown: TestProtobufFirstDecodesAtOnce).
var pmsgs sync.Map // protoreflect.MessageDescriptor → *pmsg

func msgOf(md protoreflect.MessageDescriptor) *pmsg {
	if p, ok := pmsgs.Load(md); ok {
		return p.(*pmsg)
	}
	building := map[protoreflect.MessageDescriptor]*pmsg{}
	p := buildMsg(md, building)
	// Published once the whole tree is built; a plan another task stored
	// meanwhile is as complete, and kept.
	for d, q := range building {
		pmsgs.LoadOrStore(d, q)
	}
	return p
}

// buildMsg builds md's plan and those of the messages it refers to,
// noting each in building before its fields, so that a recursive message
// finds itself there.
func buildMsg(md protoreflect.MessageDescriptor, building map[protoreflect.MessageDescriptor]*pmsg) *pmsg {
	if p, ok := pmsgs.Load(md); ok {
		return p.(*pmsg)
	}
	if p := building[md]; p != nil {
		return p
	}
	p := &pmsg{md: md, utf8: md.ParentFile().Syntax() == protoreflect.Proto3}
	if md.ParentFile().Package() == "google.protobuf" {
		p.wk = string(md.Name())
	}
	building[md] = p
	fs := md.Fields()
	var maxNum protowire.Number
	for i := range fs.Len() {
		maxNum = max(maxNum, fs.Get(i).Number())
	}
	if maxNum < 256 {
		p.fields = make([]*pfield, maxNum+1)
	} else {
		p.byMap = map[protowire.Number]*pfield{}
	}
	for i := range fs.Len() {
		fd := fs.Get(i)
		f := &pfield{fd: fd, name: string(fd.Name()), kind: fd.Kind(), list: fd.IsList(), isMap: fd.IsMap(), pres: fd.HasPresence()}
		if o := fd.ContainingOneof(); o != nil && !o.IsSynthetic() {
			f.oneof = o
		}
		if fd.Message() != nil { // a message, group or map field (a map: its entry)
			f.msg = buildMsg(fd.Message(), building)
		}
		switch {
		case f.list:
			f.zero = nil // a new []any{} per message
		case f.isMap:
			f.zero = nil
		case !f.pres:
			f.zero = protoScalar(fd, fd.Default())
		}
		if fd.Cardinality() == protoreflect.Required {
			p.req = append(p.req, f)
		}
		if p.fields != nil {
			p.fields[fd.Number()] = f
		} else {
			p.byMap[fd.Number()] = f
		}
		p.all = append(p.all, f)
	}
	return p
}

func (p *pmsg) field(n protowire.Number) *pfield {
	if p.fields != nil {
		if n >= 0 && int(n) < len(p.fields) {
			return p.fields[n]
		}
		return nil
	}
	return p.byMap[n]
}

var (
	errProtoDepth  = errors.New("exceeds maximum recursion depth")
	errUTF8        = errors.New("string field contains invalid UTF-8")
	errInvalidWire = errors.New("cannot parse invalid wire-format data")
)

// wireDec holds the record's bytes copied once into a string: string
// fields are substrings of it, as the JSON decoder's are (one retained
// string keeps the record alive, as the record in flight does anyway).
type wireDec struct {
	src    string
	capAll int // cap of the buffer src copies; a subslice v starts at capAll-cap(v)
	in     *jsoncodec.Interner
}

func newWireDec(b []byte, in *jsoncodec.Interner) *wireDec {
	return &wireDec{src: string(b), capAll: cap(b), in: in}
}

// str is v as a string: a substring of src when v lies in the buffer.
func (d *wireDec) str(v []byte) string {
	if off := d.capAll - cap(v); off >= 0 && off+len(v) <= len(d.src) && cap(v) <= d.capAll {
		return d.src[off : off+len(v)]
	}
	return string(v)
}

// interners share the boxes of repeated strings and numbers across the
// records a decoder sees, as the JSON decoder does (jsoncodec.Interner).
var interners = sync.Pool{New: func() any { return new(jsoncodec.Interner) }}

// protoWireDecode is the value tree of the message md encoded in b.
func protoWireDecode(md protoreflect.MessageDescriptor, b []byte) (any, error) {
	b = b[:len(b):len(b)]
	in := interners.Get().(*jsoncodec.Interner)
	v, err := newWireDec(b, in).message(msgOf(md), b, 0)
	interners.Put(in)
	if err != nil {
		return nil, fmt.Errorf("protobuf: %w", err)
	}
	return v, nil
}

func (d *wireDec) message(p *pmsg, b []byte, depth int) (any, error) {
	if depth > protoMaxDepth {
		return nil, errProtoDepth
	}
	out := make(map[string]any, len(p.all))
	var seenBuf [8]seenMsg
	seen := seenBuf[:0]      // singular message fields, for merging
	var set map[*pfield]bool // required fields met
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		if num > protowire.MaxValidNumber {
			return nil, errInvalidWire
		}
		b = b[n:]
		f := p.field(num)
		if f == nil || !wireFits(f, typ) {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		if len(p.req) > 0 {
			if set == nil {
				set = map[*pfield]bool{}
			}
			set[f] = true
		}
		var err error
		switch {
		case f.isMap:
			var raw []byte
			if raw, n = protowire.ConsumeBytes(b); n < 0 {
				return nil, protowire.ParseError(n)
			}
			b = b[n:]
			m, ok := out[f.name].(map[string]any)
			if !ok {
				m = map[string]any{}
				out[f.name] = m
			}
			err = d.entry(f, raw, m, depth)
		case f.list:
			n, err = d.list(f, typ, b, out, depth)
			if err == nil {
				b = b[n:]
			}
		case f.msg != nil:
			var raw []byte
			if typ == protowire.StartGroupType {
				raw, n = protowire.ConsumeGroup(num, b)
			} else {
				raw, n = protowire.ConsumeBytes(b)
			}
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			b = b[n:]
			dd, merged := d, false
			for i := range seen {
				if seen[i].f == f {
					// A message given twice merges: as if its bytes were
					// one. They are no longer in src: decode them alone.
					raw = append(append([]byte{}, seen[i].raw...), raw...)
					seen[i].raw, merged = raw, true
					dd = newWireDec(raw, d.in)
				}
			}
			if !merged {
				seen = append(seen, seenMsg{f, raw})
			}
			var v any
			if v, err = dd.message(f.msg, raw, depth+1); err == nil {
				setField(p, f, out, v)
			}
		default:
			var v any
			v, n, err = d.scalar(f, typ, b)
			if err == nil {
				b = b[n:]
				setField(p, f, out, v)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	for _, f := range p.req {
		if !set[f] {
			return nil, fmt.Errorf("required field %s not set", f.fd.FullName())
		}
	}
	// Fields without presence that the bytes did not set: their zero.
	if len(out) < len(p.all) {
		for _, f := range p.all {
			if _, ok := out[f.name]; ok {
				continue
			}
			switch {
			case f.list:
				out[f.name] = []any{}
			case f.isMap:
				out[f.name] = map[string]any{}
			case !f.pres:
				out[f.name] = f.zero
			}
		}
	}
	if p.wk != "" {
		return wellKnownTree(p.wk, out), nil
	}
	return out, nil
}

type seenMsg struct {
	f   *pfield
	raw []byte
}

// setField sets a singular field; a oneof member clears the others.
func setField(p *pmsg, f *pfield, out map[string]any, v any) {
	if f.oneof != nil {
		fs := f.oneof.Fields()
		for i := range fs.Len() {
			if o := fs.Get(i); o.Number() != f.fd.Number() {
				delete(out, string(o.Name()))
			}
		}
	}
	out[f.name] = v
}

// wireFits reports whether typ is a wire type field f is read from.
func wireFits(f *pfield, typ protowire.Type) bool {
	if f.isMap {
		return typ == protowire.BytesType
	}
	if f.list && typ == protowire.BytesType && packable(f.kind) {
		return true
	}
	return typ == wireTypeOf(f.kind)
}

func packable(k protoreflect.Kind) bool {
	switch k {
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind, protoreflect.GroupKind:
		return false
	}
	return true
}

func wireTypeOf(k protoreflect.Kind) protowire.Type {
	switch k {
	case protoreflect.BoolKind, protoreflect.EnumKind, protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Uint32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Uint64Kind:
		return protowire.VarintType
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type
	case protoreflect.GroupKind:
		return protowire.StartGroupType
	}
	return protowire.BytesType
}

// protoWireList reads one occurrence of a repeated field (packed or not)
// and appends it; n is the bytes it took.
func (d *wireDec) list(f *pfield, typ protowire.Type, b []byte, out map[string]any, depth int) (int, error) {
	l, _ := out[f.name].([]any)
	if cap(l) == 0 {
		l = make([]any, 0, 4)
	}
	switch {
	case f.msg != nil:
		var raw []byte
		var n int
		if typ == protowire.StartGroupType {
			raw, n = protowire.ConsumeGroup(f.fd.Number(), b)
		} else {
			raw, n = protowire.ConsumeBytes(b)
		}
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		v, err := d.message(f.msg, raw, depth+1)
		if err != nil {
			return 0, err
		}
		out[f.name] = append(l, v)
		return n, nil
	case typ == protowire.BytesType && packable(f.kind):
		raw, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		et := wireTypeOf(f.kind)
		for len(raw) > 0 {
			v, m, err := d.scalar(f, et, raw)
			if err != nil {
				return 0, err
			}
			l = append(l, v)
			raw = raw[m:]
		}
		out[f.name] = l
		return n, nil
	}
	v, n, err := d.scalar(f, typ, b)
	if err != nil {
		return 0, err
	}
	out[f.name] = append(l, v)
	return n, nil
}

// protoWireEntry reads one map entry into m.
func (d *wireDec) entry(f *pfield, raw []byte, m map[string]any, depth int) error {
	e := f.msg
	kf, vf := e.field(1), e.field(2)
	key := kf.fd.Default().MapKey().String()
	var val any = vf.zero
	valSet := false
	var valRaw []byte // a message value given twice in one entry merges
	for len(raw) > 0 {
		num, typ, n := protowire.ConsumeTag(raw)
		if n < 0 {
			return protowire.ParseError(n)
		}
		if num > protowire.MaxValidNumber {
			return errInvalidWire
		}
		raw = raw[n:]
		var g *pfield
		switch num {
		case 1:
			g = kf
		case 2:
			g = vf
		}
		if g == nil || !wireFits(g, typ) {
			n = protowire.ConsumeFieldValue(num, typ, raw)
			if n < 0 {
				return protowire.ParseError(n)
			}
			raw = raw[n:]
			continue
		}
		if g.msg != nil {
			sub, n := protowire.ConsumeBytes(raw)
			if n < 0 {
				return protowire.ParseError(n)
			}
			raw = raw[n:]
			dd := d
			if valSet {
				sub = append(append([]byte{}, valRaw...), sub...)
				dd = newWireDec(sub, d.in)
			}
			v, err := dd.message(g.msg, sub, depth+1)
			if err != nil {
				return err
			}
			val, valSet, valRaw = v, true, sub
			continue
		}
		v, n, err := d.value(g, typ, raw)
		if err != nil {
			return err
		}
		raw = raw[n:]
		if num == 1 {
			key = v.MapKey().String()
		} else {
			val = protoScalar(g.fd, v)
		}
	}
	if vf.msg != nil && !valSet {
		// An entry without its message value holds the empty message.
		v, err := d.message(vf.msg, nil, depth+1)
		if err != nil {
			return err
		}
		val = v
	}
	m[key] = val
	return nil
}

// protoWireScalar reads one scalar of field f (its wire type typ) at the
// start of b into the tree; n is the bytes it took.
func (d *wireDec) scalar(f *pfield, typ protowire.Type, b []byte) (any, int, error) {
	v, n, err := d.value(f, typ, b)
	if err != nil {
		return nil, 0, err
	}
	// The values protoScalar gives, boxes shared when they repeat.
	switch f.kind {
	case protoreflect.StringKind:
		return d.in.BoxString(v.String(), true), n, nil // a substring of src
	case protoreflect.DoubleKind:
		return d.in.BoxFloat(v.Float()), n, nil
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return d.in.BoxFloat(float64(v.Int())), n, nil
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return d.in.BoxFloat(float64(v.Uint())), n, nil
	}
	return protoScalar(f.fd, v), n, nil
}

// wireValue reads one scalar of field f as the runtime would hold it.
func (d *wireDec) value(f *pfield, typ protowire.Type, b []byte) (protoreflect.Value, int, error) {
	switch typ {
	case protowire.VarintType:
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return protoreflect.Value{}, 0, protowire.ParseError(n)
		}
		switch f.kind {
		case protoreflect.BoolKind:
			return protoreflect.ValueOfBool(v != 0), n, nil
		case protoreflect.Int32Kind:
			return protoreflect.ValueOfInt32(int32(v)), n, nil
		case protoreflect.Int64Kind:
			return protoreflect.ValueOfInt64(int64(v)), n, nil
		case protoreflect.Uint32Kind:
			return protoreflect.ValueOfUint32(uint32(v)), n, nil
		case protoreflect.Uint64Kind:
			return protoreflect.ValueOfUint64(v), n, nil
		case protoreflect.Sint32Kind:
			return protoreflect.ValueOfInt32(int32(protowire.DecodeZigZag(v & math.MaxUint32))), n, nil
		case protoreflect.Sint64Kind:
			return protoreflect.ValueOfInt64(protowire.DecodeZigZag(v)), n, nil
		case protoreflect.EnumKind:
			return protoreflect.ValueOfEnum(protoreflect.EnumNumber(int32(v))), n, nil
		}
	case protowire.Fixed32Type:
		v, n := protowire.ConsumeFixed32(b)
		if n < 0 {
			return protoreflect.Value{}, 0, protowire.ParseError(n)
		}
		switch f.kind {
		case protoreflect.Fixed32Kind:
			return protoreflect.ValueOfUint32(v), n, nil
		case protoreflect.Sfixed32Kind:
			return protoreflect.ValueOfInt32(int32(v)), n, nil
		case protoreflect.FloatKind:
			return protoreflect.ValueOfFloat32(math.Float32frombits(v)), n, nil
		}
	case protowire.Fixed64Type:
		v, n := protowire.ConsumeFixed64(b)
		if n < 0 {
			return protoreflect.Value{}, 0, protowire.ParseError(n)
		}
		switch f.kind {
		case protoreflect.Fixed64Kind:
			return protoreflect.ValueOfUint64(v), n, nil
		case protoreflect.Sfixed64Kind:
			return protoreflect.ValueOfInt64(int64(v)), n, nil
		case protoreflect.DoubleKind:
			return protoreflect.ValueOfFloat64(math.Float64frombits(v)), n, nil
		}
	case protowire.BytesType:
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return protoreflect.Value{}, 0, protowire.ParseError(n)
		}
		if f.kind == protoreflect.StringKind {
			if checkUTF8(f) && !utf8.Valid(v) {
				return protoreflect.Value{}, 0, fmt.Errorf("field %s: %w", f.fd.FullName(), errUTF8)
			}
			return protoreflect.ValueOfString(d.str(v)), n, nil
		}
		return protoreflect.ValueOfBytes(v), n, nil
	}
	return protoreflect.Value{}, 0, fmt.Errorf("field %s: wire type %d is not its own", f.fd.FullName(), typ)
}

// checkUTF8 reports whether the runtime validates f's strings (proto3, or
// editions with utf8_validation VERIFY).
func checkUTF8(f *pfield) bool {
	return f.fd.ParentFile().Syntax() == protoreflect.Proto3
}

// wellKnownTree turns a well-known type's decoded fields into its value.
func wellKnownTree(name string, m map[string]any) any {
	switch name {
	case "Timestamp", "Duration":
		s, _ := m["seconds"].(float64)
		n, _ := m["nanos"].(float64)
		return s*1000 + n/1e6
	case "DoubleValue", "FloatValue", "Int64Value", "UInt64Value", "Int32Value", "UInt32Value", "BoolValue", "StringValue", "BytesValue":
		return m["value"]
	case "Struct":
		return m["fields"]
	case "ListValue":
		return m["values"]
	case "Value":
		for _, k := range []string{"null_value", "number_value", "string_value", "bool_value", "struct_value", "list_value"} {
			if v, ok := m[k]; ok {
				return v
			}
		}
		return nil // no kind set
	}
	return m
}
