package serde

import (
	"hash/maphash"
	"math"
	"strings"
	"sync"
)

// Putting a string or a float64 into an `any` allocates a box, and a
// decoded payment holds dozens of them. As the JSON decoder does
// (internal/jsoncodec/intern.go), the Protobuf decoder hands out the same
// box again for a value it saw in a recent record: values that repeat
// (currencies, statuses, countries, codes, prices) cost no allocation.
// A cached string is an owned copy, never a view into a record, and is
// admitted only when seen a second time in a row at its slot, so unique
// ids cost what they cost without the cache. Sharing a box is safe: Go
// copies a value out of an interface, never writes through it.

const (
	internStrSlots = 512 // powers of two
	internNumSlots = 256
	internMaxLen   = 32
)

var internSeed = maphash.MakeSeed()

type interner struct {
	strs [internStrSlots]struct {
		s       string
		v       any
		pending uint64
	}
	nums [internNumSlots]struct {
		bits uint64
		v    any
	}
}

var interners = sync.Pool{New: func() any { return new(interner) }}

func (c *interner) str(s string) any {
	if len(s) > internMaxLen || len(s) == 0 {
		return s
	}
	h := maphash.String(internSeed, s)
	slot := &c.strs[h&(internStrSlots-1)]
	if slot.v != nil && slot.s == s {
		return slot.v
	}
	if slot.pending != h {
		slot.pending = h
		return s
	}
	own := strings.Clone(s)
	slot.s, slot.v, slot.pending = own, own, 0
	return slot.v
}

func (c *interner) num(f float64) any {
	if f >= 0 && f < float64(len(smallFloats)) && f == math.Trunc(f) && !(f == 0 && math.Signbit(f)) {
		return smallFloats[int(f)]
	}
	bits := math.Float64bits(f)
	slot := &c.nums[(bits*0x9E3779B97F4A7C15)>>(64-8)]
	if slot.v != nil && slot.bits == bits {
		return slot.v
	}
	v := any(f)
	slot.bits, slot.v = bits, v
	return v
}
