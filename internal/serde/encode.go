package serde

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// Encoder writes value trees (what the steps emit) in the Confluent wire
// format with one output schema: the schema text given (registered under
// the subject, which returns its id if it is there already) or the
// subject's latest version. It is the inverse of the decoding mapping of
// docs/RULES.md, "Avro and Protobuf".
type Encoder struct {
	reg     *Registry
	format  Format
	subject string
	text    string // "" → the subject's latest version
	message string // Protobuf: the message's full name; "" → the file's first
	indexes IndexEncoding

	mu    sync.Mutex
	s     *Schema
	md    protoreflect.MessageDescriptor
	index []int
}

// NewEncoder encodes with the schema text (or, if empty, the latest
// version of subject) in format f; message names the Protobuf message.
func NewEncoder(reg *Registry, f Format, subject, text, message string) *Encoder {
	return &Encoder{reg: reg, format: f, subject: subject, text: text, message: message}
}

// WithIndexes makes e write Protobuf message indexes in encoding x.
func (e *Encoder) WithIndexes(x IndexEncoding) *Encoder {
	e.indexes = x
	return e
}

// Ready reports whether the output schema is known.
func (e *Encoder) Ready() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.s != nil
}

// SchemaID is the output schema's id (0 before Resolve).
func (e *Encoder) SchemaID() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.s == nil {
		return 0
	}
	return e.s.ID
}

// Resolve registers or looks up the output schema. An *UnavailableError
// says to retry; any other error is a schema the registry refuses
// (incompatible, invalid) or a subject it does not have.
func (e *Encoder) Resolve(ctx context.Context) error {
	if e.Ready() {
		return nil
	}
	cl := e.reg.Client()
	var (
		ss  sr.SubjectSchema
		err error
	)
	if e.text != "" {
		ss, err = cl.CreateSchema(ctx, e.subject, sr.Schema{Schema: e.text, Type: e.format.schemaType()})
	} else {
		ss, err = cl.SchemaByVersion(ctx, e.subject, -1)
	}
	if err != nil {
		var re *sr.ResponseError
		if errors.As(err, &re) && re.StatusCode >= 400 && re.StatusCode < 500 && re.StatusCode != 401 && re.StatusCode != 403 && re.StatusCode != 408 && re.StatusCode != 429 {
			return fmt.Errorf("output schema for subject %q: %w", e.subject, err)
		}
		return &UnavailableError{Subject: e.subject, Err: err}
	}
	s, err := e.reg.Schema(ctx, ss.ID)
	if err != nil {
		return err
	}
	if s.Type != e.format.schemaType() {
		return fmt.Errorf("subject %q holds a %s schema; the sink writes %s", e.subject, s.Type, e.format)
	}
	var md protoreflect.MessageDescriptor
	var index []int
	if s.Type == sr.TypeProtobuf {
		if md, err = pickMessage(s.proto, e.message); err != nil {
			return err
		}
		index = protoIndexOf(md)
	}
	e.mu.Lock()
	e.s, e.md, e.index = s, md, index
	e.mu.Unlock()
	return nil
}

// pickMessage is the message named name in fd, or its first message.
func pickMessage(fd protoreflect.FileDescriptor, name string) (protoreflect.MessageDescriptor, error) {
	if name == "" {
		if fd.Messages().Len() == 0 {
			return nil, errors.New("the output schema has no message")
		}
		return fd.Messages().Get(0), nil
	}
	d := fd.Messages().ByName(protoreflect.Name(strings.TrimPrefix(name, string(fd.Package())+".")))
	if d == nil {
		return nil, fmt.Errorf("the output schema has no message %q", name)
	}
	return d, nil
}

// Encode writes v framed with the output schema's id. An *EncodeError is
// a value that does not fit the schema.
func (e *Encoder) Encode(v any) ([]byte, error) {
	e.mu.Lock()
	s, md, index := e.s, e.md, e.index
	e.mu.Unlock()
	if s == nil {
		return nil, errors.New("the output schema is not resolved yet")
	}
	var h sr.ConfluentHeader
	b, _ := h.AppendEncode(make([]byte, 0, 256), s.ID, nil)
	if s.Type == sr.TypeProtobuf {
		b = appendIndexes(b, index, e.indexes)
	}
	var err error
	if s.Type == sr.TypeAvro {
		w := avro.NewWriter(nil, 256)
		if err = avroWrite(w, s.avro, v, "value", 0); err == nil {
			b = append(b, w.Buffer()...)
		}
	} else {
		m := dynamicpb.NewMessage(md)
		if err = protoFill(m, v, "value", 0); err == nil {
			var body []byte
			if body, err = proto.Marshal(m); err == nil {
				b = append(b, body...)
			}
		}
	}
	if err != nil {
		return nil, &EncodeError{ID: s.ID, Err: err}
	}
	return b, nil
}

