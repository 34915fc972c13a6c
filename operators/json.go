package operators

import (
	"fmt"

	gojson "github.com/goccy/go-json"
)

// JSON is decoded and encoded with github.com/goccy/go-json, chosen by
// measurement on 1 KiB payment records (operators/jsonbench, numbers in
// docs/BENCHMARKS.md): it was the fastest of encoding/json, goccy/go-json,
// json-iterator and bytedance/sonic at both decode and encode on this
// Go version, and it is a drop-in for encoding/json semantics.
//
// Numbers decode as float64, like encoding/json into `any`: expr
// arithmetic and comparisons work on them directly, and integers up to
// 2^53 round-trip exactly. Objects encode with their keys sorted, so the
// same value always gives the same bytes.

// DecodeJSON decodes one JSON value. Objects become map[string]any,
// arrays []any, numbers float64. Trailing data after the value is an
// error.
func DecodeJSON(b []byte) (any, error) {
	var v any
	if err := gojson.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("decode json: %w", err)
	}
	return v, nil
}

// AppendJSON appends the JSON encoding of v to dst.
func AppendJSON(dst []byte, v any) ([]byte, error) {
	b, err := gojson.Marshal(v)
	if err != nil {
		return dst, fmt.Errorf("encode json: %w", err)
	}
	return append(dst, b...), nil
}
