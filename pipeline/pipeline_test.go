package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
)

// --- building routes by hand, as rules would ---------------------------------

func expr(t testing.TB, src string, bound ...string) *operators.Expr {
	t.Helper()
	e, err := operators.CompileExpr(src, bound)
	if err != nil {
		t.Fatalf("compile %q: %v", src, err)
	}
	return e
}

func filterStep(t testing.TB, i int, src string) rules.StepSpec {
	e := expr(t, src)
	return rules.StepSpec{Index: i, Kind: "filter", Fingerprint: "f:" + src,
		Build: func(rules.BuildEnv) (operators.Step, error) { return operators.NewFilter(e), nil }}
}

func fieldsOf(t testing.TB, kv [][2]string, bound ...string) []operators.Field {
	var fs []operators.Field
	for _, f := range kv {
		fs = append(fs, operators.Field{Name: f[0], Expr: expr(t, f[1], bound...)})
	}
	return fs
}

func setStep(t testing.TB, i int, kv [][2]string, bound ...string) rules.StepSpec {
	fs := fieldsOf(t, kv, bound...)
	return rules.StepSpec{Index: i, Kind: "set", Fingerprint: fmt.Sprint("s:", kv),
		Traits: operators.Traits{Value: operators.ValueMerged},
		Build:  func(rules.BuildEnv) (operators.Step, error) { return operators.NewSet(fs), nil }}
}

func mapStep(t testing.TB, i int, kv [][2]string, bound ...string) rules.StepSpec {
	fs := fieldsOf(t, kv, bound...)
	return rules.StepSpec{Index: i, Kind: "map", Fingerprint: fmt.Sprint("m:", kv),
		Traits: operators.Traits{Value: operators.ValueReplaced},
		Build:  func(rules.BuildEnv) (operators.Step, error) { return operators.NewMap(fs), nil }}
}

func joinStep(t testing.TB, i int, table, on, as string, missing operators.Missing) rules.StepSpec {
	e := expr(t, on)
	return rules.StepSpec{Index: i, Kind: "join", Fingerprint: "j:" + table + on, Table: table,
		Build: func(env rules.BuildEnv) (operators.Step, error) {
			return operators.NewJoin(env.Tables[table], e, as, missing), nil
		}}
}

func windowStep(t testing.TB, i int, spec operators.WindowSpec) rules.StepSpec {
	return rules.StepSpec{Index: i, Kind: "window", Fingerprint: "w1",
		Traits: operators.Traits{Keyed: true, Timed: true, Stateful: true, Absorbing: true, Closes: true,
			Value: operators.ValueReplaced},
		Build: func(rules.BuildEnv) (operators.Step, error) { return operators.NewWindow(spec), nil }}
}

func newRouteDef(name, hash, src, sink string, steps ...rules.StepSpec) *rules.Route {
	return &rules.Route{
		Name: name, File: "/rules/" + name + ".yaml", Hash: hash,
		Source:             rules.Source{Topic: src, Format: "json", Start: "earliest", IdleTimeout: 500 * time.Millisecond},
		Sink:               rules.Sink{Topic: sink, Delivery: rules.DeliveryAtLeastOnce},
		DeadLetter:         src + ".dlq",
		CheckpointInterval: 200 * time.Millisecond,
		Steps:              steps,
	}
}

// runManager starts a Manager on b with routes; the returned stop cancels
// Run and waits for it (final checkpoints written).
func runManager(t *testing.T, b *broker, dir string, routes ...*rules.Route) (*Manager, func()) {
	t.Helper()
	return runManagerWith(t, Config{Seeds: b.addrs, StateDir: dir}, routes...)
}

