package operators

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
)

// The rows of a file table are kept as bytes (arena.go), so that the
// garbage collector has nothing to scan in them, and decoded on lookup.
// This file is the encoding of one row and its decoding back into the
// values the table readers produce: map[string]any, []any, float64,
// string, bool and nil, as jsoncodec.Decode and csvCell give them.
//
// A value is a tag byte and its payload:
//
//	tagNull, tagFalse, tagTrue  nothing
//	tagFloat                    8 bytes, the float64's bits, little-endian
//	tagInt                      zigzag varint of a float64 that is an integer
//	                            of at most 2^53 in magnitude (and not -0)
//	tagString                   uvarint length, the bytes
//	tagConst                    uvarint index into the table's constants
//	tagArray                    uvarint count, the elements
//	tagObject                   uvarint count, then count × (name, value);
//	                            a name is a tagString, or a tagConst whose
//	                            constant is a string
//
// Constants are strings of at most constMaxLen bytes and numbers that
// occur more than once in the table (object member names, a country
// column, a price list). Each is boxed once into an `any`, so decoding it
// allocates nothing; there are at most maxConsts of them, which bounds
// what the collector scans for a table however many rows it has.
const (
	tagNull byte = iota
	tagFalse
	tagTrue
	tagFloat
	tagInt
	tagString
	tagConst
	tagArray
	tagObject
)

const (
	constMaxLen = 64
	maxConsts   = 1 << 14
	// maxSeen bounds the values remembered while a table is built, waiting
	// for a second occurrence that makes them a constant.
	maxSeen = 1 << 17
	// rowMaxDepth is jsoncodec's nesting limit: no row read from a file is
	// deeper, and a corrupt row cannot exhaust the stack.
	rowMaxDepth = 10000
)

var errRowEncoding = errors.New("corrupt row encoding")

// rowEncoder encodes rows, collecting the constants of one table.
type rowEncoder struct {
	consts  []any
	seen    map[string]int32 // encoded value -> constant index; -1: seen once
	scratch []byte
}

func newRowEncoder() *rowEncoder {
	return &rowEncoder{seen: make(map[string]int32)}
}

// appendValue appends the encoding of v. v must be one of the types the
// table readers produce.
func (e *rowEncoder) appendValue(b []byte, v any, depth int) ([]byte, error) {
	if depth > rowMaxDepth {
		return b, fmt.Errorf("row exceeds max nesting depth")
	}
	switch x := v.(type) {
	case nil:
		return append(b, tagNull), nil
	case bool:
		if x {
			return append(b, tagTrue), nil
		}
		return append(b, tagFalse), nil
	case float64:
		e.scratch = appendFloat(e.scratch[:0], x)
		return e.constant(b, v), nil
	case string:
		if len(x) > constMaxLen {
			return appendString(b, x), nil
		}
		e.scratch = appendString(e.scratch[:0], x)
		return e.constant(b, v), nil
	case []any:
		b = append(b, tagArray)
		b = binary.AppendUvarint(b, uint64(len(x)))
		var err error
		for _, el := range x {
			if b, err = e.appendValue(b, el, depth+1); err != nil {
				return b, err
			}
		}
		return b, nil
	case map[string]any:
		b = append(b, tagObject)
		b = binary.AppendUvarint(b, uint64(len(x)))
		var err error
		for k, el := range x {
			if b, err = e.appendValue(b, k, depth+1); err != nil {
				return b, err
			}
			if b, err = e.appendValue(b, el, depth+1); err != nil {
				return b, err
			}
		}
		return b, nil
	}
	return b, fmt.Errorf("row value of type %T cannot be stored", v)
}

// constant appends the value whose inline encoding is in e.scratch: as a
// reference to its constant when it has one or this is its second
// occurrence, inline otherwise.
func (e *rowEncoder) constant(b []byte, v any) []byte {
	idx, ok := e.seen[string(e.scratch)]
	switch {
	case ok && idx >= 0:
	case ok && len(e.consts) < maxConsts:
		idx = int32(len(e.consts))
		if s, isStr := v.(string); isStr {
			v = strings.Clone(s) // not a view into the line it was read from
		}
		e.consts = append(e.consts, v)
		e.seen[string(e.scratch)] = idx
	default:
		if !ok && len(e.seen) < maxSeen {
			e.seen[string(e.scratch)] = -1
		}
		return append(b, e.scratch...)
	}
	b = append(b, tagConst)
	return binary.AppendUvarint(b, uint64(idx))
}

