package jsoncodec

// Decoding only the members that are read. A route's expressions name the
// top-level members of the value they read (value.amount,
// value.card.country); DecodeMembers builds the object with those members
// and skips the bytes of the others with a scanner that checks them
// exactly as Decode does, so a value Decode refuses is refused here too,
// with the same error. SpliceMembers writes such an object back: the
// original bytes, with the members the object holds written anew and the
// ones it added at the end.

import (
	"fmt"
	"slices"
	"unsafe"
)

// Fields is a set of top-level member names.
type Fields map[string]struct{}

// DecodeMembers decodes b like Decode, except that a top-level object
// keeps only the members named in want; the others are checked and
// skipped. partial is true when members were skipped (b is an object),
// false when v is the whole value (not an object, so decoded whole).
func DecodeMembers(b []byte, want Fields) (v any, partial bool, err error) {
	d := decoders.Get().(*jsonDecoder)
	// No copy of b: what is kept of it is copied (own), and most of it is
	// only scanned.
	d.s, d.i, d.err, d.own = unsafe.String(unsafe.SliceData(b), len(b)), 0, nil, true
	d.ws()
	if d.i < len(d.s) && d.s[d.i] == '{' {
		v, partial = d.object(1, want), true
	} else {
		v = d.value(0)
	}
	if d.err == nil {
		d.ws()
		if d.i < len(d.s) {
			d.fail("invalid character %q after top-level value", d.s[d.i])
		}
	}
	err = d.err
	d.release()
	if err != nil {
		return nil, false, fmt.Errorf("decode json: %w", err)
	}
	return v, partial, nil
}

// skip moves past one value, checking it as value(depth) would, without
// building anything. The fast scanner (scan.go) does the work; when it
// refuses the value, skipChecked runs from the same place for the error.
func (d *jsonDecoder) skip(depth int) {
	if j := scanValue(d.s, d.i, depth); j >= 0 {
		d.i = j
		return
	}
	d.skipChecked(depth)
}

// skipChecked is skip with the checks written out as value(depth) makes
// them, each failing with Decode's message at Decode's offset.
func (d *jsonDecoder) skipChecked(depth int) {
	if d.i >= len(d.s) {
		d.fail("unexpected end of JSON input")
		return
	}
	switch c := d.s[d.i]; c {
	case '{':
		d.skipContainer(depth+1, '}', true)
	case '[':
		d.skipContainer(depth+1, ']', false)
	case '"':
		d.skipString()
	case 't':
		d.literal("true", nil)
	case 'f':
		d.literal("false", nil)
	case 'n':
		d.literal("null", nil)
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			d.skipNumber()
			return
		}
		d.fail("invalid character %q looking for beginning of value", c)
	}
}

// skipContainer skips an object (members) or an array.
func (d *jsonDecoder) skipContainer(depth int, end byte, members bool) {
	if depth > maxDepth {
		d.fail("%v", errJSONDepth)
		return
	}
	d.i++
	d.ws()
	if d.i < len(d.s) && d.s[d.i] == end {
		d.i++
		return
	}
	for d.err == nil {
		d.ws()
		if members {
			if d.i >= len(d.s) || d.s[d.i] != '"' {
				d.fail("want a string object key")
				return
			}
			d.skipString()
			d.ws()
			if d.i >= len(d.s) || d.s[d.i] != ':' {
				if d.err == nil {
					d.fail("want ':' after object key")
				}
				return
			}
			d.i++
			d.ws()
		}
		d.skipChecked(depth)
		d.ws()
		if d.i >= len(d.s) {
			d.fail("unexpected end of JSON input")
			return
		}
		switch d.s[d.i] {
		case ',':
			d.i++
			continue
		case end:
			d.i++
			return
		}
		if members {
			d.fail("invalid character %q after object member", d.s[d.i])
		} else {
			d.fail("invalid character %q after array element", d.s[d.i])
		}
	}
}

// skipString moves past the string at d.i, with the checks of str: control
// characters and escapes. Invalid UTF-8 is not an error (str replaces it).
func (d *jsonDecoder) skipString() {
	d.i++
	for d.i < len(d.s) {
		d.i = plainRun(d.s, d.i, true)
		if d.i >= len(d.s) {
			break
		}
		c := d.s[d.i]
		switch {
		case c == '"':
			d.i++
			return
		case c != '\\' && c >= 0x20:
			d.i++ // one of the last few bytes, or non-ASCII
			continue
		case c < 0x20:
			d.fail("invalid control character %q in string", c)
			return
		}
		// A backslash.
		if d.i+1 >= len(d.s) {
			break
		}
		e := d.s[d.i+1]
		d.i += 2
		switch e {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		case 'u':
			d.hex4()
			if d.err != nil {
				return
			}
		default:
			d.i -= 2
			d.fail("invalid escape %q in string", e)
			return
		}
	}
	d.fail("unexpected end of JSON input in string")
}

// SpliceMembers encodes obj, the object DecodeMembers made from raw and
// steps may have changed since (members set, added): raw's members as they
// are, except those obj holds, which are written from obj, and obj's
// members that raw lacks appended in name order. raw must be an object
// DecodeMembers accepted. The result encodes the object Decode(raw) would
// give with obj's members put into it.
func SpliceMembers(dst, raw []byte, obj map[string]any) ([]byte, error) {
	d := decoders.Get().(*jsonDecoder)
	defer d.release()
	// Keys are compared and forgotten: no copy of raw.
	d.s, d.i, d.err = unsafe.String(unsafe.SliceData(raw), len(raw)), 0, nil
	d.ws()
	if d.i >= len(d.s) || d.s[d.i] != '{' {
		return nil, fmt.Errorf("splice json: the value is not an object")
	}
	d.i++
	// One allocation for the output at most: raw's bytes, plus room for
	// members written anew or added.
	dst = slices.Grow(dst, len(raw)+32*len(obj))
	dst = append(dst, '{')
	n := 0
	// The members of obj found in raw: a route's object holds a few, so a
	// list on the stack beats a map.
	var seenBuf [16]string
	seen := seenBuf[:0]
	d.ws()
	for d.err == nil && d.i < len(d.s) && d.s[d.i] != '}' {
		start := d.i
		k, _ := d.str()
		d.ws()
		d.i++ // ':'
		d.ws()
		d.skip(1)
		end := d.i
		if d.err != nil {
			break
		}
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
		if v, ok := obj[k]; ok {
			seen = append(seen, k)
			dst = appendJSONString(dst, k)
			dst = append(dst, ':')
			var err error
			if dst, err = appendJSON(dst, v, 1); err != nil {
				return nil, err
			}
		} else {
			dst = append(dst, raw[start:end]...)
		}
		d.ws()
		if d.i < len(d.s) && d.s[d.i] == ',' {
			d.i++
			d.ws()
		}
	}
	if d.err != nil {
		return nil, fmt.Errorf("splice json: %w", d.err)
	}
	var addedBuf [16]string
	added := addedBuf[:0]
	for k := range obj {
		if !slices.Contains(seen, k) { // (seen may name a member twice: raw may)
			added = append(added, k)
		}
	}
	slices.Sort(added)
	for _, k := range added {
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
		dst = appendJSONString(dst, k)
		dst = append(dst, ':')
		var err error
		if dst, err = appendJSON(dst, obj[k], 1); err != nil {
			return nil, err
		}
	}
	return append(dst, '}'), nil
}
