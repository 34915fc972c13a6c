package pipeline

// Values in a schema registry's formats (source.format avro | protobuf):
// the route's decoder, the wait for a schema the registry cannot give yet,
// and the schema id header of dead letters. internal/serde does the work.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/serde"
	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
)

// HeaderSchemaID is on a dead letter whose value's schema id is known
// (reasons decode and encode): the id, in decimal.
const HeaderSchemaID = "rtproxy-schema-id"

// reasonEncode is the dead-letter reason of an output that does not fit
// the sink's schema.
const reasonEncode operators.Reason = "encode"

// codec is a route's reader and writer of registry formats.
type codec struct {
	dec *serde.Decoder // source.format avro | protobuf
	// others are the decoders of stream joins' second topics of format
	// avro | protobuf, by the join's step index (StepSpec.Index). They
	// share the source's registry client, so its schema cache.
	others map[int]*serde.Decoder
	// encs are the encoders of the route's sinks, by sink (rules.Route.Sinks,
	// a switch's branches): nil for a sink that writes JSON.
	encs []*serde.Encoder
	err  error // no usable registry: records wait, the route says why
}

// registryConfig is the registry a route uses: its rule file's, else the
// proxy's.
func registryConfig(cfg serde.Config, d *rules.Route) serde.Config { return d.RegistryConfig(cfg) }

// newCodec is the codec of route d, nil when it reads JSON or raw values.
func newCodec(cfg serde.Config, d *rules.Route) *codec {
	if !d.UsesRegistry() {
		return nil
	}
	rc := registryConfig(cfg, d)
	if !rc.Set() {
		return &codec{err: fmt.Errorf("source.format %s%s / sink.format %s need a schema registry: set schema_registry.url in the proxy config or `schema_registry:` in %s", d.Source.Format, streamFormats(d), sinkFormats(d), d.File)}
	}
	reg, err := serde.NewRegistry(rc, os.LookupEnv)
	if err != nil {
		return &codec{err: err}
	}
	c := &codec{}
	if f := d.Source.Format; f.Registry() {
		c.dec = serde.NewDecoder(reg, f.Serde())
		if x, err := serde.ParseIndexEncoding(d.Source.MessageIndexes); err == nil {
			c.dec.WithIndexes(x)
		}
	}
	for i := range d.Steps {
		in := d.Steps[i].Input
		if in == nil || !rules.Format(in.Format).Registry() {
			continue
		}
		dec := serde.NewDecoder(reg, rules.Format(in.Format).Serde())
		if x, err := serde.ParseIndexEncoding(in.MessageIndexes); err == nil {
			dec.WithIndexes(x)
		}
		if c.others == nil {
			c.others = map[int]*serde.Decoder{}
		}
		c.others[d.Steps[i].Index] = dec
	}
	for _, s := range d.Sinks() {
		var enc *serde.Encoder
		if f := s.Format; f.Registry() {
			enc = serde.NewEncoder(reg, f.Serde(), s.Subject, s.Schema, s.Message)
			if x, err := serde.ParseIndexEncoding(s.MessageIndexes); err == nil {
				enc.WithIndexes(x)
			}
		}
		c.encs = append(c.encs, enc)
	}
	return c
}

// sinkFormats names the formats of d's sinks, for messages.
func sinkFormats(d *rules.Route) string {
	var fs []string
	for _, s := range d.Sinks() {
		fs = append(fs, string(s.Format))
	}
	return strings.Join(fs, ", ")
}

// streamFormats names the registry formats of d's stream joins' second
// topics, for messages.
func streamFormats(d *rules.Route) string {
	var b strings.Builder
	for i := range d.Steps {
		if in := d.Steps[i].Input; in != nil && rules.Format(in.Format).Registry() {
			fmt.Fprintf(&b, " / step %d join.stream.format %s", d.Steps[i].Index, in.Format)
		}
	}
	return b.String()
}

// decoder is the decoder of the values task t reads: the source's, a
// second input's of a registry format, nil for JSON or raw values and for
// the repartition topics (their values are the pipeline's own).
func (c *codec) decoder(t *task) *serde.Decoder {
	if o := t.seg.other; o != nil {
		return c.others[o.step.Index]
	}
	if t.seg.idx == 0 {
		return c.dec
	}
	return nil
}

// enc is the encoder of sink i, nil for one that writes JSON.
func (c *codec) enc(i int) *serde.Encoder {
	if c == nil || i >= len(c.encs) {
		return nil
	}
	return c.encs[i]
}

