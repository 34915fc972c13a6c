package integration

// Avro and Protobuf routes through a schema registry (test/srfakebroker, a
// separate process), fed by real serializers: kafkajs with
// @kafkajs/confluent-schema-registry (avsc) and franz-go's sr.Serde
// (hamba/avro) for Avro, confluent-kafka-python's ProtobufSerializer for
// Protobuf. Every record goes through the rtproxy binary; the outputs are
// read back by franz-go.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

// requirePython skips (fails under CI=true) when a Python module the
// registry serializers need is missing.
func requirePython(t *testing.T, modules ...string) {
	t.Helper()
	for _, m := range modules {
		if err := exec.Command(DebianPython, "-c", "import "+m).Run(); err != nil {
			msg := fmt.Sprintf("python module %s is missing (%v); install the Debian packages with `make deps`", m, err)
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
}

func requireNodeModule(t *testing.T, name string) {
	t.Helper()
	RequireTool(t, "kafkajs")
	if _, err := os.Stat(filepath.Join(ModuleRoot(t), "test", "integration", "node_modules", name, "package.json")); err != nil {
		msg := fmt.Sprintf("node module %s is missing (%v); run `make deps`", name, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

const itPaymentAvsc = `{"type":"record","name":"Payment","namespace":"rtproxy.it","fields":[
	{"name":"id","type":"string"},
	{"name":"amount","type":"double"},
	{"name":"currency","type":{"type":"enum","name":"Currency","symbols":["EUR","USD"]}},
	{"name":"merchant","type":["null","string"],"default":null},
	{"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}}]}`

type itPayment struct {
	ID       string    `avro:"id"`
	Amount   float64   `avro:"amount"`
	Currency string    `avro:"currency"`
	Merchant *string   `avro:"merchant"`
	TS       time.Time `avro:"ts"`
}

const itOrderProto = `syntax = "proto3";
package rtproxy.it;

import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";

message Order {
  enum Currency {
    EUR = 0;
    USD = 1;
  }
  message Line {
    string sku = 1;
    int32 qty = 2;
  }
  string id = 1;
  double amount = 2;
  Currency currency = 3;
  string customer = 4;
  google.protobuf.Timestamp ts = 5;
  google.protobuf.StringValue note = 6;
  oneof pay {
    string card = 7;
    string iban = 8;
  }
  repeated Line lines = 9;
}
`

// protoDescriptor is the base64 FileDescriptorProto of the .proto source
// src, for a Python script to build its message class from.
func protoDescriptor(t *testing.T, name, src string) string {
	t.Helper()
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{name: src})})}
	files, err := c.Compile(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(protodesc.ToFileDescriptorProto(files[0]))
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}

// sinkValues reads topic until it holds want distinct keys, and returns
// the last value per key.
func sinkValues(t *testing.T, seeds []string, topic string, want int) map[string]string {
	t.Helper()
	got := map[string]string{}
	for _, r := range ConsumeQuiet(t, seeds, topic, want, 500*time.Millisecond, 60*time.Second) {
		got[string(r.Key)] = string(r.Value)
	}
	return got
}

func assertValues(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s %s = %s, want %s", what, k, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%s: %d keys, want %d: %v", what, len(got), len(want), got)
	}
}

