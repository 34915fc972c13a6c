package jsoncodec

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// Decode decodes one JSON value. Objects become map[string]any,
// arrays []any, numbers float64. Anything but whitespace after the value
// is an error.
func Decode(b []byte) (any, error) {
	d := decoders.Get().(*jsonDecoder)
	d.s, d.i, d.err = string(b), 0, nil
	d.ws()
	v := d.value(0)
	if d.err == nil {
		d.ws()
		if d.i < len(d.s) {
			d.fail("invalid character %q after top-level value", d.s[d.i])
		}
	}
	err := d.err
	d.release()
	if err != nil {
		return nil, fmt.Errorf("decode json: %w", err)
	}
	return v, nil
}

// decoders recycles decoders with their scratch stacks and intern caches
// (intern.go): building them per call was ten allocations of a 1 KiB
// record, and the caches only pay off when they outlive a record.
var decoders = sync.Pool{New: func() any { return new(jsonDecoder) }}

// maxScratch bounds the scratch stacks a pooled decoder keeps, so one huge
// document does not pin its scratch memory for good.
const maxScratch = 4096

// release returns d to the pool without references to the record it
// decoded.
func (d *jsonDecoder) release() {
	d.s, d.err, d.own = "", nil, false
	if cap(d.kvs) > maxScratch {
		d.kvs = nil
	}
	if cap(d.arr) > maxScratch {
		d.arr = nil
	}
	decoders.Put(d)
}

type jsonKV struct {
	k string
	v any
}

// jsonDecoder remembers its first error; after it, every method returns
// zero values quickly, so callers check once.
type jsonDecoder struct {
	s   string
	i   int
	err error
	kvs []jsonKV // scratch stack of object members being decoded
	arr []any    // scratch stack of array elements being decoded
	// own: d.s is the caller's buffer, not a copy (DecodeMembers), so no
	// decoded string may be a view into it.
	own bool
	Interner
}

func (d *jsonDecoder) fail(f string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(f+" at offset %d", append(args, d.i)...)
	}
	d.i = len(d.s)
}

func (d *jsonDecoder) ws() { d.i = skipWS(d.s, d.i) }

func (d *jsonDecoder) value(depth int) any {
	if d.i >= len(d.s) {
		d.fail("unexpected end of JSON input")
		return nil
	}
	switch c := d.s[d.i]; c {
	case '{':
		return d.object(depth+1, nil)
	case '[':
		return d.array(depth + 1)
	case '"':
		s, view := d.str()
		if d.err != nil {
			return nil
		}
		if view && d.own {
			s, view = strings.Clone(s), false
		}
		return d.BoxString(s, view)
	case 't':
		return d.literal("true", true)
	case 'f':
		return d.literal("false", false)
	case 'n':
		return d.literal("null", nil)
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			f, ok := d.number()
			if !ok {
				return nil
			}
			return d.BoxFloat(f)
		}
		d.fail("invalid character %q looking for beginning of value", c)
		return nil
	}
}

func (d *jsonDecoder) literal(word string, v any) any {
	if !strings.HasPrefix(d.s[d.i:], word) {
		d.fail("invalid literal, want %s", word)
		return nil
	}
	d.i += len(word)
	return v
}

// object decodes an object; with want, only the members it names are
// kept and the others are checked and skipped (DecodeMembers).
func (d *jsonDecoder) object(depth int, want Fields) any {
	if depth > maxDepth {
		d.fail("%v", errJSONDepth)
		return nil
	}
	d.i++ // {
	base := len(d.kvs)
	d.ws()
	if d.i < len(d.s) && d.s[d.i] == '}' {
		d.i++
		return map[string]any{}
	}
	for d.err == nil {
		d.ws()
		if d.i >= len(d.s) || d.s[d.i] != '"' {
			d.fail("want a string object key")
			break
		}
		k, view := d.str()
		d.ws()
		if d.i >= len(d.s) || d.s[d.i] != ':' {
			d.fail("want ':' after object key")
			break
		}
		d.i++
		d.ws()
		if _, keep := want[k]; want != nil && !keep {
			d.skip(depth)
		} else {
			if view && d.own {
				k = strings.Clone(k)
			}
			d.kvs = append(d.kvs, jsonKV{k, d.value(depth)})
		}
		d.ws()
		if d.i >= len(d.s) {
			d.fail("unexpected end of JSON input")
			break
		}
		if d.s[d.i] == ',' {
			d.i++
			continue
		}
		if d.s[d.i] == '}' {
			d.i++
			break
		}
		d.fail("invalid character %q after object member", d.s[d.i])
	}
	if d.err != nil {
		clear(d.kvs[base:])
		d.kvs = d.kvs[:base]
		return nil
	}
	// The top-level object gets room for two more members: `set` adds
	// members there, and a map that is full at its size (8 members, 14,
	// 28...) would otherwise be rehashed into one twice as big by the first
	// of them. Measured on the 14-member payment: the filter+set+map chain
	// -11% CPU; a decode alone +13% bytes, CPU unchanged. Sizes that are
	// not at such a boundary cost nothing.
	hint := len(d.kvs) - base
	if depth == 1 {
		hint += 2
	}
	m := make(map[string]any, hint)
	for _, kv := range d.kvs[base:] {
		m[kv.k] = kv.v // a repeated key: the last wins, as in encoding/json
	}
	clear(d.kvs[base:]) // let the scratch stack forget the values
	d.kvs = d.kvs[:base]
	return m
}