// runManagerWith is runManager with a whole Config (a registry, timeouts).
func runManagerWith(t *testing.T, cfg Config, routes ...*rules.Route) (*Manager, func()) {
	t.Helper()
	if cfg.Logger == nil {
		lvl := slog.LevelWarn
		if testing.Verbose() {
			lvl = slog.LevelInfo
		}
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	}
	m, err := New(testConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	m.Apply(routes)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(60 * time.Second):
				t.Errorf("Run did not return 60s after cancel")
			}
		})
	}
	t.Cleanup(stop)
	return m, stop
}

func jsonRecord(topic string, key string, v any) *kgo.Record {
	b, _ := json.Marshal(v)
	return &kgo.Record{Topic: topic, Key: []byte(key), Value: b}
}

func srcRef(r *kgo.Record) string { return fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset) }

// --- tests -------------------------------------------------------------------

// A filter+join+set+map route writes exactly the expected records, each
// with the rtproxy-source of its input, and sends every bad record to the
// dead-letter topic with the exact headers.
func TestRouteStatelessOutputsAndDeadLetters(t *testing.T) {
	b := startBroker(t, map[string]int{"in": 3, "merchants": 1})
	b.produce(t,
		jsonRecord("merchants", "m1", map[string]any{"name": "shop"}),
		jsonRecord("merchants", "m2", map[string]any{"name": "gone"}),
		&kgo.Record{Topic: "merchants", Key: []byte("m2")}, // tombstone: m2 deleted
	)
	def := newRouteDef("stateless", "v1", "in", "out",
		filterStep(t, 0, "value.n > 0"),
		joinStep(t, 1, "merchants", "value.m", "merchant", operators.MissingDeadLetter),
		setStep(t, 2, [][2]string{{"marker", `"v1"`}, {"name", "merchant.name"}}, "merchant"),
		mapStep(t, 3, [][2]string{{"n", "value.n"}, {"marker", "value.marker"}, {"name", "value.name"}}),
	)
	def.Tables = map[string]rules.TableSpec{"merchants": {Name: "merchants", Topic: "merchants"}}

	var in []*kgo.Record
	for i := 0; i < 10; i++ {
		in = append(in, jsonRecord("in", fmt.Sprint("k", i), map[string]any{"n": i, "m": "m1"}))
	}
	bad := []*kgo.Record{
		{Topic: "in", Key: []byte("bad-json"), Value: []byte("not json{")},
		jsonRecord("in", "bad-expr", map[string]any{"n": "x", "m": "m1"}),
		jsonRecord("in", "bad-join", map[string]any{"n": 5, "m": "m2"}),
	}
	b.produce(t, append(in, bad...)...)
	m, _ := runManager(t, b, t.TempDir(), def)

	out := b.consume(t, "out", 9, 20*time.Second, 300*time.Millisecond)
	want := map[string]string{} // source ref → value
	for _, r := range in[1:] {
		var v map[string]any
		json.Unmarshal(r.Value, &v)
		want[srcRef(r)] = fmt.Sprintf(`{"marker":"v1","n":%v,"name":"shop"}`, v["n"])
	}
	if len(out) != len(want) {
		t.Fatalf("sink has %d records, want %d", len(out), len(want))
	}
	for _, r := range out {
		src := header(r, HeaderSource)
		w, ok := want[src]
		if !ok {
			t.Errorf("output %s with rtproxy-source %q names no expected input", r.Value, src)
			continue
		}
		if string(r.Value) != w {
			t.Errorf("output for %s = %s, want %s", src, r.Value, w)
		}
		delete(want, src)
	}

	dlq := b.consume(t, "in.dlq", 3, 20*time.Second, 300*time.Millisecond)
	if len(dlq) != 3 {
		t.Fatalf("dead letters: %d, want 3", len(dlq))
	}
	byKey := map[string]*kgo.Record{}
	for _, r := range dlq {
		byKey[string(r.Key)] = r
	}
	for _, c := range []struct {
		key, reason, step, errPart string
		src                        *kgo.Record
	}{
		{"bad-json", "decode", "source", "decode json", bad[0]},
		{"bad-expr", "error", "0:filter", "value.n > 0", bad[1]},
		{"bad-join", "missing", "1:join", "m2", bad[2]},
	} {
		r := byKey[c.key]
		if r == nil {
			t.Errorf("no dead letter for %s", c.key)
			continue
		}
		if string(r.Value) != string(c.src.Value) {
			t.Errorf("%s: dead letter value %q, want the original %q", c.key, r.Value, c.src.Value)
		}
		for h, v := range map[string]string{HeaderReason: c.reason, HeaderRoute: "stateless", HeaderStep: c.step, HeaderSource: srcRef(c.src)} {
			if got := header(r, h); got != v {
				t.Errorf("%s: header %s = %q, want %q", c.key, h, got, v)
			}
		}
		if e := header(r, HeaderError); !strings.Contains(e, c.errPart) {
			t.Errorf("%s: rtproxy-error %q does not mention %q", c.key, e, c.errPart)
		}
	}

	// The topic table follows live updates: a row added now joins the next
	// record.
	b.produce(t, jsonRecord("merchants", "m3", map[string]any{"name": "late-shop"}))
	var live *kgo.Record
	waitFor(t, 30*time.Second, "a record joins the row added to the table topic", func() bool {
		r := jsonRecord("in", "live", map[string]any{"n": 1, "m": "m3"})
		b.produce(t, r)
		live = r
		for _, o := range b.consume(t, "out", 9, 5*time.Second, 200*time.Millisecond) {
			if header(o, HeaderSource) == srcRef(live) {
				return string(o.Value) == `{"marker":"v1","n":1,"name":"late-shop"}`
			}
		}
		return false
	})

	// Status shows the route running with all of its input done.
	waitFor(t, 30*time.Second, "done offsets reach the high watermarks", func() bool {
		st := m.Routes()
		if len(st) != 1 || st[0].State != "running" || len(st[0].Partitions) != 3 {
			return false
		}
		for _, p := range st[0].Partitions {
			if p.Lag != 0 {
				return false
			}
		}
		return true
	})
}

