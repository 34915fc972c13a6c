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
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/serde"
	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
)

// HeaderSchemaID is on a dead letter whose value's schema id is known
// (reasons decode and encode): the id, in decimal.
const HeaderSchemaID = "rtproxy-schema-id"

// codec is a route's reader of registry formats.
type codec struct {
	dec *serde.Decoder
	err error // no usable registry: records wait, the route says why
}

// registryConfig is the registry a route uses: its rule file's, else the
// proxy's.
func registryConfig(cfg serde.Config, d *rules.Route) serde.Config {
	if s := d.SchemaRegistry; s != nil {
		timeout := s.Timeout
		if timeout == 0 {
			timeout = cfg.Timeout
		}
		return serde.Config{URL: s.URL, BasicAuthFile: s.BasicAuthFile, BasicAuthEnv: s.BasicAuthEnv,
			BearerTokenFile: s.BearerTokenFile, BearerTokenEnv: s.BearerTokenEnv, CAFile: s.CAFile, Timeout: timeout}
	}
	return cfg
}

// newCodec is the codec of route d, nil when it reads JSON or raw values.
func newCodec(cfg serde.Config, d *rules.Route) *codec {
	if !d.UsesRegistry() {
		return nil
	}
	rc := registryConfig(cfg, d)
	if !rc.Set() {
		return &codec{err: fmt.Errorf("source.format %s needs a schema registry: set schema_registry.url in the proxy config or `schema_registry:` in %s", d.Source.Format, d.File)}
	}
	reg, err := serde.NewRegistry(rc, os.LookupEnv)
	if err != nil {
		return &codec{err: err}
	}
	return &codec{dec: serde.NewDecoder(reg, serde.Format(d.Source.Format))}
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
	c := r.codec
	if c == nil {
		return true
	}
	if c.err == nil {
		if _, ready := c.dec.Ready(kr.Value); ready {
			return true
		}
	}
	wait := schemaRetryMin
	shown := ""
	for {
		err := c.err
		if err == nil {
			if err = c.dec.Fetch(r.ctx, kr.Value); err == nil {
				if shown != "" {
					r.clearError(shown)
					r.log.Info("schema registry answered; records flow again", "topic", kr.Topic, "partition", kr.Partition, "offset", kr.Offset)
				}
				return true
			}
		}
		msg := fmt.Sprintf("%s[%d] waits at offset %d: %v (retrying)", kr.Topic, kr.Partition, kr.Offset, err)
		if msg != shown {
			r.noteError(errors.New(msg))
			shown = msg
		}
		select {
		case <-t.stop:
			return false
		case <-r.halt:
			return false
		case <-time.After(wait):
		}
		wait = min(2*wait, schemaRetryMax)
	}
}

// decodeValue sets rec.Value from the framed value of kr; false when the
// record went to the dead letters.
func (r *route) decodeValue(rec *operators.Record, kr *kgo.Record, tk *ticket) bool {
	// awaitSchema made the schema cached, and a cached schema (or refusal)
	// is never dropped for one the registry cannot give: Decode asks the
	// registry no more. Background, so it waits for a lookup another task
	// has in flight rather than fail with the route's context.
	wait := schemaRetryMin
	for {
		v, err := r.codec.dec.Decode(context.Background(), kr.Value)
		if err == nil {
			rec.Value = v
			return true
		}
		if !serde.IsUnavailable(err) {
			r.deadLetter(rec, operators.ReasonDecode, err, "source", tk)
			return false
		}
		r.noteError(fmt.Errorf("%s[%d] waits at offset %d: %w (retrying)", kr.Topic, kr.Partition, kr.Offset, err))
		time.Sleep(wait)
		wait = min(2*wait, schemaRetryMax)
	}
}

// schemaHeaders are the extra dead-letter headers of err: the schema id of
// a decode or encode error.
func schemaHeaders(err error) []kgo.RecordHeader {
	if id, ok := serde.SchemaID(err); ok {
		return []kgo.RecordHeader{{Key: HeaderSchemaID, Value: strconv.AppendInt(nil, int64(id), 10)}}
	}
	return nil
}
