package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
)

// frontierUnsent lists the writer tasks of r whose frontier has not been
// sent to every partition of the next repartition topic: a transaction
// committing now would commit their positions without the frontier those
// positions imply. cut is held by the caller (txnTestHook).
func frontierUnsent(r *route) []string {
	var bad []string
	for _, t := range r.tm.tasks {
		next := t.seg.next
		if next == nil || !t.seg.markers {
			continue
		}
		f, ok := t.frontier()
		if !ok {
			continue
		}
		f = t.passOn(f)
		t.front.Lock()
		for q := range next.nparts {
			if q >= len(t.front.sent) || t.front.sent[q] < f {
				bad = append(bad, fmt.Sprintf("%s[%d]→%s[%d] frontier %d unsent", t.seg.topic, t.part, next.topic, q, f))
			}
		}
		t.front.Unlock()
	}
	return bad
}

// sourceMoved reports whether the cut a transaction commits moves a source
// partition's position past the last commit's.
func sourceMoved(r *route, c *cutPoint) bool {
	r.grp.mu.Lock()
	defer r.grp.mu.Unlock()
	for id, off := range c.offs {
		if id >= 0 && id < maxTaskPartitions && r.grp.mu.lastOffs[id] != off {
			return true
		}
	}
	return false
}

// sourceKey names the source positions of a cut.
func sourceKey(c *cutPoint) string {
	src := map[int32]int64{}
	for id, off := range c.offs {
		if id >= 0 && id < maxTaskPartitions {
			src[id] = off
		}
	}
	return formatOffsets(src)
}

// An exactly-once route with a window behind a repartition: in each round
// every source partition gets a burst of records and then one whose event
// time closes the round's windows; the rows must reach a read_committed
// reader with no more input, and the route must then rest (no transaction,
// no produce, no offset commit while nothing moves).
//
// A source task sends the marker carrying its frontier to a repartition
// partition at most every markerEvery while records flow; the marker of
// a burst's last record was left to the idle loop, which sent it after
// the cut that committed the record's position, into the next
// transaction. With the checkpoint skip at rest that transaction was
// never committed (the tick found the route unchanged: markers are not
// counted in outbox.made), so the windows behind the marker never closed
// (TestExactlyOnceSharedKillJoin, 4 runs of 4). Without the skip, the
// marker was lost when that next transaction aborted ("abort" below: the
// first transaction after a commit that moves no source position aborts): the source tasks
// are rebuilt at the committed position with no frontier, nothing is read
// again, so nothing sends it again. Now the cut sends every writer's
// unsent frontier into the transaction that commits its position, and a
// tick skips only while the open transaction holds no write.
func TestExactlyOnceFrontierCommittedWithItsCut(t *testing.T) {
	for _, abort := range []bool{false, true} {
		name := "eofront-rest"
		if abort {
			name = "eofront-abort"
		}
		t.Run(name, func(t *testing.T) { testFrontierCommitted(t, name, abort) })
	}
}