func waitFor(t *testing.T, d time.Duration, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The same window key arriving on several partitions gives one aggregate
// per window, computed by the one worker owning the key; a record behind
// the watermark is a late dead letter.
func TestWindowAcrossPartitions(t *testing.T) {
	b := startBroker(t, map[string]int{"ev": 4})
	agg := []operators.Aggregate{
		{Name: "n", Func: operators.AggCount},
		{Name: "total", Func: operators.AggSum, Arg: expr(t, "value.v")},
	}
	def := newRouteDef("win", "v1", "ev", "win.out",
		windowStep(t, 0, operators.WindowSpec{Kind: "tumbling", Size: time.Second, Key: expr(t, "value.k"), Aggregates: agg}))
	def.Source.EventTime = expr(t, "value.ts")
	// Generous: a partition whose first fetch is slow on a loaded machine
	// must not be taken for idle, or its records would be late.
	def.Source.IdleTimeout = 2 * time.Second

	manual := kgo.RecordPartitioner(kgo.ManualPartitioner())
	var rs []*kgo.Record
	wantN := map[string]int{}
	wantSum := map[string]float64{}
	for p := int32(0); p < 4; p++ {
		for i := 0; i < 5; i++ {
			k := []string{"a", "b"}[i%2]
			v := float64(int(p)*10 + i)
			r := jsonRecord("ev", k, map[string]any{"k": k, "v": v, "ts": 100 + 100*i})
			r.Partition = p
			rs = append(rs, r)
			wantN[k]++
			wantSum[k] += v
		}
		// Moves every partition's event time to 5s: window [0,1s) closes.
		r := jsonRecord("ev", "z", map[string]any{"k": "z", "v": 1, "ts": 5000})
		r.Partition = p
		rs = append(rs, r)
	}
	cl := b.client(t, manual)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	runManager(t, b, t.TempDir(), def)

	out := b.consume(t, "win.out", 2, 20*time.Second, 0)
	rows := map[string]map[string]any{}
	for _, r := range out {
		var v map[string]any
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("row %s: %v", r.Value, err)
		}
		if got, want := header(r, HeaderWindow), fmt.Sprintf("%v-%v", v["window_start"], v["window_end"]); got != want {
			t.Errorf("row %s: rtproxy-window %q, want %q", r.Value, got, want)
		}
		if string(r.Key) != v["key"] {
			t.Errorf("row %s: key %q, want the window key", r.Value, r.Key)
		}
		if _, dup := rows[fmt.Sprint(v["key"], v["window_start"])]; dup {
			t.Errorf("window %v/%v emitted twice", v["key"], v["window_start"])
		}
		rows[fmt.Sprint(v["key"], v["window_start"])] = v
	}
	for _, k := range []string{"a", "b"} {
		v := rows[k+"0"]
		if v == nil {
			t.Fatalf("no row for key %s window 0; rows %v", k, rows)
		}
		if v["n"] != float64(wantN[k]) || v["total"] != wantSum[k] {
			t.Errorf("key %s: n=%v total=%v, want n=%d total=%v (all 4 partitions)", k, v["n"], v["total"], wantN[k], wantSum[k])
		}
	}

	// Late: event time 200 after the watermark passed 1s.
	late := jsonRecord("ev", "a", map[string]any{"k": "a", "v": 1000, "ts": 200})
	late.Partition = 2
	if err := cl.ProduceSync(ctx, late).FirstErr(); err != nil {
		t.Fatal(err)
	}
	dlq := b.consume(t, "ev.dlq", 1, 20*time.Second, 200*time.Millisecond)
	if len(dlq) != 1 || header(dlq[0], HeaderReason) != "late" || header(dlq[0], HeaderStep) != "0:window" ||
		header(dlq[0], HeaderSource) != srcRef(late) || string(dlq[0].Value) != string(late.Value) {
		for _, r := range dlq {
			t.Logf("dead letter %s %v", r.Value, r.Headers)
		}
		t.Fatalf("want one late dead letter for %s", srcRef(late))
	}
	// All partitions idle: the watermark moves at wall-clock speed and the
	// 5s window closes without more input.
	out = b.consume(t, "win.out", 3, 20*time.Second, 0)
	found := false
	for _, r := range out {
		if string(r.Key) == "z" {
			var v map[string]any
			json.Unmarshal(r.Value, &v)
			found = v["n"] == float64(4)
		}
	}
	if !found {
		t.Errorf("window z@5s did not close with n=4 after the partitions went idle")
	}
}

