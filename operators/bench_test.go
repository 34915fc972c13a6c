package operators

// Benchmarks of issue 3, on 1 KiB payment-like JSON records. Each has a
// "json" variant that includes jsoncodec.Decode of the input and
// jsoncodec.Append of every output (what the pipeline pays per record) and
// an "op" variant on already-decoded values (the operator alone). Steps
// that leave the value unchanged also have "json-raw": decoded with
// Record.SetJSON, and the sink forwards Record.ValueBytes instead of
// encoding (what a pipeline using ValueBytes would pay). The json inputs cycle through 4096 distinct
// payments (ids, amounts, times, ips differ) with the benchmark's key
// stamped in, so the decoder's intern caches see a realistic mix of
// repeated and fresh values, not one record over and over. Run:
//
//	go test -run '^$' -bench . -benchmem -cpu 1 ./operators/
//
// Each benchmark drives b.N records through one goroutine; rec/s is records
// in per second of wall clock, cpu-rec/s per second of the process's CPU
// time (GC included), which with -cpu 1 is the cost on one core.

import (
	"bytes"
	"fmt"
	mathrand "math/rand"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/google/btree"

	"github.com/rtproxy/rtproxy/internal/benchkit"
	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/state"
)

// Offsets of the fixed-width ids in a payment: benchmarks stamp distinct
// ids into one buffer instead of keeping 100k payloads (or, worse, 100k
// decoded objects, whose GC scanning would swamp what is measured).
const (
	txnAt      = len(`{"txn_id":"txn-`)
	userAt     = len(`{"txn_id":"txn-00000000","user_id":"user-`)
	merchantAt = len(`{"txn_id":"txn-00000000","user_id":"user-00000","merchant_id":"m-`)
)

// stamp writes i as the last width decimal digits at b[at:].
func stamp(b []byte, at, width, i int) {
	for j := at + width - 1; j >= at; j-- {
		b[j] = byte('0' + i%10)
		i /= 10
	}
}

func stampTxn(b []byte, i int) { stamp(b, txnAt, 8, i) }

// encodeSink encodes every emitted record like the sink writer does.
type encodeSink struct {
	buf     []byte
	n, dead int
}

func (s *encodeSink) Emit(r *Record) {
	var err error
	s.buf, err = jsoncodec.Append(s.buf[:0], r.Value)
	if err != nil {
		panic(err)
	}
	s.n++
}

func (s *encodeSink) DeadLetter(*Record, Reason, error) { s.dead++ }
func (s *encodeSink) counts() (int, int)                { return s.n, s.dead }

// rawSink is encodeSink for a pipeline that forwards the received bytes of
// a record whose value no step changed (Record.ValueBytes) and encodes the
// others. Records must come from SetJSON for Raw to be used.
type rawSink struct {
	encodeSink
	forwarded int
}

func (s *rawSink) Emit(r *Record) {
	if raw, ok := r.ValueBytes(); ok {
		s.buf = raw // handed on as is
		s.forwarded++
		s.n++
		return
	}
	s.encodeSink.Emit(r)
}

// memberSink encodes an emitted record as the pipeline's sink does for a
// route that decodes only the members it reads (Record.EncodeValue:
// forwarded, spliced or encoded).
type memberSink struct{ encodeSink }

func (s *memberSink) Emit(r *Record) {
	var err error
	s.buf, err = r.EncodeValue(s.buf[:0])
	if err != nil {
		panic(err)
	}
	s.n++
}

// readsOf is the members a route of these expressions decodes
// (rules.Source.Members).
func readsOf(es ...*Expr) jsoncodec.Fields {
	f := jsoncodec.Fields{}
	for _, e := range es {
		m, whole := e.ValueReads()
		if whole {
			panic("reads value whole: " + e.Source)
		}
		for _, k := range m {
			f[k] = struct{}{}
		}
	}
	return f
}