// ready reports whether kr can be processed without a registry request;
// dec decodes its value (nil: it is not decoded here).
func (c *codec) ready(kr *kgo.Record, dec *serde.Decoder) bool {
	if c.err != nil {
		return false
	}
	for _, e := range c.encs {
		if e != nil && !e.Ready() {
			return false
		}
	}
	if dec != nil {
		_, ok := dec.Ready(kr.Value)
		return ok
	}
	return true
}

// fetch asks the registry for what kr needs.
func (c *codec) fetch(ctx context.Context, kr *kgo.Record, dec *serde.Decoder) error {
	if c.err != nil {
		return c.err
	}
	for _, e := range c.encs {
		if e != nil {
			if err := e.Resolve(ctx); err != nil {
				return err
			}
		}
	}
	if dec != nil {
		return dec.Fetch(ctx, kr.Value)
	}
	return nil
}

// Backoff of the retries while a schema cannot be fetched.
const (
	schemaRetryMin = 100 * time.Millisecond
	schemaRetryMax = 5 * time.Second
)

// awaitSchema returns once decoding kr needs no registry request, or false
// when task t or the route stops first. It is called before the record is
// processed, outside cut: a record that waits holds back only its own
// partition (whose later records must wait anyway), never a checkpoint or
// another task. The wait is in /routes as the route's last error.
func (r *route) awaitSchema(t *task, kr *kgo.Record) bool {
	c := r.plan.codec
	if c == nil {
		return true
	}
	dec := c.decoder(t)
	if c.ready(kr, dec) {
		return true
	}
	wait := schemaRetryMin
	shown := ""
	for {
		err := c.fetch(r.ctx, kr, dec)
		if err == nil {
			if shown != "" {
				r.clearError(shown)
				r.log.Info("schema registry answered; records flow again", "topic", kr.Topic, "partition", kr.Partition, "offset", kr.Offset)
			}
			return true
		}
		msg := fmt.Sprintf("%s[%d] waits at offset %d: %v (retrying)", kr.Topic, kr.Partition, kr.Offset, err)
		if msg != shown {
			r.noteError(errors.New(msg))
			shown = msg
		}
		select {
		case <-t.stop:
			return false
		case <-r.life.halt:
			return false
		case <-time.After(wait):
		}
		wait = min(2*wait, schemaRetryMax)
	}
}

// decodeValue sets rec.Value from the framed value of kr with dec (the
// source's, or a stream join's second topic's); false when the record went
// to the dead letters, at step (the dead letter's rtproxy-step: "source",
// or the join's label).
func (r *route) decodeValue(dec *serde.Decoder, rec *operators.Record, kr *kgo.Record, tk *ticket, step string) bool {
	// awaitSchema made the schema cached, and a cached schema (or refusal)
	// is never dropped for one the registry cannot give: Decode asks the
	// registry no more. Background, so it waits for a lookup another task
	// has in flight rather than fail with the route's context.
	wait := schemaRetryMin
	for {
		v, err := dec.Decode(context.Background(), kr.Value)
		if err == nil {
			rec.Value = v
			return true
		}
		if !serde.IsUnavailable(err) {
			r.deadLetter(rec, operators.ReasonDecode, err, step, tk)
			return false
		}
		r.noteError(fmt.Errorf("%s[%d] waits at offset %d: %w (retrying)", kr.Topic, kr.Partition, kr.Offset, err))
		time.Sleep(wait)
		wait = min(2*wait, schemaRetryMax)
	}
}

// sinkValue is the value of rec for the route's sink i: encoded with the
// sink's schema for sink.format avro | protobuf, else as encodeValue
// writes it.
func (r *route) sinkValue(rec *operators.Record, i int) ([]byte, error) {
	enc := r.plan.codec.enc(i)
	if enc == nil {
		return r.encodeValue(rec)
	}
	if !enc.Ready() {
		// Only a window closed by the idle watermark before any record of
		// this run passed awaitSchema gets here.
		ctx, cancel := context.WithTimeout(r.ctx, schemaRetryMax)
		err := enc.Resolve(ctx)
		cancel()
		if err != nil {
			return nil, &serde.EncodeError{Err: err}
		}
	}
	return enc.Encode(rec.Value)
}

// outputReason is the dead-letter reason of a value sinkValue refused.
func outputReason(err error) operators.Reason {
	var e *serde.EncodeError
	if errors.As(err, &e) {
		return reasonEncode
	}
	return operators.ReasonError
}

// schemaHeaders are the extra dead-letter headers of err: the schema id of
// a decode or encode error.
func schemaHeaders(err error) []kgo.RecordHeader {
	if id, ok := serde.SchemaID(err); ok {
		return []kgo.RecordHeader{{Key: HeaderSchemaID, Value: strconv.AppendInt(nil, int64(id), 10)}}
	}
	return nil
}
