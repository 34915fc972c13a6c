package pipeline

// The route's source value format, chosen once from source.format when the
// route is made (newRoute): how a source record's value is decoded, and
// whether a value that is still the source's is written as the bytes it came
// as. Nothing else in the pipeline looks at source.format.

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
)

// valueFormat is how a route reads its source values.
type valueFormat interface {
	// decode sets rec.Value from kr's value; false when the record went
	// to the dead letters.
	decode(r *route, rec *operators.Record, kr *kgo.Record, tk *ticket) bool
	// sourceBytes is what rec's value is written as when the format
	// passes values on as the bytes they came as (raw) and rec's value is
	// still the source's (not a window row): the string a step kept, or
	// the bytes received for a nil value. ok false: encode the value.
	sourceBytes(rec *operators.Record) (b []byte, ok bool)
	// members are the only top-level members of a JSON source value the
	// route reads (rules.Source.Members); nil: decode whole.
	members() jsoncodec.Fields
}

// sourceFormatOf is the value format of route d's source.
func sourceFormatOf(d *rules.Route) valueFormat {
	switch f := d.Source.Format; {
	case f == rules.FormatRaw:
		return rawFormat{}
	case f.Registry():
		return registryFormat{}
	case d.Source.DecodeMembers:
		m := jsoncodec.Fields{}
		for _, n := range d.Source.Members {
			m[n] = struct{}{}
		}
		return jsonFormat{only: m}
	}
	return jsonFormat{}
}

// jsonFormat decodes JSON, whole or only the members the route reads.
type jsonFormat struct{ only jsoncodec.Fields }

func (f jsonFormat) decode(r *route, rec *operators.Record, kr *kgo.Record, tk *ticket) bool {
	// SetJSON remembers the bytes, so a value no step changes goes to the
	// sink as it arrived (encodeValue). On error rec keeps Raw and a nil
	// Value: the dead letter carries the bytes as received.
	var err error
	if f.only != nil {
		err = rec.SetJSONMembers(kr.Value, f.only)
	} else {
		err = rec.SetJSON(kr.Value)
	}
	if err != nil {
		r.deadLetter(rec, operators.ReasonDecode, err, "source", tk)
		return false
	}
	return true
}

func (jsonFormat) sourceBytes(*operators.Record) ([]byte, bool) { return nil, false }
func (f jsonFormat) members() jsoncodec.Fields                  { return f.only }

// rawFormat passes the bytes on: value is their string.
type rawFormat struct{}

func (rawFormat) decode(_ *route, rec *operators.Record, kr *kgo.Record, _ *ticket) bool {
	rec.Value = string(kr.Value)
	return true
}

func (rawFormat) sourceBytes(rec *operators.Record) ([]byte, bool) {
	if rec.Window != nil {
		return nil, false
	}
	switch v := rec.Value.(type) {
	case string:
		return []byte(v), true
	case nil:
		if rec.Raw != nil {
			return rec.Raw, true
		}
	}
	return nil, false
}

func (rawFormat) members() jsoncodec.Fields { return nil }

// registryFormat decodes Avro or Protobuf through the schema registry
// (format.go).
type registryFormat struct{}

func (registryFormat) decode(r *route, rec *operators.Record, kr *kgo.Record, tk *ticket) bool {
	return r.decodeValue(r.plan.codec.dec, rec, kr, tk, "source")
}

func (registryFormat) sourceBytes(*operators.Record) ([]byte, bool) { return nil, false }
func (registryFormat) members() jsoncodec.Fields                    { return nil }
