package serde

import (
	"context"
	"fmt"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Schema is one compiled registry schema.
type Schema struct {
	ID   int
	Type sr.SchemaType
	Text string // as the registry holds it

	avro  avro.Schema
	proto protoreflect.FileDescriptor
}

// Avro is the parsed Avro schema (nil for Protobuf).
func (s *Schema) Avro() avro.Schema { return s.avro }

// Proto is the compiled Protobuf file (nil for Avro).
func (s *Schema) Proto() protoreflect.FileDescriptor { return s.proto }

// compile turns a registry schema and its references into a Schema.
func compile(id int, s sr.Schema, refs []reference) (*Schema, error) {
	out := &Schema{ID: id, Type: s.Type, Text: s.Schema}
	switch s.Type {
	case sr.TypeAvro:
		cache := &avro.SchemaCache{}
		for _, r := range refs {
			if _, err := avro.ParseWithCache(r.schema, "", cache); err != nil {
				return nil, fmt.Errorf("avro reference %q does not parse: %w", r.name, err)
			}
		}
		as, err := avro.ParseWithCache(s.Schema, "", cache)
		if err != nil {
			return nil, fmt.Errorf("avro schema does not parse: %w", err)
		}
		out.avro = as
	case sr.TypeProtobuf:
		fd, err := compileProto(id, s.Schema, refs)
		if err != nil {
			return nil, err
		}
		out.proto = fd
	default:
		return nil, fmt.Errorf("schema type %s is neither AVRO nor PROTOBUF", s.Type)
	}
	return out, nil
}

// Decoder decodes framed values of one format.
type Decoder struct {
	reg     *Registry
	format  Format
	indexes IndexEncoding // Protobuf message indexes
}

// NewDecoder decodes values of format f with schemas from reg; Protobuf
// message indexes in the default (zigzag) encoding.
func NewDecoder(reg *Registry, f Format) *Decoder { return &Decoder{reg: reg, format: f} }

// WithIndexes makes d read Protobuf message indexes in encoding e.
func (d *Decoder) WithIndexes(e IndexEncoding) *Decoder {
	d.indexes = e
	return d
}

// Ready reports whether decoding b needs no registry request: its schema
// (or the knowledge that it is bad) is cached, or its header is bad.
func (d *Decoder) Ready(b []byte) (id int, ready bool) {
	id, _, err := header(b)
	if err != nil {
		return 0, true
	}
	return id, d.reg.Cached(id)
}

// Fetch makes the schema of b's header cached; an *UnavailableError when
// the registry cannot be asked now. A bad header or an unknown id is not
// an error here: Decode reports it.
func (d *Decoder) Fetch(ctx context.Context, b []byte) error {
	id, _, err := header(b)
	if err != nil {
		return nil
	}
	_, err = d.reg.Schema(ctx, id)
	if IsUnavailable(err) {
		return err
	}
	return nil
}

// Decode returns the value tree of the framed value b. Errors are
// *DecodeError (the record is bad) or *UnavailableError (call Fetch until
// it succeeds, then Decode again).
func (d *Decoder) Decode(ctx context.Context, b []byte) (any, error) {
	id, rest, err := header(b)
	if err != nil {
		return nil, err
	}
	s, err := d.reg.Schema(ctx, id)
	if err != nil {
		return nil, err
	}
	return d.decode(s, rest)
}

// decode reads rest (the bytes after the magic byte and id) with s.
func (d *Decoder) decode(s *Schema, rest []byte) (any, error) {
	fail := func(err error) error { return &DecodeError{ID: s.ID, HasID: true, Err: err} }
	if s.Type != d.format.schemaType() {
		return nil, fail(fmt.Errorf("the schema is %s, the route reads %s", s.Type, d.format))
	}
	if s.Type == sr.TypeAvro {
		v, err := avroDecode(s.avro, rest)
		if err != nil {
			return nil, fail(err)
		}
		return v, nil
	}
	idx, body, err := readIndexes(rest, d.indexes)
	if err != nil {
		return nil, fail(err)
	}
	md, err := protoMessage(s.proto, idx)
	if err != nil {
		if d.indexes == IndexesZigzag && len(idx) > 1 {
			err = fmt.Errorf("%w (written by confluent-kafka ≤ 1.7 or with use.deprecated.format? set message_indexes: unsigned)", err)
		}
		return nil, fail(err)
	}
	v, err := protoDecode(md, body)
	if err != nil {
		return nil, fail(err)
	}
	return v, nil
}
