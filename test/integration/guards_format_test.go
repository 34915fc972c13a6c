package integration

// Guards on Avro and Protobuf topics (`format: avro | protobuf`) through
// the rtproxy binary: franz-go producing Confluent-framed values, schemas
// in a schema registry process (test/srfakebroker), checks on the decoded
// value tree, and a registry that goes away.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

const gfPayAvsc = `{"type":"record","name":"GPay","namespace":"rtproxy.itg","fields":[
	{"name":"id","type":"string"},
	{"name":"amount","type":"double"}]}`

// gfPayAvscV2 is a second schema, registered but not used until the
// registry is down: its id is not in the proxy's cache.
const gfPayAvscV2 = `{"type":"record","name":"GPay","namespace":"rtproxy.itg","fields":[
	{"name":"id","type":"string"},
	{"name":"amount","type":"double"},
	{"name":"note","type":"string","default":""}]}`

const gfOrderProto = `syntax = "proto3";
package rtproxy.itg;

message GOrder {
  string id = 1;
  double amount = 2;
}
`

// framed is a value in the Confluent wire format: magic 0, the schema id,
// the extra bytes (Protobuf message indexes), the payload.
func framed(id int, extra, payload []byte) []byte {
	b := []byte{0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(id))
	return append(append(b, extra...), payload...)
}

