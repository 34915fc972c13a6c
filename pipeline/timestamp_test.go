package pipeline

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/rtproxy/rtproxy/operators"
)

// TestOutputTimestamps: an output record carries its source record's
// timestamp, across a repartition too, and a window row carries
// window_end − 1, as docs/RULES.md says. Rows used to get the time they
// were produced, which consumers and time-based retention misread (issue
// 14).
func TestOutputTimestamps(t *testing.T) {
	b := startBroker(t, map[string]int{"ts": 2, "tw": 2})
	agg := []operators.Aggregate{{Name: "n", Func: operators.AggCount}}
	win := newRouteDef("tw", "v1", "tw", "tw.out",
		dedupStep(t, 0, "value.id"),
		windowStep(t, 1, operators.WindowSpec{Kind: "tumbling", Size: time.Second, Key: expr(t, "value.k"), Aggregates: agg}))
	win.Source.IdleTimeout = time.Second
	_, _ = runManager(t, b, t.TempDir(), newRouteDef("ts", "v1", "ts", "ts.out", filterStep(t, 0, "true")), win)

	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	for i := range 4 {
		r := jsonRecord("ts", fmt.Sprint(i), map[string]any{"n": i})
		r.Timestamp = base.Add(time.Duration(i) * time.Minute)
		b.produce(t, r)
		w := jsonRecord("tw", fmt.Sprint(i), map[string]any{"id": i, "k": "a"})
		w.Timestamp = base.Add(time.Duration(i) * 300 * time.Millisecond)
		b.produce(t, w)
	}
	for _, r := range b.consume(t, "ts.out", 4, 20*time.Second, 0) {
		var v struct{ N int }
		json.Unmarshal(r.Value, &v)
		if want := base.Add(time.Duration(v.N) * time.Minute); !r.Timestamp.Equal(want) {
			t.Errorf("output of record %d: timestamp %v, want its source's %v", v.N, r.Timestamp, want)
		}
	}
	// 0, 300, 600, 900 ms after base: one window [base, base+1s), closed
	// once the partitions idle.
	rows := b.consume(t, "tw.out", 1, 30*time.Second, 0)
	var v struct {
		N         int   `json:"n"`
		WindowEnd int64 `json:"window_end"`
	}
	if err := json.Unmarshal(rows[0].Value, &v); err != nil {
		t.Fatal(err)
	}
	if want := time.UnixMilli(v.WindowEnd - 1); v.N != 4 || !rows[0].Timestamp.Equal(want) {
		t.Errorf("window row %s: timestamp %v, want window_end − 1 = %v", rows[0].Value, rows[0].Timestamp, want)
	}
}
