package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/rtproxy/rtproxy/internal/serde"
	"github.com/rtproxy/rtproxy/internal/testkit"
	"github.com/rtproxy/rtproxy/rules"
)

const avroPaymentV1 = `{"type":"record","name":"Payment","namespace":"rtproxy.it","fields":[
	{"name":"id","type":"string"},
	{"name":"amount","type":"double"},
	{"name":"currency","type":{"type":"enum","name":"Currency","symbols":["EUR","USD"]}},
	{"name":"merchant","type":["null","string"],"default":null},
	{"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}}]}`

// v2 adds a field with a default (backward compatible): schema evolution
// mid-stream.
var avroPaymentV2 = strings.Replace(avroPaymentV1, `{"name":"ts"`, `{"name":"tier","type":"string","default":"std"},{"name":"ts"`, 1)

// v3 adds another; it is registered before the registry stops and first
// used while it is down, so no route has it cached.
var avroPaymentV3 = strings.Replace(avroPaymentV2, `{"name":"ts"`, `{"name":"channel","type":"string","default":"web"},{"name":"ts"`, 1)

type payV1 struct {
	ID       string    `avro:"id"`
	Amount   float64   `avro:"amount"`
	Currency string    `avro:"currency"`
	Merchant *string   `avro:"merchant"`
	TS       time.Time `avro:"ts"`
}

type payV2 struct {
	payV1
	Tier string `avro:"tier"`
}

type payV3 struct {
	payV2
	Channel string `avro:"channel"`
}

func strp(s string) *string { return &s }

// avroSerde is franz-go's sr.Serde set up for the three payment schemas,
// with hamba/avro as the encoding.
func avroSerde(t *testing.T, cl *sr.Client, subject string) (*sr.Serde, [3]int) {
	t.Helper()
	var s sr.Serde
	var ids [3]int
	for i, c := range []struct {
		text string
		v    any
	}{{avroPaymentV1, payV1{}}, {avroPaymentV2, payV2{}}, {avroPaymentV3, payV3{}}} {
		ss, err := cl.CreateSchema(context.Background(), subject, sr.Schema{Schema: c.text, Type: sr.TypeAvro})
		if err != nil {
			t.Fatalf("register v%d: %v", i+1, err)
		}
		ids[i] = ss.ID
		sch := avro.MustParse(c.text)
		s.Register(ss.ID, c.v, sr.EncodeFn(func(v any) ([]byte, error) { return avro.Marshal(sch, v) }))
	}
	return &s, ids
}