// A restart resumes from the final checkpoint: nothing lost, nothing
// repeated, and a window's state survives.
func TestCheckpointRestartResumes(t *testing.T) {
	b := startBroker(t, map[string]int{"src": 3})
	dir := t.TempDir()
	def := func() *rules.Route {
		return newRouteDef("cp", "v1", "src", "dst", filterStep(t, 0, "int(value.n) % 2 == 0"))
	}
	var first []*kgo.Record
	for i := 0; i < 100; i++ {
		first = append(first, jsonRecord("src", fmt.Sprint(i), map[string]any{"n": i}))
	}
	b.produce(t, first...)
	_, stop := runManager(t, b, dir, def())
	b.consume(t, "dst", 50, 20*time.Second, 0)
	stop()

	var second []*kgo.Record
	for i := 100; i < 200; i++ {
		second = append(second, jsonRecord("src", fmt.Sprint(i), map[string]any{"n": i}))
	}
	b.produce(t, second...)
	runManager(t, b, dir, def())
	out := b.consume(t, "dst", 100, 20*time.Second, 500*time.Millisecond)
	seen := map[string]int{}
	for _, r := range out {
		seen[header(r, HeaderSource)]++
	}
	for _, r := range append(first, second...) {
		var v map[string]int
		json.Unmarshal(r.Value, &v)
		n := seen[srcRef(r)]
		if v["n"]%2 == 0 && n != 1 {
			t.Errorf("record n=%d (%s) is in the sink %d times, want once", v["n"], srcRef(r), n)
		}
		if v["n"]%2 != 0 && n != 0 {
			t.Errorf("record n=%d was filtered but is in the sink", v["n"])
		}
	}
	if len(out) != 100 {
		t.Errorf("sink holds %d records, want 100", len(out))
	}
}