func integer(v any, lo, hi float64, path string) (int64, error) {
	switch x := v.(type) {
	case int64:
		if float64(x) < lo || float64(x) > hi {
			return 0, fmt.Errorf("%s: %d is out of range", path, x)
		}
		return x, nil
	case int:
		return integer(int64(x), lo, hi, path)
	}
	f, ok := jsoncodec.ToFloat(v)
	if !ok {
		return 0, fmt.Errorf("%s: want a number, got %s", path, kind(v))
	}
	if f != math.Trunc(f) || f < lo || f > hi {
		return 0, fmt.Errorf("%s: %v is not an integer in range", path, f)
	}
	return int64(f), nil
}

func kind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	}
	if _, ok := jsoncodec.ToFloat(v); ok {
		return "a number"
	}
	return fmt.Sprintf("a %T", v)
}

func avroWrite(w *avro.Writer, s avro.Schema, v any, path string, depth int) error {
	if depth > avroMaxDepth {
		return fmt.Errorf("%s: nested deeper than %d", path, avroMaxDepth)
	}
	ls := logical(s)
	switch s.Type() {
	case avro.Null:
		if v != nil {
			return fmt.Errorf("%s: want null, got %s", path, kind(v))
		}
	case avro.Boolean:
		b, ok := v.(bool)
		if !ok {
			return fmt.Errorf("%s: want a boolean, got %s", path, kind(v))
		}
		w.WriteBool(b)
	case avro.Int:
		if str, ok := v.(string); ok && ls != nil && ls.Type() == avro.Date {
			d, err := time.Parse(time.DateOnly, str)
			if err != nil {
				return fmt.Errorf("%s: want a date YYYY-MM-DD: %v", path, err)
			}
			w.WriteInt(int32(d.Unix() / 86400))
			return nil
		}
		n, err := integer(v, math.MinInt32, math.MaxInt32, path)
		if err != nil {
			return err
		}
		w.WriteInt(int32(n))
	case avro.Long:
		scale := 1.0
		if ls != nil {
			switch ls.Type() {
			case avro.TimeMicros, avro.TimestampMicros, avro.LocalTimestampMicros:
				scale = 1000 // the tree holds milliseconds
			}
		}
		if ls == nil && nanosLogical(s) {
			f, ok := jsoncodec.ToFloat(v)
			if !ok || math.IsNaN(f) || math.Abs(f) >= math.MaxInt64/1e6 {
				return fmt.Errorf("%s: want milliseconds (a number in range), got %v", path, v)
			}
			// Whole milliseconds exact, the fraction to the nanosecond.
			ms := math.Floor(f)
			w.WriteLong(int64(ms)*1e6 + int64(math.Round((f-ms)*1e6)))
			return nil
		}
		if scale != 1 {
			f, ok := jsoncodec.ToFloat(v)
			if !ok || math.Abs(f*scale) >= 1<<63 || math.IsNaN(f) {
				return fmt.Errorf("%s: want milliseconds (a number in range), got %v", path, v)
			}
			w.WriteLong(int64(math.Round(f * scale)))
			return nil
		}
		n, err := integer(v, -(1 << 63), 1<<63-1, path)
		if err != nil {
			return err
		}
		w.WriteLong(n)
	case avro.Float:
		f, ok := jsoncodec.ToFloat(v)
		if !ok {
			return fmt.Errorf("%s: want a number, got %s", path, kind(v))
		}
		w.WriteFloat(float32(f))
	case avro.Double:
		f, ok := jsoncodec.ToFloat(v)
		if !ok {
			return fmt.Errorf("%s: want a number, got %s", path, kind(v))
		}
		w.WriteDouble(f)
	case avro.String:
		str, ok := v.(string)
		if !ok {
			return fmt.Errorf("%s: want a string, got %s", path, kind(v))
		}
		w.WriteString(str)
	case avro.Bytes:
		if ls != nil && ls.Type() == avro.Decimal {
			b, err := decimalBytes(v, ls.(*avro.DecimalLogicalSchema).Scale(), 0, path)
			if err != nil {
				return err
			}
			w.WriteBytes(b)
			return nil
		}
		b, err := base64Bytes(v, path)
		if err != nil {
			return err
		}
		w.WriteBytes(b)
	case avro.Fixed:
		fs := s.(*avro.FixedSchema)
		var b []byte
		var err error
		if ls := fs.Logical(); ls != nil && ls.Type() == avro.Decimal {
			b, err = decimalBytes(v, ls.(*avro.DecimalLogicalSchema).Scale(), fs.Size(), path)
		} else {
			b, err = base64Bytes(v, path)
		}
		if err != nil {
			return err
		}
		if len(b) != fs.Size() {
			return fmt.Errorf("%s: want %d bytes, got %d", path, fs.Size(), len(b))
		}
		w.Write(b)
	case avro.Enum:
		es := s.(*avro.EnumSchema)
		str, ok := v.(string)
		i := slices.Index(es.Symbols(), str)
		if !ok || i < 0 {
			return fmt.Errorf("%s: want one of %s, got %v", path, strings.Join(es.Symbols(), ", "), v)
		}
		w.WriteInt(int32(i))
	case avro.Array:
		l, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%s: want a list, got %s", path, kind(v))
		}
		items := s.(*avro.ArraySchema).Items()
		if len(l) > 0 {
			w.WriteBlockHeader(int64(len(l)), 0)
			for i, x := range l {
				if err := avroWrite(w, items, x, path+"["+strconv.Itoa(i)+"]", depth+1); err != nil {
					return err
				}
			}
		}
		w.WriteBlockHeader(0, 0)
	case avro.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: want an object, got %s", path, kind(v))
		}
		vals := s.(*avro.MapSchema).Values()
		if len(m) > 0 {
			keys := make([]string, 0, len(m))
			for k := range m {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			w.WriteBlockHeader(int64(len(keys)), 0)
			for _, k := range keys {
				w.WriteString(k)
				if err := avroWrite(w, vals, m[k], path+"."+k, depth+1); err != nil {
					return err
				}
			}
		}
		w.WriteBlockHeader(0, 0)
	case avro.Record:
		m, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: want an object, got %s", path, kind(v))
		}
		rs := s.(*avro.RecordSchema)
		for k := range m {
			if !slices.ContainsFunc(rs.Fields(), func(f *avro.Field) bool { return f.Name() == k }) {
				return fmt.Errorf("%s.%s: record %s has no such field", path, k, rs.FullName())
			}
		}
		for _, f := range rs.Fields() {
			x, ok := m[f.Name()]
			if !ok {
				if !f.HasDefault() {
					return fmt.Errorf("%s.%s: missing, and the field has no default", path, f.Name())
				}
				x = f.Default()
			}
			if err := avroWrite(w, f.Type(), x, path+"."+f.Name(), depth+1); err != nil {
				return err
			}
		}
	case avro.Ref:
		return avroWrite(w, s.(*avro.RefSchema).Schema(), v, path, depth+1)
	case avro.Union:
		types := s.(*avro.UnionSchema).Types()
		var firstErr error
		for i, t := range types {
			if (v == nil) != (t.Type() == avro.Null) {
				continue
			}
			bw := avro.NewWriter(nil, 64)
			err := avroWrite(bw, t, v, path, depth+1)
			if err == nil {
				w.WriteLong(int64(i))
				w.Write(bw.Buffer())
				return nil
			}
			if firstErr == nil {
				firstErr = err
			}
		}
		if firstErr == nil {
			firstErr = fmt.Errorf("%s: %s fits no branch of the union", path, kind(v))
		}
		return firstErr
	default:
		return fmt.Errorf("%s: unsupported schema type %s", path, s.Type())
	}
	return nil
}

