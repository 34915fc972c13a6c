package main

// Guards on Avro and Protobuf topics (rules.Guard with format avro |
// protobuf): each produced value is decoded with its schema from the
// schema registry (the guard file's `schema_registry:`, else the proxy's)
// into the value tree a route would see, then checked. A value that is not
// in the Confluent wire format, names a schema id the registry does not
// know, or does not decode fails the built-in check `decode`.
//
// Schemas are fetched by id once and cached (internal/serde), so the
// steady state asks the registry nothing. A lookup the registry does not
// answer is bounded: it waits at most guardLookupMax (or the registry's
// timeout when shorter), then the record's partition is refused with a
// retriable error (protocol.RetriableGuard: REQUEST_TIMED_OUT), and for
// guardRegistryBackoff after that, records whose schema is not cached are
// refused at once rather than wait again, so a request with many
// partitions waits once, not once per partition. Topics without a guard
// never wait for a registry.

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rtproxy/rtproxy/config"
	"github.com/rtproxy/rtproxy/internal/serde"
	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/protocol"
	"github.com/rtproxy/rtproxy/rules"
)

// Bounds of a guard's registry lookups.
const (
	// guardLookupMax bounds how long a produced record waits for its
	// schema: a producer's request times out after 30 s (Java,
	// librdkafka) or 20 s (franz-go), and the proxy must answer first.
	guardLookupMax = 5 * time.Second
	// guardRegistryBackoff is how long, after the registry did not
	// answer, lookups of schemas not cached fail at once.
	guardRegistryBackoff = time.Second
	// defaultRegistryTimeout is serde's default request timeout.
	defaultRegistryTimeout = 10 * time.Second
)

// schemaRegistryConfig is the proxy's schema registry (config
// schema_registry), with the serde metrics shared by routes and guards.
func schemaRegistryConfig(cfg *config.Config, m *serde.Metrics) serde.Config {
	s := cfg.SchemaRegistry
	return serde.Config{URL: s.URL,
		BasicAuthFile: s.BasicAuthFile, BasicAuthEnv: s.BasicAuthEnv,
		BearerTokenFile: s.BearerTokenFile, BearerTokenEnv: s.BearerTokenEnv,
		CAFile: s.CAFile, Timeout: s.Timeout,
		Limits: serde.Limits{MaxResponseBytes: s.MaxResponseBytes, MaxSchemaBytes: s.MaxSchemaBytes,
			MaxSchemaDepth: s.MaxSchemaDepth, MaxReferences: s.MaxReferences},
		Metrics: m}
}

// guardDecoder decodes the values of one registry-format guard.
type guardDecoder struct {
	dec  *serde.Decoder
	err  string        // no usable registry: every record fails `decode` with this
	wait time.Duration // bound of one lookup
	// downUntil (unix nanos): until then, a schema not cached is not
	// asked for (the registry did not answer just before).
	downUntil atomic.Int64
}

// registries keeps one registry client (and its schema cache) per
// registry configuration across reloads: a reload does not empty the
// cache. Those no guard in force uses are dropped at each apply (prune).
type registries struct {
	mu   sync.Mutex
	all  map[string]*serde.Registry
	used map[string]bool // by the guards of the apply in progress
}

func (rs *registries) get(c serde.Config) (*serde.Registry, error) {
	key := fmt.Sprintf("%q %q %q %q %q %q %d", c.URL, c.BasicAuthFile, c.BasicAuthEnv, c.BearerTokenFile, c.BearerTokenEnv, c.CAFile, c.Timeout)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.used == nil {
		rs.used = map[string]bool{}
	}
	rs.used[key] = true
	if r := rs.all[key]; r != nil {
		return r, nil
	}
	r, err := serde.NewRegistry(c, os.LookupEnv)
	if err != nil {
		return nil, err
	}
	if rs.all == nil {
		rs.all = map[string]*serde.Registry{}
	}
	rs.all[key] = r
	return r, nil
}

