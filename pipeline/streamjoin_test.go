package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/rules"
)

// streamJoinRoute matches payments to authorizations within 5 minutes
// before and 1 minute after, emitting the unmatched of both sides.
const streamJoinRoute = `route: pay
source: { topic: payments, event_time: value.ts, watermark: 2s, idle_timeout: 1s }
sink: { topic: pay.out }
dead_letter: pay.dlq
steps:
  - join:
      stream: { topic: auths, event_time: value.ts }
      on: value.auth_id
      other: value.id
      within: { before: 5m, after: 1m }
      grace: 30s
      kind: %s
      as: auth
  - map:
      p: value?.id
      a: auth?.aid
`

func loadStreamJoinRoute(t testing.TB, kind string) *rules.Route {
	return loadJoinRouteOf(t, streamJoinRoute, kind)
}

// loadJoinRouteOf loads the route whose rule file is tmpl with the join's
// kind put in.
func loadJoinRouteOf(t testing.TB, tmpl, kind string) *rules.Route {
	t.Helper()
	p := filepath.Join(t.TempDir(), "route.yaml")
	if err := os.WriteFile(p, fmt.Appendf(nil, tmpl, kind), 0o644); err != nil {
		t.Fatal(err)
	}
	def, err := rules.LoadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return def
}

// sendSJInputs hands ins to d: payments to the source, authorizations
// (keyed by their id, the join's `other`; aid names the record) to the
// stream topic.
func sendSJInputs(t testing.TB, d *Driver, ins []sjInput) {
	t.Helper()
	for _, in := range ins {
		topic := "payments"
		v, _ := json.Marshal(map[string]any{"id": in.id, "auth_id": in.key, "ts": in.t})
		if in.auth {
			topic = "auths"
			v, _ = json.Marshal(map[string]any{"id": in.key, "aid": in.id, "ts": in.t})
		}
		if err := d.SendTo(topic, DriverInput{Partition: in.part, Offset: -1, Key: []byte(in.id), Value: v}); err != nil {
			t.Fatal(err)
		}
	}
}

// sjInput is one record of either topic in the pipeline's reference test.
type sjInput struct {
	auth bool
	part int32
	id   string
	key  string
	t    int64
}

// sjReference is the brute-force result of the route above on ins, in
// the order the Driver gets them: the watermark when a record arrives is
// the minimum over the partitions of both topics of their highest event
// time before it, less source.watermark (none before every partition has
// a record); a record more than grace behind it is late; every pair of
// accepted records with equal keys within the interval is an output, and
// (outer) every accepted record without a partner too.
func sjReference(ins []sjInput, parts int, kind string) (out, late []string) {
	const lateness, grace, before, after = 2000, 30_000, 300_000, 60_000
	maxEv := map[string]int64{}
	wm, has := int64(0), false
	var pays, auths []sjInput
	for _, in := range ins {
		if len(maxEv) == 2*parts {
			low := int64(1 << 62)
			for _, v := range maxEv {
				low = min(low, v)
			}
			if c := low - lateness; !has || c > wm {
				wm, has = c, true
			}
		}
		slot := fmt.Sprint(in.auth, in.part)
		if v, ok := maxEv[slot]; !ok || in.t > v {
			maxEv[slot] = in.t
		}
		switch {
		case has && in.t < wm-grace:
			late = append(late, in.id)
		case in.auth:
			auths = append(auths, in)
		default:
			pays = append(pays, in)
		}
	}
	mp, ma := map[string]bool{}, map[string]bool{}
	for _, p := range pays {
		for _, a := range auths {
			if p.key == a.key && p.t-before <= a.t && a.t <= p.t+after {
				out = append(out, p.id+"|"+a.id)
				mp[p.id], ma[a.id] = true, true
			}
		}
	}
	if kind != "inner" {
		for _, p := range pays {
			if !mp[p.id] {
				out = append(out, p.id+"|-")
			}
		}
	}
	if kind == "outer" {
		for _, a := range auths {
			if !ma[a.id] {
				out = append(out, "-|"+a.id)
			}
		}
	}
	slices.Sort(out)
	slices.Sort(late)
	return out, late
}

