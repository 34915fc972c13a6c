package jsoncodec

import (
	"math/bits"
	"strconv"
	"unsafe"
)

// The fast skip scanner. skip (members.go) first runs scanValue, which
// only answers "valid, and where it ends" with the input and the position
// in registers (the checked scanner keeps both in the decoder, so every
// step loads and stores them) and strings scanned 16 bytes per loop turn.
// When scanValue says no, the checked scanner runs again from the same
// position and reports the error, so errors keep their message and offset
// by construction. What scanValue must get right is only the other half:
// it accepts a value only where the checked scanner (and so Decode) does,
// and ends it at the same byte. FuzzDecodeMembers checks both scanners
// against each other and against Decode.

// wsBits has the bits of the four JSON whitespace bytes, all <= ' '.
const wsBits = 1<<' ' | 1<<'\t' | 1<<'\n' | 1<<'\r'

// skipWS returns the index of the first non-whitespace byte at or after i.
func skipWS(s string, i int) int {
	for i < len(s) {
		if c := s[i]; c > ' ' || wsBits>>c&1 == 0 {
			return i
		}
		i++
	}
	return i
}

// scanValue returns the index after the value at s[i], or -1 if the
// checked scanner would refuse it. depth is that of the enclosing
// container, as for skip.
func scanValue(s string, i, depth int) int {
	if i >= len(s) {
		return -1
	}
	switch c := s[i]; c {
	case '"':
		return scanString(s, i+1)
	case '{':
		return scanContainer(s, i, depth+1, '}', true)
	case '[':
		return scanContainer(s, i, depth+1, ']', false)
	case 't':
		if i+4 <= len(s) && s[i:i+4] == "true" {
			return i + 4
		}
	case 'f':
		if i+5 <= len(s) && s[i:i+5] == "false" {
			return i + 5
		}
	case 'n':
		if i+4 <= len(s) && s[i:i+4] == "null" {
			return i + 4
		}
	default:
		if c == '-' || c-'0' <= 9 {
			return scanNumber(s, i)
		}
	}
	return -1
}

// scanContainer: the object (members) or array at s[i], of depth depth.
func scanContainer(s string, i, depth int, end byte, members bool) int {
	if depth > maxDepth {
		return -1
	}
	i = skipWS(s, i+1)
	if i < len(s) && s[i] == end {
		return i + 1
	}
	for {
		if members {
			if i >= len(s) || s[i] != '"' {
				return -1
			}
			if i = scanString(s, i+1); i < 0 {
				return -1
			}
			if i < len(s) && s[i] == ':' { // the common `"key":`
				i++
			} else if i = skipWS(s, i); i < len(s) && s[i] == ':' {
				i++
			} else {
				return -1
			}
			i = skipWS(s, i)
		}
		if i = scanValue(s, i, depth); i < 0 {
			return -1
		}
		if i = skipWS(s, i); i >= len(s) {
			return -1
		}
		switch s[i] {
		case ',':
			i = skipWS(s, i+1)
			continue
		case end:
			return i + 1
		}
		return -1
	}
}

// scanString returns the index after the string whose body starts at
// s[i] (the byte after its opening quote), or -1 if str would refuse it:
// a control character, a bad escape, or no closing quote. Invalid UTF-8 is
// not an error.
func scanString(s string, i int) int {
	n := len(s)
	p := unsafe.StringData(s)
	for {
		var m uint64
		for ; i+16 <= n; i += 16 {
			ma, mb := strStops(loadAt(p, i)), strStops(loadAt(p, i+8))
			if ma|mb != 0 {
				if ma == 0 {
					i, ma = i+8, mb
				}
				m = ma
				break
			}
		}
		if m == 0 && i+8 <= n {
			if m = strStops(loadAt(p, i)); m == 0 {
				i += 8
			}
		}
		if m != 0 {
			i += bits.TrailingZeros64(m) >> 3
		} else {
			for i < n && s[i] != '"' && s[i] != '\\' && s[i] >= 0x20 {
				i++
			}
			if i >= n {
				return -1
			}
		}
		switch s[i] {
		case '"':
			return i + 1
		case '\\':
		default:
			return -1 // a control character
		}
		if i+1 >= n {
			return -1
		}
		switch s[i+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i += 2
		case 'u':
			if i+6 > n || !isHex(s[i+2]) || !isHex(s[i+3]) || !isHex(s[i+4]) || !isHex(s[i+5]) {
				return -1
			}
			i += 6
		default:
			return -1
		}
	}
}

func isHex(c byte) bool {
	return c-'0' <= 9 || (c|0x20)-'a' <= 'f'-'a'
}

// scanNumber returns the index after the number at s[i] (a '-' or a
// digit), or -1 if number would refuse it: its grammar, or out of float64
// range (checked by strconv.ParseFloat where number would call it).
func scanNumber(s string, i int) int {
	start, n := i, len(s)
	if s[i] == '-' {
		i++
	}
	digits := 0
	switch {
	case i < n && s[i] == '0':
		i++
		digits = 1
	case i < n && s[i]-'1' <= 8:
		j := i
		i = skipDigits(s, i)
		digits = i - j
	default:
		return -1
	}
	plain := true
	if i < n && s[i] == '.' {
		j := i + 1
		if i = skipDigits(s, j); i == j {
			return -1
		}
		digits += i - j
	}
	if i < n && s[i]|0x20 == 'e' {
		plain = false
		i++
		if i < n && (s[i] == '+' || s[i] == '-') {
			i++
		}
		j := i
		if i = skipDigits(s, j); i == j {
			return -1
		}
	}
	if !plain || digits > 15 {
		if _, err := strconv.ParseFloat(s[start:i], 64); err != nil {
			return -1
		}
	}
	return i
}

// skipDigits returns the index of the first byte at or after i that is not
// a decimal digit.
func skipDigits(s string, i int) int {
	for i < len(s) && s[i]-'0' <= 9 {
		i++
	}
	return i
}
