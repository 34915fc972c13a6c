package jsoncodec

import (
	"hash/maphash"
	"math"
	"strings"
)

// Putting a string or a float64 into an `any` allocates a box for it
// (Go boxes only zero values, bools and integers below 256 for free), and a
// decoded 1 KiB payment holds about 30 strings and 10 numbers: half of the
// decoder's allocations. Record.Value has to stay map[string]any, so the
// boxes cannot go; what the decoder can do is hand out the same box again
// for a value it has seen before. Values that repeat are common in event
// data (currencies, statuses, countries, enum-like codes, small counts).
//
// Each pooled decoder keeps an Interner, two small direct-mapped caches
// (the Protobuf decoder of internal/serde keeps one too):
//
//   - strings of up to internMaxLen bytes. A cached string is an owned copy,
//     never a view into a record's buffer, so the cache never keeps a
//     record alive. Admitting costs a copy and a box, so a string is only
//     admitted when it is seen a second time in a row at its slot: unique
//     ids keep costing one box each, as without the cache, plus one hash.
//   - numbers by their bits, admitted at the first miss (the box is needed
//     anyway). Integers 0..smallFloatsN-1 come from a table boxed once.
//
// Sharing boxes is safe because a boxed value cannot be changed: Go copies
// a value out of an interface, never writes through it.
const (
	internStrSlots = 512 // power of two
	internNumSlots = 256 // power of two
	internMaxLen   = 32
	smallFloatsN   = 1024
)

var internSeed = maphash.MakeSeed()

// smallFloats[n] is float64(n), boxed once.
var smallFloats = func() (t [smallFloatsN]any) {
	for n := range t {
		t[n] = float64(n)
	}
	return t
}()

type internStr struct {
	s       string // an owned copy
	v       any    // s, boxed
	pending uint64 // hash of the last string that missed this slot
}

type internNum struct {
	bits uint64
	v    any // nil: the slot is empty
}

// Interner hands out shared boxes for repeated strings and numbers. It is
// embedded in jsonDecoder; the tables are allocated with the decoder,
// which the pool keeps for as long as it is in use. Not safe for
// concurrent use: a decoder (or a pool user) owns one at a time.
type Interner struct {
	strs [internStrSlots]internStr
	nums [internNumSlots]internNum
}

// BoxString returns s as an `any`, sharing the box of an earlier equal
// string when there is one. view says s is a view into the record buffer
// (so it must be copied before it is kept).
func (c *Interner) BoxString(s string, view bool) any {
	if len(s) == 0 || len(s) > internMaxLen {
		return s
	}
	h := maphash.String(internSeed, s)
	e := &c.strs[h&(internStrSlots-1)]
	if e.v != nil && e.s == s {
		return e.v
	}
	if e.pending != h {
		e.pending = h
		return s
	}
	if view {
		s = strings.Clone(s)
	}
	e.s, e.v, e.pending = s, s, 0
	return e.v
}

// BoxFloat returns f as an `any`, sharing the box of an earlier equal
// number when there is one. -0 is not 0: it keeps its own box.
func (c *Interner) BoxFloat(f float64) any {
	if v, ok := smallFloat(f); ok {
		return v
	}
	bits := math.Float64bits(f)
	e := &c.nums[(bits*0x9E3779B97F4A7C15)>>(64-8)]
	if e.v != nil && e.bits == bits {
		return e.v
	}
	e.bits, e.v = bits, f
	return e.v
}

// smallFloat is the box of f when f is an integer 0..smallFloatsN-1
// (not -0), boxed once for the process.
func smallFloat(f float64) (any, bool) {
	if f >= 0 && f < smallFloatsN && !math.Signbit(f) {
		if n := int(f); float64(n) == f {
			return smallFloats[n], true
		}
	}
	return nil, false
}

// BoxNumber returns f as an `any`: the shared box of a small integer, or
// a new one. For decoders that keep no Interner.
func BoxNumber(f float64) any {
	if v, ok := smallFloat(f); ok {
		return v
	}
	return f
}
