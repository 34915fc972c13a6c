package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/rules"
)

// TestExplodeThenWindow runs a rule file with explode before a keyed
// window: one order becomes one record per line, the lines are shuffled by
// sku through the window's repartition topic (several outputs of one
// source record, told apart by their seq), and every (sku, window) row
// counts each line exactly once.
func TestExplodeThenWindow(t *testing.T) {
	const parts, orders = 3, 150
	b := startBroker(t, map[string]int{"orders": parts})
	dir := t.TempDir()
	rule := `route: sku-qty
source: { topic: orders, event_time: value.ts, watermark: 5s, idle_timeout: 3s }
sink: { topic: sku-qty.out }
checkpoint_interval: 200ms
steps:
  - explode: { each: value.lines, as: line }
  - filter: line.qty > 0
  - window:
      kind: tumbling
      size: 1s
      key: line.sku
      aggregate: { lines: count(), qty: sum(line.qty) }
`
	if err := os.WriteFile(filepath.Join(dir, "r.yaml"), []byte(rule), 0o600); err != nil {
		t.Fatal(err)
	}
	def, err := rules.LoadFile(filepath.Join(dir, "r.yaml"))
	if err != nil {
		t.Fatal(err)
	}

	type winKey struct {
		sku   string
		start int64
	}
	type sums struct{ lines, qty int }
	want := map[winKey]*sums{}
	var rs []*kgo.Record
	for i := range orders {
		var lines []map[string]any
		for j := range i % 4 { // 0 to 3 lines; qty 0 is filtered out after the explode
			sku := fmt.Sprint("s", (i+j)%5)
			qty := (i + j) % 3
			lines = append(lines, map[string]any{"sku": sku, "qty": qty})
			if qty > 0 {
				wk := winKey{sku, int64(20*i) / 1000 * 1000}
				if want[wk] == nil {
					want[wk] = &sums{}
				}
				want[wk].lines++
				want[wk].qty += qty
			}
		}
		r := jsonRecord("orders", fmt.Sprint("o", i), map[string]any{"id": i, "ts": 20 * i, "lines": lines})
		r.Partition = int32(i % parts)
		rs = append(rs, r)
	}
	// Every partition's event time moves far ahead, closing every window.
	for p := range int32(parts) {
		r := jsonRecord("orders", "close", map[string]any{"ts": 60000, "lines": []any{map[string]any{"sku": "close", "qty": 1}}})
		r.Partition = p
		rs = append(rs, r)
	}
	cl := b.client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), Registerer: reg}, def)

	out := b.consume(t, "sku-qty.out", len(want), 30*time.Second, 500*time.Millisecond)
	got := map[winKey]bool{}
	for _, r := range out {
		var v struct {
			Key         string
			WindowStart int64 `json:"window_start"`
			Lines, Qty  int
		}
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("row %s: %v", r.Value, err)
		}
		if v.Key == "close" {
			continue
		}
		wk := winKey{v.Key, v.WindowStart}
		if got[wk] {
			t.Errorf("window %v emitted twice: %s", wk, r.Value)
		}
		got[wk] = true
		w := want[wk]
		if w == nil {
			t.Errorf("unexpected row %s", r.Value)
			continue
		}
		if v.Lines != w.lines || v.Qty != w.qty {
			t.Errorf("window %v: lines=%d qty=%d, want lines=%d qty=%d", wk, v.Lines, v.Qty, w.lines, w.qty)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d windows in the sink, want %d", len(got), len(want))
	}
	if dl := gathered(t, reg, "rtproxy_pipeline_dead_letters_total"); dl != 0 {
		t.Errorf("%v dead letters, want none", dl)
	}
}

// TestExplodeDeadLetterKeepsChanges: a dead letter after an explode
// carries the value as it was when it failed, with what a set before the
// explode and one after it changed (docs/RULES.md, dead_letter), not the
// bytes the record arrived with; in a source segment and past a
// repartition. The copies an explode made of a value a step had changed
// used to look unchanged, so their dead letters went out as the original
// bytes (test/shapes seed 249 found it).
func TestExplodeDeadLetterKeepsChanges(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		t.Run(fmt.Sprint("repartitioned=", keyed), func(t *testing.T) {
			dir := t.TempDir()
			dedup := ""
			if keyed {
				dedup = "  - drop_duplicates: { key: value.id }\n"
			}
			rule := `route: exdl
source: { topic: in, event_time: value.ts }
sink: { topic: out }
tables:
  tb: { file: tb.jsonl, key: id }
steps:
` + dedup + `  - set: { a: value.a + 2 }
  - explode: { each: value.tags, as: tg }
  - set: { tag: tg }
  - join: { table: tb, on: value.k, as: tb, missing: dead_letter }
`
			if err := os.WriteFile(filepath.Join(dir, "tb.jsonl"), []byte(`{"id":"known"}`+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "r.yaml"), []byte(rule), 0o600); err != nil {
				t.Fatal(err)
			}
			def, err := rules.LoadFile(filepath.Join(dir, "r.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			d, err := NewDriver(def, DriverConfig{})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if err := d.Send(DriverInput{Offset: -1, Key: []byte("r1"), Value: []byte(`{"id":"r1","a":1,"k":"none","tags":["t0","t1"],"ts":1767225600000}`)}); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, o := range d.Outputs() {
				if !o.DeadLetter {
					t.Errorf("output %s, want dead letters only", o.Value)
					continue
				}
				var v map[string]any
				if err := json.Unmarshal(o.Value, &v); err != nil {
					t.Fatal(err)
				}
				got = append(got, fmt.Sprint(v["a"], "/", v["tag"]))
			}
			if want := []string{"3/t0", "3/t1"}; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("dead letters (a/tag) %v, want %v: the value as the join saw it", got, want)
			}
		})
	}
}
