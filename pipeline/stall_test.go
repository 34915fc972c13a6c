package pipeline

// Chained keyed steps keep time (issue 24, invariant "markers reach every
// repartition partition"): a window behind drop_duplicates closes every
// window the source's watermark passed, soon after the last record,
// however fast the records come and wherever they were partitioned.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
)

// stallRoute is the quickstart-shaped route of the issue: a filter, a
// drop_duplicates (keyed, not timed: it only passes the watermark on), a
// sliding window keyed by another field, and a filter on the rows.
const stallRoute = `route: payments-sliding
source: { topic: payments, event_time: value.ts, watermark: 10s, idle_timeout: 30s }
sink: { topic: payments.sliding }
checkpoint_interval: 500ms
steps:
  - filter: value.amount > 0 && value.status != "test"
  - drop_duplicates: { key: value.txn_id }
  - window: { kind: sliding, size: 2m, slide: 1m, key: value.user_id, emit: on_close,
              aggregate: { n: count(), total: sum(value.amount) } }
  - filter: value.n >= 2
`

func loadStallRoute(t *testing.T) *rules.Route {
	t.Helper()
	p := filepath.Join(t.TempDir(), "payments.yaml")
	if err := os.WriteFile(p, []byte(stallRoute), 0o644); err != nil {
		t.Fatal(err)
	}
	def, err := rules.LoadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return def
}

// stallPayment is one generated payment and the partition it goes to.
type stallPayment struct {
	part  int32
	value []byte
}

// stallWindow is an expected row: user and window start, count and total.
type stallWindow struct {
	user  string
	start int64
}

type stallSums struct{ n, total int64 }

const stallBase = int64(1767225600000) // 2026-01-01T00:00:00Z

// stallInputs makes n payments over parts partitions, event times over
// span with up to 5 s of disorder per partition (less than the 10 s
// watermark, so nothing is late), some filtered out (status "test", a
// zero amount), and every seventh a duplicate copy with the same value on
// the next partition. It returns them in produce order and the windows a
// brute force over the unique passing payments expects once the
// watermark passed all of them. closer adds, on every partition, one
// payment far ahead in event time, so every window of the others closes
// (its own windows never do).
func stallInputs(rng *rand.Rand, n, parts, users int, span time.Duration, closer bool) ([]stallPayment, map[stallWindow]stallSums, int64) {
	var out []stallPayment
	want := map[stallWindow]stallSums{}
	step := span.Milliseconds() / int64(n)
	var maxEv int64
	for i := range n {
		ev := stallBase + int64(i)*step + rng.Int64N(5000)
		maxEv = max(maxEv, ev)
		user := fmt.Sprint("u", rng.IntN(users))
		amount := 1 + rng.Int64N(500)
		status := "ok"
		switch rng.IntN(20) {
		case 0:
			status = "test"
		case 1:
			amount = 0
		}
		v, _ := json.Marshal(map[string]any{"txn_id": fmt.Sprint("t", i), "user_id": user, "amount": amount, "status": status, "ts": ev})
		p := int32(rng.IntN(parts))
		out = append(out, stallPayment{p, v})
		if i%7 == 0 {
			out = append(out, stallPayment{(p + 1) % int32(parts), v})
		}
		if amount <= 0 || status == "test" {
			continue
		}
		const size, slide = 120000, 60000
		for s := ev / slide * slide; s > ev-size; s -= slide {
			k := stallWindow{user, s}
			w := want[k]
			w.n++
			w.total += amount
			want[k] = w
		}
	}
	for k, w := range want {
		if w.n < 2 {
			delete(want, k)
		}
	}
	if closer {
		for p := range parts {
			v, _ := json.Marshal(map[string]any{"txn_id": fmt.Sprint("close", p), "user_id": "close", "amount": 1, "status": "ok",
				"ts": maxEv + 20*time.Minute.Milliseconds()})
			out = append(out, stallPayment{int32(p), v})
		}
	}
	return out, want, maxEv
}

