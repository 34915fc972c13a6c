package serde

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"time"

	"github.com/hamba/avro/v2"
)

// Avro values become the JSON value tree (docs/RULES.md, "Avro and
// Protobuf"):
//
//	null → nil; boolean → bool; int, long, float, double → float64;
//	string → string; bytes, fixed → base64 (standard, padded) string;
//	enum → its symbol; array → []any; map, record → map[string]any;
//	a union → the value of its branch (null → nil), not wrapped;
//	decimal → float64; date → "YYYY-MM-DD"; time-millis, time-micros →
//	milliseconds since midnight; timestamp-* and local-timestamp-* →
//	epoch milliseconds (float64, micros or nanos as the fraction); uuid →
//	string.

// avroMaxDepth bounds nesting of a recursive schema's value.
const avroMaxDepth = 1000

// avroDecode reads one value of schema s from b (the bytes after the
// header) into the value tree.
func avroDecode(s avro.Schema, b []byte) (any, error) {
	d := avroDec{r: avroReader{all: b, b: b}, budget: 1024 + 8*len(b)}
	v := d.value(s, 0)
	err := d.r.err
	if err == nil {
		err = d.err
	}
	if err == nil && len(d.r.b) > 0 {
		err = errTrailing
	}
	if err != nil {
		return nil, fmt.Errorf("avro: %w", err)
	}
	return v, nil
}

// avroReader reads Avro's binary encoding from the record's bytes. Every
// length (bytes, string, fixed) is checked against what is left of the
// record before anything is allocated for it: a schema or a record that
// claims more is refused, whatever the size (issue 25, finding 5).
type avroReader struct {
	all []byte // the record
	b   []byte // what is left of it
	err error
	// src is the record copied once, on the first string: strings are
	// substrings of it, as the JSON and Protobuf decoders' are (one
	// retained string keeps the record's copy alive).
	src string
}

var errAvroEOF = errors.New("unexpected end of the record")

func (r *avroReader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.b = nil
}

// varint reads a zigzag varint of at most max bytes.
func (r *avroReader) varint(max int) int64 {
	if len(r.b) > 0 && r.b[0] < 0x80 { // one byte: most lengths, counts, indexes
		v := int64(r.b[0])
		r.b = r.b[1:]
		return v>>1 ^ -(v & 1)
	}
	var v uint64
	var shift uint
	for i := 0; i < len(r.b); i++ {
		if i >= max {
			r.fail(errors.New("int overflow"))
			return 0
		}
		c := r.b[i]
		v |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			r.b = r.b[i+1:]
			return int64(v>>1) ^ -int64(v&1)
		}
		shift += 7
	}
	r.fail(errAvroEOF)
	return 0
}

func (r *avroReader) long() int64 { return r.varint(10) }

func (r *avroReader) int() int32 { return int32(r.varint(5)) }

func (r *avroReader) bool() bool {
	if len(r.b) == 0 {
		r.fail(errAvroEOF)
		return false
	}
	c := r.b[0]
	r.b = r.b[1:]
	if c > 1 {
		r.fail(errors.New("invalid bool"))
	}
	return c == 1
}

// take is the next n bytes of the record, not copied.
func (r *avroReader) take(n int64, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 {
		r.fail(fmt.Errorf("negative %s length %d", what, n))
		return nil
	}
	if n > int64(len(r.b)) {
		r.fail(fmt.Errorf("%s of %d bytes, but only %d are left in the record", what, n, len(r.b)))
		return nil
	}
	out := r.b[:n:n]
	r.b = r.b[n:]
	return out
}

func (r *avroReader) float() float32 {
	b := r.take(4, "float")
	if b == nil {
		return 0
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(b))
}

func (r *avroReader) double() float64 {
	b := r.take(8, "double")
	if b == nil {
		return 0
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(b))
}

// bytes reads a length and that many bytes (not copied).
func (r *avroReader) bytes(what string) []byte {
	n := r.long()
	if r.err != nil {
		return nil
	}
	return r.take(n, what)
}

func (r *avroReader) string() string {
	n := r.long()
	if r.err != nil {
		return ""
	}
	off := len(r.all) - len(r.b)
	if r.take(n, "string") == nil && r.err != nil {
		return ""
	}
	if n == 0 {
		return ""
	}
	if r.src == "" {
		r.src = string(r.all)
	}
	return r.src[off : off+int(n)]
}

// blockHeader reads an array or map block's item count (a negative count
// is followed by the block's size in bytes, which is skipped).
func (r *avroReader) blockHeader() int64 {
	n := r.long()
	if n < 0 {
		r.long()
		if n == math.MinInt64 {
			r.fail(errors.New("negative block count"))
			return 0
		}
		n = -n
	}
	return n
}

type avroDec struct {
	r avroReader
	// budget is how many array and map items the value may still hold:
	// items of type null take no bytes, so a count alone could loop for
	// ever.
	budget int
	err    error
}

func (d *avroDec) fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

func (d *avroDec) ok() bool { return d.r.err == nil && d.err == nil }