// decodeAs decodes raw into r as a variant does: "json" whole
// (jsoncodec.Decode), "json-raw" whole and remembering the bytes
// (Record.SetJSON), "json-members" only the members in want
// (Record.SetJSONMembers).
func decodeAs(b *testing.B, mode string, r *Record, raw []byte, want jsoncodec.Fields) {
	var err error
	switch mode {
	case "json":
		r.Value, err = jsoncodec.Decode(raw)
		r.Raw = raw
	case "json-raw":
		err = r.SetJSON(raw)
	case "json-members":
		err = r.SetJSONMembers(raw, want)
	default:
		b.Fatalf("no decoding %q", mode)
	}
	if err != nil {
		b.Fatal(err)
	}
}

// countingSink is a sink that says what it received.
type countingSink interface {
	Emitter
	counts() (int, int)
}

// sinkFor is the sink of a variant: encode everything, forward unchanged
// values (ValueBytes), or encode as the pipeline does (EncodeValue).
func sinkFor(mode string) countingSink {
	switch mode {
	case "json-raw":
		return &rawSink{}
	case "json-members":
		return &memberSink{}
	}
	return &encodeSink{}
}

// countSink only counts.
type countSink struct{ n, dead int }

func (s *countSink) Emit(*Record)                      { s.n++ }
func (s *countSink) DeadLetter(*Record, Reason, error) { s.dead++ }
func (s *countSink) counts() (int, int)                { return s.n, s.dead }

// chain runs steps in order, like the pipeline's operator chain.
type chain struct {
	steps []Step
	i     int
	next  Emitter
}

func (c *chain) Emit(r *Record) {
	if c.i == len(c.steps) {
		c.next.Emit(r)
		return
	}
	s := c.steps[c.i]
	c.i++
	s.Process(r, c)
	c.i--
}

func (c *chain) DeadLetter(r *Record, reason Reason, err error) { c.next.DeadLetter(r, reason, err) }

func (c *chain) run(r *Record) {
	c.i = 0
	c.Emit(r)
}

func mustExpr(b *testing.B, src string, bound ...string) *Expr {
	e, err := CompileExpr(src, bound)
	if err != nil {
		b.Fatal(err)
	}
	return e
}

func decodeAll(b *testing.B, in [][]byte) []any {
	out := make([]any, len(in))
	for i, p := range in {
		v, err := jsoncodec.Decode(p)
		if err != nil {
			b.Fatal(err)
		}
		out[i] = v
	}
	return out
}

// BenchmarkChainFilterSetMap is the filter + set + map chain of issue 3.
func BenchmarkChainFilterSetMap(b *testing.B) {
	exprs := []*Expr{
		mustExpr(b, `value.amount > 0 && value.status != "test"`),
		mustExpr(b, `value.amount / (value.risk.score + 1.0)`),
		mustExpr(b, "value.user_id"), mustExpr(b, "value.amount"), mustExpr(b, "value.risk_adj"), mustExpr(b, "value.merchant_id"),
	}
	steps := []Step{
		NewFilter(exprs[0]),
		NewSet([]Field{{Name: "risk_adj", Expr: exprs[1]}}),
		NewMap([]Field{
			{Name: "user_id", Expr: exprs[2]},
			{Name: "amount", Expr: exprs[3]},
			{Name: "risk", Expr: exprs[4]},
			{Name: "merchant", Expr: exprs[5]},
		}),
	}
	in := benchkit.Inputs(4096)
	want := readsOf(exprs...)
	run := func(b *testing.B, mode string) {
		sink := sinkFor(mode)
		c := &chain{steps: steps, next: sink}
		b.SetBytes(1024)
		b.ReportAllocs()
		i := 0
		cpu0 := benchkit.CPUNow()
		for b.Loop() {
			raw := in[i%len(in)]
			i++
			r := &Record{Key: raw[txnAt : txnAt+8]}
			decodeAs(b, mode, r, raw, want)
			c.run(r)
		}
		benchkit.RecPerSec(b, cpu0)
		if n, dead := sink.counts(); n == 0 || dead != 0 {
			b.Fatalf("emitted %d, dead %d", n, dead)
		}
	}
	b.Run("json", func(b *testing.B) { run(b, "json") })
	b.Run("json-members", func(b *testing.B) { run(b, "json-members") })
	b.Run("op", func(b *testing.B) {
		vals := decodeAll(b, in)
		sink := &countSink{}
		c := &chain{steps: steps, next: sink}
		b.ReportAllocs()
		i := 0
		cpu0 := benchkit.CPUNow()
		for b.Loop() {
			// set writes "risk_adj" into the shared decoded object; it is the
			// same key every time, and map never touches the input.
			c.run(&Record{Value: vals[i%len(vals)]})
			i++
		}
		benchkit.RecPerSec(b, cpu0)
		if sink.n == 0 || sink.dead != 0 {
			b.Fatalf("emitted %d, dead %d", sink.n, sink.dead)
		}
	})
}

