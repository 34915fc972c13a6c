package serde

import (
	"context"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

// TestEncodeRoundTrips: a value tree encoded with the output schema is read
// back, by the decoder and by hamba/avro's own generic decoder (Avro) or
// the protobuf runtime (Protobuf), as the same record.
func TestEncodeRoundTrips(t *testing.T) {
	reg := testkit.StartRegistry(t, "")
	r, err := NewRegistry(Config{URL: reg.URL}, os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	avsc := readFile(t, "testdata/payment.avsc")
	enc := NewEncoder(r, Avro, "out-avro-value", avsc, "")
	if err := enc.Resolve(ctx); err != nil {
		t.Fatal(err)
	}
	tree := jsonTree(t, samplePaymentJSON)
	b, err := enc.Encode(tree)
	if err != nil {
		t.Fatal(err)
	}
	got, err := NewDecoder(r, Avro).Decode(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, tree) {
		t.Fatalf("avro round trip\n%#v\nwant\n%#v", got, tree)
	}
	var p avroPayment
	if err := avro.Unmarshal(avro.MustParse(avsc), b[5:], &p); err != nil {
		t.Fatalf("hamba/avro cannot read what we wrote: %v", err)
	}
	if want := samplePayment(); p.ID != want.ID || p.Price.Cmp(want.Price) != 0 || !p.TSMicros.Equal(want.TSMicros) || !p.Day.Equal(want.Day) || *p.Note != *want.Note || p.Digest != want.Digest {
		t.Fatalf("hamba/avro read %+v", p)
	}
	// Missing fields with defaults take them; the union's null branch.
	m := jsonTree(t, samplePaymentJSON).(map[string]any)
	delete(m, "note")
	delete(m, "merchant")
	if _, err := enc.Encode(m); err != nil {
		t.Fatalf("fields with defaults left out: %v", err)
	}
	for name, c := range map[string]struct {
		mod  func(m map[string]any)
		want string
	}{
		"extra field":   {func(m map[string]any) { m["colour"] = "red" }, "value.colour: record rtproxy.test.Payment has no such field"},
		"missing field": {func(m map[string]any) { delete(m, "amount") }, "value.amount: missing, and the field has no default"},
		"wrong type":    {func(m map[string]any) { m["cents"] = "a lot" }, "value.cents: want a number, got a string"},
		"not integral":  {func(m map[string]any) { m["count"] = 1.5 }, "value.count: 1.5 is not an integer"},
		"enum symbol":   {func(m map[string]any) { m["currency"] = "JPY" }, "value.currency: want one of EUR, USD, GBP"},
		"decimals":      {func(m map[string]any) { m["price"] = 1.234 }, "value.price: 1.234 has more than 2 decimals"},
	} {
		m := jsonTree(t, samplePaymentJSON).(map[string]any)
		c.mod(m)
		_, err := enc.Encode(m)
		var ee *EncodeError
		if !errors.As(err, &ee) || ee.ID != enc.SchemaID() || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an EncodeError with %q", name, err, c.want)
		}
	}

	// Protobuf: the schema is registered with its reference by a producer
	// first; the encoder looks the subject's latest version up.
	register(t, r.Client(), "common.proto", sr.Schema{Schema: readFile(t, "testdata/common.proto"), Type: sr.TypeProtobuf})
	register(t, r.Client(), "out-pb-value", sr.Schema{Schema: readFile(t, "testdata/payment.proto"), Type: sr.TypeProtobuf,
		References: []sr.SchemaReference{{Name: "common.proto", Subject: "common.proto", Version: 1}}})
	penc := NewEncoder(r, Protobuf, "out-pb-value", "", "rtproxy.test.Payment")
	if err := penc.Resolve(ctx); err != nil {
		t.Fatal(err)
	}
	ptree := jsonTree(t, samplePaymentProtoTree)
	pb, err := penc.Encode(ptree)
	if err != nil {
		t.Fatal(err)
	}
	got, err = NewDecoder(r, Protobuf).Decode(ctx, pb)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, ptree) {
		t.Fatalf("protobuf round trip\n%#v\nwant\n%#v", got, ptree)
	}
	md := compileTestProto(t).Messages().ByName("Payment")
	var h sr.ConfluentHeader
	_, rest, _ := h.DecodeID(pb)
	idx, body, err := h.DecodeIndex(rest, 8)
	if err != nil || !reflect.DeepEqual(idx, protoIndexOf(md)) {
		t.Fatalf("indexes %v %v, want %v", idx, err, protoIndexOf(md))
	}
	msg := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(body, msg); err != nil {
		t.Fatal(err)
	}
	want := dynamicpb.NewMessage(md)
	if err := protojson.Unmarshal([]byte(strings.Replace(samplePaymentProtoJSON, `"9007199254740993"`, `"9007199254740992"`, 1)), want); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(msg, want) {
		t.Fatalf("protobuf runtime read\n%v\nwant\n%v", msg, want)
	}
	pt := jsonTree(t, samplePaymentProtoTree).(map[string]any)
	pt["colour"] = "red"
	if _, err := penc.Encode(pt); err == nil || !strings.Contains(err.Error(), "message rtproxy.test.Payment has no such field") {
		t.Fatalf("extra protobuf field: %v", err)
	}
}

func TestCheckFields(t *testing.T) {
	avsc := readFile(t, "testdata/payment.avsc")
	got, err := CheckFields(Avro, avsc, "", []string{"id", "amount", "colour"})
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(got, "\n")
	for _, w := range []string{"field `colour` is not in record rtproxy.test.Payment", "needs field `cents`"} {
		if !strings.Contains(text, w) {
			t.Errorf("problems %q lack %q", text, w)
		}
	}
	if strings.Contains(text, "`note`") {
		t.Errorf("a field with a default is reported: %q", text)
	}
	common := readFile(t, "testdata/common.proto")
	got, err = CheckFields(Protobuf, common, "", []string{"id", "name"})
	if err != nil || len(got) != 1 || !strings.Contains(got[0], "field `name` is not in message rtproxy.common.Merchant") {
		t.Fatalf("protobuf: %v %v", got, err)
	}
	if err := CheckSchema(Protobuf, common, "Nope"); err == nil {
		t.Fatal("a message the schema lacks passes")
	}
	if err := CheckSchema(Avro, `{"type":"record"`, ""); err == nil {
		t.Fatal("a broken Avro schema passes")
	}
}
