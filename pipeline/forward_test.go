package pipeline

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
)

// A value no step changed reaches the sink as the bytes the producer sent
// (spacing, key order, number spelling kept); a value a step changed (set,
// map) is re-encoded as canonical JSON. Four routes read the same source.
func TestUnchangedValuesForwardedAsReceived(t *testing.T) {
	b := startBroker(t, map[string]int{"fw": 2, "shops": 1})
	b.produce(t, jsonRecord("shops", "s1", map[string]any{"name": "corner"}))
	vals := []string{
		`{ "z" : 1 ,"id":"a",  "n": 2.50, "shop":"s1", "arr":[ 1e0 , true ] }`,
		"{\n\t\"shop\": \"s1\",\n\t\"n\": 3,\n\t\"id\": \"b\",\n\t\"s\": \"\\u00e9t\\u00e9\"\n}",
		`{"id":"a","n":7,"shop":"s1"}`, // a duplicate of "a" for the drop_duplicates route
		`{"n":0,"id":"c","shop":"s1"}`, // filtered out everywhere
	}
	var in []*kgo.Record
	for i, v := range vals {
		in = append(in, &kgo.Record{Topic: "fw", Key: []byte(fmt.Sprint("k", i)), Value: []byte(v)})
	}

	filter := newRouteDef("fw-filter", "v1", "fw", "fw.filter", filterStep(t, 0, "value.n > 0"))
	join := newRouteDef("fw-join", "v1", "fw", "fw.join",
		filterStep(t, 0, "value.n > 0"),
		joinStep(t, 1, "shops", "value.shop", "shop", operators.MissingDeadLetter),
		rules.StepSpec{})
	join.Tables = map[string]rules.TableSpec{"shops": {Name: "shops", Topic: "shops"}}
	// The third filter reads the joined row: compile it with "shop" bound.
	join.Steps[2] = func() rules.StepSpec {
		e := expr(t, `shop.name == "corner"`, "shop")
		return rules.StepSpec{Index: 2, Kind: "filter", Fingerprint: "f:shop",
			Build: func(rules.BuildEnv) (operators.Step, error) { return operators.NewFilter(e), nil }}
	}()
	dedup := newRouteDef("fw-dedup", "v1", "fw", "fw.dedup", filterStep(t, 0, "value.n > 0"), dedupStep(t, 1, "value.id"))
	set := newRouteDef("fw-set", "v1", "fw", "fw.set", filterStep(t, 0, "value.n > 0"), setStep(t, 1, [][2]string{{"tag", `"x"`}}))

	b.produce(t, in...)
	runManager(t, b, t.TempDir(), filter, join, dedup, set)

	bySrc := func(rs []*kgo.Record) map[string]string {
		m := map[string]string{}
		for _, r := range rs {
			m[header(r, HeaderSource)] = string(r.Value)
		}
		return m
	}
	same := map[string]string{srcRef(in[0]): vals[0], srcRef(in[1]): vals[1], srcRef(in[2]): vals[2]}
	for _, c := range []struct {
		sink string
		want map[string]string
	}{
		{"fw.filter", same},
		{"fw.join", same},
		{"fw.dedup", map[string]string{srcRef(in[0]): vals[0], srcRef(in[1]): vals[1]}},
		{"fw.set", map[string]string{
			srcRef(in[0]): `{"arr":[1,true],"id":"a","n":2.5,"shop":"s1","tag":"x","z":1}`,
			srcRef(in[1]): `{"id":"b","n":3,"s":"été","shop":"s1","tag":"x"}`,
			srcRef(in[2]): `{"id":"a","n":7,"shop":"s1","tag":"x"}`,
		}},
	} {
		got := bySrc(b.consume(t, c.sink, len(c.want), 20*time.Second, 300*time.Millisecond))
		if len(got) != len(c.want) {
			t.Errorf("%s: %d records %q, want %d", c.sink, len(got), got, len(c.want))
		}
		for src, w := range c.want {
			if g, ok := got[src]; !ok {
				t.Errorf("%s: no output for %s", c.sink, src)
			} else if !bytes.Equal([]byte(g), []byte(w)) {
				t.Errorf("%s: output for %s\n got %q\nwant %q", c.sink, src, g, w)
			}
		}
	}
	// Decode errors still go to the dead-letter topic as received.
	bad := &kgo.Record{Topic: "fw", Key: []byte("bad"), Value: []byte(`{"id":`)}
	b.produce(t, bad)
	dlq := b.consume(t, "fw.dlq", 4, 20*time.Second, 300*time.Millisecond) // one per route
	n := 0
	for _, r := range dlq {
		if string(r.Key) == "bad" {
			n++
			if string(r.Value) != `{"id":` || header(r, HeaderReason) != "decode" || !strings.Contains(header(r, HeaderError), "json") {
				t.Errorf("dead letter %q reason %q error %q", r.Value, header(r, HeaderReason), header(r, HeaderError))
			}
		}
	}
	if n != 4 {
		t.Errorf("%d decode dead letters, want 4 (one per route)", n)
	}
}
