package serde

import (
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"sync"
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
//	epoch milliseconds (float64, micros as the fraction); uuid → string.

// avroMaxDepth bounds nesting of a recursive schema's value.
const avroMaxDepth = 1000

var avroReaders = sync.Pool{New: func() any { return avro.NewReader(nil, 0) }}

// avroDecode reads one value of schema s from b (the bytes after the
// header) into the value tree.
func avroDecode(s avro.Schema, b []byte) (any, error) {
	r := avroReaders.Get().(*avro.Reader)
	r.Reset(b)
	r.Error = nil
	d := avroDec{r: r, budget: 1024 + 8*len(b)}
	v := d.value(s, 0)
	err := r.Error
	if err == nil && d.err != nil {
		err = d.err
	}
	if err == nil {
		// Peek sets io.EOF when nothing is left, as it must be.
		r.Peek()
		if r.Error == nil {
			err = errTrailing
		}
	}
	r.Reset(nil)
	r.Error = nil
	avroReaders.Put(r)
	if err != nil {
		return nil, fmt.Errorf("avro: %w", err)
	}
	return v, nil
}

type avroDec struct {
	r *avro.Reader
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

func (d *avroDec) ok() bool { return d.r.Error == nil && d.err == nil }

func (d *avroDec) value(s avro.Schema, depth int) any {
	if depth > avroMaxDepth {
		d.fail(errors.New("nested deeper than 1000"))
		return nil
	}
	r := d.r
	switch s.Type() {
	case avro.Null:
		return nil
	case avro.Boolean:
		return r.ReadBool()
	case avro.Int:
		n := r.ReadInt()
		if ls := logical(s); ls != nil {
			switch ls.Type() {
			case avro.Date:
				return time.Unix(int64(n)*86400, 0).UTC().Format(time.DateOnly)
			}
		}
		return float64(n)
	case avro.Long:
		n := r.ReadLong()
		if ls := logical(s); ls != nil {
			switch ls.Type() {
			case avro.TimeMicros, avro.TimestampMicros, avro.LocalTimestampMicros:
				return float64(n) / 1000
			}
		}
		return float64(n)
	case avro.Float:
		return float32To64(r.ReadFloat())
	case avro.Double:
		return r.ReadDouble()
	case avro.String:
		return r.ReadString()
	case avro.Bytes:
		b := r.ReadBytes()
		if ls := logical(s); ls != nil && ls.Type() == avro.Decimal {
			return decimalFloat(b, ls.(*avro.DecimalLogicalSchema).Scale())
		}
		return base64.StdEncoding.EncodeToString(b)
	case avro.Fixed:
		fs := s.(*avro.FixedSchema)
		b := make([]byte, fs.Size())
		r.Read(b)
		if ls := fs.Logical(); ls != nil && ls.Type() == avro.Decimal {
			return decimalFloat(b, ls.(*avro.DecimalLogicalSchema).Scale())
		}
		return base64.StdEncoding.EncodeToString(b)
	case avro.Enum:
		es := s.(*avro.EnumSchema)
		i := r.ReadInt()
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
				k := r.ReadString()
				m[k] = d.value(vals, depth+1)
			}
		}
		return m
	case avro.Union:
		types := s.(*avro.UnionSchema).Types()
		i := r.ReadLong()
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
	n, _ := d.r.ReadBlockHeader()
	if n < 0 {
		d.fail(errors.New("negative block count"))
		return 0
	}
	if n > int64(d.budget) {
		d.fail(fmt.Errorf("a block of %d items is more than the record's bytes can hold", n))
		return 0
	}
	d.budget -= int(n)
	return n
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