func TestGuardsAvroAndProtobuf(t *testing.T) {
	reg := testkit.StartRegistry(t, "")
	srcl, err := sr.NewClient(sr.URLs(reg.URL))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	avroSS, err := srcl.CreateSchema(ctx, "g.avro-value", sr.Schema{Schema: gfPayAvsc, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	v2SS, err := srcl.CreateSchema(ctx, "g.avro2-value", sr.Schema{Schema: gfPayAvscV2, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	pbSS, err := srcl.CreateSchema(ctx, "g.pb-value", sr.Schema{Schema: gfOrderProto, Type: sr.TypeProtobuf})
	if err != nil {
		t.Fatal(err)
	}
	avroSch, v2Sch := avro.MustParse(gfPayAvsc), avro.MustParse(gfPayAvscV2)
	payAvro := func(id string, amount float64) []byte {
		b, err := avro.Marshal(avroSch, map[string]any{"id": id, "amount": amount})
		if err != nil {
			t.Fatal(err)
		}
		return framed(avroSS.ID, nil, b)
	}
	c := protocompile.Compiler{Resolver: &protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{"gorder.proto": gfOrderProto})}}
	files, err := c.Compile(ctx, "gorder.proto")
	if err != nil {
		t.Fatal(err)
	}
	md := files[0].Messages().ByName("GOrder")
	order := func(id string, amount float64) []byte {
		m := dynamicpb.NewMessage(md)
		m.Set(md.Fields().ByName("id"), protoreflect.ValueOfString(id))
		m.Set(md.Fields().ByName("amount"), protoreflect.ValueOfFloat64(amount))
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return framed(pbSS.ID, []byte{0}, b) // message index [0], zigzag: one 0 byte
	}

	k := StartKfake(t, KfakeOpts{Topics: map[string]int{"g.avro": 1, "g.avro.rejected": 1, "g.pb": 1, "gfree": 1}})
	rulesDir := t.TempDir()
	WriteRuleFile(t, rulesDir, "avro.yaml", `guard: pay-avro
topic: g.avro
format: avro
on_reject: dead_letter
dead_letter: g.avro.rejected
checks:
  - check: value.amount > 0
    name: positive
    message: amount must be positive
`)
	WriteRuleFile(t, rulesDir, "pb.yaml", `guard: order-pb
topic: g.pb
format: protobuf
checks:
  - check: value.id != ""
    name: has-id
`)
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rulesDir, Env: []string{"RTPROXY_SCHEMA_REGISTRY_URL=" + reg.URL}})
	cl := NewClient(t, []string{p.Addr}, kgo.ProducerLinger(0))
	defer cl.Close()
	// In force once a value not in the wire format is refused.
	srWait(t, 30*time.Second, "the guards are in force", func() error {
		for _, topic := range []string{"g.avro", "g.pb"} {
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			err := cl.ProduceSync(pctx, &kgo.Record{Topic: topic, Value: []byte(`{"probe":1}`)}).FirstErr()
			pcancel()
			if !errors.Is(err, kerr.InvalidRecord) {
				return fmt.Errorf("%s probe: %v", topic, err)
			}
		}
		return nil
	})

	produce := func(cl *kgo.Client, topic string, v []byte) error {
		return cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: v}).FirstErr()
	}
	var accepted []string
	good := payAvro("a1", 10)
	if err := produce(cl, "g.avro", good); err != nil {
		t.Fatalf("valid Avro record refused: %v", err)
	}
	accepted = append(accepted, string(good))
	refusals := []struct {
		what  string
		value []byte
		check string
		msg   string
	}{
		{"failing a check", payAvro("a2", -5), "positive", "amount must be positive"},
		{"not the wire format", []byte(`{"id":"a3","amount":3}`), "decode", "not the Confluent wire format"},
		{"an unknown schema id", framed(12345, nil, good[5:]), "decode", "schema id 12345: the registry has no schema with this id"},
		{"bytes that do not decode", framed(avroSS.ID, nil, good[5:8]), "decode", "schema id"},
	}
	for _, r := range refusals {
		if err := produce(cl, "g.avro", r.value); !errors.Is(err, kerr.InvalidRecord) {
			t.Errorf("Avro record %s: %v, want INVALID_RECORD", r.what, err)
		}
	}
	// Protobuf.
	gpb := order("o1", 5)
	if err := produce(cl, "g.pb", gpb); err != nil {
		t.Errorf("valid Protobuf record refused: %v", err)
	}
	if err := produce(cl, "g.pb", order("", 5)); !errors.Is(err, kerr.InvalidRecord) {
		t.Errorf("Protobuf record without an id: %v, want INVALID_RECORD", err)
	}

	// The registry goes away. Cached schemas still check at once; a
	// schema not cached is refused with a retriable error within the
	// bound (5 s), and a topic without a guard does not wait at all.
	reg.Stop()
	start := time.Now()
	if err := produce(cl, "gfree", []byte("anything")); err != nil || time.Since(start) > 3*time.Second {
		t.Errorf("unguarded topic while the registry is down: %v after %s", err, time.Since(start))
	}
	good2 := payAvro("a4", 4)
	if err := produce(cl, "g.avro", good2); err != nil {
		t.Errorf("a cached schema while the registry is down: %v", err)
	}
	accepted = append(accepted, string(good2))
	b, err := avro.Marshal(v2Sch, map[string]any{"id": "a5", "amount": 7.0, "note": "v2"})
	if err != nil {
		t.Fatal(err)
	}
	v2 := framed(v2SS.ID, nil, b)
	once := NewClient(t, []string{p.Addr}, kgo.ProducerLinger(0), kgo.DisableIdempotentWrite(), kgo.RecordRetries(1),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }))
	defer once.Close()
	start = time.Now()
	err = produce(once, "g.avro", v2)
	took := time.Since(start)
	if err == nil || errors.Is(err, kerr.InvalidRecord) {
		t.Errorf("a schema not cached while the registry is down: %v, want a retriable refusal", err)
	}
	if took > 15*time.Second {
		t.Errorf("the refusal took %s; the bound is 5 s a lookup", took)
	}
	t.Logf("registry down: refused after %s with %v", took, err)

	// Back: an idempotent producer retries until the schema is fetched.
	done := make(chan error, 1)
	go func() { done <- produce(cl, "g.avro", v2) }()
	time.Sleep(300 * time.Millisecond)
	reg.Restart()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the retried record once the registry is back: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the retried record did not pass once the registry was back")
	}
	accepted = append(accepted, string(v2))

	// The brokers hold exactly the accepted records; the dead letters are
	// the refused Avro records, each naming its check.
	AssertSameSet(t, "records in g.avro", Values(ConsumeQuiet(t, k.Addrs, "g.avro", len(accepted), time.Second, 30*time.Second)), accepted)
	AssertSameSet(t, "records in g.pb", Values(ConsumeQuiet(t, k.Addrs, "g.pb", 1, time.Second, 30*time.Second)), []string{string(gpb)})
	dls := ConsumeQuiet(t, k.Addrs, "g.avro.rejected", len(refusals), time.Second, 30*time.Second)
	byValue := map[string]*kgo.Record{}
	for _, r := range dls {
		byValue[string(r.Value)] = r
	}
	for _, r := range refusals {
		dl := byValue[string(r.value)]
		if dl == nil {
			t.Errorf("no dead letter for the record %s", r.what)
			continue
		}
		if hdr(dl, "rtproxy-guard") != "pay-avro" || hdr(dl, "rtproxy-check") != r.check || !strings.Contains(hdr(dl, "rtproxy-error"), r.msg) {
			t.Errorf("dead letter of the record %s: check %q error %q, want %q with %q", r.what, hdr(dl, "rtproxy-check"), hdr(dl, "rtproxy-error"), r.check, r.msg)
		}
	}
	if _, ok := byValue[string(v2)]; ok {
		t.Error("the record refused while the registry was down is a dead letter; it was retried")
	}
	m, err := srMetrics(p)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := srMetric(m, "rtproxy_guard_rejected_records_total", `guard="pay-avro"`, `check="decode"`); v < 3 {
		t.Errorf("rejected{check=decode} = %v, want at least 3", v)
	}
	if v, _ := srMetric(m, "rtproxy_guard_registry_unavailable_total", `guard="pay-avro"`); v < 1 {
		t.Errorf("rtproxy_guard_registry_unavailable_total = %v, want at least 1", v)
	}
}

