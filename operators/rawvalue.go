package operators

import (
	"reflect"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
)

// Encoding a 1 KiB JSON object costs about as much CPU as the steps of a
// short chain. A record whose value no step changed (a route of filters,
// joins and drop_duplicates) can go to the sink as the bytes it arrived
// with, so the sink skips jsoncodec.Append. SetJSON remembers which value
// was decoded from Raw; ValueBytes hands Raw back while Value is still that
// value. A step that changes the value in place (set) calls ValueChanged;
// replacing Value (map, or code outside the steps) is noticed by identity.

// SetJSON decodes raw into r.Value and keeps raw as r.Raw, remembering that
// the one is the decoding of the other (see ValueBytes). On error r is
// left unchanged.
func (r *Record) SetJSON(raw []byte) error {
	v, err := jsoncodec.Decode(raw)
	if err != nil {
		return err
	}
	r.Raw, r.Value = raw, v
	r.rawValue, r.rawFrom, r.rawSet, r.valueChanged = v, raw, true, false
	r.partialOf, r.partialFrom, r.partialWant = nil, nil, nil
	return nil
}

// SetJSONMembers is SetJSON for a route whose expressions read only the
// top-level members in want: an object keeps only those (the rest of raw
// is checked, not decoded: jsoncodec.DecodeMembers). It fails for exactly
// the values SetJSON fails for. Such a partial object must be encoded
// with EncodeValue, which puts back what was not decoded.
func (r *Record) SetJSONMembers(raw []byte, want jsoncodec.Fields) error {
	v, partial, err := jsoncodec.DecodeMembers(raw, want)
	if err != nil {
		return err
	}
	r.Raw, r.Value = raw, v
	r.rawValue, r.rawFrom, r.rawSet, r.valueChanged = v, raw, true, false
	r.partialOf, r.partialFrom, r.partialWant = nil, nil, nil
	if partial {
		r.partialOf, r.partialFrom, r.partialWant = v.(map[string]any), raw, want
	}
	return nil
}

// Partial reports whether Value is an object SetJSONMembers decoded only
// in part.
func (r *Record) Partial() bool {
	return r.partialOf != nil && sameValue(r.Value, r.partialOf)
}

// EncodeValue is the JSON encoding of Value: the bytes it was decoded from
// when no step changed it (ValueBytes); for an object decoded in part
// (SetJSONMembers), those bytes with the members it holds written anew;
// otherwise jsoncodec.Append.
func (r *Record) EncodeValue(dst []byte) ([]byte, error) {
	if raw, ok := r.ValueBytes(); ok {
		return append(dst, raw...), nil
	}
	if r.Partial() {
		return jsoncodec.SpliceMembers(dst, r.partialFrom, r.partialOf)
	}
	return jsoncodec.Append(dst, r.Value)
}

// ValueBytes returns r.Raw when r.Raw and r.Value are still what SetJSON
// set: the same bytes and the same object (or an equal scalar), not changed
// in place since. The bytes then encode the same JSON value as
// jsoncodec.Append(nil, r.Value), though not necessarily byte for byte
// (Append sorts keys and writes numbers and escapes its own way; Raw is
// what the producer sent). ok is false when the sink has to encode Value.
func (r *Record) ValueBytes() (raw []byte, ok bool) {
	if !r.rawSet || r.valueChanged || !sameBytes(r.Raw, r.rawFrom) || !sameValue(r.Value, r.rawValue) {
		return nil, false
	}
	return r.Raw, true
}

// Rewritten reports whether Value was decoded from Raw (SetJSON or
// SetJSONMembers) and a step changed it since, so Raw no longer holds the
// value as it is: a dead letter then encodes Value (EncodeValue).
func (r *Record) Rewritten() bool {
	if !r.rawSet {
		return false
	}
	_, same := r.ValueBytes()
	return !same
}

// ValueChanged records that r.Value was changed in place (a member of the
// object set or deleted), so ValueBytes no longer returns Raw. Assigning a
// new Value needs no call.
func (r *Record) ValueChanged() { r.valueChanged = true }

// sameBytes says whether a and b are the same slice (not just equal
// bytes): Raw was not replaced since SetJSON.
func sameBytes(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// sameValue says whether a is b: the same map or slice, or an equal
// scalar. Maps and slices cannot be compared with ==.
func sameValue(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		return ok && reflect.ValueOf(x).UnsafePointer() == reflect.ValueOf(y).UnsafePointer()
	case []any:
		y, ok := b.([]any)
		return ok && len(x) == len(y) && (len(x) == 0 || &x[0] == &y[0])
	case nil, string, float64, bool:
		return a == b
	}
	return false
}
