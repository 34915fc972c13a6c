package jsoncodec

import (
	"encoding/binary"
	"math/bits"
	"unsafe"
)

// Scanning a long string byte by byte is most of the cost of decoding a
// value that holds one (a description, a user agent, padding), and all of
// the cost of skipping it (scan.go). plainRun and scanString look at 16
// bytes a loop turn, as two words (SWAR: the bit tricks of "Bit Twiddling
// Hacks", hasless and haszero), for the bytes that end a plain run of a
// string.

const (
	swarLo = 0x0101010101010101
	swarHi = 0x8080808080808080
)

// loadAt reads the 8 bytes at p+i as a little-endian word; the caller
// checks that they are inside the string p points into.
func loadAt(p *byte, i int) uint64 {
	return binary.LittleEndian.Uint64((*[8]byte)(unsafe.Add(unsafe.Pointer(p), i))[:])
}

// strStops flags (0x80) the bytes of x that stop the scan of a string that
// may hold non-ASCII bytes: '"', '\\' and control characters (< 0x20).
// Flags above the lowest may be false, the lowest is exact: below the
// first stop byte no subtraction borrows. The three tests share one
// "high bit clear" mask because '"' and '\\' have bit 7 clear, so x, x^'"'
// and x^'\\' agree on it.
func strStops(x uint64) uint64 {
	q := x ^ (swarLo * '"')
	b := x ^ (swarLo * '\\')
	return ((x - swarLo*0x20) | (q - swarLo) | (b - swarLo)) &^ x & swarHi
}

// plainRun returns the index of the first byte at or after i that needs a
// look in a string: '"', '\\', a control character (< 0x20), and, unless
// nonASCII, a byte >= 0x80. With fewer than 8 bytes left it returns where
// the scan stopped, and the caller goes on byte by byte from there.
// Two words are tested per loop turn, and one branch taken for both.
func plainRun(s string, i int, nonASCII bool) int {
	n := len(s)
	p := unsafe.StringData(s)
	// add: unless nonASCII, x's high bits, which flag the bytes >= 0x80
	// (no borrow runs below the lowest of them either).
	var add uint64
	if !nonASCII {
		add = swarHi
	}
	for ; i+16 <= n; i += 16 {
		a, b := loadAt(p, i), loadAt(p, i+8)
		ma := strStops(a) | a&add
		mb := strStops(b) | b&add
		if ma|mb != 0 {
			if ma != 0 {
				return i + bits.TrailingZeros64(ma)>>3
			}
			return i + 8 + bits.TrailingZeros64(mb)>>3
		}
	}
	if i+8 <= n {
		a := loadAt(p, i)
		if m := strStops(a) | a&add; m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		i += 8
	}
	return i
}