func base64Bytes(v any, path string) ([]byte, error) {
	str, ok := v.(string)
	if !ok {
		return nil, fmt.Errorf("%s: want base64 bytes (a string), got %s", path, kind(v))
	}
	b, err := base64.StdEncoding.DecodeString(str)
	if err != nil {
		return nil, fmt.Errorf("%s: not standard base64: %v", path, err)
	}
	return b, nil
}

// decimalBytes is the two's complement big-endian unscaled value of the
// number v at scale, size bytes long (0: as short as it goes).
func decimalBytes(v any, scale, size int, path string) ([]byte, error) {
	f, ok := jsoncodec.ToFloat(v)
	if !ok || math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, fmt.Errorf("%s: want a decimal number, got %v", path, v)
	}
	// The shortest decimal form of f, scaled: 12.34 at scale 2 is 1234.
	r, ok := new(big.Rat).SetString(strconv.FormatFloat(f, 'f', -1, 64))
	if !ok {
		return nil, fmt.Errorf("%s: %v is not a decimal", path, f)
	}
	r.Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(scale)), nil)))
	if !r.IsInt() {
		return nil, fmt.Errorf("%s: %v has more than %d decimals", path, f, scale)
	}
	n := r.Num()
	var b []byte
	if n.Sign() >= 0 {
		b = n.Bytes()
		if len(b) == 0 || b[0]&0x80 != 0 {
			b = append([]byte{0}, b...)
		}
	} else {
		// Two's complement: 2^(8k) + n for the smallest k that holds it.
		k := len(n.Bytes()) + 1
		t := new(big.Int).Add(new(big.Int).Lsh(big.NewInt(1), uint(8*k)), n)
		b = t.Bytes()
		for len(b) < k {
			b = append([]byte{0xff}, b...)
		}
		for len(b) > 1 && b[0] == 0xff && b[1]&0x80 != 0 {
			b = b[1:]
		}
	}
	if size > 0 {
		if len(b) > size {
			return nil, fmt.Errorf("%s: %v does not fit in %d bytes", path, f, size)
		}
		pad := byte(0)
		if b[0]&0x80 != 0 {
			pad = 0xff
		}
		for len(b) < size {
			b = append([]byte{pad}, b...)
		}
	}
	return b, nil
}