func writeRule(t *testing.T, dir, name, body string) *rules.Route {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := rules.LoadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestAvroRouteThroughTheRegistry: Avro records written with franz-go's
// sr.Serde flow through filter, drop_duplicates, join, map and a window
// like the same records in JSON; a schema evolved mid-stream is read with
// its own schema; bad bytes, an unknown id and a non-framed value are dead
// letters with reason decode and the schema id; with the registry stopped,
// records of a cached schema flow, a record of an uncached one waits (and
// /routes says so), and it goes through once the registry is back.
func TestAvroRouteThroughTheRegistry(t *testing.T) {
	b := startBroker(t, map[string]int{"pay.avro": 2})
	reg := testkit.StartRegistry(t, "")
	srcl, err := sr.NewClient(sr.URLs(reg.URL))
	if err != nil {
		t.Fatal(err)
	}
	ser, ids := avroSerde(t, srcl, "pay.avro-value")

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "merchants.jsonl"), []byte(`{"merchant_id":"m1","name":"Shop One"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	records := writeRule(t, dir, "records.yaml", `route: avro-records
source: { topic: pay.avro, format: avro, event_time: value.ts }
sink: { topic: pay.out }
dead_letter: pay.dlq
tables:
  merchants: { file: merchants.jsonl, key: merchant_id }
steps:
  - filter: value.amount > 0
  - drop_duplicates: { key: value.id, ttl: 1h }
  - join: { table: merchants, on: value.merchant, as: m }
  - map:
      id: value.id
      amount: value.amount
      currency: value.currency
      merchant: m?.name
      tier: value.tier ?? "none"
      channel: value.channel ?? "none"
`)
	windows := writeRule(t, dir, "windows.yaml", `route: avro-windows
source: { topic: pay.avro, format: avro, event_time: value.ts }
sink: { topic: pay.windows }
dead_letter: pay.windows.dlq
steps:
  - filter: value.amount > 0
  - window: { kind: tumbling, size: 1h, key: value.currency, aggregate: { n: count(), total: sum(value.amount) }, emit: on_update }
`)

	ts := time.UnixMilli(1_700_000_000_000).UTC()
	enc := func(v any) []byte {
		t.Helper()
		bs, err := ser.Encode(v)
		if err != nil {
			t.Fatal(err)
		}
		return bs
	}
	rec := func(p int32, key string, v []byte) *kgo.Record {
		return &kgo.Record{Topic: "pay.avro", Partition: p, Key: []byte(key), Value: v}
	}
	p1 := payV1{ID: "p1", Amount: 10, Currency: "EUR", Merchant: strp("m1"), TS: ts}
	p2 := payV1{ID: "p2", Amount: 5.5, Currency: "USD", TS: ts}
	zero := payV1{ID: "p0", Amount: 0, Currency: "EUR", TS: ts}
	p3 := payV2{payV1{ID: "p3", Amount: 7, Currency: "EUR", Merchant: strp("m9"), TS: ts}, "gold"}
	good1 := enc(p1)
	corrupt := append(append([]byte{}, good1[:5]...), 0x02, 0xff, 0xff)
	unknown := append([]byte{0, 0, 0, 0x03, 0xe7}, good1[5:]...) // schema id 999

	prodCl := b.client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	produce := func(rs ...*kgo.Record) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := prodCl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produce(
		rec(0, "p1", good1), rec(1, "p2", enc(p2)), rec(0, "p0", enc(zero)),
		rec(1, "p1", good1), // a duplicate
		rec(0, "p3", enc(p3)),
		rec(1, "bad-bytes", corrupt), rec(0, "bad-id", unknown), rec(1, "bad-header", []byte(`{"id":"json"}`)),
	)

	m, _ := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), SchemaRegistry: serde.Config{URL: reg.URL, Timeout: 2 * time.Second}}, records, windows)

	want := map[string]string{
		"p1": `{"amount":10,"channel":"none","currency":"EUR","id":"p1","merchant":"Shop One","tier":"none"}`,
		"p2": `{"amount":5.5,"channel":"none","currency":"USD","id":"p2","merchant":null,"tier":"none"}`,
		"p3": `{"amount":7,"channel":"none","currency":"EUR","id":"p3","merchant":null,"tier":"gold"}`,
	}
	out := b.consume(t, "pay.out", 3, 30*time.Second, 0)
	checkOutputs(t, out, want)

	dlq := b.consume(t, "pay.dlq", 3, 30*time.Second, 0)
	wantDLQ := map[string]string{"bad-bytes": fmt.Sprint(ids[0]), "bad-id": "999", "bad-header": ""}
	for _, r := range dlq {
		k := string(r.Key)
		id, ok := wantDLQ[k]
		if !ok {
			t.Fatalf("unexpected dead letter %s: %s", k, header(r, HeaderError))
		}
		if header(r, HeaderReason) != "decode" || header(r, HeaderSchemaID) != id || header(r, HeaderStep) != "source" {
			t.Errorf("dead letter %s: reason %q schema id %q (want %q) step %q error %q", k,
				header(r, HeaderReason), header(r, HeaderSchemaID), id, header(r, HeaderStep), header(r, HeaderError))
		}
		delete(wantDLQ, k)
	}
	if len(wantDLQ) != 0 {
		t.Fatalf("dead letters missing: %v", wantDLQ)
	}

	// The registry stops. Partition 0 gets a record of the uncached v3
	// and a cached one behind it; partition 1 cached ones only.
	reg.Stop()
	p4 := payV3{payV2{payV1{ID: "p4", Amount: 1, Currency: "USD", TS: ts}, "std"}, "app"}
	p5 := payV1{ID: "p5", Amount: 2, Currency: "USD", TS: ts}
	p6 := payV1{ID: "p6", Amount: 3, Currency: "EUR", Merchant: strp("m1"), TS: ts}
	produce(rec(0, "p4", enc(p4)), rec(0, "p5", enc(p5)), rec(1, "p6", enc(p6)))
	want["p6"] = `{"amount":3,"channel":"none","currency":"EUR","id":"p6","merchant":"Shop One","tier":"none"}`
	out = b.consume(t, "pay.out", 4, 30*time.Second, 0)
	for _, r := range out {
		if k := string(r.Key); k == "p4" || k == "p5" {
			t.Fatalf("%s went through while its schema (or the one before it) could not be fetched", k)
		}
	}
	waitFor(t, 30*time.Second, "/routes to show the wait", func() bool {
		for _, s := range m.Routes() {
			if s.Name == "avro-records" && strings.Contains(s.LastError, "pay.avro[0] waits at offset") &&
				strings.Contains(s.LastError, fmt.Sprintf("schema id %d", ids[2])) {
				return true
			}
		}
		return false
	})

	reg.Restart()
	want["p4"] = `{"amount":1,"channel":"app","currency":"USD","id":"p4","merchant":null,"tier":"std"}`
	want["p5"] = `{"amount":2,"channel":"none","currency":"USD","id":"p5","merchant":null,"tier":"none"}`
	out = b.consume(t, "pay.out", 6, 30*time.Second, 300*time.Millisecond)
	checkOutputs(t, out, want)
	waitFor(t, 10*time.Second, "/routes to clear the wait", func() bool {
		for _, s := range m.Routes() {
			if s.Name == "avro-records" {
				return s.LastError == ""
			}
		}
		return false
	})

	// The window saw every valid record once per source record (no
	// dedup there): EUR p1, p1, p3, p6; USD p2, p4, p5.
	rows := b.consume(t, "pay.windows", 7, 30*time.Second, 300*time.Millisecond)
	last := map[string]map[string]any{}
	for _, r := range rows {
		var v map[string]any
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatal(err)
		}
		k := v["key"].(string)
		if prev := last[k]; prev == nil || v["n"].(float64) > prev["n"].(float64) {
			last[k] = v
		}
	}
	if e := last["EUR"]; e == nil || e["n"] != 4.0 || e["total"] != 30.0 {
		t.Errorf("EUR window %v, want n 4 total 30", e)
	}
	if u := last["USD"]; u == nil || u["n"] != 3.0 || u["total"] != 8.5 {
		t.Errorf("USD window %v, want n 3 total 8.5", u)
	}
}

// checkOutputs: out holds exactly one record per key of want, with that
// value.
func checkOutputs(t *testing.T, out []*kgo.Record, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for _, r := range out {
		k := string(r.Key)
		if _, dup := got[k]; dup {
			t.Errorf("output %s twice", k)
		}
		got[k] = string(r.Value)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("output %s = %s, want %s", k, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d outputs, want %d: %v", len(got), len(want), got)
	}
}

const pbOrder = `syntax = "proto3";
package rtproxy.pt;

import "google/protobuf/timestamp.proto";

message Order {
  string id = 1;
  double amount = 2;
  string customer = 3;
  google.protobuf.Timestamp ts = 4;
  oneof pay {
    string card = 5;
    string iban = 6;
  }
}
`

// TestProtobufRouteWithSrSerde: Protobuf records written with franz-go's
// sr.Serde (the runtime's own encoding of a dynamicpb message) go through
// filter, drop_duplicates, map and a window, and corrupt bytes are a
// decode dead letter naming the schema id.
func TestProtobufRouteWithSrSerde(t *testing.T) {
	b := startBroker(t, map[string]int{"orders.pb": 2})
	reg := testkit.StartRegistry(t, "")
	srcl, err := sr.NewClient(sr.URLs(reg.URL))
	if err != nil {
		t.Fatal(err)
	}
	ss, err := srcl.CreateSchema(context.Background(), "orders.pb-value", sr.Schema{Schema: pbOrder, Type: sr.TypeProtobuf})
	if err != nil {
		t.Fatal(err)
	}
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{"order.proto": pbOrder})})}
	files, err := c.Compile(context.Background(), "order.proto")
	if err != nil {
		t.Fatal(err)
	}
	md := files[0].Messages().ByName("Order")
	var ser sr.Serde
	ser.Register(ss.ID, &dynamicpb.Message{}, sr.Index(0), sr.EncodeFn(func(v any) ([]byte, error) { return proto.Marshal(v.(*dynamicpb.Message)) }))
	order := func(js string) []byte {
		t.Helper()
		m := dynamicpb.NewMessage(md)
		if err := protojson.Unmarshal([]byte(js), m); err != nil {
			t.Fatal(err)
		}
		out, err := ser.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	dir := t.TempDir()
	def := writeRule(t, dir, "orders.yaml", `route: pb-orders
source: { topic: orders.pb, format: protobuf, event_time: value.ts }
sink: { topic: orders.out }
steps:
  - filter: value.amount > 0
  - drop_duplicates: { key: value.id, ttl: 1h }
  - map:
      id: value.id
      amount: value.amount
      pay: value.card ?? value.iban
      ts: value.ts
`)
	win := writeRule(t, dir, "totals.yaml", `route: pb-totals
source: { topic: orders.pb, format: protobuf, event_time: value.ts }
sink: { topic: orders.totals }
dead_letter: orders.totals.dlq
steps:
  - window: { kind: tumbling, size: 1h, key: value.customer, aggregate: { n: count(), total: sum(value.amount) }, emit: on_update }
`)
	o1 := order(`{"id":"o1","amount":3.5,"customer":"c1","ts":"2023-11-14T22:13:20Z","card":"4111"}`)
	b.produce(t,
		&kgo.Record{Topic: "orders.pb", Key: []byte("o1"), Value: o1},
		&kgo.Record{Topic: "orders.pb", Key: []byte("o1"), Value: o1},
		&kgo.Record{Topic: "orders.pb", Key: []byte("o2"), Value: order(`{"id":"o2","amount":1,"customer":"c1","ts":"2023-11-14T22:13:21.250Z","iban":"DE00"}`)},
		&kgo.Record{Topic: "orders.pb", Key: []byte("o0"), Value: order(`{"id":"o0","customer":"c2","ts":"2023-11-14T22:13:22Z"}`)},
		&kgo.Record{Topic: "orders.pb", Key: []byte("bad"), Value: append(append([]byte{}, o1[:6]...), 0x0a, 0x7f)},
	)
	runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), SchemaRegistry: serde.Config{URL: reg.URL}}, def, win)

	checkOutputs(t, b.consume(t, "orders.out", 2, 30*time.Second, 300*time.Millisecond), map[string]string{
		"o1": `{"amount":3.5,"id":"o1","pay":"4111","ts":1700000000000}`,
		"o2": `{"amount":1,"id":"o2","pay":"DE00","ts":1700000001250}`,
	})
	dlq := b.consume(t, "orders.pb.dlq", 1, 30*time.Second, 300*time.Millisecond)
	if len(dlq) != 1 || header(dlq[0], HeaderReason) != "decode" || header(dlq[0], HeaderSchemaID) != fmt.Sprint(ss.ID) {
		t.Fatalf("dead letters %d, first %v", len(dlq), dlq[0].Headers)
	}
	last := map[string]map[string]any{}
	for _, r := range b.consume(t, "orders.totals", 4, 30*time.Second, 300*time.Millisecond) {
		var v map[string]any
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatal(err)
		}
		k := v["key"].(string)
		if p := last[k]; p == nil || v["n"].(float64) > p["n"].(float64) {
			last[k] = v
		}
	}
	if c1, c2 := last["c1"], last["c2"]; c1["n"] != 3.0 || c1["total"] != 8.0 || c2["n"] != 1.0 || c2["total"] != 0.0 {
		t.Fatalf("windows c1 %v c2 %v", c1, c2)
	}
}

// TestAvroRouteWithoutRegistryWaits: a route reading Avro with no registry
// configured drops nothing: its records wait and /routes says why.
func TestAvroRouteWithoutRegistryWaits(t *testing.T) {
	b := startBroker(t, map[string]int{"nr.avro": 1})
	b.produce(t, &kgo.Record{Topic: "nr.avro", Key: []byte("k"), Value: []byte{0, 0, 0, 0, 1, 2}})
	def := writeRule(t, t.TempDir(), "nr.yaml", "route: nr\nsource: { topic: nr.avro, format: avro }\nsink: { topic: nr.out }\n")
	m, _ := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir()}, def)
	waitFor(t, 30*time.Second, "/routes to say the route needs a registry", func() bool {
		for _, s := range m.Routes() {
			if s.Name == "nr" && strings.Contains(s.LastError, "nr.avro[0] waits at offset 0") && strings.Contains(s.LastError, "need a schema registry") {
				return true
			}
		}
		return false
	})
	if got := b.consume(t, "nr.avro.dlq", 0, time.Second, 500*time.Millisecond); len(got) != 0 {
		t.Fatalf("%d dead letters while the route has no registry", len(got))
	}
}
