package pipeline

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/serde"
	"github.com/rtproxy/rtproxy/internal/testkit"
)

const avroOutSchema = `{"type":"record","name":"Out","namespace":"rtproxy.vf","fields":[
	{"name":"id","type":"string"},{"name":"amount","type":"double"}]}`

// TestJSONSourceToAvroSink: a route that reads JSON and writes Avro decodes
// its source as JSON. The source's format is chosen apart from the sink's:
// before, a registry sink sent JSON source records to the registry decoder,
// which the route did not have, and every record became a dead letter.
func TestJSONSourceToAvroSink(t *testing.T) {
	b := startBroker(t, map[string]int{"vf.in": 1})
	reg := testkit.StartRegistry(t, "")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "out.avsc"), []byte(avroOutSchema), 0o644); err != nil {
		t.Fatal(err)
	}
	def := writeRule(t, dir, "vf.yaml", `route: vf
source: { topic: vf.in }
sink: { topic: vf.out, format: avro, schema: out.avsc }
dead_letter: vf.dlq
steps:
  - filter: value.amount > 0
  - map: { id: value.id, amount: value.amount }
`)
	prodCl := b.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := prodCl.ProduceSync(ctx,
		&kgo.Record{Topic: "vf.in", Key: []byte("a"), Value: []byte(`{"id":"a","amount":2.5}`)},
		&kgo.Record{Topic: "vf.in", Key: []byte("z"), Value: []byte(`{"id":"z","amount":0}`)},
		&kgo.Record{Topic: "vf.in", Key: []byte("b"), Value: []byte(`{"id":"b","amount":4}`)},
	).FirstErr(); err != nil {
		t.Fatal(err)
	}
	runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), SchemaRegistry: serde.Config{URL: reg.URL, Timeout: 2 * time.Second}}, def)

	sch := avro.MustParse(avroOutSchema)
	out := b.consume(t, "vf.out", 2, 30*time.Second, 0)
	want := map[string]float64{"a": 2.5, "b": 4}
	for _, r := range out {
		if len(r.Value) < 5 || r.Value[0] != 0 || binary.BigEndian.Uint32(r.Value[1:5]) == 0 {
			t.Fatalf("output %s is not in the Confluent wire format: %q", r.Key, r.Value)
		}
		var v struct {
			ID     string  `avro:"id"`
			Amount float64 `avro:"amount"`
		}
		if err := avro.Unmarshal(sch, r.Value[5:], &v); err != nil {
			t.Fatalf("output %s: %v", r.Key, err)
		}
		if a, ok := want[v.ID]; !ok || a != v.Amount || string(r.Key) != v.ID {
			t.Errorf("output %s: %+v", r.Key, v)
		}
		delete(want, v.ID)
	}
	if len(want) > 0 {
		t.Errorf("missing outputs %v", want)
	}
	if dl := b.consume(t, "vf.dlq", 0, 0, 500*time.Millisecond); len(dl) > 0 {
		t.Errorf("dead letters: %s: %s", dl[0].Key, header(dl[0], HeaderError))
	}
}

// TestRawValuesPassAsBytes: under format raw a value no step replaced is
// written as the bytes it came as, at the sink and across a repartition
// (drop_duplicates), and a value a map built is JSON. (A tombstone reads as
// the empty string under format raw, as it always did.)
func TestRawValuesPassAsBytes(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		steps string
		want  []string // key=value of each sink output, "<nil>" a tombstone
	}{
		{"  - filter: value == nil || !(value startsWith \"skip\")\n  - drop_duplicates: { key: key }\n",
			[]string{`a=not "json" {`, "b="}},
		{"  - drop_duplicates: { key: key }\n  - map: { line: value }\n",
			[]string{`a={"line":"not \"json\" {"}`, `b={"line":""}`, `c={"line":"skip me"}`}},
	} {
		def := writeRule(t, dir, "raw.yaml", "route: raw\nsource: { topic: raw.in, format: raw }\nsink: { topic: raw.out }\nsteps:\n"+c.steps)
		d, err := NewDriver(def, DriverConfig{Partitions: 2})
		if err != nil {
			t.Fatal(err)
		}
		for i, in := range []DriverInput{
			{Key: []byte("a"), Value: []byte(`not "json" {`)},
			{Key: []byte("a"), Value: []byte(`not "json" {`)},
			{Key: []byte("b")},
			{Key: []byte("c"), Value: []byte("skip me")},
		} {
			in.Partition, in.Offset = int32(i%2), -1
			if err := d.Send(in); err != nil {
				t.Fatal(err)
			}
		}
		var got []string
		for _, o := range d.Outputs() {
			v := string(o.Value)
			if o.Value == nil {
				v = "<nil>"
			}
			if o.DeadLetter {
				t.Errorf("dead letter %s: %v", o.Key, o.Headers)
			}
			got = append(got, string(o.Key)+"="+v)
		}
		d.Close()
		slices.Sort(got)
		if !slices.Equal(got, c.want) {
			t.Errorf("steps\n%s: got %q, want %q", c.steps, got, c.want)
		}
	}
}