func TestSchemaRegistryRoutesWithRealSerializers(t *testing.T) {
	requireNodeModule(t, "@kafkajs/confluent-schema-registry")
	requirePython(t, "confluent_kafka.schema_registry.protobuf")
	reg := testkit.StartRegistry(t, "")
	rulesDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(rulesDir, "merchants.jsonl"), []byte(`{"merchant_id":"m1","name":"Shop One"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	WriteRuleFile(t, rulesDir, "avro.yaml", `route: it-avro
source: { topic: pay.avro, format: avro, event_time: value.ts }
sink: { topic: pay.avro.out }
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
      ts: value.ts
`)
	WriteRuleFile(t, rulesDir, "avro-windows.yaml", `route: it-avro-windows
source: { topic: pay.avro, format: avro, event_time: value.ts }
sink: { topic: pay.avro.windows }
dead_letter: pay.avro.windows.dlq
steps:
  - window: { kind: tumbling, size: 1h, key: value.currency, aggregate: { n: count(), total: sum(value.amount) }, emit: on_update }
`)
	WriteRuleFile(t, rulesDir, "proto.yaml", `route: it-proto
source: { topic: orders.pb, format: protobuf, event_time: value.ts }
sink: { topic: orders.out }
steps:
  - filter: value.amount > 0
  - drop_duplicates: { key: value.id, ttl: 1h }
  - map:
      id: value.id
      amount: value.amount
      currency: value.currency
      note: value.note ?? "none"
      pay: value.card ?? value.iban
      lines: len(value.lines)
      ts: value.ts
`)
	WriteRuleFile(t, rulesDir, "proto-windows.yaml", `route: it-proto-windows
source: { topic: orders.pb, format: protobuf, event_time: value.ts }
sink: { topic: orders.windows }
steps:
  - window: { kind: tumbling, size: 1h, key: value.customer, aggregate: { n: count(), total: sum(value.amount) }, emit: on_update }
`)
	// Outputs in Avro and Protobuf, with their schemas registered by the
	// routes (sink.schema).
	for name, body := range map[string]string{"out.avsc": itOutAvsc, "row.proto": itRowProto} {
		if err := os.WriteFile(filepath.Join(rulesDir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	WriteRuleFile(t, rulesDir, "avro-sink.yaml", `route: it-avro-sink
source: { topic: pay.avro, format: avro }
sink: { topic: pay.avro.enc, format: avro, schema: out.avsc }
dead_letter: pay.avro.enc.dlq
steps:
  - filter: value.amount > 0
  - drop_duplicates: { key: value.id, ttl: 1h }
  - map:
      id: value.id
      amount: 'value.amount >= 4 ? value.amount : "tiny"'
      currency: value.currency
      merchant: value.merchant
`)
	WriteRuleFile(t, rulesDir, "proto-sink.yaml", `route: it-proto-sink
source: { topic: orders.pb, format: protobuf, event_time: value.ts }
sink: { topic: orders.enc, format: protobuf, schema: row.proto }
dead_letter: orders.enc.dlq
steps:
  - window: { kind: tumbling, size: 1h, key: value.customer, aggregate: { n: count(), total: sum(value.amount) }, emit: on_update }
`)
	s := StartStack(t, KfakeOpts{Topics: map[string]int{"pay.avro": 2, "orders.pb": 2}},
		ProxyOpts{RulesDir: rulesDir, Env: []string{"RTPROXY_SCHEMA_REGISTRY_URL=" + reg.URL}})
	boot := s.Bootstrap[0]
	const ts = 1_700_000_000_000

	// Avro: kafkajs with avsc registers the schema and writes p1..p3 (p3
	// twice, amount 0 once); franz-go's sr.Serde writes p4 with the id the
	// registry gave kafkajs.
	avroRecs := []map[string]any{
		{"key": "p1", "value": map[string]any{"id": "p1", "amount": 10.5, "currency": "EUR", "merchant": "m1", "ts": ts}},
		{"key": "p2", "value": map[string]any{"id": "p2", "amount": 4, "currency": "USD", "merchant": nil, "ts": ts + 1}},
		{"key": "p3", "value": map[string]any{"id": "p3", "amount": 1.25, "currency": "EUR", "merchant": "m9", "ts": ts + 2}},
		{"key": "p3", "value": map[string]any{"id": "p3", "amount": 1.25, "currency": "EUR", "merchant": "m9", "ts": ts + 2}},
		{"key": "p0", "value": map[string]any{"id": "p0", "amount": 0, "currency": "EUR", "merchant": nil, "ts": ts}},
	}
	var node struct {
		ID       int      `json:"id"`
		Produced []string `json:"produced"`
	}
	runJSONClient(t, &node, 90*time.Second, "node", "clients/kafkajs_avro_produce.js", mustJSON(map[string]any{
		"bootstrap": boot, "registry": reg.URL, "topic": "pay.avro", "subject": "pay.avro-value", "schema": itPaymentAvsc, "records": avroRecs}))
	if len(node.Produced) != len(avroRecs) || node.ID == 0 {
		t.Fatalf("kafkajs produced %v with schema id %d", node.Produced, node.ID)
	}
	var serde sr.Serde
	sch := avro.MustParse(itPaymentAvsc)
	serde.Register(node.ID, itPayment{}, sr.EncodeFn(func(v any) ([]byte, error) { return avro.Marshal(sch, v) }))
	m1 := "m1"
	p4, err := serde.Encode(itPayment{ID: "p4", Amount: 2, Currency: "USD", Merchant: &m1, TS: time.UnixMilli(ts + 3).UTC()})
	if err != nil {
		t.Fatal(err)
	}
	cl := NewClient(t, s.Bootstrap)
	bad := []*kgo.Record{
		{Topic: "pay.avro", Key: []byte("p4"), Value: p4},
		{Topic: "pay.avro", Key: []byte("bad-bytes"), Value: append(append([]byte{}, p4[:5]...), 0x01)},
		{Topic: "pay.avro", Key: []byte("bad-id"), Value: append([]byte{0, 0, 0, 0x30, 0x39}, p4[5:]...)}, // id 12345
	}
	if err := cl.ProduceSync(context.Background(), bad...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	// Protobuf: confluent-kafka's ProtobufSerializer registers orders.proto
	// and its well-known imports as references.
	protoRecs := []map[string]any{
		{"key": "o1", "value": map[string]any{"id": "o1", "amount": 20, "currency": "USD", "customer": "c1", "ts": "2023-11-14T22:13:20Z", "note": "gift", "card": "4111", "lines": []any{map[string]any{"sku": "a", "qty": 2}, map[string]any{"sku": "b", "qty": 1}}}},
		{"key": "o2", "value": map[string]any{"id": "o2", "amount": 5, "customer": "c1", "ts": "2023-11-14T22:13:21Z", "iban": "DE00"}},
		{"key": "o2", "value": map[string]any{"id": "o2", "amount": 5, "customer": "c1", "ts": "2023-11-14T22:13:21Z", "iban": "DE00"}},
		{"key": "o3", "value": map[string]any{"id": "o3", "amount": 7.5, "currency": "EUR", "customer": "c2", "ts": "2023-11-14T22:13:22.5Z"}},
	}
	var py struct {
		Produced []string `json:"produced"`
		Errors   []string `json:"errors"`
	}
	runJSONClient(t, &py, 90*time.Second, DebianPython, "clients/confluent_protobuf_produce.py", mustJSON(map[string]any{
		"bootstrap": boot, "registry": reg.URL, "topic": "orders.pb", "descriptor": protoDescriptor(t, "orders.proto", itOrderProto), "message": "rtproxy.it.Order", "records": protoRecs}))
	if len(py.Errors) > 0 || len(py.Produced) != len(protoRecs) {
		t.Fatalf("confluent-kafka produced %v, errors %v", py.Produced, py.Errors)
	}

	assertValues(t, "avro route output", sinkValues(t, s.Bootstrap, "pay.avro.out", 4), map[string]string{
		"p1": fmt.Sprintf(`{"amount":10.5,"currency":"EUR","id":"p1","merchant":"Shop One","ts":%d}`, ts),
		"p2": fmt.Sprintf(`{"amount":4,"currency":"USD","id":"p2","merchant":null,"ts":%d}`, ts+1),
		"p3": fmt.Sprintf(`{"amount":1.25,"currency":"EUR","id":"p3","merchant":null,"ts":%d}`, ts+2),
		"p4": fmt.Sprintf(`{"amount":2,"currency":"USD","id":"p4","merchant":"Shop One","ts":%d}`, ts+3),
	})
	assertValues(t, "protobuf route output", sinkValues(t, s.Bootstrap, "orders.out", 3), map[string]string{
		"o1": `{"amount":20,"currency":"USD","id":"o1","lines":2,"note":"gift","pay":"4111","ts":1700000000000}`,
		"o2": `{"amount":5,"currency":"EUR","id":"o2","lines":0,"note":"none","pay":"DE00","ts":1700000001000}`,
		"o3": `{"amount":7.5,"currency":"EUR","id":"o3","lines":0,"note":"none","pay":null,"ts":1700000002500}`,
	})

	// Windows (no filter, no dedup): the last row per key counts every
	// decoded record.
	lastRows := func(topic string, n int) map[string]map[string]any {
		last := map[string]map[string]any{}
		for _, r := range ConsumeQuiet(t, s.Bootstrap, topic, n, 500*time.Millisecond, 60*time.Second) {
			var v map[string]any
			if err := json.Unmarshal(r.Value, &v); err != nil {
				t.Fatal(err)
			}
			k := fmt.Sprint(v["key"])
			if p := last[k]; p == nil || v["n"].(float64) > p["n"].(float64) {
				last[k] = v
			}
		}
		return last
	}
	aw := lastRows("pay.avro.windows", 6)
	if e, u := aw["EUR"], aw["USD"]; e["n"] != 4.0 || e["total"] != 13.0 || u["n"] != 2.0 || u["total"] != 6.0 {
		t.Errorf("avro windows: EUR %v USD %v; want n 4 total 13, n 2 total 6", e, u)
	}
	pw := lastRows("orders.windows", 4)
	if c1, c2 := pw["c1"], pw["c2"]; c1["n"] != 3.0 || c1["total"] != 30.0 || c2["n"] != 1.0 || c2["total"] != 7.5 {
		t.Errorf("protobuf windows: c1 %v c2 %v; want n 3 total 30, n 1 total 7.5", c1, c2)
	}

	checkEncodedOutputs(t, s, reg)

	// The bad records are dead letters with reason decode and their id.
	dlq := ConsumeQuiet(t, s.Bootstrap, "pay.avro.dlq", 2, 500*time.Millisecond, 30*time.Second)
	want := map[string]string{"bad-bytes": fmt.Sprint(node.ID), "bad-id": "12345"}
	for _, r := range dlq {
		h := map[string]string{}
		for _, x := range r.Headers {
			h[x.Key] = string(x.Value)
		}
		k := string(r.Key)
		if id, ok := want[k]; !ok || h["rtproxy-reason"] != "decode" || h["rtproxy-schema-id"] != id {
			t.Errorf("dead letter %s: headers %v, want reason decode and schema id %q", k, h, id)
		}
		if !strings.Contains(h["rtproxy-error"], "schema id") {
			t.Errorf("dead letter %s: error %q does not name the schema id", k, h["rtproxy-error"])
		}
		delete(want, k)
	}
	if len(want) > 0 {
		t.Errorf("dead letters missing: %v", want)
	}
}

const itOutAvsc = `{"type":"record","name":"Out","namespace":"rtproxy.it.out","fields":[
	{"name":"id","type":"string"},
	{"name":"amount","type":"double"},
	{"name":"currency","type":{"type":"enum","name":"Currency","symbols":["EUR","USD"]}},
	{"name":"merchant","type":["null","string"],"default":null}]}`

type itOut struct {
	ID       string  `avro:"id"`
	Amount   float64 `avro:"amount"`
	Currency string  `avro:"currency"`
	Merchant *string `avro:"merchant"`
}

const itRowProto = `syntax = "proto3";
package rtproxy.out;

import "google/protobuf/timestamp.proto";

message CustomerTotals {
  string key = 1;
  google.protobuf.Timestamp window_start = 2;
  google.protobuf.Timestamp window_end = 3;
  int64 n = 4;
  double total = 5;
}
`

// checkEncodedOutputs reads the Avro and Protobuf sinks with real
// deserializers: kafkajs's @kafkajs/confluent-schema-registry and franz-go's
// sr.Serde (hamba/avro) for Avro, confluent-kafka's ProtobufDeserializer for
// Protobuf. An output that does not fit its schema is a dead letter with
// reason encode and the output schema's id.
func checkEncodedOutputs(t *testing.T, s *Stack, reg *testkit.Registry) {
	t.Helper()
	var node struct {
		Records []struct {
			Key   string         `json:"key"`
			Value map[string]any `json:"value"`
		} `json:"records"`
		Errors []string `json:"errors"`
	}
	outs := ConsumeQuiet(t, s.Bootstrap, "pay.avro.enc", 2, 300*time.Millisecond, 30*time.Second)
	var recs []map[string]string
	for _, r := range outs {
		recs = append(recs, map[string]string{"key": string(r.Key), "value": base64.StdEncoding.EncodeToString(r.Value)})
	}
	runJSONClient(t, &node, 60*time.Second, "node", "clients/schema_registry_avro_decode.js", mustJSON(map[string]any{
		"registry": reg.URL, "records": recs}))
	if len(node.Errors) > 0 {
		t.Fatalf("avsc could not decode the Avro outputs: %v", node.Errors)
	}
	got := map[string]string{}
	for _, r := range node.Records {
		got[r.Key] = mustJSON(r.Value)
	}
	assertValues(t, "Avro outputs read by avsc", got, map[string]string{
		"p1": `{"amount":10.5,"currency":"EUR","id":"p1","merchant":"m1"}`,
		"p2": `{"amount":4,"currency":"USD","id":"p2","merchant":null}`,
	})

	srcl, err := sr.NewClient(sr.URLs(reg.URL))
	if err != nil {
		t.Fatal(err)
	}
	ss, err := srcl.SchemaByVersion(context.Background(), "pay.avro.enc-value", -1)
	if err != nil {
		t.Fatal(err)
	}
	var serde sr.Serde
	sch := avro.MustParse(itOutAvsc)
	serde.Register(ss.ID, itOut{}, sr.DecodeFn(func(b []byte, v any) error { return avro.Unmarshal(sch, b, v) }))
	for _, r := range outs {
		var o itOut
		if err := serde.Decode(r.Value, &o); err != nil {
			t.Fatalf("sr.Serde cannot decode output %s: %v", r.Key, err)
		}
		if o.ID != string(r.Key) || (o.ID == "p1" && (o.Merchant == nil || *o.Merchant != "m1" || o.Amount != 10.5)) || (o.ID == "p2" && (o.Merchant != nil || o.Currency != "USD")) {
			t.Errorf("sr.Serde read %s as %+v", r.Key, o)
		}
	}
	// p3 and p4 map their amount to "tiny": not a double.
	enc := map[string]bool{"p3": true, "p4": true}
	for _, r := range ConsumeQuiet(t, s.Bootstrap, "pay.avro.enc.dlq", 4, 500*time.Millisecond, 30*time.Second) {
		h := map[string]string{}
		for _, x := range r.Headers {
			h[x.Key] = string(x.Value)
		}
		k := string(r.Key)
		switch {
		case enc[k]:
			if h["rtproxy-reason"] != "encode" || h["rtproxy-schema-id"] != fmt.Sprint(ss.ID) || h["rtproxy-step"] != "sink" || !strings.Contains(h["rtproxy-error"], "value.amount: want a number") {
				t.Errorf("encode dead letter %s: %v", k, h)
			}
			delete(enc, k)
		case k == "bad-bytes" || k == "bad-id":
			if h["rtproxy-reason"] != "decode" {
				t.Errorf("dead letter %s: %v", k, h)
			}
		default:
			t.Errorf("unexpected dead letter %s: %v", k, h)
		}
	}
	if len(enc) > 0 {
		t.Errorf("encode dead letters missing: %v", enc)
	}

	var py struct {
		Records []struct {
			Key   string         `json:"key"`
			Value map[string]any `json:"value"`
		} `json:"records"`
		Errors []string `json:"errors"`
	}
	runJSONClient(t, &py, 90*time.Second, DebianPython, "clients/confluent_protobuf_consume.py", mustJSON(map[string]any{
		"bootstrap": s.Bootstrap[0], "topic": "orders.enc", "group": "it-pb-reader", "descriptor": protoDescriptor(t, "row.proto", itRowProto),
		"message": "rtproxy.out.CustomerTotals", "n": 4, "timeout": 45}))
	if len(py.Errors) > 0 || len(py.Records) != 4 {
		t.Fatalf("ProtobufDeserializer read %d rows, errors %v", len(py.Records), py.Errors)
	}
	last := map[string]map[string]any{}
	for _, r := range py.Records {
		k := fmt.Sprint(r.Value["key"])
		if p := last[k]; p == nil || fmt.Sprint(r.Value["n"]) > fmt.Sprint(p["n"]) {
			last[k] = r.Value
		}
	}
	want := map[string]string{
		"c1": `{"key":"c1","n":"3","total":30,"window_end":"2023-11-14T23:00:00Z","window_start":"2023-11-14T22:00:00Z"}`,
		"c2": `{"key":"c2","n":"1","total":7.5,"window_end":"2023-11-14T23:00:00Z","window_start":"2023-11-14T22:00:00Z"}`,
	}
	for k, w := range want {
		if g := mustJSON(last[k]); g != w {
			t.Errorf("Protobuf row %s read by ProtobufDeserializer: %s, want %s", k, g, w)
		}
	}
}