func (d *jsonDecoder) array(depth int) any {
	if depth > maxDepth {
		d.fail("%v", errJSONDepth)
		return nil
	}
	d.i++ // [
	base := len(d.arr)
	d.ws()
	if d.i < len(d.s) && d.s[d.i] == ']' {
		d.i++
		return []any{}
	}
	for d.err == nil {
		d.ws()
		d.arr = append(d.arr, d.value(depth))
		d.ws()
		if d.i >= len(d.s) {
			d.fail("unexpected end of JSON input")
			break
		}
		if d.s[d.i] == ',' {
			d.i++
			continue
		}
		if d.s[d.i] == ']' {
			d.i++
			break
		}
		d.fail("invalid character %q after array element", d.s[d.i])
	}
	if d.err != nil {
		clear(d.arr[base:])
		d.arr = d.arr[:base]
		return nil
	}
	a := make([]any, len(d.arr)-base)
	copy(a, d.arr[base:])
	clear(d.arr[base:])
	d.arr = d.arr[:base]
	return a
}

// strStop[c] is true for the bytes that end the fast scan of a string:
// the closing quote, a backslash, control characters and non-ASCII bytes.
var strStop = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c == '"' || c == '\\' || c < 0x20 || c >= utf8.RuneSelf
	}
	return t
}()

// str decodes the string at d.i (which is '"'). view reports that s is a
// substring of d.s (no escapes, valid UTF-8) rather than a new string.
func (d *jsonDecoder) str() (s string, view bool) {
	d.i++
	start := d.i
	ascii := true
	for d.i < len(d.s) {
		d.i = plainRun(d.s, d.i, !ascii)
		if d.i >= len(d.s) {
			break
		}
		c := d.s[d.i]
		if !strStop[c] {
			d.i++
			continue
		}
		switch {
		case c == '"':
			s := d.s[start:d.i]
			d.i++
			if !ascii && !utf8.ValidString(s) {
				return fixUTF8(s), false
			}
			return s, true
		case c == '\\':
			return d.strEscaped(start), false
		case c < 0x20:
			d.fail("invalid control character %q in string", c)
			return "", false
		}
		ascii = false
		d.i++
	}
	d.fail("unexpected end of JSON input in string")
	return "", false
}

// strEscaped finishes a string that has escapes; d.i is at the first '\'.
func (d *jsonDecoder) strEscaped(start int) string {
	b := make([]byte, 0, d.i-start+16)
	b = append(b, d.s[start:d.i]...)
	for d.i < len(d.s) {
		c := d.s[d.i]
		switch {
		case c == '"':
			d.i++
			if !utf8.Valid(b) {
				return fixUTF8(string(b))
			}
			return string(b)
		case c < 0x20:
			d.fail("invalid control character %q in string", c)
			return ""
		case c != '\\':
			b = append(b, c)
			d.i++
			continue
		}
		if d.i+1 >= len(d.s) {
			break
		}
		e := d.s[d.i+1]
		d.i += 2
		switch e {
		case '"', '\\', '/':
			b = append(b, e)
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r := d.hex4()
			if d.err != nil {
				return ""
			}
			if utf16.IsSurrogate(r) {
				// A surrogate pair, or U+FFFD for a lone half (as in
				// encoding/json).
				r2 := rune(-1)
				if strings.HasPrefix(d.s[d.i:], `\u`) {
					save := d.i
					d.i += 2
					r2 = d.hex4()
					if d.err != nil {
						return ""
					}
					if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
						b = utf8.AppendRune(b, dec)
						continue
					}
					d.i = save
				}
				b = utf8.AppendRune(b, utf8.RuneError)
				continue
			}
			b = utf8.AppendRune(b, r)
		default:
			d.i -= 2
			d.fail("invalid escape %q in string", e)
			return ""
		}
	}
	d.fail("unexpected end of JSON input in string")
	return ""
}

