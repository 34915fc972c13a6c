package pipeline

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	if st.TappedRecords == 0 {
		t.Errorf("no record was processed from the tap (share %.2f): the test compared the fetch with itself", st.TappedShare)
	}
	t.Logf("%d records, %d processed from the tap (share %.2f)", n, st.TappedRecords, st.TappedShare)
}

// The tap's ordering rule, without a broker: a tapped batch is processed
// only from the task's next offset; one that starts further on is held
// until the offsets reach it; what the fetch delivered already is dropped;
// past maxHeldTaps tapped data is dropped, never waited for.
func TestTapContinuing(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := New(testConfig(Config{Seeds: []string{"127.0.0.1:1"}, StateDir: t.TempDir(), Registerer: reg})) // never dialled
	if err != nil {
		t.Fatal(err)
	}
	r := newRoute(m, newRouteDef("tc", "v1", "tc", "tc.out"))
	tk := &task{r: r, pos: 10}
	batch := func(from, n int64) taskBatch {
		var recs []*kgo.Record
		for o := from; o < from+n; o++ {
			recs = append(recs, &kgo.Record{Offset: o})
		}
		return taskBatch{recs: recs, tapped: true}
	}
	offsets := func(recs []*kgo.Record) string {
		var s []string
		for _, r := range recs {
			s = append(s, strconv.FormatInt(r.Offset, 10))
		}
		return strings.Join(s, ",")
	}
	if got := offsets(tk.continuing(batch(10, 3))); got != "10,11,12" {
		t.Errorf("a batch at the next offset: %q, want it whole", got)
	}
	if got := tk.continuing(batch(5, 3)); got != nil {
		t.Errorf("a batch the fetch delivered already: %q, want it dropped", offsets(got))
	}
	if got := offsets(tk.continuing(batch(8, 4))); got != "10,11" {
		t.Errorf("a batch straddling the next offset: %q, want its tail from 10", got)
	}
	if got := tk.continuing(batch(15, 2)); got != nil || len(tk.held) != 1 {
		t.Fatalf("a batch beyond a gap: %q, %d held; want it held", offsets(got), len(tk.held))
	}
	if got := tk.heldContinuing(); got != nil {
		t.Errorf("before the fetch fills the gap: %q, want nothing", offsets(got))
	}
	tk.pos = 16 // the fetch processed 10..15
	if got := offsets(tk.heldContinuing()); got != "16" || len(tk.held) != 0 {
		t.Errorf("after the fetch reached it: %q (%d held), want 16 and nothing held", got, len(tk.held))
	}
	for i := range maxHeldTaps + 3 {
		tk.continuing(batch(int64(100+10*i), 1))
	}
	if len(tk.held) != maxHeldTaps {
		t.Errorf("%d batches held, want at most %d", len(tk.held), maxHeldTaps)
	}
	if d := gathered(t, reg, "rtproxy_route_tap_dropped_batches_total"); d != 3 {
		t.Errorf("tap dropped batches = %v, want the 3 over the bound", d)
	}
}
