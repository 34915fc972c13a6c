// Package serde reads and writes record values in the Confluent wire
// format: a magic byte 0, a 4-byte big-endian schema id, for Protobuf the
// message indexes, then the Avro or Protobuf bytes. Schemas come from a
// Confluent-API schema registry through franz-go's pkg/sr, are fetched by
// id once and kept.
//
// Decoding gives the value tree the JSON path gives (internal/jsoncodec):
// map[string]any, []any, float64, string, bool and nil, so every operator,
// the analyzer and `rtproxy test` see an Avro record or a Protobuf message
// as they see the same record written as JSON. docs/RULES.md ("Avro and
// Protobuf") says how each schema type maps to that tree.
//
// Avro is read and written with github.com/hamba/avro/v2 (its schema
// parser, Reader and Writer), Protobuf with google.golang.org/protobuf
// (dynamicpb) and github.com/bufbuild/protocompile, which compiles the
// registry's .proto text with its references.
package serde

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/sr"
)

// Format is a value format that goes through the registry.
type Format string

// The formats of this package.
const (
	Avro     Format = "avro"
	Protobuf Format = "protobuf"
)

// schemaType is the registry's schema type of f.
func (f Format) schemaType() sr.SchemaType {
	if f == Protobuf {
		return sr.TypeProtobuf
	}
	return sr.TypeAvro
}

// maxIndexes bounds the Protobuf message indexes of one record's header: a
// nesting deeper than this is not a schema anyone registers, and the bound
// keeps a hostile count from allocating.
const maxIndexes = 64

// DecodeError is a record that cannot be decoded: its header is not the
// Confluent wire format, its schema id is unknown to the registry, its
// schema does not compile, or its bytes do not match its schema. It is
// permanent: the record goes to the dead-letter topic.
type DecodeError struct {
	ID    int  // the schema id of the header
	HasID bool // false when the header itself is bad
	Err   error
}

func (e *DecodeError) Error() string {
	if !e.HasID {
		return e.Err.Error()
	}
	return fmt.Sprintf("schema id %d: %v", e.ID, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// EncodeError is a value that does not fit the output schema.
type EncodeError struct {
	ID  int
	Err error
}

func (e *EncodeError) Error() string { return fmt.Sprintf("schema id %d: %v", e.ID, e.Err) }

func (e *EncodeError) Unwrap() error { return e.Err }

// UnavailableError is a schema the registry could not be asked for now
// (unreachable, a server error, refused credentials): the record must wait
// and the lookup be retried; it is never a reason to drop the record.
type UnavailableError struct {
	ID      int    // the schema id, or 0 for a subject lookup
	Subject string // the subject of an output schema lookup
	Err     error
}

func (e *UnavailableError) Error() string {
	what := "schema id " + strconv.Itoa(e.ID)
	if e.Subject != "" {
		what = "subject " + strconv.Quote(e.Subject)
	}
	return fmt.Sprintf("schema registry unavailable for %s: %v", what, e.Err)
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// IsUnavailable reports whether err says the registry could not be
// reached: the caller waits and retries.
func IsUnavailable(err error) bool {
	var u *UnavailableError
	return errors.As(err, &u)
}

// SchemaID is the schema id a decode or encode error names.
func SchemaID(err error) (int, bool) {
	var d *DecodeError
	if errors.As(err, &d) {
		return d.ID, d.HasID
	}
	var e *EncodeError
	if errors.As(err, &e) {
		return e.ID, e.ID != 0
	}
	return 0, false
}

var (
	errBadHeader = errors.New("not the Confluent wire format: want magic byte 0 and a 4-byte schema id")
	errTrailing  = errors.New("bytes left after the value: they do not match the schema")
)

// header splits a framed value into its schema id and the rest.
func header(b []byte) (int, []byte, error) {
	var h sr.ConfluentHeader
	id, rest, err := h.DecodeID(b)
	if err != nil {
		return 0, nil, &DecodeError{Err: errBadHeader}
	}
	return id, rest, nil
}

// SchemaIDOf is the schema id in b's header.
func SchemaIDOf(b []byte) (int, bool) {
	id, _, err := header(b)
	return id, err == nil
}