func testFrontierCommitted(t *testing.T, name string, abort bool) {
	const parts, rounds, users = 2, 3, 4
	b := startBroker(t, map[string]int{name: parts})
	agg := []operators.Aggregate{
		{Name: "n", Func: operators.AggCount},
		{Name: "total", Func: operators.AggSum, Arg: expr(t, "value.amount")},
	}
	def := newRouteDef(name, "v1", name, name+".out",
		windowStep(t, 0, operators.WindowSpec{Kind: "tumbling", Size: time.Second, Key: expr(t, "value.user"), Aggregates: agg}))
	def.Sink.Delivery = rules.DeliveryExactlyOnce
	// Cuts far more often than the idle loop ticks (every 200ms): a
	// marker left to the idle loop is all but sure to follow a cut.
	def.CheckpointInterval = 10 * time.Millisecond
	def.Source.EventTime = expr(t, "value.ts")
	// No writer idles out during the test: only markers and records
	// move the windows' watermarks.
	def.Source.IdleTimeout = time.Minute

	var (
		cur      atomic.Pointer[route]
		injected atomic.Int64
		hookMu   sync.Mutex
		unsent   []string
		// under cp.mu (txnTestHook runs with it held)
		lastAborted string
	)
	txnTestHook = func(rn string) error {
		r := cur.Load()
		if r == nil || r.name != rn || len(r.cp.pending) == 0 {
			return nil
		}
		if bad := frontierUnsent(r); len(bad) > 0 {
			hookMu.Lock()
			unsent = append(unsent, bad...)
			hookMu.Unlock()
		}
		c := r.cp.pending[len(r.cp.pending)-1]
		if abort && !sourceMoved(r, c) && sourceKey(c) != lastAborted {
			// Once per committed source position: the keyed tasks'
			// work that follows must commit.
			lastAborted = sourceKey(c)
			injected.Add(1)
			return errors.New("test: a transaction that moves no source position aborted")
		}
		return nil
	}
	t.Cleanup(func() { txnTestHook = nil })

	wc := newWireCount()
	m, _ := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), ClientOpts: []kgo.Opt{kgo.WithHooks(wc)}}, def)
	waitFor(t, 30*time.Second, "the route running", func() bool {
		r := routeOf(m, name)
		if r == nil || r.txnState() != "open" {
			return false
		}
		cur.Store(r)
		return true
	})

	rd := b.client(t, kgo.ConsumeTopics(name+".out"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(50*time.Millisecond))
	var out []*kgo.Record
	seen := map[winKey]bool{}
	readUntil := func(want map[winKey]*winSums, d time.Duration) bool {
		deadline := time.Now().Add(d)
		for {
			missing := 0
			for wk := range want {
				if !seen[wk] {
					missing++
				}
			}
			if missing == 0 {
				return true
			}
			if time.Now().After(deadline) {
				return false
			}
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			for _, r := range rd.PollFetches(ctx).Records() {
				out = append(out, r)
				var v map[string]any
				if err := json.Unmarshal(r.Value, &v); err == nil {
					if st, ok := v["window_start"].(float64); ok {
						seen[winKey{fmt.Sprint(v["key"]), int64(st)}] = true
					}
				}
			}
			cancel()
		}
	}

	manual := b.client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	want := map[winKey]*winSums{}
	for round := range rounds {
		base := int64(10_000 * (round + 1))
		roundWant := map[winKey]*winSums{}
		var rs []*kgo.Record
		for p := int32(0); p < parts; p++ {
			for k := range 12 {
				user := fmt.Sprint("u", k%users)
				amount := float64(int(p)*100+k) + 0.5
				r := jsonRecord(name, user, map[string]any{"user": user, "amount": amount, "ts": base + int64(50*k)})
				r.Partition = p
				rs = append(rs, r)
				wk := winKey{user, base}
				if want[wk] == nil {
					want[wk] = &winSums{}
					roundWant[wk] = want[wk]
				}
				want[wk].n++
				want[wk].total += amount
			}
			// Last on the partition: its frontier closes the round's
			// windows on every repartition partition.
			r := jsonRecord(name, "close", map[string]any{"user": "close", "amount": 0, "ts": base + 1500})
			r.Partition = p
			rs = append(rs, r)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := manual.ProduceSync(ctx, rs...).FirstErr()
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if !readUntil(roundWant, 10*time.Second) {
			var missing []winKey
			for wk := range roundWant {
				if !seen[wk] {
					missing = append(missing, wk)
				}
			}
			hookMu.Lock()
			t.Fatalf("round %d: windows %v not closed 10s after the records that close them (%d aborts injected; writers whose frontier a commit did not carry: %v)",
				round, missing, injected.Load(), unsent)
			hookMu.Unlock()
		}
	}
	// Anything repeated after the last row.
	readUntil(map[winKey]*winSums{{"none", -1}: nil}, 300*time.Millisecond)
	checkWindowRows(t, out, want, 1000)
	hookMu.Lock()
	if len(unsent) > 0 {
		t.Errorf("%d transactions committed positions without the frontier they imply, e.g. %v", len(unsent), unsent[:min(len(unsent), 4)])
	}
	hookMu.Unlock()
	if abort && injected.Load() == 0 {
		t.Errorf("no transaction aborted: the test did not exercise a reset after a committed position")
	}
	t.Logf("%d windows exact over %d rounds, %d aborts injected", len(want), rounds, injected.Load())

	// At rest: a tick with nothing moved and nothing written commits no
	// transaction (docs/ARCHITECTURE.md, invariant 80).
	skipped := func() float64 { return testutil.ToFloat64(m.met.checkpointSkipped.WithLabelValues(name)) }
	s0 := skipped()
	waitFor(t, 20*time.Second, "two checkpoint ticks skipped at rest", func() bool { return skipped() >= s0+2 })
	r := routeOf(m, name)
	time.Sleep(300 * time.Millisecond)
	seq0, w0 := r.cp.seq.Load(), wc.snapshot()
	time.Sleep(time.Second) // a hundred checkpoint intervals
	seq1, w1 := r.cp.seq.Load(), wc.snapshot()
	if seq1 != seq0 {
		t.Errorf("%d transactions committed at rest, want none", seq1-seq0)
	}
	for _, k := range []kmsg.Key{kmsg.Produce, kmsg.AddPartitionsToTxn, kmsg.AddOffsetsToTxn, kmsg.TxnOffsetCommit, kmsg.EndTxn, kmsg.OffsetCommit} {
		if n := w1[int16(k)] - w0[int16(k)]; n != 0 {
			t.Errorf("%d %s requests at rest, want none", n, k.Name())
		}
	}
}

// failingWriter refuses the first fail writes it is handed and accepts the
// rest, calling back at once; it records every write.
type failingWriter struct {
	mu   sync.Mutex
	fail int
	sent []*kgo.Record
}

func (w *failingWriter) send(kr *kgo.Record, cb func(*kgo.Record, error)) {
	w.mu.Lock()
	w.sent = append(w.sent, kr)
	var err error
	if w.fail > 0 {
		w.fail--
		err = errors.New("test: write refused")
	}
	w.mu.Unlock()
	cb(kr, err)
}

func (w *failingWriter) retry(*kgo.Record, func(*kgo.Record, error), error) bool { return false }
func (w *failingWriter) flush()                                                  {}
func (w *failingWriter) changelog(context.Context, []*kgo.Record, bool) (kgo.ProduceResults, error) {
	return nil, nil
}
func (w *failingWriter) aside(kr *kgo.Record, cb func(*kgo.Record, error)) { w.send(kr, cb) }

// markersTo are the partitions the markers among w's writes went to.
func (w *failingWriter) markersTo() []int32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ps []int32
	for _, kr := range w.sent {
		if len(kr.Headers) == 1 && kr.Headers[0].Key == headerMarker {
			ps = append(ps, kr.Partition)
		}
	}
	return ps
}

