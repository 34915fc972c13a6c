package pipeline

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

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

// TestDeadLetterTimestamps: a dead letter carries its source record's
// timestamp, as an output does, in the live route and in the Driver that
// `rtproxy test` runs (issue 26): it used to get the time it was written
// (the producer's clock live, the test clock in the Driver).
func TestDeadLetterTimestamps(t *testing.T) {
	base := time.Now().Add(-2 * time.Hour).Truncate(time.Millisecond)
	def := newRouteDef("dlts", "v1", "dlts", "dlts.out", filterStep(t, 0, "value.n > 0"))

	t.Run("live", func(t *testing.T) {
		b := startBroker(t, map[string]int{"dlts": 1})
		_, _ = runManager(t, b, t.TempDir(), def)
		for i := range 3 {
			r := &kgo.Record{Topic: "dlts", Key: []byte(fmt.Sprint(i)), Value: []byte("not json"), Timestamp: base.Add(time.Duration(i) * time.Minute)}
			b.produce(t, r)
		}
		for _, r := range b.consume(t, "dlts.dlq", 3, 20*time.Second, 0) {
			var i int
			fmt.Sscan(string(r.Key), &i)
			if want := base.Add(time.Duration(i) * time.Minute); !r.Timestamp.Equal(want) {
				t.Errorf("dead letter of record %d: timestamp %v, want its source's %v", i, r.Timestamp, want)
			}
		}
	})
	t.Run("driver", func(t *testing.T) {
		d, err := NewDriver(def, DriverConfig{Partitions: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		for i := range 3 {
			if err := d.Send(DriverInput{Key: []byte(fmt.Sprint(i)), Value: []byte("not json"), Offset: -1, Timestamp: base.Add(time.Duration(i) * time.Minute)}); err != nil {
				t.Fatal(err)
			}
		}
		n := 0
		for _, o := range d.Outputs() {
			if !o.DeadLetter {
				continue
			}
			var i int
			fmt.Sscan(string(o.Key), &i)
			if want := base.Add(time.Duration(i) * time.Minute); !o.Timestamp.Equal(want) {
				t.Errorf("driver dead letter of record %d: timestamp %v, want its source's %v (the clock is %v)", i, o.Timestamp, want, d.Now())
			}
			n++
		}
		if n != 3 {
			t.Fatalf("%d dead letters, want 3", n)
		}
	})
}
