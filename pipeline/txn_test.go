package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
)

// consumeCommitted is broker.consume with a read_committed reader.
func (b *broker) consumeCommitted(t *testing.T, topic string, want int, timeout, quiet time.Duration, opts ...kgo.Opt) []*kgo.Record {
	t.Helper()
	return b.consume(t, topic, want, timeout, quiet, append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))...)
}

// An exactly-once route with a drop_duplicates and a window behind it,
// whose transactions abort again and again (every third one that wrote
// records) while records arrive, and which stops and restarts halfway:
// a read_committed reader of the sink sees every window once, with the
// sums of an independent computation, and every dead letter once. Each
// abort sends the tasks back to the last commit (resetTasks): the
// dedup keys, the open windows and the inboxes of the aborted
// transaction are discarded with its outputs.
func TestExactlyOnceThroughAborts(t *testing.T) {
	const parts, txns = 4, 300
	b := startBroker(t, map[string]int{"eo": parts})
	agg := []operators.Aggregate{
		{Name: "n", Func: operators.AggCount},
		{Name: "total", Func: operators.AggSum, Arg: expr(t, "value.amount")},
	}
	def := newRouteDef("eo", "v1", "eo", "eo.out",
		dedupStep(t, 0, "value.txn_id"),
		windowStep(t, 1, operators.WindowSpec{Kind: "tumbling", Size: time.Second, Key: expr(t, "value.user_id"), Aggregates: agg}))
	def.Sink.Delivery = rules.DeliveryExactlyOnce
	def.CheckpointInterval = 100 * time.Millisecond
	def.Source.EventTime = expr(t, "value.ts")
	def.Source.Watermark = 5 * time.Second
	def.Source.IdleTimeout = 3 * time.Second

	var commits, injected atomic.Int64
	txnTestHook = func(route string) error {
		if commits.Add(1)%3 == 0 {
			injected.Add(1)
			return errors.New("test: injected abort")
		}
		return nil
	}
	t.Cleanup(func() { txnTestHook = nil })

	want := map[winKey]*winSums{}
	var batches [][]*kgo.Record
	var rs []*kgo.Record
	add := func(p int32, v map[string]any) {
		r := jsonRecord("eo", fmt.Sprint(v["txn_id"]), v)
		r.Partition = p
		rs = append(rs, r)
	}
	for i := 0; i < txns; i++ {
		user := fmt.Sprint("u", i%7)
		v := map[string]any{"txn_id": fmt.Sprint("t", i), "user_id": user, "amount": float64(i%17) + 0.25, "ts": 12 * i}
		n := 1
		if i%3 == 0 {
			n = 2
		}
		for c := 0; c < n; c++ {
			add(int32((i+c)%parts), v)
		}
		wk := winKey{user, int64(12*i) / 1000 * 1000}
		if want[wk] == nil {
			want[wk] = &winSums{}
		}
		want[wk].n++
		want[wk].total += float64(i%17) + 0.25
		if i%30 == 29 {
			batches = append(batches, rs)
			rs = nil
		}
	}
	for p := int32(0); p < parts; p++ {
		add(p, map[string]any{"txn_id": fmt.Sprint("close", p), "user_id": "close", "amount": 0, "ts": 20000})
	}
	// A record that is not JSON: one dead letter, also exactly once.
	bad := &kgo.Record{Topic: "eo", Partition: 1, Value: []byte("{not json")}
	rs = append(rs, bad)
	batches = append(batches, rs)

	cl := b.client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	produce := func(rs []*kgo.Record) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	_, stop := runManagerWith(t, Config{Seeds: b.addrs, StateDir: dir, Registerer: reg}, def)
	half := len(batches) / 2
	for _, bt := range batches[:half] {
		produce(bt)
		time.Sleep(150 * time.Millisecond) // spread over several transactions
	}
	stop()
	// The second run has its own registry: the injected aborts may all
	// fall in either run.
	reg2 := prometheus.NewRegistry()
	_, stop = runManagerWith(t, Config{Seeds: b.addrs, StateDir: dir, Registerer: reg2}, def)
	defer stop()
	for _, bt := range batches[half:] {
		produce(bt)
		time.Sleep(150 * time.Millisecond)
	}

	out := b.consumeCommitted(t, "eo.out", len(want), 60*time.Second, time.Second)
	checkWindowRows(t, out, want, 1000)
	dls := b.consumeCommitted(t, "eo.dlq", 1, 20*time.Second, 500*time.Millisecond)
	if len(dls) != 1 {
		t.Errorf("%d dead letters, want exactly 1", len(dls))
	}
	if injected.Load() < 3 {
		t.Errorf("only %d aborts were injected; the test did not exercise resets", injected.Load())
	}
	if a := gathered(t, reg, "rtproxy_route_txn_aborts_total") + gathered(t, reg2, "rtproxy_route_txn_aborts_total"); a < 1 {
		t.Errorf("rtproxy_route_txn_aborts_total = %v, want the injected aborts counted", a)
	}
	t.Logf("%d windows exact after %d injected aborts", len(want), injected.Load())
}

// Brokers that refuse transactions (the principal may not write any
// transactional id) stop an exactly-once route in state error with the
// brokers' reason, and it never falls back to at-least-once: its sink stays
// empty, while an at-least-once route of the same principal runs.
func TestExactlyOnceRefusedTransactions(t *testing.T) {
	b := startBroker(t, map[string]int{"rt": 2, "rt.eo": 2, "rt.alo": 2, "rt.dlq": 1},
		"-sasl", "PLAIN:admin:admin-pass", "-no-txn-user", "PLAIN:app:app-pass")
	sasl := kgo.SASL(plain.Auth{User: "admin", Pass: "admin-pass"}.AsMechanism())
	admin := b.client(t, sasl)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rs []*kgo.Record
	for i := 0; i < 20; i++ {
		rs = append(rs, jsonRecord("rt", fmt.Sprint(i), map[string]any{"n": i}))
	}
	if err := admin.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	eo := newRouteDef("rt-eo", "v1", "rt", "rt.eo")
	eo.Sink.Delivery = rules.DeliveryExactlyOnce
	alo := newRouteDef("rt-alo", "v1", "rt", "rt.alo")
	app := kgo.SASL(plain.Auth{User: "app", Pass: "app-pass"}.AsMechanism())
	m, _ := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), ClientOpts: []kgo.Opt{app}, SetupTimeout: 5 * time.Second}, eo, alo)
	waitFor(t, 30*time.Second, "the exactly-once route stops in state error", func() bool {
		for _, r := range m.Routes() {
			if r.Name == "rt-eo" {
				return r.State == "error" && strings.Contains(r.LastError, "refused") &&
					strings.Contains(r.LastError, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED")
			}
		}
		return false
	})
	got := b.consume(t, "rt.alo", 20, 20*time.Second, 0, sasl)
	if len(got) != 20 {
		t.Errorf("the at-least-once route wrote %d records, want 20", len(got))
	}
	ends, err := kadm.NewClient(admin).ListEndOffsets(context.Background(), "rt.eo")
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset != 0 {
			t.Errorf("rt.eo[%d] holds %d records; a route refused transactions must write nothing", o.Partition, o.Offset)
		}
	})
	for _, r := range m.Routes() {
		if r.Name == "rt-eo" {
			t.Logf("state %s: %s", r.State, r.LastError)
		}
	}
}