// sjInOrder draws n records of both topics over keys keys, one every 2 s
// of event time from an hour ago, each up to 10 s early: in order enough
// that none is late (grace is 30 s) whatever order the partitions are
// read in.
func sjInOrder(rng *rand.Rand, n, parts, keys int) []sjInput {
	base := time.Now().Add(-time.Hour).UnixMilli()
	var ins []sjInput
	for i := range n {
		in := sjInput{auth: rng.IntN(2) == 0, part: int32(rng.IntN(parts)), key: fmt.Sprint("k", rng.IntN(keys)),
			t: base + int64(i)*2000 - rng.Int64N(10_000)}
		in.id = fmt.Sprint("p", i)
		if in.auth {
			in.id = fmt.Sprint("a", i)
		}
		ins = append(ins, in)
	}
	return ins
}

func sjInputs(rng *rand.Rand, n, parts int) []sjInput {
	now := int64(1767225600000)
	var ins []sjInput
	for i := range n {
		now += rng.Int64N(20_000)
		t := now - rng.Int64N(90_000)
		if rng.IntN(20) == 0 {
			t = now - 10*60_000 // late
		}
		in := sjInput{auth: rng.IntN(2) == 0, part: int32(rng.IntN(parts)), key: fmt.Sprint("k", rng.IntN(8)), t: t}
		in.id = fmt.Sprint("p", i)
		if in.auth {
			in.id = fmt.Sprint("a", i)
		}
		ins = append(ins, in)
	}
	return ins
}

// TestStreamJoinDriverMatchesReference: the route's join through its
// tasks (the source and the second topic keyed into the join's
// repartition topic, the watermark over the partitions of both) gives on
// random out-of-order records of both topics, with late ones, exactly the
// outputs and late dead letters of the brute-force reference.
func TestStreamJoinDriverMatchesReference(t *testing.T) {
	const parts = 2
	for seed := range uint64(6) {
		kind := []string{"inner", "left", "outer"}[seed%3]
		rng := rand.New(rand.NewPCG(seed, 2727))
		ins := sjInputs(rng, 200, parts)
		d, err := NewDriver(loadStreamJoinRoute(t, kind), DriverConfig{Partitions: parts})
		if err != nil {
			t.Fatal(err)
		}
		if got := d.StreamTopics(); !slices.Equal(got, []string{"auths"}) {
			t.Fatalf("stream topics %v", got)
		}
		sendSJInputs(t, d, ins)
		d.AdvanceWatermark(time.UnixMilli(1767225600000 + 1e9))
		var out, late []string
		for _, o := range d.Outputs() {
			if o.DeadLetter {
				var v map[string]any
				_ = json.Unmarshal(o.Value, &v)
				reason := ""
				for _, h := range o.Headers {
					if h.Key == HeaderReason {
						reason = string(h.Value)
					}
				}
				if reason != "late" {
					t.Fatalf("seed %d: dead letter %s: %s", seed, reason, o.Value)
				}
				id := fmt.Sprint(v["id"])
				if _, isAuth := v["aid"]; isAuth {
					id = fmt.Sprint(v["aid"])
				}
				late = append(late, id)
				continue
			}
			out = append(out, joinRow(t, o.Value))
		}
		d.Close()
		wantOut, wantLate := sjReference(ins, parts, kind)
		slices.Sort(out)
		slices.Sort(late)
		if !slices.Equal(out, wantOut) {
			t.Fatalf("seed %d %s: outputs\n got %d %v\nwant %d %v", seed, kind, len(out), out, len(wantOut), wantOut)
		}
		if !slices.Equal(late, wantLate) {
			t.Fatalf("seed %d: late\n got %v\nwant %v", seed, late, wantLate)
		}
		if len(wantLate) == 0 || len(wantOut) == 0 {
			t.Fatalf("seed %d: the inputs exercise nothing (%d outputs, %d late)", seed, len(wantOut), len(wantLate))
		}
	}
}

