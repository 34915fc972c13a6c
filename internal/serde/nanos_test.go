package serde

import (
	"testing"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
)

// TestAvroTimestampNanos: timestamp-nanos and local-timestamp-nanos (Avro
// 1.12; hamba/avro keeps them as a plain long with the logicalType
// property) read as epoch milliseconds with the nanoseconds as the
// fraction, and write back.
func TestAvroTimestampNanos(t *testing.T) {
	const schema = `{"type":"record","name":"E","fields":[
		{"name":"ts","type":{"type":"long","logicalType":"timestamp-nanos"}},
		{"name":"local","type":{"type":"long","logicalType":"local-timestamp-nanos"}},
		{"name":"n","type":"long"}]}`
	s := fuzzSchema(t, sr.TypeAvro, schema)
	type rec struct {
		TS    int64 `avro:"ts"`
		Local int64 `avro:"local"`
		N     int64 `avro:"n"`
	}
	const ns = 1_700_000_000_123_456_789
	body, err := avro.Marshal(avro.MustParse(schema), rec{TS: ns, Local: -1_500_000, N: ns})
	if err != nil {
		t.Fatal(err)
	}
	v, err := (&Decoder{format: Avro}).decode(s, body)
	if err != nil {
		t.Fatal(err)
	}
	m := v.(map[string]any)
	if want := 1700000000123.0 + 0.456789; m["ts"] != want {
		t.Errorf("ts = %v, want %v (epoch ms)", m["ts"], want)
	}
	if m["local"] != -1.5 {
		t.Errorf("local = %v, want -1.5", m["local"])
	}
	if m["n"] != float64(ns) {
		t.Errorf("a plain long = %v", m["n"])
	}
	// Written back: whole milliseconds and microseconds exactly; a
	// fraction finer than float64 holds at this magnitude (~0.25µs) to
	// the nearest it can.
	e := &Encoder{format: Avro, s: s}
	for ms, want := range map[float64]int64{1700000000123: 1_700_000_000_123_000_000, 1700000000123.5: 1_700_000_000_123_500_000, -1.5: -1_500_000, 0.000001: 1} {
		out, err := e.Encode(map[string]any{"ts": ms, "local": 0.0, "n": 1.0})
		if err != nil {
			t.Fatal(err)
		}
		var r rec
		if err := avro.Unmarshal(avro.MustParse(schema), out[5:], &r); err != nil {
			t.Fatal(err)
		}
		if r.TS != want {
			t.Errorf("%v ms written as %d ns, want %d", ms, r.TS, want)
		}
	}
	out, err := e.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	var r rec
	if err := avro.Unmarshal(avro.MustParse(schema), out[5:], &r); err != nil {
		t.Fatal(err)
	}
	if d := r.TS - ns; d < -256 || d > 256 {
		t.Errorf("round trip of %d ns gave %d", int64(ns), r.TS)
	}
	if _, err := e.Encode(map[string]any{"ts": 1e300, "local": 0.0, "n": 1.0}); err == nil {
		t.Error("1e300 ms encoded as nanoseconds")
	}
}
