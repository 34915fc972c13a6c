// Package jsoncodec is rtproxy's JSON codec: Decode turns a record's bytes
// into the value steps work on (map[string]any, []any, float64, string,
// bool, nil) and Append writes such a value back. Both are our own code,
// written for that one shape and chosen by measurement on 1 KiB payment
// records (operators/jsonbench; numbers in docs/BENCHMARKS.md). Of
// encoding/json, goccy/go-json, json-iterator and bytedance/sonic,
// goccy/go-json was the fastest at both decode and encode (Go 1.26.8).
// Decode cost the same CPU as goccy/go-json with about half its
// allocations (fewer since the intern caches), so less GC work for the rest
// of the pipeline; Append was faster than all four and allocates nothing
// when it appends to a reused buffer.
//
// Decoding:
//
//   - the input is copied once into a string, and every string without
//     escapes (keys and values) is a substring of it, so strings cost no
//     allocation. The price: one retained string keeps the whole record's
//     bytes alive, which is what a record does anyway while it is in flight.
//   - objects and arrays collect their members on a scratch stack and are
//     allocated once at their final size (the top-level object with room
//     for two more, see object), so maps never grow while decoding.
//   - decoders are pooled with their scratch stacks, and strings and numbers
//     that repeat from record to record share one box (intern.go).
//
// Numbers decode as float64, like encoding/json into `any`: expr
// arithmetic and comparisons work on them directly, and integers up to
// 2^53 round-trip exactly. A number out of float64 range is an error, as
// in encoding/json. Invalid UTF-8 inside strings becomes U+FFFD, as in
// encoding/json.
//
// Encoding writes what encoding/json.Marshal writes, byte for byte: objects
// with their keys sorted (so the same value always gives the same bytes),
// HTML-safe escapes, its number format. Append writes the types Decode and
// the operators produce itself, without reflection; any other type, alone
// or inside those, is written by encoding/json.Marshal. The one difference:
// nesting deeper than maxDepth is an error.
package jsoncodec

import "errors"

// maxDepth bounds nesting so hostile input cannot exhaust the stack; it is
// encoding/json's limit.
const maxDepth = 10000

var errJSONDepth = errors.New("exceeds max nesting depth")
