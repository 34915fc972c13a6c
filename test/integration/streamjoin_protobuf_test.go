package integration

// A stream join whose authorizations are Protobuf, written by
// confluent-kafka-python's ProtobufSerializer (which registers the schema
// itself), decoded by the binary through the schema registry
// (test/srfakebroker).

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

const itAuthProto = `syntax = "proto3";
package rtproxy.it;

message Auth {
  string id = 1;
  bool approved = 2;
  int64 ts = 3;
}
`

// TestStreamJoinProtobufAuthorizations: payments (JSON) matched to
// authorizations written in Protobuf by confluent-kafka's serializer give
// exactly the brute-force join of the same records, as the JSON stream of
// TestStreamJoinPaymentsAuthorizations does; an authorization that is not
// in the wire format is a dead letter with reason decode at the join.
func TestStreamJoinProtobufAuthorizations(t *testing.T) {
	requirePython(t, "confluent_kafka", "google.protobuf", "requests")
	const parts = 2
	// The authorizations have one partition: the serializer's producer
	// picks partitions by key, and the last record must be on every one.
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{"payments": parts, "auths.pb": 1, "payments.authorized": 2, "payments.dlq": 1}})
	reg := testkit.StartRegistry(t, "")
	rules := t.TempDir()
	rule := sjRule("payments-authorized-pb", "payments", "auths.pb", "payments.authorized", "payments.dlq", "at_least_once")
	rule = strings.Replace(rule, "event_time: value.ts, format: json }", "event_time: value.ts, format: protobuf }", 1)
	if !strings.Contains(rule, "format: protobuf") {
		t.Fatal("the rule does not read the stream as protobuf")
	}
	WriteRuleFile(t, rules, "pa.yaml", rule)
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules, StateDir: t.TempDir(),
		Env: []string{"RTPROXY_SCHEMA_REGISTRY_URL=" + reg.URL}})

	ps, as := sjData(0, 300)
	want := sjWant(ps, as)
	var recs []map[string]any
	for i, a := range as {
		recs = append(recs, map[string]any{"key": fmt.Sprint("a", i), "value": map[string]any{"id": a.ID, "approved": a.Approved, "ts": a.TS}})
	}
	// Far ahead: with the payments' own, it moves the watermark past every
	// window. Its key matches nothing.
	far := sjBase + 48*3_600_000
	recs = append(recs, map[string]any{"key": "flush", "value": map[string]any{"id": "flush-auth", "ts": far}})
	var py struct {
		Produced []string `json:"produced"`
		Errors   []string `json:"errors"`
	}
	runJSONClient(t, &py, 90*time.Second, DebianPython, "clients/confluent_protobuf_produce.py", mustJSON(map[string]any{
		"bootstrap": p.Addr, "registry": reg.URL, "topic": "auths.pb", "descriptor": protoDescriptor(t, "auth.proto", itAuthProto),
		"message": "rtproxy.it.Auth", "records": recs}))
	if len(py.Errors) > 0 || len(py.Produced) != len(recs) {
		t.Fatalf("confluent-kafka produced %d of %d, errors %v", len(py.Produced), len(recs), py.Errors)
	}

	sjProduce(t, p.Addr, "payments", "auths.pb", ps, nil)
	cl := NewClient(t, k.Addrs, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	defer cl.Close()
	var rs []*kgo.Record
	for q := range int32(parts) {
		b, _ := json.Marshal(sjPayment{ID: fmt.Sprintf("flush-%d", q), AuthID: "flush", TS: far})
		rs = append(rs, &kgo.Record{Topic: "payments", Partition: q, Value: b})
	}
	// A JSON authorization on the Protobuf topic: not the wire format.
	b, _ := json.Marshal(sjAuth{ID: "A1", Approved: true, TS: sjBase + 1000})
	rs = append(rs, &kgo.Record{Topic: "auths.pb", Key: []byte("not-framed"), Value: b})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("flush: %v", err)
	}

	sjWaitRows(t, k.Addrs, "payments.authorized", len(want), 120*time.Second)
	var got []string
	for _, r := range srRead(t, k.Addrs, "payments.authorized") {
		if row := sjRow(t, r.Value); !strings.HasPrefix(row, "flush-") {
			got = append(got, row)
		}
	}
	AssertSameSet(t, "payments.authorized", got, want)
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d: a row repeats", len(got), len(want))
	}
	srWait(t, 30*time.Second, "the JSON authorization in the dead-letter topic", func() error {
		for _, r := range srRead(t, k.Addrs, "payments.dlq") {
			if string(r.Key) != "not-framed" {
				continue
			}
			h := map[string]string{}
			for _, x := range r.Headers {
				h[x.Key] = string(x.Value)
			}
			if h["rtproxy-reason"] != "decode" || h["rtproxy-step"] != "0:join" {
				return fmt.Errorf("dead letter with headers %v", h)
			}
			return nil
		}
		return fmt.Errorf("not yet")
	})
}
