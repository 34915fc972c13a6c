package serde

import (
	"context"
	"errors"
	"math/big"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/internal/testkit"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testkit.Cleanup()
	os.Exit(code)
}

func readFile(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// jsonTree is what the JSON path makes of doc: the tree decoders must give.
func jsonTree(t testing.TB, doc string) any {
	t.Helper()
	v, err := jsoncodec.Decode([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func register(t testing.TB, cl *sr.Client, subject string, s sr.Schema) int {
	t.Helper()
	ss, err := cl.CreateSchema(context.Background(), subject, s)
	if err != nil {
		t.Fatalf("register %s: %v", subject, err)
	}
	return ss.ID
}

func frame(t testing.TB, id int, index []int, body []byte) []byte {
	t.Helper()
	var h sr.ConfluentHeader
	b, err := h.AppendEncode(nil, id, index)
	if err != nil {
		t.Fatal(err)
	}
	return append(b, body...)
}

type avroMerchant struct {
	ID      string `avro:"id"`
	Country string `avro:"country"`
}

type avroPayment struct {
	ID       string           `avro:"id"`
	Amount   float64          `avro:"amount"`
	Cents    int64            `avro:"cents"`
	Count    int32            `avro:"count"`
	Rate     float32          `avro:"rate"`
	OK       bool             `avro:"ok"`
	Currency string           `avro:"currency"`
	Note     *string          `avro:"note"`
	Merchant *avroMerchant    `avro:"merchant"`
	Tags     []string         `avro:"tags"`
	Attrs    map[string]int64 `avro:"attrs"`
	Raw      []byte           `avro:"raw"`
	Digest   [4]byte          `avro:"digest"`
	Price    *big.Rat         `avro:"price"`
	TS       time.Time        `avro:"ts"`
	TSMicros time.Time        `avro:"ts_us"`
	Day      time.Time        `avro:"day"`
	Nothing  any              `avro:"nothing"`
}

func samplePayment() avroPayment {
	note := "hello"
	return avroPayment{
		ID: "p1", Amount: 12.5, Cents: 1250, Count: 3, Rate: 0.1, OK: true, Currency: "USD", Note: &note,
		Merchant: &avroMerchant{ID: "m1", Country: "FR"}, Tags: []string{"a", "b"}, Attrs: map[string]int64{"x": 1},
		Raw: []byte{1, 2, 3}, Digest: [4]byte{0xde, 0xad, 0xbe, 0xef}, Price: big.NewRat(1234, 100),
		TS: time.UnixMilli(1700000000123).UTC(), TSMicros: time.UnixMicro(1700000000123456).UTC(),
		Day: time.Date(2024, 1, 2, 0, 0, 0, 0, time.UTC),
	}
}

const samplePaymentJSON = `{"id":"p1","amount":12.5,"cents":1250,"count":3,"rate":0.1,"ok":true,"currency":"USD",
	"note":"hello","merchant":{"id":"m1","country":"FR"},"tags":["a","b"],"attrs":{"x":1},"raw":"AQID",
	"digest":"3q2+7w==","price":12.34,"ts":1700000000123,"ts_us":1700000000123.456,"day":"2024-01-02","nothing":null}`

// TestAvroDecodesToTheJSONTree: an Avro record decodes to exactly the tree
// (same Go types) the JSON path gives for the same record as JSON.
func TestAvroDecodesToTheJSONTree(t *testing.T) {
	reg := testkit.StartRegistry(t, "")
	r, err := NewRegistry(Config{URL: reg.URL}, os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	text := readFile(t, "testdata/payment.avsc")
	id := register(t, r.Client(), "payments-value", sr.Schema{Schema: text, Type: sr.TypeAvro})
	body, err := avro.Marshal(avro.MustParse(text), samplePayment())
	if err != nil {
		t.Fatal(err)
	}
	dec := NewDecoder(r, Avro)
	got, err := dec.Decode(context.Background(), frame(t, id, nil, body))
	if err != nil {
		t.Fatal(err)
	}
	if want := jsonTree(t, samplePaymentJSON); !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded\n%#v\nwant\n%#v", got, want)
	}

	// The null branch of a union is nil, as JSON null.
	p := samplePayment()
	p.Note, p.Merchant = nil, nil
	body, _ = avro.Marshal(avro.MustParse(text), p)
	got, err = dec.Decode(context.Background(), frame(t, id, nil, body))
	if err != nil {
		t.Fatal(err)
	}
	m := got.(map[string]any)
	if v, ok := m["note"]; !ok || v != nil {
		t.Fatalf("note = %#v, %v; want nil present", v, ok)
	}

	badRecords(t, dec, id, body)
}

// badRecords: a bad header, an unknown id, truncated and trailing bytes
// are decode errors naming the schema id when there is one.
func badRecords(t *testing.T, dec *Decoder, id int, body []byte) {
	t.Helper()
	ctx := context.Background()
	var de *DecodeError
	if _, err := dec.Decode(ctx, []byte("{\"json\":1}")); !errors.As(err, &de) || de.HasID {
		t.Fatalf("bad header: %v", err)
	}
	if _, err := dec.Decode(ctx, frame(t, 9999, nil, body)); !errors.As(err, &de) || de.ID != 9999 || !strings.Contains(err.Error(), "no schema") {
		t.Fatalf("unknown id: %v", err)
	}
	if got, ok := SchemaID(errors.New("x")); ok {
		t.Fatalf("SchemaID of a plain error: %d", got)
	}
	for name, b := range map[string][]byte{
		"truncated": frame(t, id, nil, body[:len(body)/2]),
		"trailing":  frame(t, id, nil, append(append([]byte{}, body...), 7, 7, 7)),
	} {
		_, err := dec.Decode(ctx, b)
		if !errors.As(err, &de) || de.ID != id {
			t.Fatalf("%s: %v", name, err)
		}
		if got, ok := SchemaID(err); !ok || got != id {
			t.Fatalf("%s: SchemaID = %d %v", name, got, ok)
		}
	}
}

const samplePaymentProtoJSON = `{"id":"p1","amount":12.5,"cents":"1250","count":3,"rate":0.1,"ok":true,"currency":"USD",
	"note":"hi","merchant":{"id":"m1","country":"FR"},"tags":["a","b"],"attrs":{"x":"1"},"raw":"AQID",
	"big":"9007199254740993","card":"4111","ts":"2023-11-14T22:13:20.123Z","took":"1.500s","channel":"web",
	"retries":"2","extra":{"k":[1,"two",null,true],"o":{"n":2}},"lines":[{"sku":"s1","qty":2},{"sku":"s2"}]}`

// big decodes to the nearest float64 (2^53+1 → 2^53); unset oneof members,
// unset messages (other) and unset optional fields are absent; unset proto3
// scalars (qty of the second line) are their zero value.
const samplePaymentProtoTree = `{"id":"p1","amount":12.5,"cents":1250,"count":3,"rate":0.1,"ok":true,"currency":"USD",
	"note":"hi","merchant":{"id":"m1","country":"FR"},"tags":["a","b"],"attrs":{"x":1},"raw":"AQID",
	"big":9007199254740992,"card":"4111","ts":1700000000123,"took":1500,"channel":"web",
	"retries":2,"extra":{"k":[1,"two",null,true],"o":{"n":2}},"lines":[{"sku":"s1","qty":2},{"sku":"s2","qty":0}]}`

// compileTestProto compiles testdata's payment.proto on the test's side,
// independently of the decoder.
func compileTestProto(t testing.TB) protoreflect.FileDescriptor {
	t.Helper()
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{"testdata"}})}
	files, err := c.Compile(context.Background(), "payment.proto")
	if err != nil {
		t.Fatal(err)
	}
	return files[0]
}

// TestProtobufDecodesToTheJSONTree: a Protobuf message whose schema
// references another subject's file and the well-known types decodes to
// the tree the JSON path gives.
func TestProtobufDecodesToTheJSONTree(t *testing.T) {
	reg := testkit.StartRegistry(t, "Bearer s3cret")
	tok := t.TempDir() + "/token"
	if err := os.WriteFile(tok, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := NewRegistry(Config{URL: reg.URL, BearerTokenFile: tok}, os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	register(t, r.Client(), "common.proto", sr.Schema{Schema: readFile(t, "testdata/common.proto"), Type: sr.TypeProtobuf})
	id := register(t, r.Client(), "payments-value", sr.Schema{Schema: readFile(t, "testdata/payment.proto"), Type: sr.TypeProtobuf,
		References: []sr.SchemaReference{{Name: "common.proto", Subject: "common.proto", Version: 1}}})

	fd := compileTestProto(t)
	md := fd.Messages().ByName("Payment")
	msg := dynamicpb.NewMessage(md)
	if err := protojson.Unmarshal([]byte(samplePaymentProtoJSON), msg); err != nil {
		t.Fatal(err)
	}
	body, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	dec := NewDecoder(r, Protobuf)
	got, err := dec.Decode(context.Background(), frame(t, id, protoIndexOf(md), body))
	if err != nil {
		t.Fatal(err)
	}
	if want := jsonTree(t, samplePaymentProtoTree); !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded\n%#v\nwant\n%#v", got, want)
	}

	// A nested message by its index path (map entries count as nested
	// messages, as in the descriptor).
	line := dynamicpb.NewMessage(md.Messages().ByName("Line"))
	protojson.Unmarshal([]byte(`{"sku":"z","qty":5}`), line)
	lb, _ := proto.Marshal(line)
	got, err = dec.Decode(context.Background(), frame(t, id, protoIndexOf(line.Descriptor()), lb))
	if err != nil || !reflect.DeepEqual(got, jsonTree(t, `{"sku":"z","qty":5}`)) {
		t.Fatalf("nested message: %#v, %v", got, err)
	}
	// An index the schema does not have; an Avro decoder meeting a
	// Protobuf schema.
	var de *DecodeError
	if _, err := dec.Decode(context.Background(), frame(t, id, []int{7}, lb)); !errors.As(err, &de) || de.ID != id {
		t.Fatalf("bad index: %v", err)
	}
	if _, err := NewDecoder(r, Avro).Decode(context.Background(), frame(t, id, nil, body)); !errors.As(err, &de) || !strings.Contains(err.Error(), "the route reads avro") {
		t.Fatalf("format mismatch: %v", err)
	}
	corrupt := frame(t, id, protoIndexOf(md), []byte{0x0a, 0xff, 0x01})
	if _, err := dec.Decode(context.Background(), corrupt); !errors.As(err, &de) || de.ID != id {
		t.Fatalf("corrupt bytes: %v", err)
	}
}

// TestRegistryDownThenBack: a cached schema needs no registry; an uncached
// one is Unavailable (not a decode error) while the registry is down, and
// decodes once it is back.
func TestRegistryDownThenBack(t *testing.T) {
	reg := testkit.StartRegistry(t, "")
	r, err := NewRegistry(Config{URL: reg.URL, Timeout: 2 * time.Second}, os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	text := readFile(t, "testdata/payment.avsc")
	id1 := register(t, r.Client(), "a-value", sr.Schema{Schema: text, Type: sr.TypeAvro})
	id2 := register(t, r.Client(), "b-value", sr.Schema{Schema: strings.Replace(text, `"name": "Payment"`, `"name": "Payment2"`, 1), Type: sr.TypeAvro})
	body, _ := avro.Marshal(avro.MustParse(text), samplePayment())
	dec := NewDecoder(r, Avro)
	ctx := context.Background()
	if _, err := dec.Decode(ctx, frame(t, id1, nil, body)); err != nil {
		t.Fatal(err)
	}
	reg.Stop()
	if _, ready := dec.Ready(frame(t, id1, nil, body)); !ready {
		t.Fatal("a cached schema is not ready")
	}
	if _, err := dec.Decode(ctx, frame(t, id1, nil, body)); err != nil {
		t.Fatalf("cached schema with the registry down: %v", err)
	}
	if _, ready := dec.Ready(frame(t, id2, nil, body)); ready {
		t.Fatal("an uncached schema is ready with the registry down")
	}
	err = dec.Fetch(ctx, frame(t, id2, nil, body))
	if !IsUnavailable(err) {
		t.Fatalf("registry down: %v, want unavailable", err)
	}
	if _, ok := SchemaID(err); ok {
		t.Fatal("an unavailable registry is no decode error")
	}
	reg.Restart()
	if err := dec.Fetch(ctx, frame(t, id2, nil, body)); err != nil {
		t.Fatal(err)
	}
	if _, err := dec.Decode(ctx, frame(t, id2, nil, body)); err != nil {
		t.Fatal(err)
	}
}

func TestConfigCheck(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{URL: "registry:8081"}, "must start with http"},
		{Config{URL: "http://r", BasicAuthEnv: "A", BearerTokenEnv: "B"}, "use one"},
		{Config{URL: "http://r", BasicAuthEnv: "RTPROXY_TEST_UNSET_VAR"}, "is not set"},
		{Config{URL: "http://r", BasicAuthFile: "/nonexistent/file"}, "no such file"},
		{Config{URL: "http://r", CAFile: "/nonexistent/ca"}, "ca_file"},
	} {
		_, err := NewRegistry(c.cfg, func(string) (string, bool) { return "", false })
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
	if _, err := NewRegistry(Config{URL: "http://r", BasicAuthEnv: "SR"}, func(string) (string, bool) { return "user:pass", true }); err != nil {
		t.Fatal(err)
	}
}