// stallRows reads window rows into the form of want.
func stallRows(t *testing.T, vals [][]byte) map[stallWindow]stallSums {
	t.Helper()
	got := map[stallWindow]stallSums{}
	for _, b := range vals {
		var v struct {
			Key   string  `json:"key"`
			Start int64   `json:"window_start"`
			N     int64   `json:"n"`
			Total float64 `json:"total"`
		}
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("row %s: %v", b, err)
		}
		k := stallWindow{v.Key, v.Start}
		if _, dup := got[k]; dup {
			t.Errorf("window %v emitted twice", k)
		}
		got[k] = stallSums{v.N, int64(v.Total)}
	}
	return got
}

func compareStallRows(t *testing.T, got, want map[stallWindow]stallSums) {
	t.Helper()
	missing := 0
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			missing++
			if missing <= 5 {
				t.Errorf("window %v (n=%d) never emitted", k, w.n)
			}
		case g != w:
			t.Errorf("window %v: n=%d total=%d, want n=%d total=%d", k, g.n, g.total, w.n, w.total)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("window %v emitted, not expected", k)
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d windows never emitted", missing, len(want))
	}
}

// TestChainedKeyedStepsKeepTimeDriver: through the Driver, with no idle
// advance at all, every window the records' own watermark passed is
// emitted as soon as the records are in, on one partition (where every
// repartition record of a writer goes to the same reader) and on four.
// The drop_duplicates segment reads no watermark itself but passes it
// on: it must learn its writers' frontiers from the records they carry,
// not only from markers, because a writer sends no marker to a partition
// its records already brought that frontier to.
func TestChainedKeyedStepsKeepTimeDriver(t *testing.T) {
	for _, parts := range []int{1, 4} {
		t.Run(fmt.Sprint(parts), func(t *testing.T) {
			def := loadStallRoute(t)
			rng := rand.New(rand.NewPCG(uint64(parts), 24))
			in, all, _ := stallInputs(rng, 2000, parts, 40, 10*time.Minute, false)
			d, err := NewDriver(def, DriverConfig{Partitions: parts})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			// After every 25th record (and the last), the rows written so
			// far are exactly the windows the watermark every task has
			// reached by then passed: the lowest partition's newest event
			// time minus the 10 s allowed lateness.
			maxEv := make([]int64, parts)
			check := func(n int) {
				t.Helper()
				wm := slices.Min(maxEv) - 10000
				want := map[stallWindow]stallSums{}
				for k, w := range all {
					if k.start+120000 <= wm {
						want[k] = w
					}
				}
				var vals [][]byte
				for _, o := range d.Outputs() {
					if o.DeadLetter {
						t.Fatalf("dead letter: %s", o.Value)
					}
					vals = append(vals, o.Value)
				}
				compareStallRows(t, stallRows(t, vals), want)
				if t.Failed() {
					t.Fatalf("after %d of %d records (watermark %s)", n, len(in), time.UnixMilli(wm).UTC().Format(time.RFC3339))
				}
			}
			for i, p := range in {
				var v struct{ Ts int64 }
				json.Unmarshal(p.value, &v)
				maxEv[p.part] = max(maxEv[p.part], v.Ts)
				if err := d.Send(DriverInput{Partition: p.part, Offset: -1, Value: p.value}); err != nil {
					t.Fatal(err)
				}
				if i%25 == 24 && !slices.Contains(maxEv, 0) {
					check(i + 1)
				}
			}
			check(len(in))
			if e := d.Errors(); e != "" {
				t.Errorf("route error: %s", e)
			}
		})
	}
}

