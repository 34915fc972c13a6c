package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/rtproxy/rtproxy/internal/serde"
	"github.com/rtproxy/rtproxy/internal/testkit"
	"github.com/rtproxy/rtproxy/rules"
)

// avroAuth is the Avro schema of the authorizations of the stream join
// tests: the fields the JSON twin carries.
const avroAuth = `{"type":"record","name":"Auth","namespace":"rtproxy.it","fields":[
	{"name":"id","type":"string"},
	{"name":"aid","type":"string"},
	{"name":"ts","type":"long"}]}`

type authV1 struct {
	ID  string `avro:"id"`
	AID string `avro:"aid"`
	TS  int64  `avro:"ts"`
}

// streamJoinFormatRoute is streamJoinKfakeRoute over a stream of format
// %[2]s on topic %[1]s (the route is named after the topic).
const streamJoinFormatRoute = `route: %[1]s
source: { topic: payments, event_time: value.ts, watermark: 2s, idle_timeout: 10s, start: earliest }
sink: { topic: %[1]s.out }
dead_letter: %[1]s.dlq
checkpoint_interval: 200ms
steps:
  - join:
      stream: { topic: %[1]s, event_time: value.ts, format: %[2]s }
      on: value.auth_id
      other: value.id
      within: { before: 5m, after: 1m }
      grace: 30s
      kind: left
      as: auth
  - map:
      p: value.id
      a: auth?.aid
`

// joinRows reads the sink of a stream join route as "payment|auth" rows
// ("-" for a null side), sorted.
func joinRows(t *testing.T, out []*kgo.Record) []string {
	t.Helper()
	var got []string
	for _, r := range out {
		got = append(got, joinRow(t, r.Value))
	}
	slices.Sort(got)
	return got
}

// joinRow reads one output of a stream join route as "payment|auth" ("-"
// for a null side).
func joinRow(t testing.TB, value []byte) string {
	t.Helper()
	var v struct{ P, A *string }
	if err := json.Unmarshal(value, &v); err != nil {
		t.Fatal(err)
	}
	l, a := "-", "-"
	if v.P != nil {
		l = *v.P
	}
	if v.A != nil {
		a = *v.A
	}
	return l + "|" + a
}

