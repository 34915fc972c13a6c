package offsets

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// A checkpoint position (map[int32]int64, partition → done offset) is
// encoded as:
//
//	+---------+-----------+------------------------------------+
//	| version | count     | count × (partition, offset)        |
//	| 1 byte  | uvarint   | varint (zigzag), varint (zigzag)   |
//	+---------+-----------+------------------------------------+
//
// version is 0x01. Entries are in strictly increasing partition order, so
// each map has exactly one encoding, and Decode rejects anything else:
// unsorted or repeated partitions, a partition outside int32, a truncated
// or overlong varint, a count larger than the bytes could hold, trailing
// bytes. Signed varints keep the format total: offsets are normally ≥ 0,
// but Kafka's sentinels (-1, -2) round-trip too.
const encodingVersion = 1

// ErrCorrupt is wrapped by every Decode error.
var ErrCorrupt = errors.New("offsets: corrupt checkpoint position")

// Encode appends the encoding of m to dst and returns the extended slice.
func Encode(dst []byte, m map[int32]int64) []byte {
	parts := make([]int32, 0, len(m))
	for p := range m {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	dst = append(dst, encodingVersion)
	dst = binary.AppendUvarint(dst, uint64(len(parts)))
	for _, p := range parts {
		dst = binary.AppendVarint(dst, int64(p))
		dst = binary.AppendVarint(dst, m[p])
	}
	return dst
}

// Decode parses what Encode wrote.
func Decode(b []byte) (map[int32]int64, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty", ErrCorrupt)
	}
	if b[0] != encodingVersion {
		return nil, fmt.Errorf("%w: unknown version %d", ErrCorrupt, b[0])
	}
	pos := 1
	n, k := binary.Uvarint(b[pos:])
	if k <= 0 || k != uvarintLen(n) {
		return nil, fmt.Errorf("%w: bad count at byte %d", ErrCorrupt, pos)
	}
	pos += k
	// Each entry takes at least two bytes; refuse a count the input cannot
	// hold before allocating for it.
	if n > uint64(len(b)-pos)/2 {
		return nil, fmt.Errorf("%w: count %d exceeds the %d bytes left", ErrCorrupt, n, len(b)-pos)
	}
	m := make(map[int32]int64, n)
	prev := int64(math.MinInt32) - 1
	for i := uint64(0); i < n; i++ {
		p, k := binary.Varint(b[pos:])
		if k <= 0 || k != varintLen(p) {
			return nil, fmt.Errorf("%w: bad partition of entry %d at byte %d", ErrCorrupt, i, pos)
		}
		if p < math.MinInt32 || p > math.MaxInt32 {
			return nil, fmt.Errorf("%w: partition %d of entry %d is outside int32", ErrCorrupt, p, i)
		}
		if p <= prev {
			return nil, fmt.Errorf("%w: partition %d of entry %d is not above the previous %d", ErrCorrupt, p, i, prev)
		}
		pos += k
		off, k := binary.Varint(b[pos:])
		if k <= 0 || k != varintLen(off) {
			return nil, fmt.Errorf("%w: bad offset of partition %d at byte %d", ErrCorrupt, p, pos)
		}
		pos += k
		m[int32(p)] = off
		prev = p
	}
	if pos != len(b) {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(b)-pos)
	}
	return m, nil
}

// uvarintLen is the length of x's shortest encoding; binary.Uvarint also
// accepts padded ones, which would give one map two encodings.
func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

func varintLen(x int64) int {
	ux := uint64(x) << 1
	if x < 0 {
		ux = ^ux
	}
	return uvarintLen(ux)
}
