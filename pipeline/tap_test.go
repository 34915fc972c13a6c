package pipeline

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Tapped batches continue a task's offsets or wait for the fetch; the
// route's outputs are exactly those of the fetch alone: each source record
// once, in offset order. Records are produced in rounds; each round's
// acknowledged records are also tapped (as the proxy does), sometimes
// twice, sometimes ahead of untapped records of "another producer" that
// the fetch must bring first.
func TestTapOutputsMatchTheFetch(t *testing.T) {
	b := startBroker(t, map[string]int{"tp": 1})
	def := newRouteDef("tp", "v1", "tp", "tp.out", setStep(t, 0, [][2]string{{"tag", `"seen"`}}))
	m, _ := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir()}, def)
	waitFor(t, 30*time.Second, "the route owns its partition", func() bool {
		rs := m.Routes()
		return len(rs) == 1 && len(rs[0].Partitions) == 1
	})
	cl := b.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	produce := func(from, n int) (int64, []TapRecord) {
		var rs []*kgo.Record
		for i := from; i < from+n; i++ {
			rs = append(rs, jsonRecord("tp", strconv.Itoa(i), map[string]any{"n": i}))
		}
		res := cl.ProduceSync(ctx, rs...)
		if err := res.FirstErr(); err != nil {
			t.Fatal(err)
		}
		var trs []TapRecord
		for _, r := range rs {
			trs = append(trs, TapRecord{Key: r.Key, Value: r.Value, Timestamp: r.Timestamp})
		}
		return rs[0].Offset, trs
	}
	n := 0
	for round := range 30 {
		if round%5 == 4 {
			// Another producer's records, not tapped: the next tapped
			// batch starts beyond what the task has seen until the fetch
			// brings these.
			produce(n, 7)
			n += 7
		}
		base, trs := produce(n, 10)
		n += 10
		m.Tapped("tp", 0, base, trs)
		if round%3 == 0 {
			m.Tapped("tp", 0, base, trs) // the same acknowledgement twice
		}
	}
	out := b.consume(t, "tp.out", n, 30*time.Second, time.Second)
	if len(out) != n {
		t.Fatalf("sink holds %d records, want %d (one per source record)", len(out), n)
	}
	for i, r := range out {
		want := fmt.Sprintf("tp/0/%d", i)
		if got := header(r, HeaderSource); got != want {
			t.Fatalf("output %d names %s, want %s (every source record once, in offset order)", i, got, want)
		}
		if !strings.Contains(string(r.Value), fmt.Sprintf(`"n":%d`, i)) || !strings.Contains(string(r.Value), `"tag":"seen"`) {
			t.Fatalf("output %d: %s", i, r.Value)
		}
	}
	st := m.Routes()[0]
	t.Logf("%d records, %d processed from the tap (share %.2f)", n, st.TappedRecords, st.TappedShare)
}