// TestStreamJoinAvroStream: a stream join whose second topic is Avro in
// the Confluent wire format (written by franz-go's sr.Serde, decoded
// through the route's registry) gives exactly the rows of the same join
// over the same authorizations in JSON, which are the brute-force
// reference's; a stream value that is not in the wire format, and one
// whose schema id the registry does not know, are dead letters with
// reason decode at the join (the second with its schema id), the
// dead-letter counter moving, and change no row.
func TestStreamJoinAvroStream(t *testing.T) {
	const parts = 2
	b := startBroker(t, map[string]int{"payments": parts, "auths.json": parts, "auths.avro": parts})
	reg := testkit.StartRegistry(t, "")
	srcl, err := sr.NewClient(sr.URLs(reg.URL))
	if err != nil {
		t.Fatal(err)
	}
	ss, err := srcl.CreateSchema(context.Background(), "auths.avro-value", sr.Schema{Schema: avroAuth, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	var ser sr.Serde
	sch := avro.MustParse(avroAuth)
	ser.Register(ss.ID, authV1{}, sr.EncodeFn(func(v any) ([]byte, error) { return avro.Marshal(sch, v) }))

	rdir := t.TempDir()
	load := func(topic, format string) *rules.Route {
		p := filepath.Join(rdir, topic+".yaml")
		if err := os.WriteFile(p, fmt.Appendf(nil, streamJoinFormatRoute, topic, format), 0o644); err != nil {
			t.Fatal(err)
		}
		def, err := rules.LoadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return def
	}
	jsonDef, avroDef := load("auths.json", "json"), load("auths.avro", "avro")

	ins := sjInOrder(rand.New(rand.NewPCG(11, 27)), 300, parts, 30)
	want, late := sjReference(ins, parts, "left")
	if len(late) > 0 {
		t.Fatalf("the inputs have late records: %v", late)
	}
	// A last record far ahead on every partition of both topics moves
	// the watermark past every window: the unmatched payments are
	// emitted. Their keys match nothing, and they are not emitted.
	end := time.Now().Add(2 * time.Hour).UnixMilli() // past every record (sjInOrder)
	for q := range int32(parts) {
		ins = append(ins, sjInput{part: q, id: fmt.Sprint("endp", q), key: "none-p", t: end},
			sjInput{auth: true, part: q, id: fmt.Sprint("enda", q), key: "none-a", t: end})
	}

	var pays, jsonAuths, avroAuths []*kgo.Record
	for _, in := range ins {
		if !in.auth {
			r := jsonRecord("payments", in.id, map[string]any{"id": in.id, "auth_id": in.key, "ts": in.t})
			r.Partition = in.part
			pays = append(pays, r)
			continue
		}
		r := jsonRecord("auths.json", in.id, map[string]any{"id": in.key, "aid": in.id, "ts": in.t})
		r.Partition = in.part
		jsonAuths = append(jsonAuths, r)
		v, err := ser.Encode(authV1{ID: in.key, AID: in.id, TS: in.t})
		if err != nil {
			t.Fatal(err)
		}
		avroAuths = append(avroAuths, &kgo.Record{Topic: "auths.avro", Partition: in.part, Key: []byte(in.id), Value: v})
		if len(avroAuths) == 20 {
			// Not in the wire format (a JSON authorization), and an
			// unknown schema id: neither is an authorization.
			unknown := append([]byte{0, 0, 0, 0x03, 0xe7}, v[5:]...) // schema id 999
			avroAuths = append(avroAuths,
				&kgo.Record{Topic: "auths.avro", Partition: in.part, Key: []byte("bad-header"), Value: jsonAuths[len(jsonAuths)-1].Value},
				&kgo.Record{Topic: "auths.avro", Partition: in.part, Key: []byte("bad-id"), Value: unknown})
		}
	}
	cl := b.tmpClient(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	if err := cl.ProduceSync(ctx, slices.Concat(pays, jsonAuths, avroAuths)...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	cancel()
	cl.Close()

	m, _ := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), SchemaRegistry: serde.Config{URL: reg.URL, Timeout: 2 * time.Second}}, jsonDef, avroDef)
	rows := func(topic string) []string {
		var out []*kgo.Record
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
			if out = b.consume(t, topic, 0, time.Second, 500*time.Millisecond); len(out) >= len(want) {
				break
			}
		}
		return joinRows(t, out)
	}
	jsonRows, avroRows := rows("auths.json.out"), rows("auths.avro.out")
	if !slices.Equal(jsonRows, want) {
		t.Fatalf("JSON stream: %d rows, the reference %d:\n got %v\nwant %v", len(jsonRows), len(want), jsonRows, want)
	}
	if !slices.Equal(avroRows, jsonRows) {
		t.Fatalf("Avro stream: %d rows, the JSON stream's %d:\n got %v\nwant %v", len(avroRows), len(jsonRows), avroRows, jsonRows)
	}

	dlq := b.consume(t, "auths.avro.dlq", 2, 30*time.Second, 0)
	wantDLQ := map[string]string{"bad-header": "", "bad-id": "999"}
	for _, r := range dlq {
		k := string(r.Key)
		id, ok := wantDLQ[k]
		if !ok {
			t.Fatalf("unexpected dead letter %s: %s %s", k, header(r, HeaderReason), header(r, HeaderError))
		}
		if header(r, HeaderReason) != "decode" || header(r, HeaderSchemaID) != id || header(r, HeaderStep) != "0:join" {
			t.Errorf("dead letter %s: reason %q schema id %q (want %q) step %q error %q", k,
				header(r, HeaderReason), header(r, HeaderSchemaID), id, header(r, HeaderStep), header(r, HeaderError))
		}
		delete(wantDLQ, k)
	}
	if len(wantDLQ) > 0 {
		t.Errorf("missing dead letters %v", wantDLQ)
	}
	if got := testutil.ToFloat64(m.met.deadLetters.WithLabelValues("auths.avro", "decode")); got != 2 {
		t.Errorf("dead letters with reason decode counted %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.met.deadLetters.WithLabelValues("auths.json", "decode")); got != 0 {
		t.Errorf("the JSON route counted %v decode dead letters, want 0", got)
	}
}

// TestStreamJoinAvroStreamWithoutRegistryWaits: a route whose only
// registry format is its stream join's, run with no registry, holds its
// records (none is a dead letter) and says in /routes that the stream's
// format needs one, as a route reading Avro from its source does.
func TestStreamJoinAvroStreamWithoutRegistryWaits(t *testing.T) {
	b := startBroker(t, map[string]int{"payments": 1, "auths.nr": 1})
	b.produce(t, &kgo.Record{Topic: "auths.nr", Key: []byte("k"), Value: []byte{0, 0, 0, 0, 1, 2}})
	def := writeRule(t, t.TempDir(), "nr.yaml", fmt.Sprintf(streamJoinFormatRoute, "auths.nr", "avro"))
	m, _ := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir()}, def)
	waitFor(t, 30*time.Second, "/routes to say the stream needs a registry", func() bool {
		for _, s := range m.Routes() {
			if s.Name == "auths.nr" && strings.Contains(s.LastError, "auths.nr[0] waits at offset 0") &&
				strings.Contains(s.LastError, "join.stream.format avro") && strings.Contains(s.LastError, "need a schema registry") {
				return true
			}
		}
		return false
	})
	if got := b.consume(t, "auths.nr.dlq", 0, time.Second, 500*time.Millisecond); len(got) != 0 {
		t.Fatalf("%d dead letters while the route has no registry", len(got))
	}
}