// streamJoinKfakeRoute is the stream join run on kfake: a left join whose
// sink a read_committed reader checks.
const streamJoinKfakeRoute = `route: payauth
source: { topic: payments, event_time: value.ts, watermark: 2s, idle_timeout: 10s, start: earliest }
sink: { topic: payauth.out, delivery: %s }
dead_letter: payauth.dlq
checkpoint_interval: 200ms
steps:
  - join:
      stream: { topic: auths, event_time: value.ts }
      on: value.auth_id
      other: value.id
      within: { before: 5m, after: 1m }
      grace: 30s
      kind: left
      as: auth
  - map:
      p: value.id
      a: auth?.aid
`

// TestStreamJoinOnKfake: the route's group reads both topics, keys both
// into the join's repartition topic, and the sink holds exactly the
// reference's pairs and unmatched payments, across a restart in the middle
// (a graceful stop: nothing repeats), at least once and exactly once; an
// exactly-once route commits the offsets of both topics.
func TestStreamJoinOnKfake(t *testing.T) {
	for _, delivery := range []string{rules.DeliveryAtLeastOnce, rules.DeliveryExactlyOnce} {
		t.Run(delivery, func(t *testing.T) {
			const parts = 2
			b := startBroker(t, map[string]int{"payments": parts, "auths": parts})
			dir := filepath.Join(t.TempDir(), "state")
			rdir := t.TempDir()
			p := filepath.Join(rdir, "payauth.yaml")
			if err := os.WriteFile(p, fmt.Appendf(nil, streamJoinKfakeRoute, delivery), 0o644); err != nil {
				t.Fatal(err)
			}
			def, err := rules.LoadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			// In order enough that nothing is late whatever order the
			// partitions are read in: jitter well within grace.
			ins := sjInOrder(rand.New(rand.NewPCG(7, 27)), 400, parts, 40)
			rec := func(in sjInput) *kgo.Record {
				if in.auth {
					r := jsonRecord("auths", in.id, map[string]any{"id": in.key, "aid": in.id, "ts": in.t})
					r.Partition = in.part
					return r
				}
				r := jsonRecord("payments", in.id, map[string]any{"id": in.id, "auth_id": in.key, "ts": in.t})
				r.Partition = in.part
				return r
			}
			var first, second []*kgo.Record
			for i, in := range ins {
				if i < len(ins)/2 {
					first = append(first, rec(in))
				} else {
					second = append(second, rec(in))
				}
			}
			// A last record far ahead on every partition of both topics
			// moves the watermark past every window: the unmatched
			// payments are emitted. Their keys match nothing.
			end := time.Now().Add(2 * time.Hour).UnixMilli() // past every record (sjInOrder)
			for q := range int32(parts) {
				second = append(second, rec(sjInput{part: q, id: fmt.Sprint("endp", q), key: "none-p", t: end}),
					rec(sjInput{auth: true, part: q, id: fmt.Sprint("enda", q), key: "none-a", t: end}))
			}
			want, late := sjReference(ins, parts, "left")
			if len(late) > 0 {
				t.Fatalf("the inputs have late records: %v", late)
			}

			// On the partitions the inputs name (the reference and the
			// last records count on it).
			produce := func(rs []*kgo.Record) {
				cl := b.tmpClient(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
				defer cl.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
					t.Fatalf("produce: %v", err)
				}
			}
			produce(first)
			_, stop := runManager(t, b, dir, def)
			iso := kgo.FetchIsolationLevel(kgo.ReadCommitted())
			b.consume(t, "payauth.out", 20, 30*time.Second, 0, iso)
			stop()
			produce(second)
			runManager(t, b, dir, def)
			var out []*kgo.Record
			for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
				if out = b.consume(t, "payauth.out", 0, time.Second, 500*time.Millisecond, iso); len(out) >= len(want) {
					break
				}
			}
			got := joinRows(t, out)
			if !slices.Equal(got, want) {
				var extra, missing []string
				for _, g := range got {
					if !slices.Contains(want, g) {
						extra = append(extra, g)
					}
				}
				for _, w := range want {
					if !slices.Contains(got, w) {
						missing = append(missing, w)
					}
				}
				for _, r := range b.consume(t, "payauth.dlq", 0, time.Second, 2*time.Second) {
					t.Logf("dead letter %s: %s", header(r, HeaderReason), r.Value)
				}
				t.Fatalf("sink: got %d, want %d; extra %v, missing %v", len(got), len(want), extra, missing)
			}
			if delivery != rules.DeliveryExactlyOnce {
				return
			}
			adm := kadm.NewClient(b.client(t))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			offs, err := adm.FetchOffsets(ctx, def.GroupID())
			if err != nil {
				t.Fatal(err)
			}
			n := map[string]int64{}
			for _, r := range append(first, second...) {
				n[fmt.Sprint(r.Topic, r.Partition)]++
			}
			for _, topic := range []string{"payments", "auths"} {
				for q := range int32(parts) {
					waitFor(t, 10*time.Second, fmt.Sprintf("%s[%d] committed at its end", topic, q), func() bool {
						offs, err = adm.FetchOffsets(ctx, def.GroupID())
						o, ok := offs.Lookup(topic, q)
						return err == nil && ok && o.At == n[fmt.Sprint(topic, q)]
					})
				}
			}
		})
	}
}