// TestChainedKeyedStepsKeepTime: the reproduction, live on kfake.
// 8 partitions, payments over 10 minutes of event time with 5 s of
// disorder produced in one burst (thousands a second, far faster than
// the 20 ms between a writer's markers), then one payment per partition
// 20 minutes ahead. Every window must be written within 10 s of the last
// record: well inside idle_timeout (30 s), so idleness cannot be what
// closes them.
func TestChainedKeyedStepsKeepTime(t *testing.T) {
	const parts = 8
	def := loadStallRoute(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 24))
	in, want, _ := stallInputs(rng, 6000, parts, 150, 10*time.Minute, true)
	b := startBroker(t, map[string]int{"payments": parts})

	reg := prometheus.NewRegistry()
	m, stop := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), Registerer: reg}, def)
	defer stop()
	waitFor(t, 30*time.Second, "the route owns its partitions", func() bool {
		for _, s := range m.Routes() {
			if s.Name == def.Name && s.State == "running" && len(s.Owned) == 3*parts {
				return true
			}
		}
		return false
	})

	rs := make([]*kgo.Record, len(in))
	for i, p := range in {
		rs[i] = &kgo.Record{Topic: "payments", Partition: p.part, Value: p.value}
	}
	cl := b.client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	last := time.Now()

	reader := b.client(t, kgo.ConsumeTopics("payments.sliding"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(50*time.Millisecond))
	var vals [][]byte
	deadline := last.Add(10 * time.Second)
	for len(vals) < len(want) && time.Now().Before(deadline) {
		pctx, pcancel := context.WithDeadline(context.Background(), deadline)
		for _, r := range reader.PollFetches(pctx).Records() {
			vals = append(vals, r.Value)
		}
		pcancel()
	}
	took := time.Since(last)
	// A little longer for rows that should not be there.
	qctx, qcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	for qctx.Err() == nil {
		for _, r := range reader.PollFetches(qctx).Records() {
			vals = append(vals, r.Value)
		}
	}
	qcancel()
	got := stallRows(t, vals)
	if len(got) < len(want) {
		for _, s := range m.Routes() {
			for _, o := range s.Owned {
				if o.Watermark != nil {
					t.Logf("%s[%d]: watermark %s", o.Topic, o.Partition, o.Watermark.Format(time.RFC3339))
				}
			}
		}
	}
	compareStallRows(t, got, want)
	t.Logf("%d payments, %d windows written %v after the last record", len(in), len(got), took.Round(time.Millisecond))
}