// TestStreamJoinProtobufStreamIndexes: the stream's message_indexes is
// its decoder's, apart from the source's: a value of the file's second
// message with its indexes written unsigned (count 1, index 1) decodes as
// that message under `message_indexes: unsigned`, and is refused (a
// decode error, so a dead letter) under the default zigzag.
func TestStreamJoinProtobufStreamIndexes(t *testing.T) {
	reg := testkit.StartRegistry(t, "")
	srcl, err := sr.NewClient(sr.URLs(reg.URL))
	if err != nil {
		t.Fatal(err)
	}
	const file = "syntax = \"proto3\";\npackage rtproxy.it;\nmessage A { string id = 1; }\nmessage B { string name = 1; }\n"
	ss, err := srcl.CreateSchema(context.Background(), "auths.pb-value", sr.Schema{Schema: file, Type: sr.TypeProtobuf})
	if err != nil {
		t.Fatal(err)
	}
	value := []byte{0, byte(ss.ID >> 24), byte(ss.ID >> 16), byte(ss.ID >> 8), byte(ss.ID), 0x01, 0x01, 0x0a, 0x01, 'x'}
	dir := t.TempDir()
	for _, c := range []struct {
		indexes string
		want    string // the decoded value, "" for a decode error
	}{{"unsigned", `{"name":"x"}`}, {"", ""}} {
		stream := "{ topic: auths.pb, format: protobuf }"
		if c.indexes != "" {
			stream = "{ topic: auths.pb, format: protobuf, message_indexes: " + c.indexes + " }"
		}
		def := writeRule(t, dir, "pb.yaml", "route: pb\nsource: { topic: payments }\nsink: { topic: out }\nsteps:\n  - join: { stream: "+stream+
			", on: value.a, other: value.id, within: { before: 1m }, grace: 1s, as: a }\n")
		cd := newCodec(serde.Config{URL: reg.URL, Timeout: 2 * time.Second}, def)
		if cd == nil || cd.err != nil || cd.dec != nil || cd.others[def.Steps[0].Index] == nil {
			t.Fatalf("%q: codec %+v", c.indexes, cd)
		}
		v, err := cd.others[def.Steps[0].Index].Decode(context.Background(), value)
		if c.want == "" {
			var de *serde.DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("zigzag: %v, %v; want a decode error", v, err)
			}
			continue
		}
		got, _ := json.Marshal(v)
		if err != nil || string(got) != c.want {
			t.Fatalf("%q: %s, %v; want %s", c.indexes, got, err, c.want)
		}
	}
}
