package jsoncodec

import (
	"encoding/binary"
	"math/bits"
	"unsafe"
)

// Scanning a long string byte by byte is most of the cost of decoding a
// value that holds one (a description, a user agent, padding), and all of
// the cost of skipping it (members.go). plainRun looks at 8 bytes at a time
// (SWAR: the bit tricks of "Bit Twiddling Hacks", hasless and haszero) for
// the bytes that end a plain run of a string.

const (
	swarLo = 0x0101010101010101
	swarHi = 0x8080808080808080
)

// load8 reads s[i:i+8] as a little-endian word; the caller checks bounds.
func load8(s string, i int) uint64 {
	return binary.LittleEndian.Uint64(unsafe.Slice(unsafe.StringData(s[i:]), 8))
}

// zeroBytes flags (0x80) the bytes of x that are 0. Flags above the lowest
// may be false (a borrow runs upward); the lowest is exact.
func zeroBytes(x uint64) uint64 { return (x - swarLo) &^ x & swarHi }

// plainRun returns the index of the first byte at or after i that needs a
// look in a string: '"', '\\', a control character (< 0x20), and, unless
// nonASCII, a byte >= 0x80. With fewer than 8 bytes left it returns where
// the scan stopped, and the caller goes on byte by byte from there.
func plainRun(s string, i int, nonASCII bool) int {
	for i+8 <= len(s) {
		x := load8(s, i)
		stop := (x-swarLo*0x20)&^x&swarHi | // bytes < 0x20
			zeroBytes(x^(swarLo*'"')) | zeroBytes(x^(swarLo*'\\'))
		if !nonASCII {
			stop |= x & swarHi
		}
		if stop != 0 {
			return i + bits.TrailingZeros64(stop)/8
		}
		i += 8
	}
	return i
}