// A registry that accepts connections and never answers: the guarded
// produce is refused (retriably) within the bound, not held forever, and
// an unguarded topic through the same proxy is not held at all.
func TestGuardsRegistryBlackHole(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // read nothing, answer nothing
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	}()
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{"g.avro": 1, "gfree": 1}})
	rulesDir := t.TempDir()
	WriteRuleFile(t, rulesDir, "avro.yaml", "guard: pay-avro\ntopic: g.avro\nformat: avro\nchecks:\n  - check: value.amount > 0\n")
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rulesDir,
		Env: []string{"RTPROXY_SCHEMA_REGISTRY_URL=http://" + ln.Addr().String(), "RTPROXY_SCHEMA_REGISTRY_TIMEOUT=2s"}})
	cl := NewClient(t, []string{p.Addr}, kgo.ProducerLinger(0), kgo.DisableIdempotentWrite(), kgo.RecordRetries(0))
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srWait(t, 30*time.Second, "the guard is in force", func() error {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "g.avro", Value: []byte("probe")}).FirstErr(); !errors.Is(err, kerr.InvalidRecord) {
			return fmt.Errorf("probe: %v", err)
		}
		return nil
	})
	start := time.Now()
	err = cl.ProduceSync(ctx, &kgo.Record{Topic: "g.avro", Value: framed(7, nil, []byte{2, 'x', 0, 0, 0, 0, 0, 0, 0, 0})}).FirstErr()
	took := time.Since(start)
	if err == nil || errors.Is(err, kerr.InvalidRecord) {
		t.Errorf("record while the registry does not answer: %v, want a retriable refusal", err)
	}
	// The lookup waits schema_registry.timeout (2 s here; never more than 5 s).
	if took < 1500*time.Millisecond || took > 8*time.Second {
		t.Errorf("refused after %s, want about 2 s", took)
	}
	t.Logf("refused after %s: %v", took, err)
	start = time.Now()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "gfree", Value: []byte("x")}).FirstErr(); err != nil || time.Since(start) > time.Second {
		t.Errorf("unguarded topic: %v after %s", err, time.Since(start))
	}
}