// TestStatusNamesTheWriterHoldingAWatermark: /routes shows, for every
// keyed partition that keeps a watermark, the upstream partition it waits
// for: a partition stuck behind the others names the writer whose
// frontier does not reach it.
func TestStatusNamesTheWriterHoldingAWatermark(t *testing.T) {
	def := loadStallRoute(t)
	d, err := NewDriver(def, DriverConfig{Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	send := func(p int32, txn string, ts int64) {
		v, _ := json.Marshal(map[string]any{"txn_id": txn, "user_id": "u1", "amount": 5, "status": "ok", "ts": ts})
		if err := d.Send(DriverInput{Partition: p, Offset: -1, Value: v}); err != nil {
			t.Fatal(err)
		}
	}
	st := d.r.status()
	for _, o := range st.Owned {
		if o.HeldBy != nil && o.Topic != def.Source.Topic && o.HeldBy.Frontier != nil {
			t.Errorf("%s[%d] held by %+v before any record", o.Topic, o.Partition, *o.HeldBy)
		}
	}
	// Partition 1 stops early; partition 0 goes on for five minutes.
	send(1, "a", stallBase+1000)
	for i := range 30 {
		send(0, fmt.Sprint("b", i), stallBase+int64(i)*10000)
	}
	st = d.r.status()
	dedup, win := 0, 0
	for _, o := range st.Owned {
		switch o.Topic {
		case def.Source.Topic:
			if o.HeldBy != nil {
				t.Errorf("source partition %d has a holder: %+v", o.Partition, *o.HeldBy)
			}
		case "payments-sliding.01-drop_duplicates.repartition":
			dedup++
			h := o.HeldBy
			if h == nil || h.Writer != 1 || h.Frontier == nil || h.Frontier.UnixMilli() != stallBase+1000-10000 || h.LastHeard == nil {
				t.Errorf("%s[%d] held by %+v, want writer 1 at its frontier", o.Topic, o.Partition, h)
			}
		case "payments-sliding.02-window.repartition":
			win++
			if h := o.HeldBy; h == nil || h.Frontier == nil || h.Frontier.UnixMilli() != stallBase+1000-10000 {
				t.Errorf("%s[%d] held by %+v, want a drop_duplicates partition at source partition 1's frontier", o.Topic, o.Partition, h)
			}
		}
	}
	if dedup != 2 || win != 2 {
		t.Errorf("status lists %d drop_duplicates and %d window partitions, want 2 and 2", dedup, win)
	}
}

// TestRowsOfOneAdvanceReachTheNextWindowTogether: the rows a window emits
// when its watermark moves carry the frontier from before that move, and
// the new one follows them (a marker): otherwise the first row would
// carry a watermark past the others' event time (window_end − 1), and
// the next window would close before the rest arrived, counting them
// late. Found by the differential test of shapes (test/shapes).
func TestRowsOfOneAdvanceReachTheNextWindowTogether(t *testing.T) {
	const src = `route: rows
source: { topic: rows, event_time: value.ts, watermark: 0s, idle_timeout: 30s }
sink: { topic: rows.out }
steps:
  - window: { kind: tumbling, size: 1s, key: value.k, aggregate: { n: count() } }
  - window: { kind: tumbling, size: 1s, key: '"all"', aggregate: { keys: count(), n: sum(value.n) } }
`
	p := filepath.Join(t.TempDir(), "rows.yaml")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	def, err := rules.LoadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, parts := range []int{1, 3} {
		t.Run(fmt.Sprint(parts), func(t *testing.T) {
			d, err := NewDriver(def, DriverConfig{Partitions: parts})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			send := func(p int32, k string, ts int64) {
				v, _ := json.Marshal(map[string]any{"k": k, "ts": stallBase + ts})
				if err := d.Send(DriverInput{Partition: p, Offset: -1, Value: v}); err != nil {
					t.Fatal(err)
				}
			}
			// Five keys in the first second, then every partition past it.
			for i, k := range []string{"a", "b", "c", "d", "e"} {
				send(int32(i%parts), k, int64(100*(i+1)))
			}
			for p := range parts {
				send(int32(p), "z", 1500)
			}
			d.AdvanceWatermark(time.UnixMilli(stallBase + 10000))
			var rows []string
			for _, o := range d.Outputs() {
				if o.DeadLetter {
					t.Errorf("dead letter: %s", o.Value)
					continue
				}
				rows = append(rows, string(o.Value))
			}
			want := []string{
				fmt.Sprintf(`{"key":"all","keys":5,"n":5,"window_end":%d,"window_start":%d}`, stallBase+1000, stallBase),
				fmt.Sprintf(`{"key":"all","keys":1,"n":%d,"window_end":%d,"window_start":%d}`, parts, stallBase+2000, stallBase+1000),
			}
			if !slices.Equal(rows, want) {
				t.Errorf("rows:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// TestDeadLetterCarriesTheValueAsItFailed: a record that fails after a
// set or a map is a dead letter with the value as it was when it failed
// (docs/RULES.md, dead_letter), in the segment that changed it as across
// a repartition; one no step changed keeps its bytes as they came. Found
// by the differential test of shapes (test/shapes): the same failure gave
// the source bytes before a keyed step and the changed value after one.
func TestDeadLetterCarriesTheValueAsItFailed(t *testing.T) {
	const src = `route: dlv
source: { topic: dlv }
sink: { topic: dlv.out }
steps:
  - set: { g: value.g + "!" }
  - filter: value.a > 1
  - map: { a: value.a, g: value.g, b: value.a * 2 }
  - drop_duplicates: { key: value.g }
  - set: { c: value.b + 1 }
  - filter: value.a < 100
`
	p := filepath.Join(t.TempDir(), "dlv.yaml")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	def, err := rules.LoadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	d, err := NewDriver(def, DriverConfig{Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, v := range []string{
		`{"a": "x", "g": "s", "zz": 1}`, // fails at step 1, after the set
		`{"a": 5, "g": 1}`,              // fails at step 0 (string + int): as it came
		`{"a": 5, "g": "t", "zz": 1}`,   // passes
	} {
		if err := d.Send(DriverInput{Partition: 0, Offset: -1, Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, o := range d.Outputs() {
		got = append(got, fmt.Sprintf("dl=%v %s %s", o.DeadLetter, headerOf(o.Headers, HeaderStep), o.Value))
	}
	want := []string{
		`dl=true 1:filter {"a":"x","g":"s!","zz": 1}`,
		`dl=true 0:set {"a": 5, "g": 1}`,
		`dl=false  {"a":5,"b":10,"c":11,"g":"t!"}`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("wrote:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func headerOf(hs []operators.Header, k string) string {
	for _, h := range hs {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}

// TestIdleAdvanceWhileRecordsFlow: a keyed task's watermark moved by the
// idle loop (a writer went idle) while its dispatch goroutine runs records
// through the same window: both run the task's chain, so the task's steps
// lock keeps them apart (run it with -race). Every row is the brute-force
// count of its window, and no record is late.
func TestIdleAdvanceWhileRecordsFlow(t *testing.T) {
	const src = `route: idlerace
source: { topic: idlerace, event_time: value.ts, watermark: 0s, idle_timeout: 300ms }
sink: { topic: idlerace.out }
steps:
  - window: { kind: tumbling, size: 100ms, key: value.k, aggregate: { n: count() } }
`
	p := filepath.Join(t.TempDir(), "idlerace.yaml")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	def, err := rules.LoadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b := startBroker(t, map[string]int{"idlerace": 2})
	m, stop := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), Registerer: prometheus.NewRegistry()}, def)
	defer stop()
	waitFor(t, 30*time.Second, "the route owns its partitions", func() bool {
		for _, s := range m.Routes() {
			if s.State == "running" && len(s.Owned) == 4 {
				return true
			}
		}
		return false
	})
	cl := b.client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	rec := func(p int32, k string, ts int64) *kgo.Record {
		v, _ := json.Marshal(map[string]any{"k": k, "ts": ts})
		return &kgo.Record{Topic: "idlerace", Partition: p, Value: v}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Partition 1 speaks once and goes quiet; partition 0 streams for 1.5 s
	// of wall clock, so partition 1 turns idle while records flow.
	if err := cl.ProduceSync(ctx, rec(1, "a", stallBase)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	want := map[int64]int{}
	ts := stallBase
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); {
		var rs []*kgo.Record
		for range 20 {
			ts += 7
			rs = append(rs, rec(0, "a", ts))
			want[ts/100*100]++
		}
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	want[stallBase/100*100]++ // partition 1's record
	// The window holding the last record, and those after the watermark,
	// stay open: compare the windows that closed.
	last := ts / 100 * 100
	n := 0
	for s := range want {
		if s < last-100 {
			n++
		}
	}
	out := b.consume(t, "idlerace.out", n, 20*time.Second, 0)
	for _, r := range out {
		var v struct {
			Start int64 `json:"window_start"`
			N     int   `json:"n"`
		}
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatal(err)
		}
		if v.N != want[v.Start] {
			t.Errorf("window %d: n=%d, want %d", v.Start, v.N, want[v.Start])
		}
	}
	for _, s := range m.Routes() {
		if s.LastError != "" {
			t.Errorf("route error: %s", s.LastError)
		}
	}
}