// BenchmarkFilter is a route of one filter: with json-raw the sink
// forwards the received bytes (Record.ValueBytes) instead of encoding.
func BenchmarkFilter(b *testing.B) {
	f := NewFilter(mustExpr(b, `value.amount > 0 && value.status != "test"`))
	in := benchkit.Inputs(4096)
	passes := make([]bool, len(in)) // amount is 0.00 for every 500th input
	for i, v := range decodeAll(b, in) {
		passes[i] = v.(map[string]any)["amount"].(float64) > 0
	}
	members := readsOf(f.(*filter).pred)
	run := func(b *testing.B, mode string) {
		sink := sinkFor(mode)
		b.SetBytes(1024)
		b.ReportAllocs()
		i, want := 0, 0
		cpu0 := benchkit.CPUNow()
		for b.Loop() {
			raw := in[i%len(in)]
			if passes[i%len(in)] {
				want++
			}
			i++
			r := &Record{Key: raw[txnAt : txnAt+8]}
			decodeAs(b, mode, r, raw, members)
			f.Process(r, sink)
		}
		benchkit.RecPerSec(b, cpu0)
		if n, dead := sink.counts(); n != want || dead != 0 {
			b.Fatalf("passed %d of %d, want %d, dead %d", n, b.N, want, dead)
		}
	}
	for _, mode := range []string{"json", "json-raw", "json-members"} {
		b.Run(mode, func(b *testing.B) { run(b, mode) })
	}
}

func BenchmarkWindowTumbling10kKeys(b *testing.B) {
	spec := WindowSpec{
		Kind: "tumbling", Size: time.Minute, Key: mustExpr(b, "value.user_id"),
		Aggregates: []Aggregate{
			{Name: "n", Func: AggCount},
			{Name: "total", Func: AggSum, Arg: mustExpr(b, "value.amount")},
			{Name: "top", Func: AggMax, Arg: mustExpr(b, "value.amount")},
			{Name: "mean", Func: AggAvg, Arg: mustExpr(b, "value.amount")},
		},
	}
	members := readsOf(spec.Key, spec.Aggregates[1].Arg)
	run := func(b *testing.B, decode, partial bool) {
		w := NewWindow(spec)
		in := benchkit.Inputs(4096)
		tmpl, _ := jsoncodec.Decode(benchkit.Payment(0))
		users := make([]string, 10000)
		for k := range users {
			users[k] = fmt.Sprintf("user-%05d", k)
		}
		sink := &encodeSink{}
		b.SetBytes(1024)
		b.ReportAllocs()
		i := 0
		cpu0 := benchkit.CPUNow()
		for b.Loop() {
			k := i % 10000 // user_id cycles through 10k keys
			// 1000 records per second of event time: a one-minute window
			// takes 60k updates, 6 per key, then closes.
			t := int64(i)
			var v any
			if decode {
				raw := in[i%len(in)]
				stamp(raw, userAt, 5, k)
				var err error
				if partial {
					v, _, err = jsoncodec.DecodeMembers(raw, members)
				} else {
					v, err = jsoncodec.Decode(raw)
				}
				if err != nil {
					b.Fatal(err)
				}
			} else {
				// The step only reads the value, so one object serves.
				tmpl.(map[string]any)["user_id"] = users[k]
				v = tmpl
			}
			r := &Record{Value: v, EventTime: t}
			if _, err := w.ShuffleKey(r); err != nil {
				b.Fatal(err)
			}
			w.Process(r, sink)
			if i%10000 == 9999 {
				w.(Timed).Advance(t, sink)
			}
			i++
		}
		benchkit.RecPerSec(b, cpu0)
		if sink.dead != 0 {
			b.Fatalf("dead %d", sink.dead)
		}
	}
	b.Run("json", func(b *testing.B) { run(b, true, false) })
	b.Run("json-members", func(b *testing.B) { run(b, true, true) })
	b.Run("op", func(b *testing.B) { run(b, false, false) })
}

