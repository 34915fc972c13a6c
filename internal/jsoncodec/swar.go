package jsoncodec

import "unsafe"

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
	return *(*uint64)(unsafe.Add(unsafe.Pointer(unsafe.StringData(s)), i))
}

// hasZeroByte reports whether a byte of x is 0.
func hasZeroByte(x uint64) bool { return (x-swarLo)&^x&swarHi != 0 }

// plainRun returns the first index at or after i where s has a byte that
// needs a look in a string: '"', '\\', a control character (< 0x20), and,
// unless nonASCII, a byte >= 0x80. It may stop earlier, at the start of
// the 8 bytes that hold one; the caller goes on byte by byte from there.
func plainRun(s string, i int, nonASCII bool) int {
	for i+8 <= len(s) {
		x := load8(s, i)
		stop := (x-swarLo*0x20)&^x&swarHi != 0 || // a byte < 0x20
			hasZeroByte(x^(swarLo*'"')) || hasZeroByte(x^(swarLo*'\\'))
		if !nonASCII {
			stop = stop || x&swarHi != 0
		}
		if stop {
			return i
		}
		i += 8
	}
	return i
}
