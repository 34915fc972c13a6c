package pipeline

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
)

// driverRoute is a route that uses every kind of step: filter, drop
// duplicates across partitions, a join, set, map, a window behind a
// repartition, and a filter on its rows; plus dead letters.
const driverRoute = `route: drv
source: { topic: drv, event_time: value.ts, watermark: 2s, idle_timeout: 1s }
sink: { topic: drv.out, key: value.key }
dead_letter: drv.dlq
checkpoint_interval: 200ms
tables:
  shops: { file: shops.jsonl, key: shop }
steps:
  - filter: value.amount >= 0
  - drop_duplicates: { key: value.txn }
  - join: { table: shops, on: value.shop, as: s, missing: keep }
  - set:
      region: s?.region ?? "none"
      cents: int(value.amount * 100)
  - map: { user: value.user, region: value.region, cents: value.cents, ts: value.ts }
  - window:
      kind: tumbling
      size: 1s
      key: value.user + "/" + value.region
      aggregate: { n: count(), cents: sum(value.cents), first: min(value.ts) }
      emit: on_close
  - filter: value.n > 1
`

func loadDriverRoute(t *testing.T) *rules.Route {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "shops.jsonl"),
		[]byte(`{"shop":"s1","region":"eu"}`+"\n"+`{"shop":"s2","region":"us"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "drv.yaml")
	if err := os.WriteFile(p, []byte(driverRoute), 0o644); err != nil {
		t.Fatal(err)
	}
	def, err := rules.LoadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return def
}

// driverInputs are the records both runs get: copies of some transactions
// on other partitions, a negative amount, a value that is not JSON, and
// event time rising per partition (so that no record is late in either
// run, whatever order partitions are read in).
func driverInputs() []*kgo.Record {
	const parts = 3
	var rs []*kgo.Record
	for i := range 300 {
		v := map[string]any{"txn": fmt.Sprint("t", i), "user": fmt.Sprint("u", i%5), "shop": fmt.Sprint("s", i%3),
			"amount": float64(i%11) - 1.5, "ts": int64(1767225600000) + int64(i*40)}
		b, _ := json.Marshal(v)
		copies := 1
		if i%4 == 0 {
			copies = 2
		}
		for c := range copies {
			rs = append(rs, &kgo.Record{Topic: "drv", Partition: int32((i + c) % parts), Key: []byte(v["txn"].(string)), Value: b})
		}
		if i%50 == 7 {
			rs = append(rs, &kgo.Record{Topic: "drv", Partition: int32(i % parts), Value: []byte("not json")})
		}
	}
	return rs
}

// outputLine is what both runs are compared on: topic, key, value and the
// headers that say what a record is.
func outputLine(topic string, key, value []byte, hdr func(string) string) string {
	return fmt.Sprintf("%s key=%s value=%s window=%s reason=%s step=%s", topic, key, value,
		hdr(HeaderWindow), hdr(HeaderReason), hdr(HeaderStep))
}

// TestDriverMatchesRun: the Driver of `rtproxy test` and a route running
// on a broker give the same outputs and dead letters for the same input.
// Both build the route with the same code; the Driver only replaces the
// topics and the clock, and this test shows that replacing them changes
// nothing a consumer sees.
func TestDriverMatchesRun(t *testing.T) {
	def := loadDriverRoute(t)
	in := driverInputs()

	d, err := NewDriver(def, DriverConfig{Partitions: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, r := range in {
		if err := d.Send(DriverInput{Partition: r.Partition, Offset: -1, Key: r.Key, Value: r.Value,
			Timestamp: time.UnixMilli(1767225600000)}); err != nil {
			t.Fatal(err)
		}
	}
	d.AdvanceIdle(10 * time.Second) // every partition idle: the last windows close
	var fromDriver []string
	for _, o := range d.Outputs() {
		hdr := func(k string) string {
			for _, h := range o.Headers {
				if h.Key == k {
					return string(h.Value)
				}
			}
			return ""
		}
		fromDriver = append(fromDriver, outputLine(o.Topic, o.Key, o.Value, hdr))
	}
	if len(fromDriver) < 20 {
		t.Fatalf("the driver wrote only %d records", len(fromDriver))
	}
	var nDLQ int
	for _, l := range fromDriver {
		if strings.HasPrefix(l, "drv.dlq ") {
			nDLQ++
		}
	}

	b := startBroker(t, map[string]int{"drv": 3})
	for _, r := range in {
		r.Timestamp = time.UnixMilli(1767225600000)
	}
	b.produce(t, in...)
	_, stop := runManager(t, b, t.TempDir(), def)
	defer stop()
	out := b.consume(t, "drv.out", len(fromDriver)-nDLQ, 60*time.Second, time.Second)
	dlq := b.consume(t, "drv.dlq", nDLQ, 30*time.Second, 500*time.Millisecond)
	var fromRun []string
	for _, r := range append(out, dlq...) {
		fromRun = append(fromRun, outputLine(r.Topic, r.Key, r.Value, func(k string) string { return header(r, k) }))
	}
	slices.Sort(fromDriver)
	slices.Sort(fromRun)
	if !slices.Equal(fromDriver, fromRun) {
		for _, l := range fromDriver {
			if !slices.Contains(fromRun, l) {
				t.Errorf("only the driver wrote: %s", l)
			}
		}
		for _, l := range fromRun {
			if !slices.Contains(fromDriver, l) {
				t.Errorf("only the run wrote: %s", l)
			}
		}
		t.Fatalf("driver: %d records, run: %d", len(fromDriver), len(fromRun))
	}
}

// TestDriverErrors: bad input to the driver is refused with a reason.
func TestDriverErrors(t *testing.T) {
	def := loadDriverRoute(t)
	d, err := NewDriver(def, DriverConfig{Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Send(DriverInput{Partition: 2, Offset: -1, Value: []byte(`{}`)}); err == nil || !strings.Contains(err.Error(), "partitions 0 to 1") {
		t.Errorf("partition 2 of 2: %v", err)
	}
	if err := d.Send(DriverInput{Partition: 0, Offset: 5, Value: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if err := d.Send(DriverInput{Partition: 0, Offset: 3, Value: []byte(`{}`)}); err == nil || !strings.Contains(err.Error(), "next one is 6") {
		t.Errorf("an offset going back: %v", err)
	}
	if _, err := NewDriver(def, DriverConfig{Tables: map[string]operators.Table{"nope": nil}}); err == nil {
		t.Error("a table the route does not have was accepted")
	}
}

// TestDecodeMembersChangesNoOutput: a route that decodes only the members
// its expressions read (rules.Source.DecodeMembers) writes the same values
// as the same route decoding every record whole: records that pass
// untouched, values set changed (spliced into the producer's bytes, also
// across a repartition), explode's copies, dead letters for bad JSON.
func TestDecodeMembersChangesNoOutput(t *testing.T) {
	routes := map[string]string{
		"set-then-dedup": `route: m1
source: { topic: m1, event_time: value.ts, watermark: 1s, idle_timeout: 1s }
sink: { topic: m1.out }
steps:
  - filter: value.amount > 2 && headers.env != "test"
  - set:
      amount: value.amount * 2
      tag: '"big"'
      nested: '{"a": value.user, "n": [1, 2]}'
  - drop_duplicates: { key: value.txn }
  - filter: value.tag == "big"
`,
		"explode-join-window": `route: m2
source: { topic: m2, event_time: value.ts, watermark: 1s, idle_timeout: 1s }
sink: { topic: m2.out }
tables:
  shops: { file: shops.jsonl, key: shop }
steps:
  - explode: { each: value.items, as: item }
  - join: { table: shops, on: value.shop, as: s, missing: keep }
  - set:
      sku: item.sku
      region: s?.region ?? "none"
  - window: { kind: tumbling, size: 1s, key: value.region, aggregate: { n: count(), skus: count_distinct(value.sku) }, emit: on_close }
`,
		"untouched": `route: m3
source: { topic: m3 }
sink: { topic: m3.out, key: value.user }
steps:
  - filter: value.user != "u3"
`,
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "shops.jsonl"),
		[]byte(`{"shop":"s1","region":"eu"}`+"\n"+`{"shop":"s2","region":"us"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var values [][]byte
	for i := range 120 {
		v := map[string]any{"txn": fmt.Sprint("t", i%90), "user": fmt.Sprint("u", i%5), "shop": fmt.Sprint("s", i%3),
			"amount": float64(i%9) + 0.5, "ts": 1767225600000 + i*30, "unread": map[string]any{"deep": []any{i, "x\u00e9", nil}},
			"items": []any{map[string]any{"sku": fmt.Sprint("k", i%4)}, map[string]any{"sku": "k9"}}, "note": "the rest of the record"}
		b, _ := json.Marshal(v)
		values = append(values, b)
		if i%40 == 3 {
			values = append(values, []byte(`{"user": "u1", "amount": 5, "broken": [1, 2`))
		}
	}
	for name, src := range routes {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, name+".yaml")
			if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			def, err := rules.LoadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if !def.Source.DecodeMembers {
				t.Fatalf("the route decodes whole (members %v)", def.Source.Members)
			}
			whole := *def
			whole.Source.DecodeMembers = false
			run := func(d *rules.Route) []string {
				drv, err := NewDriver(d, DriverConfig{Partitions: 2})
				if err != nil {
					t.Fatal(err)
				}
				defer drv.Close()
				for i, v := range values {
					in := DriverInput{Partition: int32(i % 2), Offset: -1, Key: []byte("k"), Value: v}
					if i%7 == 0 {
						in.Headers = []operators.Header{{Key: "env", Value: []byte("test")}}
					}
					if err := drv.Send(in); err != nil {
						t.Fatal(err)
					}
				}
				drv.AdvanceIdle(5 * time.Second)
				var out []string
				for _, o := range drv.Outputs() {
					val := string(o.Value)
					if v, err := jsoncodec.Decode(o.Value); err == nil {
						b, _ := json.Marshal(v) // the value, whatever its layout
						val = string(b)
					}
					hs := ""
					for _, h := range o.Headers {
						hs += h.Key + "=" + string(h.Value) + ";"
					}
					out = append(out, fmt.Sprintf("%s key=%s value=%s headers=%s", o.Topic, o.Key, val, hs))
				}
				return out
			}
			partial, full := run(def), run(&whole)
			if len(full) < 5 {
				t.Fatalf("only %d outputs", len(full))
			}
			if !slices.Equal(partial, full) {
				for i := range max(len(partial), len(full)) {
					var p, f string
					if i < len(partial) {
						p = partial[i]
					}
					if i < len(full) {
						f = full[i]
					}
					if p != f {
						t.Fatalf("output %d differs:\n members: %s\n whole:   %s", i, p, f)
					}
				}
			}
		})
	}
}