// prune drops the clients no guard of the last apply asked for.
func (rs *registries) prune() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for k := range rs.all {
		if !rs.used[k] {
			delete(rs.all, k)
		}
	}
	rs.used = nil
}

// newGuardDecoder is the decoder of guard file f (format avro or
// protobuf); proxy is the proxy's registry.
func (g *guards) newGuardDecoder(f *rules.Route, proxy serde.Config) *guardDecoder {
	gd := f.Guard
	c := f.RegistryConfig(proxy)
	if !c.Set() {
		msg := fmt.Sprintf("guard %s reads format %s but no schema registry is set: set schema_registry.url in the proxy's config or `schema_registry:` in its file; its records are refused", f.Name, gd.Format)
		g.log.Error(msg, "guard", f.Name, "file", f.File)
		return &guardDecoder{err: msg}
	}
	reg, err := g.regs.get(c)
	if err != nil {
		msg := fmt.Sprintf("guard %s: %v; its records are refused", f.Name, err)
		g.log.Error(msg, "guard", f.Name, "file", f.File)
		return &guardDecoder{err: msg}
	}
	d := &guardDecoder{dec: serde.NewDecoder(reg, gd.Format.Serde()), wait: guardLookupMax}
	if x, err := serde.ParseIndexEncoding(gd.MessageIndexes); err == nil && gd.Format == rules.FormatProtobuf {
		d.dec.WithIndexes(x)
	}
	t := c.Timeout
	if t == 0 {
		t = defaultRegistryTimeout
	}
	d.wait = min(d.wait, t)
	return d
}

// decode is the value tree of the produced value b (nil: a tombstone,
// which decodes to nil). retry: the registry did not answer in time.
func (d *guardDecoder) decode(b []byte) (v any, message string, ok, retry bool) {
	if d.err != "" {
		return nil, d.err, false, false
	}
	if b == nil {
		return nil, "", true, false
	}
	if _, ready := d.dec.Ready(b); !ready && time.Now().UnixNano() < d.downUntil.Load() {
		return nil, "the schema registry did not answer just before; its schema is not cached", false, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.wait)
	v, err := d.dec.Decode(ctx, b)
	cancel()
	switch {
	case err == nil:
		return v, "", true, false
	case serde.IsUnavailable(err):
		d.downUntil.Store(time.Now().Add(guardRegistryBackoff).UnixNano())
		return nil, fmt.Sprintf("%v (waited at most %s)", err, d.wait), false, true
	}
	return nil, err.Error(), false, false
}

// CheckRetriable checks one record of a guard (protocol.RetriableGuard):
// a registry format's value is decoded first.
func (o *guardOf) CheckRetriable(topic string, partition int32, rec *protocol.ProducedRecord) (string, string, bool, bool) {
	r := operators.Record{Topic: topic, Partition: partition, Offset: -1, Key: rec.Key, Raw: rec.Value, Timestamp: rec.Timestamp}
	if len(rec.Headers) > 0 {
		r.Headers = make([]operators.Header, len(rec.Headers))
		for i, h := range rec.Headers {
			r.Headers[i] = operators.Header{Key: h.Key, Value: h.Value}
		}
	}
	var check, msg string
	var ok bool
	if o.dec == nil || o.g.Closed != "" {
		check, msg, ok = o.g.Check(&r)
	} else {
		v, dmsg, dok, retry := o.dec.decode(rec.Value)
		if !dok {
			return o.name + "/" + rules.GuardDecode, dmsg, false, retry
		}
		check, msg, ok = o.g.CheckDecoded(&r, v)
	}
	if !ok {
		return o.name + "/" + check, msg, false, false
	}
	return "", "", true, false
}

// CheckRetriable: each record must pass every guard of the topic.
func (l guardList) CheckRetriable(topic string, partition int32, rec *protocol.ProducedRecord) (string, string, bool, bool) {
	for _, g := range l {
		if check, msg, ok, retry := g.CheckRetriable(topic, partition, rec); !ok {
			return check, msg, false, retry
		}
	}
	return "", "", true, false
}