// protoFill sets the fields of m from the object v.
func protoFill(m protoreflect.Message, v any, path string, depth int) error {
	if depth > protoMaxDepth {
		return fmt.Errorf("%s: nested deeper than %d", path, protoMaxDepth)
	}
	md := m.Descriptor()
	if ok, err := wellKnownFill(m, md, v, path); ok {
		return err
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("%s: want an object for message %s, got %s", path, md.FullName(), kind(v))
	}
	for k, x := range obj {
		fd := md.Fields().ByName(protoreflect.Name(k))
		if fd == nil {
			fd = md.Fields().ByJSONName(k)
		}
		if fd == nil {
			return fmt.Errorf("%s.%s: message %s has no such field", path, k, md.FullName())
		}
		if x == nil {
			continue // unset
		}
		p := path + "." + k
		switch {
		case fd.IsList():
			l, ok := x.([]any)
			if !ok {
				return fmt.Errorf("%s: want a list, got %s", p, kind(x))
			}
			lv := m.Mutable(fd).List()
			for i, e := range l {
				if fd.Message() != nil {
					em := lv.NewElement()
					if err := protoFill(em.Message(), e, p+"["+strconv.Itoa(i)+"]", depth+1); err != nil {
						return err
					}
					lv.Append(em)
					continue
				}
				pv, err := protoScalarValue(fd, e, p+"["+strconv.Itoa(i)+"]")
				if err != nil {
					return err
				}
				lv.Append(pv)
			}
		case fd.IsMap():
			mo, ok := x.(map[string]any)
			if !ok {
				return fmt.Errorf("%s: want an object, got %s", p, kind(x))
			}
			mv := m.Mutable(fd).Map()
			kd, vd := fd.MapKey(), fd.MapValue()
			for mk, e := range mo {
				key, err := protoMapKey(kd, mk, p)
				if err != nil {
					return err
				}
				if vd.Message() != nil {
					ev := mv.NewValue()
					if err := protoFill(ev.Message(), e, p+"."+mk, depth+1); err != nil {
						return err
					}
					mv.Set(key, ev)
					continue
				}
				pv, err := protoScalarValue(vd, e, p+"."+mk)
				if err != nil {
					return err
				}
				mv.Set(key, pv)
			}
		case fd.Message() != nil:
			if err := protoFill(m.Mutable(fd).Message(), x, p, depth+1); err != nil {
				return err
			}
		default:
			pv, err := protoScalarValue(fd, x, p)
			if err != nil {
				return err
			}
			m.Set(fd, pv)
		}
	}
	return nil
}

func protoMapKey(kd protoreflect.FieldDescriptor, k, path string) (protoreflect.MapKey, error) {
	var x any = k
	switch kd.Kind() {
	case protoreflect.StringKind:
	case protoreflect.BoolKind:
		b, err := strconv.ParseBool(k)
		if err != nil {
			return protoreflect.MapKey{}, fmt.Errorf("%s: key %q is not a boolean", path, k)
		}
		x = b
	default:
		f, err := strconv.ParseFloat(k, 64)
		if err != nil {
			return protoreflect.MapKey{}, fmt.Errorf("%s: key %q is not a number", path, k)
		}
		x = f
	}
	v, err := protoScalarValue(kd, x, path)
	if err != nil {
		return protoreflect.MapKey{}, err
	}
	return v.MapKey(), nil
}