func appendString(b []byte, s string) []byte {
	b = append(b, tagString)
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendFloat(b []byte, f float64) []byte {
	if f == math.Trunc(f) && math.Abs(f) <= 1<<53 && !(f == 0 && math.Signbit(f)) {
		b = append(b, tagInt)
		return binary.AppendVarint(b, int64(f))
	}
	b = append(b, tagFloat)
	return binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
}

// rowDecoder decodes one encoded value. Strings are substrings of one copy
// of the encoded bytes, made on the first string that is not a constant,
// so a row costs one string allocation however many strings it holds.
type rowDecoder struct {
	b      []byte
	i      int
	s      string
	consts []any
}

// decodeRow decodes b, which must hold exactly one value.
func decodeRow(b []byte, consts []any) (any, error) {
	d := rowDecoder{b: b, consts: consts}
	v, err := d.value(0)
	if err == nil && d.i != len(b) {
		err = errRowEncoding
	}
	return v, err
}

func (d *rowDecoder) uvarint() (uint64, error) {
	n, w := binary.Uvarint(d.b[d.i:])
	if w <= 0 {
		return 0, errRowEncoding
	}
	d.i += w
	return n, nil
}

// count reads an element count, each element at least min bytes long.
func (d *rowDecoder) count(min int) (int, error) {
	n, err := d.uvarint()
	if err != nil || n > uint64((len(d.b)-d.i)/min) {
		return 0, errRowEncoding
	}
	return int(n), nil
}

func (d *rowDecoder) str() (string, error) {
	n, err := d.uvarint()
	if err != nil || n > uint64(len(d.b)-d.i) {
		return "", errRowEncoding
	}
	if n == 0 {
		return "", nil
	}
	if d.s == "" {
		d.s = string(d.b)
	}
	s := d.s[d.i : d.i+int(n)]
	d.i += int(n)
	return s, nil
}

func (d *rowDecoder) value(depth int) (any, error) {
	if d.i >= len(d.b) || depth > rowMaxDepth {
		return nil, errRowEncoding
	}
	tag := d.b[d.i]
	d.i++
	switch tag {
	case tagNull:
		return nil, nil
	case tagFalse:
		return false, nil
	case tagTrue:
		return true, nil
	case tagFloat:
		if len(d.b)-d.i < 8 {
			return nil, errRowEncoding
		}
		f := math.Float64frombits(binary.LittleEndian.Uint64(d.b[d.i:]))
		d.i += 8
		return f, nil
	case tagInt:
		n, w := binary.Varint(d.b[d.i:])
		if w <= 0 {
			return nil, errRowEncoding
		}
		d.i += w
		return float64(n), nil
	case tagString:
		return d.str()
	case tagConst:
		n, err := d.uvarint()
		if err != nil || n >= uint64(len(d.consts)) {
			return nil, errRowEncoding
		}
		return d.consts[n], nil
	case tagArray:
		n, err := d.count(1)
		if err != nil {
			return nil, err
		}
		a := make([]any, n)
		for i := range a {
			if a[i], err = d.value(depth + 1); err != nil {
				return nil, err
			}
		}
		return a, nil
	case tagObject:
		n, err := d.count(2)
		if err != nil {
			return nil, err
		}
		m := make(map[string]any, n)
		for range n {
			k, err := d.name()
			if err != nil {
				return nil, err
			}
			if m[k], err = d.value(depth + 1); err != nil {
				return nil, err
			}
		}
		return m, nil
	}
	return nil, errRowEncoding
}

// name decodes an object member's name.
func (d *rowDecoder) name() (string, error) {
	if d.i >= len(d.b) {
		return "", errRowEncoding
	}
	switch d.b[d.i] {
	case tagString:
		d.i++
		return d.str()
	case tagConst:
		v, err := d.value(0)
		if s, ok := v.(string); ok && err == nil {
			return s, nil
		}
	}
	return "", errRowEncoding
}