// A rule edit that keeps the route's name but changes source.topic starts
// the new topic at source.start: the local checkpoint's offsets are
// positions in the old topic, and using them would skip the new topic's
// first records (issue 10).
func TestSourceTopicChangeStartsNewTopic(t *testing.T) {
	b := startBroker(t, map[string]int{"old": 3, "new": 3})
	dir := t.TempDir()
	var old, fresh []*kgo.Record
	for i := 0; i < 90; i++ {
		old = append(old, jsonRecord("old", fmt.Sprint(i), map[string]any{"n": i}))
	}
	for i := 0; i < 30; i++ {
		fresh = append(fresh, jsonRecord("new", fmt.Sprint(i), map[string]any{"n": 1000 + i}))
	}
	b.produce(t, old...)
	b.produce(t, fresh...)
	_, stop := runManager(t, b, dir, newRouteDef("sw", "v1", "old", "sw.out"))
	b.consume(t, "sw.out", 90, 20*time.Second, 0)
	stop()

	runManager(t, b, dir, newRouteDef("sw", "v2", "new", "sw.out"))
	out := b.consume(t, "sw.out", 120, 20*time.Second, 500*time.Millisecond)
	seen := map[string]int{}
	for _, r := range out {
		seen[header(r, HeaderSource)]++
	}
	for _, r := range fresh {
		if n := seen[srcRef(r)]; n != 1 {
			t.Errorf("record %s of the new source topic is in the sink %d times, want once", srcRef(r), n)
		}
	}
	if len(out) != 120 {
		t.Errorf("sink holds %d records, want 120 (90 from the old topic, 30 from the new)", len(out))
	}
}