func protoScalarValue(fd protoreflect.FieldDescriptor, v any, path string) (protoreflect.Value, error) {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		b, ok := v.(bool)
		if !ok {
			return protoreflect.Value{}, fmt.Errorf("%s: want a boolean, got %s", path, kind(v))
		}
		return protoreflect.ValueOfBool(b), nil
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		n, err := integer(v, math.MinInt32, math.MaxInt32, path)
		return protoreflect.ValueOfInt32(int32(n)), err
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		n, err := integer(v, -(1 << 63), 1<<63-1, path)
		return protoreflect.ValueOfInt64(n), err
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		n, err := integer(v, 0, math.MaxUint32, path)
		return protoreflect.ValueOfUint32(uint32(n)), err
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		f, ok := jsoncodec.ToFloat(v)
		if !ok || f < 0 || f != math.Trunc(f) || f >= 1<<64 {
			return protoreflect.Value{}, fmt.Errorf("%s: want an unsigned integer, got %v", path, v)
		}
		return protoreflect.ValueOfUint64(uint64(f)), nil
	case protoreflect.FloatKind:
		f, ok := jsoncodec.ToFloat(v)
		if !ok {
			return protoreflect.Value{}, fmt.Errorf("%s: want a number, got %s", path, kind(v))
		}
		return protoreflect.ValueOfFloat32(float32(f)), nil
	case protoreflect.DoubleKind:
		f, ok := jsoncodec.ToFloat(v)
		if !ok {
			return protoreflect.Value{}, fmt.Errorf("%s: want a number, got %s", path, kind(v))
		}
		return protoreflect.ValueOfFloat64(f), nil
	case protoreflect.StringKind:
		s, ok := v.(string)
		if !ok {
			return protoreflect.Value{}, fmt.Errorf("%s: want a string, got %s", path, kind(v))
		}
		return protoreflect.ValueOfString(s), nil
	case protoreflect.BytesKind:
		b, err := base64Bytes(v, path)
		return protoreflect.ValueOfBytes(b), err
	case protoreflect.EnumKind:
		ed := fd.Enum()
		if s, ok := v.(string); ok {
			ev := ed.Values().ByName(protoreflect.Name(s))
			if ev == nil {
				return protoreflect.Value{}, fmt.Errorf("%s: enum %s has no value %q", path, ed.FullName(), s)
			}
			return protoreflect.ValueOfEnum(ev.Number()), nil
		}
		n, err := integer(v, math.MinInt32, math.MaxInt32, path)
		return protoreflect.ValueOfEnum(protoreflect.EnumNumber(n)), err
	}
	return protoreflect.Value{}, fmt.Errorf("%s: unsupported field kind %s", path, fd.Kind())
}