func (d *avroDec) value(s avro.Schema, depth int) any {
	if depth > avroMaxDepth {
		d.fail(errors.New("nested deeper than 1000"))
		return nil
	}
	r := &d.r
	switch s.Type() {
	case avro.Null:
		return nil
	case avro.Boolean:
		return r.bool()
	case avro.Int:
		n := r.int()
		if ls := logical(s); ls != nil {
			switch ls.Type() {
			case avro.Date:
				return time.Unix(int64(n)*86400, 0).UTC().Format(time.DateOnly)
			}
		}
		return float64(n)
	case avro.Long:
		n := r.long()
		if ls := logical(s); ls != nil {
			switch ls.Type() {
			case avro.TimeMicros, avro.TimestampMicros, avro.LocalTimestampMicros:
				return float64(n) / 1000
			}
		} else if nanosLogical(s) {
			// Whole milliseconds exact, the nanoseconds as the fraction.
			return float64(n/1e6) + float64(n%1e6)/1e6
		}
		return float64(n)
	case avro.Float:
		return float32To64(r.float())
	case avro.Double:
		return r.double()
	case avro.String:
		return r.string()
	case avro.Bytes:
		b := r.bytes("bytes")
		if r.err != nil {
			return nil
		}
		if ls := logical(s); ls != nil && ls.Type() == avro.Decimal {
			return decimalFloat(b, ls.(*avro.DecimalLogicalSchema).Scale())
		}
		return base64.StdEncoding.EncodeToString(b)
	case avro.Fixed:
		fs := s.(*avro.FixedSchema)
		b := r.take(int64(fs.Size()), "fixed "+fs.FullName())
		if r.err != nil {
			return nil
		}
		if ls := fs.Logical(); ls != nil && ls.Type() == avro.Decimal {
			return decimalFloat(b, ls.(*avro.DecimalLogicalSchema).Scale())
		}
		return base64.StdEncoding.EncodeToString(b)
	case avro.Enum:
		es := s.(*avro.EnumSchema)
		i := r.int()
		sym, ok := es.Symbol(int(i))
		if !ok {
			d.fail(fmt.Errorf("enum %s has no symbol %d", es.FullName(), i))
			return nil
		}
		return sym
	case avro.Record:
		rs := s.(*avro.RecordSchema)
		fields := rs.Fields()
		m := make(map[string]any, len(fields))
		for _, f := range fields {
			m[f.Name()] = d.value(f.Type(), depth+1)
			if !d.ok() {
				return nil
			}
		}
		return m
	case avro.Ref:
		return d.value(s.(*avro.RefSchema).Schema(), depth+1)
	case avro.Array:
		items := s.(*avro.ArraySchema).Items()
		arr := []any{}
		for d.ok() {
			n := d.block()
			if n == 0 {
				break
			}
			for ; n > 0 && d.ok(); n-- {
				arr = append(arr, d.value(items, depth+1))
			}
		}
		return arr
	case avro.Map:
		vals := s.(*avro.MapSchema).Values()
		m := map[string]any{}
		for d.ok() {
			n := d.block()
			if n == 0 {
				break
			}
			for ; n > 0 && d.ok(); n-- {
				k := r.string()
				m[k] = d.value(vals, depth+1)
			}
		}
		return m
	case avro.Union:
		types := s.(*avro.UnionSchema).Types()
		i := r.long()
		if i < 0 || i >= int64(len(types)) {
			d.fail(fmt.Errorf("union has no branch %d", i))
			return nil
		}
		return d.value(types[i], depth+1)
	}
	d.fail(fmt.Errorf("unsupported schema type %s", s.Type()))
	return nil
}

// block reads an array or map block header: its item count, charged to
// the budget.
func (d *avroDec) block() int64 {
	n := d.r.blockHeader()
	if n > int64(d.budget) {
		d.fail(fmt.Errorf("a block of %d items is more than the record's bytes can hold", n))
		return 0
	}
	d.budget -= int(n)
	return n
}

// nanosLogical reports whether s is a long with logicalType
// timestamp-nanos or local-timestamp-nanos (Avro 1.12), which hamba/avro
// keeps as a plain long with the property.
func nanosLogical(s avro.Schema) bool {
	ps, ok := s.(*avro.PrimitiveSchema)
	if !ok || ps.Logical() != nil {
		return false
	}
	switch ps.Prop("logicalType") {
	case "timestamp-nanos", "local-timestamp-nanos":
		return true
	}
	return false
}

func logical(s avro.Schema) avro.LogicalSchema {
	if ls, ok := s.(avro.LogicalTypeSchema); ok {
		return ls.Logical()
	}
	return nil
}

// float32To64 is the float64 whose shortest decimal form is the float32's,
// as a JSON producer would have written it (0.1f reads as 0.1).
func float32To64(f float32) float64 {
	if math.IsInf(float64(f), 0) || math.IsNaN(float64(f)) {
		return float64(f)
	}
	v, err := strconv.ParseFloat(strconv.FormatFloat(float64(f), 'g', -1, 32), 64)
	if err != nil {
		return float64(f)
	}
	return v
}

var pow10 = [...]float64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22}

// decimalFloat is the decimal whose unscaled value is b (big-endian two's
// complement) and scale is scale, as the nearest float64.
func decimalFloat(b []byte, scale int) float64 {
	if len(b) <= 7 && scale >= 0 && scale < len(pow10) {
		// |n| < 2^55: exact when below 2^53, and the division is one
		// correctly rounded operation.
		var n int64
		for _, c := range b {
			n = n<<8 | int64(c)
		}
		if len(b) > 0 && b[0]&0x80 != 0 {
			n -= 1 << (8 * len(b))
		}
		if n > -(1<<53) && n < 1<<53 {
			return float64(n) / pow10[scale]
		}
	}
	n := new(big.Int).SetBytes(b)
	if len(b) > 0 && b[0]&0x80 != 0 {
		n.Sub(n, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
	}
	rat := new(big.Rat).SetFrac(n, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(scale)), nil))
	f, _ := rat.Float64()
	return f
}