// fixUTF8 replaces every byte of invalid UTF-8 with U+FFFD, one for each
// byte as encoding/json does (strings.ToValidUTF8 would merge a run).
func fixUTF8(s string) string {
	b := make([]byte, 0, len(s)+8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b = utf8.AppendRune(b, utf8.RuneError)
		} else {
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return string(b)
}

func (d *jsonDecoder) hex4() rune {
	if d.i+4 > len(d.s) {
		d.fail("short \\u escape")
		return 0
	}
	var r rune
	for _, c := range []byte(d.s[d.i : d.i+4]) {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			d.fail("invalid \\u escape")
			return 0
		}
		r = r<<4 | rune(c)
	}
	d.i += 4
	return r
}

// number checks the JSON number grammar, then converts. Integers of up to
// 15 digits are converted by hand (exact in float64); the rest go through
// strconv.ParseFloat.
func (d *jsonDecoder) number() (float64, bool) {
	start := d.i
	n, digits, frac, plain, ok := d.scanNumber()
	if !ok {
		return 0, false
	}
	if plain && digits <= 15 {
		// n < 10^15 < 2^53 and 10^frac (frac <= 15) are exact in float64,
		// and IEEE division rounds correctly, so n / 10^frac is exactly
		// what ParseFloat returns (the classic fast path).
		f := float64(n)
		if frac > 0 {
			f /= pow10[frac]
		}
		if d.s[start] == '-' {
			f = -f
		}
		return f, true
	}
	return d.parseFloat(start)
}

// skipNumber checks a number as number does, range included, without
// converting what the fast path would.
func (d *jsonDecoder) skipNumber() {
	start := d.i
	_, digits, _, plain, ok := d.scanNumber()
	if ok && !(plain && digits <= 15) {
		d.parseFloat(start)
	}
}

// scanNumber moves past the number at d.i, checking its grammar. n holds
// its first 18 digits (sign and point left out), digits counts them all,
// frac those after the point; plain is false with an exponent.
func (d *jsonDecoder) scanNumber() (n int64, digits, frac int, plain, ok bool) {
	s := d.s
	if s[d.i] == '-' {
		d.i++
	}
	switch {
	case d.i < len(s) && s[d.i] == '0':
		d.i++
		digits = 1
	case d.i < len(s) && s[d.i] >= '1' && s[d.i] <= '9':
		for d.i < len(s) && s[d.i] >= '0' && s[d.i] <= '9' {
			if digits < 18 {
				n = n*10 + int64(s[d.i]-'0')
			}
			digits++
			d.i++
		}
	default:
		d.fail("invalid number")
		return 0, 0, 0, false, false
	}
	plain = true
	if d.i < len(s) && s[d.i] == '.' {
		d.i++
		if d.i >= len(s) || s[d.i] < '0' || s[d.i] > '9' {
			d.fail("invalid number: want a digit after '.'")
			return 0, 0, 0, false, false
		}
		for d.i < len(s) && s[d.i] >= '0' && s[d.i] <= '9' {
			if digits < 18 {
				n = n*10 + int64(s[d.i]-'0')
			}
			digits++
			frac++
			d.i++
		}
	}
	if d.i < len(s) && (s[d.i] == 'e' || s[d.i] == 'E') {
		plain = false
		d.i++
		if d.i < len(s) && (s[d.i] == '+' || s[d.i] == '-') {
			d.i++
		}
		if d.i >= len(s) || s[d.i] < '0' || s[d.i] > '9' {
			d.fail("invalid number: want a digit in the exponent")
			return 0, 0, 0, false, false
		}
		for d.i < len(s) && s[d.i] >= '0' && s[d.i] <= '9' {
			d.i++
		}
	}
	return n, digits, frac, plain, true
}

// parseFloat converts s[start:d.i] with strconv, failing out of range.
func (d *jsonDecoder) parseFloat(start int) (float64, bool) {
	f, err := strconv.ParseFloat(d.s[start:d.i], 64)
	if err != nil {
		d.i = start
		d.fail("number %s out of range", d.s[start:min(len(d.s), start+40)])
		return 0, false
	}
	return f, true
}

var pow10 = [...]float64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15}
