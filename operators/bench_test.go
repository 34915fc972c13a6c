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
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/rtproxy/rtproxy/internal/benchkit"
	"github.com/rtproxy/rtproxy/internal/jsoncodec"
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
// only -benchtime 1000000x, sees a state of at least 1M keys (and the GC
// scans it, as it would scan an in-memory state in the pipeline). Every
// measured record has a new id, so every one passes and is encoded.
func BenchmarkDropDuplicates1MKeys(b *testing.B) {
	const keys = 1_000_000
	d := NewDropDuplicates(mustExpr(b, "value.txn_id"), time.Hour, NewMemKV())
	fill := map[string]any{"txn_id": ""}
	for k := range keys {
		fill["txn_id"] = fmt.Sprintf("old-%08d", k)
		d.Process(&Record{Value: fill, EventTime: -1}, &countSink{})
	}
	next := 0 // ids already used by an earlier run of a variant
	in := benchkit.Inputs(4096)
	run := func(b *testing.B, mode string) {
		v, _ := jsoncodec.Decode(benchkit.Payment(0))
		tmpl := v.(map[string]any)
		var sink countingSink = &countSink{}
		if mode != "op" {
			sink = sinkFor(mode)
		}
		b.SetBytes(1024)
		b.ReportAllocs()
		i := 0
		cpu0 := benchkit.CPUNow()
		for b.Loop() {
			k := next + i
			raw := in[i%len(in)]
			r := &Record{EventTime: int64(i)}
			switch mode {
			case "json", "json-raw", "json-members":
				stampTxn(raw, k)
				decodeAs(b, mode, r, raw, dedupMembers)
			default:
				// A fresh id string, as a decode would give; the step only
				// reads the value, so one object serves.
				tmpl["txn_id"] = "txn-" + strconv.Itoa(k)
				r.Value = tmpl
			}
			if _, err := d.ShuffleKey(r); err != nil {
				b.Fatal(err)
			}
			d.Process(r, sink)
			i++
		}
		benchkit.RecPerSec(b, cpu0)
		next += b.N
		if n, dead := sink.counts(); n != b.N || dead != 0 {
			b.Fatalf("passed %d, want %d (dead %d)", n, b.N, dead)
		}
		if rs, ok := sink.(*rawSink); ok && rs.forwarded != b.N {
			b.Fatalf("forwarded %d of %d", rs.forwarded, b.N)
		}
	}
	b.Run("json", func(b *testing.B) { run(b, "json") })
	b.Run("json-raw", func(b *testing.B) { run(b, "json-raw") })
	b.Run("json-members", func(b *testing.B) { run(b, "json-members") })
	b.Run("op", func(b *testing.B) { run(b, "op") })
}

var dedupMembers = jsoncodec.Fields{"txn_id": {}}

func BenchmarkJoin100kRows(b *testing.B) {
	mt := NewMapTable()
	for i := range 100_000 {
		id := fmt.Sprintf("m-%05d", i)
		mt.Set(id, map[string]any{"merchant_id": id, "name": "Merchant " + id, "avg_amount": float64(i%500) + 0.5, "country": "DE"})
	}
	j := NewJoin(mt, mustExpr(b, "value.merchant_id"), "merchant", MissingDeadLetter)
	ids := make([]string, 100_000)
	for k := range ids {
		ids[k] = fmt.Sprintf("m-%05d", k)
	}
	in := benchkit.Inputs(4096)
	members := readsOf(mustExpr(b, "value.merchant_id"))
	run := func(b *testing.B, mode string) {
		sink := sinkFor(mode)
		b.SetBytes(1024)
		b.ReportAllocs()
		i := 0
		cpu0 := benchkit.CPUNow()
		for b.Loop() {
			raw := in[i%len(in)]
			stamp(raw, merchantAt, 5, i%100_000) // every row in turn
			r := &Record{}
			decodeAs(b, mode, r, raw, members)
			j.Process(r, sink)
			i++
		}
		benchkit.RecPerSec(b, cpu0)
		if n, _ := sink.counts(); n != b.N {
			b.Fatalf("joined %d of %d", n, b.N)
		}
		if rs, ok := sink.(*rawSink); ok && rs.forwarded != b.N {
			b.Fatalf("forwarded %d of %d", rs.forwarded, b.N)
		}
	}
	for _, mode := range []string{"json", "json-raw", "json-members"} {
		b.Run(mode, func(b *testing.B) { run(b, mode) })
	}
	b.Run("op", func(b *testing.B) {
		tmpl, _ := jsoncodec.Decode(benchkit.Payment(0))
		m := tmpl.(map[string]any)
		sink := &countSink{}
		b.ReportAllocs()
		i := 0
		cpu0 := benchkit.CPUNow()
		for b.Loop() {
			m["merchant_id"] = ids[i%len(ids)]
			j.Process(&Record{Value: m}, sink)
			i++
		}
		benchkit.RecPerSec(b, cpu0)
		if sink.n != b.N {
			b.Fatalf("joined %d of %d", sink.n, b.N)
		}
	})
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