// A marker whose write fails is sent again by the next round, also when no
// record follows: it was counted as sent when it was handed over, so at
// rest (only a newer frontier makes a partition stale) its partition never
// heard the frontier. In an exactly-once route the failed marker fails the
// open transaction, which must not commit the position without it.
func TestFailedMarkerSentAgain(t *testing.T) {
	for _, eo := range []bool{false, true} {
		t.Run(fmt.Sprint("exactly_once=", eo), func(t *testing.T) {
			w := &failingWriter{fail: 1}
			def := newRouteDef("mk", "v1", "mk", "mk.out")
			def.Source.IdleTimeout = time.Minute
			r := &route{name: "mk", def: def, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			r.wr, r.out = w, newOutbox()
			r.txn.on = eo
			next := &segment{topic: "mk.01-window.repartition", nparts: 3}
			tk := &task{r: r, seg: &segment{topic: "mk", next: next, markers: true}, part: 0}
			now := time.Now()
			tk.observeEvent(5000)
			tk.sendMarkers(now, false) // the one to partition 0 is refused
			if got := w.markersTo(); len(got) != 3 {
				t.Fatalf("markers to %v, want one to each of 3 partitions", got)
			}
			if eo && r.txn.failed.Load() == nil {
				t.Errorf("the refused marker did not fail the open transaction")
			}
			if !eo && r.txn.failed.Load() != nil {
				t.Errorf("an at-least-once route's transaction state was touched: %v", *r.txn.failed.Load())
			}
			// No record follows: the idle loop's round, and the cut's.
			tk.sendMarkers(now.Add(time.Second), true)
			got := w.markersTo()
			if len(got) != 4 || got[3] != 0 {
				t.Fatalf("markers to %v, want partition 0's sent again by the next round", got)
			}
			tk.sendMarkers(now.Add(2*time.Second), true)
			tk.cutMarkers(now.Add(2 * time.Second))
			if got := w.markersTo(); len(got) != 4 {
				t.Errorf("markers to %v, want none once each partition has the frontier", got)
			}
		})
	}
}