// wellKnownFill sets a well-known type's message from its value-tree form;
// false when md is no well-known type handled here.
func wellKnownFill(m protoreflect.Message, md protoreflect.MessageDescriptor, v any, path string) (bool, error) {
	if md.ParentFile().Package() != "google.protobuf" {
		return false, nil
	}
	f := md.Fields()
	switch md.Name() {
	case "Timestamp", "Duration":
		ms, ok := jsoncodec.ToFloat(v)
		if s, isStr := v.(string); isStr && md.Name() == "Timestamp" {
			t, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				return true, fmt.Errorf("%s: want epoch milliseconds or RFC 3339: %v", path, err)
			}
			ms, ok = float64(t.UnixNano())/1e6, true
		}
		if !ok || math.IsNaN(ms) || math.Abs(ms) > 1e18 {
			return true, fmt.Errorf("%s: want milliseconds (a number in range), got %v", path, v)
		}
		sec := math.Floor(ms / 1000)
		nanos := math.Round((ms - sec*1000) * 1e6)
		if md.Name() == "Duration" && ms < 0 {
			sec = math.Ceil(ms / 1000)
			nanos = math.Round((ms - sec*1000) * 1e6)
		}
		m.Set(f.ByName("seconds"), protoreflect.ValueOfInt64(int64(sec)))
		m.Set(f.ByName("nanos"), protoreflect.ValueOfInt32(int32(nanos)))
		return true, nil
	case "DoubleValue", "FloatValue", "Int64Value", "UInt64Value", "Int32Value", "UInt32Value", "BoolValue", "StringValue", "BytesValue":
		fd := f.ByName("value")
		pv, err := protoScalarValue(fd, v, path)
		if err == nil {
			m.Set(fd, pv)
		}
		return true, err
	case "Struct":
		obj, ok := v.(map[string]any)
		if !ok {
			return true, fmt.Errorf("%s: want an object, got %s", path, kind(v))
		}
		fd := f.ByName("fields")
		mv := m.Mutable(fd).Map()
		for k, x := range obj {
			ev := mv.NewValue()
			if _, err := wellKnownFill(ev.Message(), ev.Message().Descriptor(), x, path+"."+k); err != nil {
				return true, err
			}
			mv.Set(protoreflect.ValueOfString(k).MapKey(), ev)
		}
		return true, nil
	case "ListValue":
		l, ok := v.([]any)
		if !ok {
			return true, fmt.Errorf("%s: want a list, got %s", path, kind(v))
		}
		lv := m.Mutable(f.ByName("values")).List()
		for i, x := range l {
			ev := lv.NewElement()
			if _, err := wellKnownFill(ev.Message(), ev.Message().Descriptor(), x, path+"["+strconv.Itoa(i)+"]"); err != nil {
				return true, err
			}
			lv.Append(ev)
		}
		return true, nil
	case "Value":
		switch x := v.(type) {
		case nil:
			m.Set(f.ByName("null_value"), protoreflect.ValueOfEnum(0))
		case bool:
			m.Set(f.ByName("bool_value"), protoreflect.ValueOfBool(x))
		case string:
			m.Set(f.ByName("string_value"), protoreflect.ValueOfString(x))
		case map[string]any:
			_, err := wellKnownFill(m.Mutable(f.ByName("struct_value")).Message(), f.ByName("struct_value").Message(), x, path)
			return true, err
		case []any:
			_, err := wellKnownFill(m.Mutable(f.ByName("list_value")).Message(), f.ByName("list_value").Message(), x, path)
			return true, err
		default:
			n, ok := jsoncodec.ToFloat(v)
			if !ok {
				return true, fmt.Errorf("%s: %s is no JSON value", path, kind(v))
			}
			m.Set(f.ByName("number_value"), protoreflect.ValueOfFloat64(n))
		}
		return true, nil
	}
	return false, nil
}

// CheckFields reports the fields of an output object that do not fit the
// output schema text (format f; Protobuf: the message named message, or
// the file's first): fields it does not have, and (Avro) fields it needs
// that are not given and have no default. It is what `rtproxy check` can
// know before any record: the names, not the values.
func CheckFields(f Format, text, message string, fields []string) ([]string, error) {
	var problems []string
	switch f {
	case Avro:
		s, err := avro.Parse(text)
		if err != nil {
			return nil, fmt.Errorf("the Avro schema does not parse: %w", err)
		}
		if r, ok := s.(*avro.RefSchema); ok {
			s = r.Schema()
		}
		rs, ok := s.(*avro.RecordSchema)
		if !ok {
			return nil, fmt.Errorf("the Avro schema is a %s, not a record", s.Type())
		}
		for _, name := range fields {
			if !slices.ContainsFunc(rs.Fields(), func(fl *avro.Field) bool { return fl.Name() == name }) {
				problems = append(problems, fmt.Sprintf("field `%s` is not in record %s", name, rs.FullName()))
			}
		}
		for _, fl := range rs.Fields() {
			if !slices.Contains(fields, fl.Name()) && !fl.HasDefault() {
				problems = append(problems, fmt.Sprintf("record %s needs field `%s` (it has no default), which is not written", rs.FullName(), fl.Name()))
			}
		}
	case Protobuf:
		fd, err := compileProto(0, text, nil)
		if err != nil {
			return nil, err
		}
		md, err := pickMessage(fd, message)
		if err != nil {
			return nil, err
		}
		for _, name := range fields {
			if md.Fields().ByName(protoreflect.Name(name)) == nil && md.Fields().ByJSONName(name) == nil {
				problems = append(problems, fmt.Sprintf("field `%s` is not in message %s", name, md.FullName()))
			}
		}
	}
	return problems, nil
}

// CheckSchema reports whether text is a schema of format f that the
// encoder can use (and, for Protobuf, has the message named).
func CheckSchema(f Format, text, message string) error {
	if f == Avro {
		if _, err := avro.Parse(text); err != nil {
			return fmt.Errorf("the Avro schema does not parse: %w", err)
		}
		return nil
	}
	_, err := CheckFields(f, text, message, nil)
	return err
}