// Apply with a changed filter swaps at a record boundary under load: per
// partition, every record before the switch is judged by v1 and every
// record after by v2, none lost, none doubled.
func TestApplySwapAtRecordBoundary(t *testing.T) {
	b := startBroker(t, map[string]int{"s": 3})
	v1 := newRouteDef("swap", "h1", "s", "s.out", filterStep(t, 0, "int(value.n) % 2 == 0"), setStep(t, 1, [][2]string{{"ver", `"v1"`}}))
	v2 := newRouteDef("swap", "h2", "s", "s.out", filterStep(t, 0, "int(value.n) % 3 == 0"), setStep(t, 1, [][2]string{{"ver", `"v2"`}}))
	m, _ := runManager(t, b, t.TempDir(), v1)

	cl := b.client(t)
	const total = 3000
	prodDone := make(chan []*kgo.Record)
	go func() {
		var rs []*kgo.Record
		for i := 0; i < total; i++ {
			r := jsonRecord("s", fmt.Sprint(i), map[string]any{"n": i})
			res := cl.ProduceSync(context.Background(), r)
			if res.FirstErr() != nil {
				break
			}
			rs = append(rs, r)
			if i%50 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
		prodDone <- rs
	}()
	b.consume(t, "s.out", 200, 20*time.Second, 0)
	m.Apply([]*rules.Route{v2})
	produced := <-prodDone
	if len(produced) != total {
		t.Fatalf("produced %d of %d", len(produced), total)
	}
	adm := func(ver string, n int) bool {
		if ver == "v1" {
			return n%2 == 0
		}
		return n%3 == 0
	}
	// Expected count is only known after finding the switch points, so read
	// until quiet; but first wait until the route has done every produced
	// record, so a loaded machine's 2s pause cannot cut the read short.
	waitFor(t, 60*time.Second, "the route is done with all produced records", func() bool {
		st := m.Routes()
		if len(st) != 1 {
			return false
		}
		var hwm int64
		for _, p := range st[0].Partitions {
			if p.Lag != 0 {
				return false
			}
			hwm += p.HighWatermark
		}
		return hwm == total
	})
	out := b.consume(t, "s.out", 1, 20*time.Second, 2*time.Second)
	type rec struct {
		n   int
		ver string
	}
	got := map[string]rec{} // source ref → output
	for _, r := range out {
		var v struct {
			N   int    `json:"n"`
			Ver string `json:"ver"`
		}
		json.Unmarshal(r.Value, &v)
		src := header(r, HeaderSource)
		if _, dup := got[src]; dup {
			t.Errorf("%s output twice", src)
		}
		got[src] = rec{v.N, v.Ver}
	}
	byPart := map[int32][]*kgo.Record{}
	for _, r := range produced {
		byPart[r.Partition] = append(byPart[r.Partition], r)
	}
	v2seen := 0
	for p, rs := range byPart {
		sort.Slice(rs, func(i, j int) bool { return rs[i].Offset < rs[j].Offset })
		// The switch point is the first offset judged by v2; before it
		// everything follows v1, from it on everything follows v2.
		sw := len(rs)
		for i, r := range rs {
			if g, ok := got[srcRef(r)]; ok && g.ver == "v2" {
				sw = i
				break
			}
		}
		// Records between the last v1 output and the first v2 output were
		// admitted by neither; the switch may lie anywhere among them, so
		// move it back over records v2 rejects and v1 would also reject.
		for sw > 0 {
			r := rs[sw-1]
			n := indexOf(r)
			if _, ok := got[srcRef(r)]; ok || adm("v2", n) {
				break
			}
			sw--
		}
		for i, r := range rs {
			n := indexOf(r)
			ver := "v1"
			if i >= sw {
				ver = "v2"
			}
			g, ok := got[srcRef(r)]
			if adm(ver, n) != ok || (ok && g.ver != ver) {
				t.Errorf("partition %d offset %d n=%d: output=%v (%s), but the switch is at index %d, so %s should judge it", p, r.Offset, n, ok, g.ver, sw, ver)
			}
		}
		v2seen += len(rs) - sw
	}
	if v2seen == 0 {
		t.Errorf("no record was judged by v2: the swap did not happen")
	}
	st := m.Routes()
	if len(st) != 1 || st[0].State != "running" {
		t.Errorf("status after swap: %+v", st)
	}
}

func indexOf(r *kgo.Record) int {
	var v map[string]int
	json.Unmarshal(r.Value, &v)
	return v["n"]
}

func dedupStep(t testing.TB, i int, key string) rules.StepSpec {
	e := expr(t, key)
	return rules.StepSpec{Index: i, Kind: "drop_duplicates", Fingerprint: "d:" + key,
		Traits: operators.Traits{Keyed: true},
		Build: func(env rules.BuildEnv) (operators.Step, error) {
			return operators.NewDropDuplicates(e, 0, env.KV), nil
		}}
}

// drop_duplicates keyed by a value field (not the Kafka key): copies on
// different partitions meet in one worker, and its pebble-backed state
// survives a restart through the Freeze/Commit checkpoint.
func TestDropDuplicatesAcrossPartitionsAndRestart(t *testing.T) {
	b := startBroker(t, map[string]int{"dd": 4})
	dir := t.TempDir()
	def := func() *rules.Route {
		return newRouteDef("dd", "v1", "dd", "dd.out", dedupStep(t, 0, "value.txn"), setStep(t, 1, [][2]string{{"seen", "true"}}))
	}
	manual := kgo.RecordPartitioner(kgo.ManualPartitioner())
	cl := b.client(t, manual)
	produce := func(from, to int) {
		var rs []*kgo.Record
		for i := from; i < to; i++ {
			for p := int32(0); p < 4; p++ { // every txn on every partition
				r := jsonRecord("dd", fmt.Sprint(p), map[string]any{"txn": fmt.Sprint("t", i), "p": p})
				r.Partition = p
				rs = append(rs, r)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produce(0, 50)
	_, stop := runManager(t, b, dir, def())
	out := b.consume(t, "dd.out", 50, 20*time.Second, 500*time.Millisecond)
	stop()
	// A drop_duplicates without ttl never reads the watermark: its
	// repartition topic holds the 200 records and no watermark markers.
	ends, err := kadm.NewClient(cl).ListEndOffsets(context.Background(), "dd.00-drop_duplicates.repartition")
	if err != nil {
		t.Fatal(err)
	}
	var inRepartition int64
	ends.Each(func(o kadm.ListedOffset) { inRepartition += o.Offset })
	if inRepartition != 200 {
		t.Errorf("the repartition topic holds %d records, want the 200 source records (no markers)", inRepartition)
	}
	// After the restart the old txns are still known; only new ones pass.
	produce(0, 60)
	_, stop = runManager(t, b, dir, def())
	out = b.consume(t, "dd.out", 60, 20*time.Second, time.Second)
	stop()
	// On an empty state directory (another machine, an emptyDir) the keys
	// come back from the changelog: drop_duplicates keeps empty values,
	// which must not read back as tombstones.
	produce(0, 70)
	runManager(t, b, t.TempDir(), def())
	out = b.consume(t, "dd.out", 70, 20*time.Second, time.Second)
	count := map[string]int{}
	for _, r := range out {
		var v map[string]any
		json.Unmarshal(r.Value, &v)
		count[fmt.Sprint(v["txn"])]++
	}
	if len(out) != 70 {
		t.Errorf("sink holds %d records, want 70 (one per txn)", len(out))
	}
	for i := 0; i < 70; i++ {
		if c := count[fmt.Sprint("t", i)]; c != 1 {
			t.Errorf("txn t%d in the sink %d times, want once", i, c)
		}
	}
}

// Two keyed steps in one route re-shuffle between stages: drop_duplicates
// keyed by value.txn_id, then a window keyed by value.user_id. Copies of a
// txn on different partitions meet in one dedup worker and are dropped
// exactly once each; the survivors of one user, spread over all partitions
// and dedup workers, meet in one window worker. Window rows equal an
// independent computation over the unique txns.
func TestDropDuplicatesThenWindowReshuffle(t *testing.T) {
	const parts, txns = 4, 240
	b := startBroker(t, map[string]int{"rs": parts})
	agg := []operators.Aggregate{
		{Name: "n", Func: operators.AggCount},
		{Name: "total", Func: operators.AggSum, Arg: expr(t, "value.amount")},
	}
	def := newRouteDef("rs", "v1", "rs", "rs.out",
		dedupStep(t, 0, "value.txn_id"),
		windowStep(t, 1, operators.WindowSpec{Kind: "tumbling", Size: time.Second, Key: expr(t, "value.user_id"), Aggregates: agg}))
	def.Source.EventTime = expr(t, "value.ts")
	def.Source.Watermark = 5 * time.Second
	def.Source.IdleTimeout = 3 * time.Second

	want := map[winKey]*winSums{}
	copies := map[string]int{} // txn_id → copies produced
	var rs []*kgo.Record
	add := func(p int32, v map[string]any) {
		r := jsonRecord("rs", fmt.Sprint(v["txn_id"]), v)
		r.Partition = p
		rs = append(rs, r)
	}
	for i := 0; i < txns; i++ {
		user := fmt.Sprint("u", i%7)
		v := map[string]any{"txn_id": fmt.Sprint("t", i), "user_id": user, "amount": float64(i%17) + 0.25, "ts": 12 * i}
		// Every txn once; every third again on the next partition, every
		// ninth a third time on the one after. Event time rises with i, so
		// no record is late on its own partition.
		n := 1
		if i%3 == 0 {
			n = 2
		}
		if i%9 == 0 {
			n = 3
		}
		for c := 0; c < n; c++ {
			add(int32((i+c)%parts), v)
		}
		copies[fmt.Sprint("t", i)] = n
		wk := winKey{user, int64(12*i) / 1000 * 1000}
		if want[wk] == nil {
			want[wk] = &winSums{}
		}
		want[wk].n++
		want[wk].total += float64(i%17) + 0.25
	}
	dups := 0
	for _, n := range copies {
		dups += n - 1
	}
	// Every partition's event time moves far ahead: all windows of the
	// txns close (user "close" rows are not compared).
	for p := int32(0); p < parts; p++ {
		add(p, map[string]any{"txn_id": fmt.Sprint("close", p), "user_id": "close", "amount": 0, "ts": 20000})
	}
	cl := b.client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	m, err := New(testConfig(Config{Seeds: b.addrs, StateDir: t.TempDir(), Registerer: reg}))
	if err != nil {
		t.Fatal(err)
	}
	m.Apply([]*rules.Route{def})
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(rctx) }()
	defer func() { rcancel(); <-done }()

	out := b.consume(t, "rs.out", len(want), 30*time.Second, 500*time.Millisecond)
	checkWindowRows(t, out, want, 1000)
	if dl := gathered(t, reg, "rtproxy_pipeline_dead_letters_total"); dl != 0 {
		t.Errorf("%v dead letters, want none", dl)
	}
	waitFor(t, 10*time.Second, "the dropped count settles", func() bool {
		return gathered(t, reg, "rtproxy_pipeline_records_dropped_total") >= float64(dups)
	})
	if d := gathered(t, reg, "rtproxy_pipeline_records_dropped_total"); d != float64(dups) {
		t.Errorf("records_dropped_total = %v, want %d (each extra copy exactly once)", d, dups)
	}
	t.Logf("%d records (%d duplicate copies dropped), %d windows match", len(rs), dups, len(want))
}

// winKey names a window of the tests' keyed tumbling windows: its key and
// start.
type winKey struct {
	user  string
	start int64
}

// winSums is a window's expected count and total.
type winSums struct {
	n     int
	total float64
}

// checkWindowRows compares the window rows in out (key "close" left out:
// the rows of the records that close the others) with want: every window
// once, with its count and total, and an rtproxy-window header of size ms.
func checkWindowRows(t *testing.T, out []*kgo.Record, want map[winKey]*winSums, size int64) {
	t.Helper()
	got := map[winKey]map[string]any{}
	for _, r := range out {
		var v map[string]any
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("row %s: %v", r.Value, err)
		}
		if v["key"] == "close" {
			continue
		}
		wk := winKey{fmt.Sprint(v["key"]), int64(v["window_start"].(float64))}
		if _, dup := got[wk]; dup {
			t.Errorf("window %v emitted twice: %s", wk, r.Value)
		}
		if h := header(r, HeaderWindow); h != fmt.Sprintf("%d-%d", wk.start, wk.start+size) {
			t.Errorf("row %s: rtproxy-window %q", r.Value, h)
		}
		got[wk] = v
	}
	for wk, s := range want {
		v := got[wk]
		if v == nil {
			t.Errorf("window %v missing", wk)
			continue
		}
		if v["n"] != float64(s.n) || fmt.Sprintf("%.2f", v["total"]) != fmt.Sprintf("%.2f", s.total) {
			t.Errorf("window %v: n=%v total=%v, want n=%d total=%.2f", wk, v["n"], v["total"], s.n, s.total)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d windows in the sink, want %d", len(got), len(want))
	}
}