// TestStreamJoinWatermarkWaitsForTheStream: the join's watermark is the
// minimum over the partitions of both topics. A stream partition that
// has a record holds it back while it is active, whatever the source's
// frontier; once it has been idle for idle_timeout it no longer does, and
// the left join emits the payment that matched nothing.
func TestStreamJoinWatermarkWaitsForTheStream(t *testing.T) {
	d, err := NewDriver(loadStreamJoinRoute(t, "left"), DriverConfig{Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	t0 := DefaultDriverStart.UnixMilli()
	send := func(topic string, v map[string]any) {
		t.Helper()
		b, _ := json.Marshal(v)
		if err := d.SendTo(topic, DriverInput{Offset: -1, Value: b}); err != nil {
			t.Fatal(err)
		}
	}
	send("auths", map[string]any{"id": "other", "aid": "a0", "ts": t0})
	send("payments", map[string]any{"id": "p1", "auth_id": "x", "ts": t0})
	send("payments", map[string]any{"id": "p2", "auth_id": "y", "ts": t0 + 20*60_000})
	if n := len(d.Outputs()); n != 0 {
		t.Fatalf("%d outputs while the stream's partition holds the watermark at its record: %v", n, d.Outputs())
	}
	// Half the idle_timeout (1s): still active.
	d.AdvanceIdle(500 * time.Millisecond)
	if n := len(d.Outputs()); n != 0 {
		t.Fatalf("%d outputs before the stream's idle_timeout", n)
	}
	// The stream idle for longer than idle_timeout; the payments go on.
	d.AdvanceIdle(time.Second)
	send("payments", map[string]any{"id": "p3", "auth_id": "z", "ts": t0 + 20*60_000})
	var got []string
	for _, o := range d.Outputs() {
		got = append(got, string(o.Value))
	}
	if !slices.Equal(got, []string{`{"a":null,"p":"p1"}`}) {
		t.Fatalf("outputs once the stream is idle: %v, want p1 alone (p2's and p3's windows are open)", got)
	}
}

// TestStreamJoinBadStreamRecords: a stream record that is not JSON, or
// whose event_time cannot be read, is a dead letter at the join (reasons
// decode and error) with the dead-letter counter moving; the records
// around it are joined as if it had not come.
func TestStreamJoinBadStreamRecords(t *testing.T) {
	d, err := NewDriver(loadStreamJoinRoute(t, "inner"), DriverConfig{Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	t0 := DefaultDriverStart.UnixMilli()
	for _, v := range []string{
		`{"id": "k1", "aid": "a1", "ts": ` + fmt.Sprint(t0) + `}`,
		`not json`,
		`{"id": "k1", "aid": "a2", "ts": "yesterday"}`,
	} {
		if err := d.SendTo("auths", DriverInput{Offset: -1, Key: []byte("k"), Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := json.Marshal(map[string]any{"id": "p1", "auth_id": "k1", "ts": t0 + 1000})
	if err := d.Send(DriverInput{Offset: -1, Value: b}); err != nil {
		t.Fatal(err)
	}
	var rows, reasons []string
	for _, o := range d.Outputs() {
		if !o.DeadLetter {
			rows = append(rows, string(o.Value))
			continue
		}
		var reason, step string
		for _, h := range o.Headers {
			switch h.Key {
			case HeaderReason:
				reason = string(h.Value)
			case "rtproxy-step":
				step = string(h.Value)
			}
		}
		reasons = append(reasons, reason+"@"+step)
	}
	if !slices.Equal(rows, []string{`{"a":"a1","p":"p1"}`}) {
		t.Errorf("rows %v, want p1 with a1 alone", rows)
	}
	if !slices.Equal(reasons, []string{"decode@0:join", "error@0:join"}) {
		t.Errorf("dead letters %v", reasons)
	}
	for reason, want := range map[string]float64{"decode": 1, "error": 1} {
		if got := testutil.ToFloat64(d.r.m.met.deadLetters.WithLabelValues(d.r.name, reason)); got != want {
			t.Errorf("dead letters with reason %s counted %v, want %v", reason, got, want)
		}
	}
}

// TestStreamJoinRecordsInCountsBothInputs: a stream join's route reads two
// topics, and rtproxy_pipeline_records_in_total covers both: the source's
// partitions under partition="<p>", the second topic's under
// partition="<topic>:<p>" (the lag metric's label), so summed by route it
// is every record the route read. /routes says the same in records_in,
// and per topic in records_in_by_topic.
func TestStreamJoinRecordsInCountsBothInputs(t *testing.T) {
	const parts = 2
	b := startBroker(t, map[string]int{"payments": parts, "auths": parts})
	p := filepath.Join(t.TempDir(), "payauth.yaml")
	if err := os.WriteFile(p, fmt.Appendf(nil, streamJoinKfakeRoute, rules.DeliveryAtLeastOnce), 0o644); err != nil {
		t.Fatal(err)
	}
	def, err := rules.LoadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	base := time.Now().Add(-time.Hour).UnixMilli()
	var rs []*kgo.Record
	const payments, auths = 30, 17
	for i := range payments {
		r := jsonRecord("payments", fmt.Sprint("p", i), map[string]any{"id": fmt.Sprint("p", i), "auth_id": fmt.Sprint("k", i%5), "ts": base + int64(i)*100})
		r.Partition = int32(i % parts)
		rs = append(rs, r)
	}
	for i := range auths {
		r := jsonRecord("auths", fmt.Sprint("a", i), map[string]any{"id": fmt.Sprint("k", i%5), "aid": fmt.Sprint("a", i), "ts": base + int64(i)*100})
		r.Partition = int32(i % parts)
		rs = append(rs, r)
	}
	cl := b.tmpClient(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	reg := prometheus.NewRegistry()
	m, _ := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), Registerer: reg}, def)
	in := func(labels map[string]string) float64 {
		return gatheredLabels(t, reg, "rtproxy_pipeline_records_in_total", labels)
	}
	waitFor(t, 30*time.Second, "every record of both topics counted in", func() bool {
		return in(map[string]string{"route": "payauth"}) >= payments+auths
	})
	if n := in(map[string]string{"route": "payauth"}); n != payments+auths {
		t.Errorf("records_in summed over the route: %v, want %d (payments and authorizations)", n, payments+auths)
	}
	var src, other float64
	for q := range parts {
		src += in(map[string]string{"route": "payauth", "partition": fmt.Sprint(q)})
		other += in(map[string]string{"route": "payauth", "partition": fmt.Sprintf("auths:%d", q)})
	}
	if src != payments || other != auths {
		t.Errorf("records_in: %v under the source's partitions, %v under auths:<p>; want %d and %d", src, other, payments, auths)
	}
	var st RouteStatus
	for _, s := range m.Routes() {
		if s.Name == "payauth" {
			st = s
		}
	}
	if st.RecordsIn != payments+auths || st.RecordsInByTopic["payments"] != payments || st.RecordsInByTopic["auths"] != auths {
		t.Errorf("/routes: records_in %d, by topic %v; want %d, payments %d, auths %d", st.RecordsIn, st.RecordsInByTopic, payments+auths, payments, auths)
	}
}
