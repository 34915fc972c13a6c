package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// reloadRule is version v of the edited route: it admits every record
// except those with id%7 == v, and stamps v with `set`.
func reloadRule(v int) string {
	return fmt.Sprintf(`route: reload
source: { topic: rl, format: json }
sink: { topic: rl.out }
checkpoint_interval: 1s
steps:
  - filter: int(value.id) %% 7 != %d
  - set: { ver: %d }
`, v, v)
}

func reloadAdmits(v, id int) bool { return id%7 != v }

// TestReloadUnderLoad edits a filter 5 times while about 4k records/s flow
// (ConfigMap ..data symlink swap, atomic rename, truncate-and-write, a
// chunked write), then checks the sink record by record: per source
// partition, versions take over at record boundaries in order, every
// record is judged by the version active at its position, and nothing is
// lost or duplicated by a reload.
func TestReloadUnderLoad(t *testing.T) {
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{"rl": 3, "st": 3}})
	dir := t.TempDir()
	// A second, untouched route: its latency during the reloads shows
	// whether a reload stalls the others.
	WriteRuleFile(t, dir, "steady.yaml", "route: steady\nsource: { topic: st, format: json }\nsink: { topic: st.out }\nsteps:\n  - filter: value.n >= 0\n")
	// ConfigMap layout: route.yaml -> ..data/route.yaml, ..data -> ..v0.
	cmDir := func(v int) string {
		d := filepath.Join(dir, fmt.Sprintf("..v%d", v))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "route.yaml"), []byte(reloadRule(v)), 0o644); err != nil {
			t.Fatal(err)
		}
		return filepath.Base(d)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink(cmDir(0), filepath.Join(dir, "..data")))
	must(os.Symlink("..data/route.yaml", filepath.Join(dir, "route.yaml")))
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: dir})

	var produced atomic.Int64
	stopProd := make(chan struct{})
	prodDone := make(chan []*kgo.Record)
	go func() {
		cl := NewClient(t, k.Addrs)
		// The acknowledged records, in a slice rather than a bounded
		// channel read only after the Flush: a promise blocked on a full
		// channel stalls the client's other promises, and Flush waits for
		// them all (at 4000/s, 2^16 records fill in 16 s, which a loaded
		// machine's slow reloads reach).
		var mu sync.Mutex
		var rs []*kgo.Record
		start := time.Now()
		for i := 0; ; i++ {
			select {
			case <-stopProd:
				cl.Flush(context.Background())
				mu.Lock()
				acked := rs
				mu.Unlock()
				prodDone <- acked
				return
			default:
			}
			if due := start.Add(time.Duration(i) * time.Second / 4000); time.Until(due) > 0 {
				time.Sleep(time.Until(due))
			}
			cl.Produce(context.Background(), &kgo.Record{Topic: "rl", Key: []byte(strconv.Itoa(i)), Value: fmt.Appendf(nil, `{"id":%d}`, i)},
				func(r *kgo.Record, err error) {
					if err != nil {
						t.Errorf("produce: %v", err)
						return
					}
					produced.Add(1)
					mu.Lock()
					rs = append(rs, r)
					mu.Unlock()
				})
		}
	}()

	// Sink reader that remembers when each version first showed up.
	firstSeen := make([]time.Time, 6)
	var out []*kgo.Record
	sink := NewClient(t, k.Addrs, kgo.ConsumeTopics("rl.out"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(20*time.Millisecond))
	poll := func(d time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		for ctx.Err() == nil {
			fs := sink.PollFetches(ctx)
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				var v struct{ Ver int }
				json.Unmarshal(r.Value, &v)
				if v.Ver >= 0 && v.Ver < len(firstSeen) && firstSeen[v.Ver].IsZero() {
					firstSeen[v.Ver] = now
				}
				out = append(out, r)
			})
		}
	}
	waitVersion := func(v int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for firstSeen[v].IsZero() {
			if time.Now().After(deadline) {
				t.Fatalf("version %d never reached the sink; proxy logs:\n%s", v, p.Logs())
			}
			poll(20 * time.Millisecond)
		}
	}
	waitVersion(0)
	poll(500 * time.Millisecond)

	steadyStop := make(chan struct{})
	steadyDone := make(chan []time.Duration)
	var steadySent atomic.Int64
	go func() {
		pc := NewClient(t, k.Addrs)
		cc := NewClient(t, k.Addrs, kgo.ConsumeTopics("st.out"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(20*time.Millisecond))
		var lats []time.Duration
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-steadyStop:
				// Generous: the loop ends as soon as every sent record is read.
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				for int64(len(lats)) < steadySent.Load() && ctx.Err() == nil {
					cc.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
						var v struct{ Sent int64 }
						json.Unmarshal(r.Value, &v)
						lats = append(lats, time.Duration(time.Now().UnixNano()-v.Sent))
					})
				}
				cancel()
				steadyDone <- lats
				return
			case <-tick.C:
			}
			pc.Produce(context.Background(), &kgo.Record{Topic: "st", Value: fmt.Appendf(nil, `{"n":%d,"sent":%d}`, n, time.Now().UnixNano())},
				func(_ *kgo.Record, err error) {
					if err == nil {
						steadySent.Add(1)
					}
				})
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			cc.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
				var v struct{ Sent int64 }
				json.Unmarshal(r.Value, &v)
				lats = append(lats, time.Duration(time.Now().UnixNano()-v.Sent))
			})
			cancel()
		}
	}()

	edits := []struct {
		how   string
		write func(v int)
	}{
		{"ConfigMap ..data symlink swap", func(v int) {
			tmp := filepath.Join(dir, "..data_tmp")
			must(os.Symlink(cmDir(v), tmp))
			must(os.Rename(tmp, filepath.Join(dir, "..data")))
		}},
		{"atomic rename", func(v int) { WriteRuleFile(t, dir, "route.yaml", reloadRule(v)) }},
		{"truncate and write in place", func(v int) {
			must(os.WriteFile(filepath.Join(dir, "route.yaml"), []byte(reloadRule(v)), 0o644))
		}},
		{"atomic rename", func(v int) { WriteRuleFile(t, dir, "route.yaml", reloadRule(v)) }},
		{"chunked write (half, pause, rest)", func(v int) {
			f, err := os.OpenFile(filepath.Join(dir, "route.yaml"), os.O_WRONLY|os.O_TRUNC, 0o644)
			must(err)
			body := reloadRule(v)
			f.WriteString(body[:len(body)/2])
			time.Sleep(30 * time.Millisecond)
			f.WriteString(body[len(body)/2:])
			must(f.Close())
		}},
	}
	var effect []time.Duration
	for i, e := range edits {
		v := i + 1
		wrote := time.Now()
		e.write(v)
		waitVersion(v)
		effect = append(effect, firstSeen[v].Sub(wrote))
		t.Logf("edit %d (%s): v%d in the sink %v after the write, %d records produced", v, e.how, v, firstSeen[v].Sub(wrote).Round(time.Millisecond), produced.Load())
		poll(400 * time.Millisecond)
	}
	close(stopProd)
	produced2 := <-prodDone
	close(steadyStop)
	steady := <-steadyDone
	if int64(len(steady)) != steadySent.Load() {
		t.Errorf("untouched route: %d of %d records reached its sink", len(steady), steadySent.Load())
	}
	if len(steady) > 0 {
		sort.Slice(steady, func(i, j int) bool { return steady[i] < steady[j] })
		t.Logf("untouched route during the 5 reloads: %d records, end-to-end p50 %v, p99 %v, max %v", len(steady),
			steady[len(steady)/2].Round(10*time.Microsecond), steady[len(steady)*99/100].Round(10*time.Microsecond), steady[len(steady)-1].Round(10*time.Microsecond))
	}
	// Drain: first wait until the route is done with every produced record
	// (a loaded machine may pause longer than the quiet period below), then
	// read until the sink is quiet.
	Eventually(t, 60*time.Second, "the reload route is done with all produced records", func() error {
		var routes []struct {
			Name       string `json:"name"`
			Partitions []struct {
				HighWatermark int64 `json:"high_watermark"`
				Lag           int64 `json:"lag"`
			} `json:"partitions"`
		}
		p.GetJSON(t, "/routes", &routes)
		for _, r := range routes {
			if r.Name != "reload" {
				continue
			}
			var hwm int64
			for _, pt := range r.Partitions {
				if pt.Lag != 0 {
					return fmt.Errorf("partition lag %d", pt.Lag)
				}
				hwm += pt.HighWatermark
			}
			if hwm < int64(len(produced2)) {
				return fmt.Errorf("high watermarks sum to %d of %d produced", hwm, len(produced2))
			}
			return nil
		}
		return fmt.Errorf("no reload route in /routes")
	})
	for {
		n := len(out)
		poll(1500 * time.Millisecond)
		if len(out) == n {
			break
		}
	}

	got := map[string]int{} // rtproxy-source → version
	for _, r := range out {
		var v struct{ ID, Ver int }
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("sink record %s: %v", r.Value, err)
		}
		ref := hdr(r, "rtproxy-source")
		if _, dup := got[ref]; dup {
			t.Errorf("%s is in the sink twice: a reload repeated it", ref)
		}
		got[ref] = v.Ver
	}
	byPart := map[int32][]*kgo.Record{}
	for _, r := range produced2 {
		byPart[r.Partition] = append(byPart[r.Partition], r)
	}
	total := 0
	for part, rs := range byPart {
		sort.Slice(rs, func(i, j int) bool { return rs[i].Offset < rs[j].Offset })
		// Walk the partition in offset order. prev is the version of the
		// last output; each output must be judged by a version >= prev that
		// admits it; each record without output must lie where some version
		// between the surrounding outputs' versions rejects it.
		prev := 0
		var gap []int // ids without output since the last output
		for _, r := range rs {
			id, _ := strconv.Atoi(string(r.Key))
			ref := fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset)
			ver, ok := got[ref]
			if !ok {
				gap = append(gap, id)
				continue
			}
			total++
			if ver < prev {
				t.Errorf("partition %d offset %d: judged by v%d after a record judged by v%d", part, r.Offset, ver, prev)
			}
			if !reloadAdmits(ver, id) {
				t.Errorf("partition %d offset %d id %d: output stamped v%d, which rejects it", part, r.Offset, id, ver)
			}
			checkGap(t, part, gap, prev, ver)
			gap = gap[:0]
			prev = ver
		}
		checkGap(t, part, gap, prev, 5)
	}
	if total != len(out) {
		t.Errorf("sink holds %d records, %d of them name a produced source record", len(out), total)
	}
	sort.Slice(effect, func(i, j int) bool { return effect[i] < effect[j] })
	t.Logf("%d records produced, %d in the sink; reload-to-effect (write → first record of the new version in the sink): min %v, max %v",
		len(produced2), len(out), effect[0].Round(time.Millisecond), effect[len(effect)-1].Round(time.Millisecond))
}

// checkGap fails unless the records without output between an output
// judged by version lo and one judged by hi can each be explained by a
// version switch at a record boundary: a monotone assignment of versions
// in [lo, hi] under which each is rejected.
func checkGap(t *testing.T, part int32, ids []int, lo, hi int) {
	t.Helper()
	v := lo
	for _, id := range ids {
		for v <= hi && reloadAdmits(v, id) {
			v++
		}
		if v > hi {
			t.Errorf("partition %d: record id %d is missing from the sink, yet every version from v%d to v%d admits it (lost by a reload)", part, id, lo, hi)
			return
		}
	}
}