// BenchmarkDropDuplicates1MKeys measures a step that already remembers 1M
// keys: the state is filled with 1M other ids first, so every b.N, not
// only -benchtime 1000000x, sees a state of at least 1M keys. Every
// measured record has a new id, so every one passes and is encoded.
//
// The variants run on MemKV, whose keys are in a byte arena the collector
// does not scan (as pebble's memtable and block cache, which hold a
// production step's keys); the "oldkv-" variants on a copy of the MemKV
// before issue 13, a btree of key and value slices, which the collector
// scans key by key; the "pebble-" variants on production's state (package
// state: pebble, with the writes since the last checkpoint in an in-heap
// overlay). Each variant fills a state of its own, so only its own is live
// while it runs.
func BenchmarkDropDuplicates1MKeys(b *testing.B) {
	const keys = 1_000_000
	in := benchkit.Inputs(4096)
	run := func(b *testing.B, mode string, kv KV, checkpoint func()) {
		d := NewDropDuplicates(mustExpr(b, "value.txn_id"), time.Hour, kv)
		fill := map[string]any{"txn_id": ""}
		for k := range keys {
			fill["txn_id"] = fmt.Sprintf("old-%08d", k)
			d.Process(&Record{Value: fill, EventTime: -1}, &countSink{})
		}
		if checkpoint != nil {
			checkpoint()
		}
		runtime.GC() // the filling's garbage is not the benchmark's
		v, _ := jsoncodec.Decode(benchkit.Payment(0))
		tmpl := v.(map[string]any)
		var sink countingSink = &countSink{}
		if mode != "op" {
			sink = sinkFor(mode)
		}
		b.SetBytes(1024)
		b.ReportAllocs()
		i := 0
		gc0 := readGCStats()
		cpu0 := benchkit.CPUNow()
		for b.Loop() {
			raw := in[i%len(in)]
			r := &Record{EventTime: int64(i)}
			switch mode {
			case "json", "json-raw", "json-members":
				stampTxn(raw, i)
				decodeAs(b, mode, r, raw, dedupMembers)
			default:
				// A fresh id string, as a decode would give; the step only
				// reads the value, so one object serves.
				tmpl["txn_id"] = "txn-" + strconv.Itoa(i)
				r.Value = tmpl
			}
			if _, err := d.ShuffleKey(r); err != nil {
				b.Fatal(err)
			}
			d.Process(r, sink)
			i++
			if checkpoint != nil && i%pebbleCheckpointEvery == 0 {
				checkpoint()
			}
		}
		benchkit.RecPerSec(b, cpu0)
		gc0.report(b, cpu0)
		if n, dead := sink.counts(); n != b.N || dead != 0 {
			b.Fatalf("passed %d, want %d (dead %d)", n, b.N, dead)
		}
		if rs, ok := sink.(*rawSink); ok && rs.forwarded != b.N {
			b.Fatalf("forwarded %d of %d", rs.forwarded, b.N)
		}
		runtime.KeepAlive(kv)
	}
	for _, mode := range []string{"json", "json-raw", "json-members", "op"} {
		b.Run(mode, func(b *testing.B) { run(b, mode, NewMemKV(), nil) })
	}
	for _, mode := range []string{"json", "json-raw", "json-members", "op"} {
		b.Run("oldkv-"+mode, func(b *testing.B) { run(b, mode, newOldMemKV(), nil) })
	}
	for _, mode := range []string{"json-members", "op"} {
		b.Run("pebble-"+mode, func(b *testing.B) {
			db, err := state.Open(b.TempDir(), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			n := int64(0)
			run(b, mode, db.Namespace("bench", "dedup"), func() {
				n++
				if err := db.Checkpoint("bench", map[int32]int64{0: n}, nil); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

// pebbleCheckpointEvery is how many records the "pebble-" variants of
// BenchmarkDropDuplicates1MKeys process between checkpoints: about a
// second's worth, where production's default is 5s. Until a checkpoint the
// writes stay in the namespace's overlay (state/overlay.go), a btree in
// the Go heap; the checkpoint's synced pebble commit is part of the cost.
const pebbleCheckpointEvery = 250_000

var dedupMembers = jsoncodec.Fields{"txn_id": {}}

// merchantRow is row i of the join benchmarks' merchant table.
func merchantRow(id string, i int) map[string]any {
	return map[string]any{"merchant_id": id, "name": "Merchant " + id, "avg_amount": float64(i%500) + 0.5, "country": "DE"}
}

// writeMerchants writes a JSON-lines merchant table of n rows, ids
// fmt.Sprintf(idFormat, i), and returns its path.
func writeMerchants(b *testing.B, n int, idFormat string) string {
	var buf []byte
	for i := range n {
		var err error
		if buf, err = jsoncodec.Append(buf, merchantRow(fmt.Sprintf(idFormat, i), i)); err != nil {
			b.Fatal(err)
		}
		buf = append(buf, '\n')
	}
	p := filepath.Join(b.TempDir(), "merchants.jsonl")
	if err := os.WriteFile(p, buf, 0o644); err != nil {
		b.Fatal(err)
	}
	return p
}

// oldMapTable is FileTable before issue 13: the decoded rows in a Go map
// swapped in whole, every map, string and box of them scanned by the
// collector on every cycle.
type oldMapTable struct {
	rows atomic.Pointer[map[string]map[string]any]
}

func loadOldMapTable(b *testing.B, path, keyField string) *oldMapTable {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	rows := map[string]map[string]any{}
	if err := readTable(f, path, keyField, func(k string, row map[string]any) error {
		rows[k] = row
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	t := &oldMapTable{}
	t.rows.Store(&rows)
	return t
}

func (t *oldMapTable) Lookup(key string) (map[string]any, bool) {
	row, ok := (*t.rows.Load())[key]
	return row, ok
}

func (t *oldMapTable) Len() int { return len(*t.rows.Load()) }

// BenchmarkJoin100kRows joins against a 100k-row file table: FileTable
// (rows in a byte arena, decoded on lookup) in the plain variants, the old
// map of decoded rows in the "oldmap-" ones. Each variant loads a table of
// its own, so only its own is live while it runs. Every row is looked up in
// turn, except in the "-zipf" variants, where a few rows are hot.
func BenchmarkJoin100kRows(b *testing.B) {
	path := writeMerchants(b, 100_000, "m-%05d")
	ids := make([]string, 100_000)
	for k := range ids {
		ids[k] = fmt.Sprintf("m-%05d", k)
	}
	in := benchkit.Inputs(4096)
	members := readsOf(mustExpr(b, "value.merchant_id"))
	load := func(b *testing.B, old bool) Table { return loadJoinTable(b, path, old) }
	// zipf is a skewed order of the rows (s=1.1: a few merchants take most
	// records, a long tail the rest), for the "-zipf" variants.
	zipf := make([]int, 1<<20)
	z := mathrand.NewZipf(mathrand.New(mathrand.NewSource(1)), 1.1, 1, 100_000-1)
	for i := range zipf {
		zipf[i] = int(z.Uint64())
	}
	run := func(b *testing.B, mode string, old bool) {
		mode, skewed := strings.CutSuffix(mode, "-zipf")
		j := NewJoin(load(b, old), mustExpr(b, "value.merchant_id"), "merchant", MissingDeadLetter)
		sink := sinkFor(mode)
		b.SetBytes(1024)
		b.ReportAllocs()
		i := 0
		gc0 := readGCStats()
		cpu0 := benchkit.CPUNow()
		for b.Loop() {
			raw := in[i%len(in)]
			if skewed {
				stamp(raw, merchantAt, 5, zipf[i%len(zipf)])
			} else {
				stamp(raw, merchantAt, 5, i%100_000) // every row in turn
			}
			r := &Record{}
			decodeAs(b, mode, r, raw, members)
			j.Process(r, sink)
			i++
		}
		benchkit.RecPerSec(b, cpu0)
		gc0.report(b, cpu0)
		if n, _ := sink.counts(); n != b.N {
			b.Fatalf("joined %d of %d", n, b.N)
		}
		if rs, ok := sink.(*rawSink); ok && rs.forwarded != b.N {
			b.Fatalf("forwarded %d of %d", rs.forwarded, b.N)
		}
	}
	op := func(b *testing.B, old bool) { joinOp(b, load(b, old), ids) }
	for _, old := range []bool{false, true} {
		prefix := ""
		if old {
			prefix = "oldmap-"
		}
		for _, mode := range []string{"json", "json-raw", "json-members", "json-members-zipf"} {
			b.Run(prefix+mode, func(b *testing.B) { run(b, mode, old) })
		}
		b.Run(prefix+"op", func(b *testing.B) { op(b, old) })
	}
}

// loadJoinTable loads the merchant table at path as FileTable, or as the
// old map of decoded rows, and collects the loading's garbage.
func loadJoinTable(b *testing.B, path string, old bool) Table {
	var t Table
	if old {
		t = loadOldMapTable(b, path, "merchant_id")
	} else {
		ft, err := LoadFileTable(path, "merchant_id")
		if err != nil {
			b.Fatal(err)
		}
		t = ft
	}
	runtime.GC() // the loading's garbage is not the benchmark's
	return t
}

// joinOp is the join step alone on a decoded payment whose merchant_id
// goes through ids in turn.
func joinOp(b *testing.B, table Table, ids []string) {
	j := NewJoin(table, mustExpr(b, "value.merchant_id"), "merchant", MissingDeadLetter)
	tmpl, _ := jsoncodec.Decode(benchkit.Payment(0))
	m := tmpl.(map[string]any)
	sink := &countSink{}
	b.ReportAllocs()
	i := 0
	gc0 := readGCStats()
	cpu0 := benchkit.CPUNow()
	for b.Loop() {
		m["merchant_id"] = ids[i%len(ids)]
		j.Process(&Record{Value: m}, sink)
		i++
	}
	benchkit.RecPerSec(b, cpu0)
	gc0.report(b, cpu0)
	if sink.n != b.N {
		b.Fatalf("joined %d of %d", sink.n, b.N)
	}
}

// BenchmarkJoin1MRows is the join step alone (op) against a table of 1M
// rows, FileTable and the old map: where the collector's scan of the old
// map grows with the table, and FileTable's cost per lookup does not.
func BenchmarkJoin1MRows(b *testing.B) {
	const n = 1_000_000
	path := writeMerchants(b, n, "m-%07d")
	ids := make([]string, n)
	for k := range ids {
		ids[k] = fmt.Sprintf("m-%07d", k)
	}
	b.Run("op", func(b *testing.B) { joinOp(b, loadJoinTable(b, path, false), ids) })
	b.Run("oldmap-op", func(b *testing.B) { joinOp(b, loadJoinTable(b, path, true), ids) })
}

// gcStats is the collector's counters at the start of a measurement.
type gcStats struct{ cycles, gcCPU float64 }

var gcMetrics = []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/cpu/classes/gc/total:cpu-seconds"}}

func readGCStats() gcStats {
	s := append([]metrics.Sample(nil), gcMetrics...)
	metrics.Read(s)
	return gcStats{float64(s[0].Value.Uint64()), s[1].Value.Float64()}
}

// report adds the collection cycles per million records and the share of
// the process's CPU time since cpu0 that the collector took (the runtime's
// estimate: mark workers, assists and pauses).
func (g gcStats) report(b *testing.B, cpu0 time.Duration) {
	now := readGCStats()
	b.ReportMetric((now.cycles-g.cycles)*1e6/float64(b.N), "gc/Mrec")
	if cpu := (benchkit.CPUNow() - cpu0).Seconds(); cpu > 0 {
		b.ReportMetric(100*(now.gcCPU-g.gcCPU)/cpu, "gc-cpu-%")
	}
}

// BenchmarkLargeStateGC is what a collection cycle costs while a large
// state is live, and how much heap that state holds: ns/op is one forced
// runtime.GC() (with -cpu 1, one mark worker), live-MB the heap in use
// after it (minus what was in use before the state was built). The states:
// a join table of 100k and 1M rows as FileTable and as the old map of
// decoded rows, and drop_duplicates' state of 1M keys (2M KV entries) in
// MemKV and in the old btree of slices.
func BenchmarkLargeStateGC(b *testing.B) {
	gcOnce := func(b *testing.B, build func(b *testing.B) any) {
		runtime.GC()
		base := liveHeap()
		st := build(b)
		runtime.GC()
		live := liveHeap() - base
		for b.Loop() {
			runtime.GC()
		}
		b.ReportMetric(float64(live)/(1<<20), "live-MB")
		runtime.KeepAlive(st)
	}
	for _, n := range []int{100_000, 1_000_000} {
		path := writeMerchants(b, n, "m-%07d")
		table := func(old bool) func(b *testing.B) any {
			return func(b *testing.B) any {
				if old {
					return loadOldMapTable(b, path, "merchant_id")
				}
				ft, err := LoadFileTable(path, "merchant_id")
				if err != nil {
					b.Fatal(err)
				}
				return ft
			}
		}
		name := fmt.Sprintf("join-%dk", n/1000)
		b.Run(name+"/filetable", func(b *testing.B) { gcOnce(b, table(false)) })
		b.Run(name+"/oldmap", func(b *testing.B) { gcOnce(b, table(true)) })
	}
	dedup := func(kv KV) func(b *testing.B) any {
		return func(b *testing.B) any {
			d := NewDropDuplicates(mustExpr(b, "value.txn_id"), time.Hour, kv)
			fill := map[string]any{"txn_id": ""}
			for k := range 1_000_000 {
				fill["txn_id"] = fmt.Sprintf("old-%08d", k)
				d.Process(&Record{Value: fill, EventTime: int64(k)}, &countSink{})
			}
			return d
		}
	}
	b.Run("dedup-1M/memkv", func(b *testing.B) { gcOnce(b, dedup(NewMemKV())) })
	b.Run("dedup-1M/oldkv", func(b *testing.B) { gcOnce(b, dedup(newOldMemKV())) })
}

// liveHeap is the bytes of heap objects, live and not yet swept (right
// after runtime.GC(): live).
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// oldMemKV is MemKV before issue 13, kept to measure against: a btree of
// items holding their own key and value slices.
type oldMemKV struct {
	tree *btree.BTreeG[oldMemItem]
}

type oldMemItem struct{ key, val []byte }

func newOldMemKV() *oldMemKV {
	return &oldMemKV{tree: btree.NewG(32, func(a, b oldMemItem) bool { return bytes.Compare(a.key, b.key) < 0 })}
}

func (m *oldMemKV) Get(key []byte) ([]byte, bool, error) {
	it, ok := m.tree.Get(oldMemItem{key: key})
	return it.val, ok, nil
}

func (m *oldMemKV) Set(key, val []byte) error {
	m.tree.ReplaceOrInsert(oldMemItem{key: bytes.Clone(key), val: append([]byte{}, val...)})
	return nil
}

func (m *oldMemKV) Delete(key []byte) error {
	m.tree.Delete(oldMemItem{key: key})
	return nil
}

func (m *oldMemKV) Scan(start, end []byte, fn func(key, val []byte) bool) error {
	m.tree.AscendGreaterOrEqual(oldMemItem{key: start}, func(it oldMemItem) bool {
		if end != nil && bytes.Compare(it.key, end) >= 0 {
			return false
		}
		return fn(it.key, it.val)
	})
	return nil
}

func TestPaymentIs1KiB(t *testing.T) {
	for _, i := range []int{0, 7, 99_999_999} {
		p := benchkit.Payment(i)
		if len(p) != 1024 {
			t.Fatalf("benchkit.Payment(%d) is %d bytes", i, len(p))
		}
		stampTxn(p, 12345678)
		v, err := jsoncodec.Decode(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := v.(map[string]any)["txn_id"]; got != "txn-12345678" {
			t.Fatalf("stamped txn_id = %v", got)
		}
	}
}

// BenchmarkWindowSession100kSessions is a session window (gap 200s,
// max_duration 1000s, the four aggregates of BenchmarkWindowTumbling10kKeys)
// holding 100k open sessions: 100k users, one record each per 100 s of
// event time (1000 records per second), so every record extends its user's
// open session; each session reaches max_duration after 10 records and
// closes as the watermark (every 10k records, 1 s behind) passes, while
// the user's next record opens the next. The state is filled before the
// clock starts. It reports B/session, the heap the 100k sessions hold
// (sessions, map, heap, keys, accumulators) per session, and
// B/session-state, the same without the accumulators (4 × 72 B here).
func BenchmarkWindowSession100kSessions(b *testing.B) {
	const users = 100_000
	spec := WindowSpec{
		Kind: "session", Gap: 200 * time.Second, MaxDuration: 1000 * time.Second, Key: mustExpr(b, "value.user_id"),
		Aggregates: []Aggregate{
			{Name: "n", Func: AggCount},
			{Name: "total", Func: AggSum, Arg: mustExpr(b, "value.amount")},
			{Name: "top", Func: AggMax, Arg: mustExpr(b, "value.amount")},
			{Name: "mean", Func: AggAvg, Arg: mustExpr(b, "value.amount")},
		},
	}
	members := readsOf(spec.Key, spec.Aggregates[1].Arg)
	run := func(b *testing.B, decode bool) {
		in := benchkit.Inputs(4096)
		tmpl, _ := jsoncodec.Decode(benchkit.Payment(0))
		ids := make([]string, users)
		for k := range ids {
			ids[k] = fmt.Sprintf("user-%05d", k)
		}
		sink := &encodeSink{}
		runtime.GC()
		heap0 := liveHeap()
		w := NewWindow(spec)
		sw := w.(*sessionWindow)
		// Fill: one record per user, then the measured records go on
		// from there.
		i := 0
		step := func() {
			k := i % users
			t := int64(i)
			var v any
			if decode {
				raw := in[i%len(in)]
				stamp(raw, userAt, 5, k)
				var err error
				if v, _, err = jsoncodec.DecodeMembers(raw, members); err != nil {
					b.Fatal(err)
				}
			} else {
				tmpl.(map[string]any)["user_id"] = ids[k]
				v = tmpl
			}
			r := &Record{Value: v, EventTime: t}
			if _, err := w.ShuffleKey(r); err != nil {
				b.Fatal(err)
			}
			w.Process(r, sink)
			if i%10000 == 9999 {
				w.(Timed).Advance(t-1000, sink)
			}
			i++
		}
		for range users {
			step()
		}
		runtime.GC()
		held := float64(liveHeap()-heap0) / float64(sw.open)
		if sw.open != users {
			b.Fatalf("%d sessions open after the fill, want %d", sw.open, users)
		}
		accs := float64(len(spec.Aggregates) * int(unsafe.Sizeof(acc{})))
		b.SetBytes(1024)
		b.ReportAllocs()
		b.ResetTimer()
		cpu0 := benchkit.CPUNow()
		for b.Loop() {
			step()
		}
		benchkit.RecPerSec(b, cpu0)
		b.ReportMetric(held, "B/session")
		b.ReportMetric(held-accs, "B/session-state")
		b.ReportMetric(float64(sw.open), "open-sessions")
		if sink.dead != 0 {
			b.Fatalf("dead %d", sink.dead)
		}
		runtime.KeepAlive(ids)
	}
	b.Run("json-members", func(b *testing.B) { run(b, true) })
	b.Run("op", func(b *testing.B) { run(b, false) })
}
