package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Rule files of the crash and broker-restart tests: a per-record route
// (filter + set) and a window route (tumbling, on_update) on one source.
const (
	crashFilterRule = `route: crash-filter
source: { topic: %[1]s, format: json, event_time: value.ts, watermark: 5s, idle_timeout: 2s }
sink: { topic: %[1]s.out }
dead_letter: %[1]s.dlq
checkpoint_interval: 500ms
steps:
  - filter: int(value.id) %% 5 != 0
  - set: { tag: '"kept"' }
`
	crashWindowRule = `route: crash-window
source: { topic: %[1]s, format: json, event_time: value.ts, watermark: 5s, idle_timeout: 2s }
sink: { topic: %[1]s.win }
dead_letter: %[1]s.win.dlq
checkpoint_interval: 500ms
steps:
  - window: { kind: tumbling, size: 1s, key: value.user, aggregate: { n: count(), total: sum(value.amount) }, emit: on_update }
`
)

// crashEvent is one source record as the producer writes it. Event time is
// derived from the id, so the window recomputation does not depend on when
// a record was produced.
type crashEvent struct {
	ID     int     `json:"id"`
	User   string  `json:"user"`
	Amount float64 `json:"amount"`
	TS     int64   `json:"ts"`
}

const crashBaseTS = int64(1_700_000_000_000)

func crashEventOf(id int) crashEvent {
	return crashEvent{ID: id, User: "u" + strconv.Itoa(id%7), Amount: float64(id%13) + 0.5, TS: crashBaseTS + int64(id)*2}
}

// produceThrough writes n events with unique ids through seeds at about
// rate records/s, retrying across proxy restarts (the idempotent producer
// keeps each id once in the source). It returns when every record is acked.
func produceThrough(t *testing.T, seeds []string, topic string, n, rate int, progress *atomic.Int64) {
	t.Helper()
	cl := NewClient(t, seeds, kgo.RecordRetries(1<<30), kgo.RequestTimeoutOverhead(2*time.Second))
	var wg sync.WaitGroup
	var firstErr atomic.Value
	start := time.Now()
	for i := 0; i < n; i++ {
		if due := start.Add(time.Duration(i) * time.Second / time.Duration(rate)); time.Until(due) > 0 {
			time.Sleep(time.Until(due))
		}
		b, _ := json.Marshal(crashEventOf(i))
		wg.Add(1)
		cl.Produce(context.Background(), &kgo.Record{Topic: topic, Key: []byte(strconv.Itoa(i)), Value: b}, func(_ *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				firstErr.CompareAndSwap(nil, err)
			}
			progress.Add(1)
		})
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		t.Fatalf("producer: %v", e)
	}
}

// readAll reads every record of topic directly from the brokers, until the
// high watermarks seen at call time are reached.
func readAll(t *testing.T, brokers []string, topic string) []*kgo.Record {
	t.Helper()
	return ConsumeQuiet(t, brokers, topic, 0, 1500*time.Millisecond, 60*time.Second)
}

func hdr(r *kgo.Record, k string) string {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}

// TestPipelineCrashRecovery kills the proxy with SIGKILL three times at
// random moments while 20k records (not the 200k: each run must
// stay within a minute on a shared 2-core machine) flow through it, then
// checks the sink against an independent recomputation from the source.
func TestPipelineCrashRecovery(t *testing.T) {
	const n, rate = 20000, 2000
	topic := "crash"
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{topic: 4}})
	rulesDir := t.TempDir()
	WriteRuleFile(t, rulesDir, "filter.yaml", fmt.Sprintf(crashFilterRule, topic))
	WriteRuleFile(t, rulesDir, "window.yaml", fmt.Sprintf(crashWindowRule, topic))
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rulesDir})

	var produced atomic.Int64
	prodDone := make(chan struct{})
	go func() {
		defer close(prodDone)
		produceThrough(t, []string{p.Addr}, topic, n, rate, &produced)
	}()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for kill := 1; kill <= 3; kill++ {
		// A random moment inside the produce run (about 10s long).
		time.Sleep(time.Duration(800+rng.IntN(1800)) * time.Millisecond)
		t.Logf("kill %d: SIGKILL at %d records produced", kill, produced.Load())
		p.Kill()
		p.Restart()
	}
	select {
	case <-prodDone:
	case <-time.After(60 * time.Second):
		t.Fatalf("producer did not finish: %d of %d acked", produced.Load(), n)
	}

	src := readAll(t, k.Addrs, topic)
	if len(src) < n {
		t.Fatalf("source holds %d records, want at least %d", len(src), n)
	}
	// Independent recomputation from what the source topic really holds.
	wantOut := map[string]int{} // rtproxy-source → id, for records the filter keeps
	type winKey struct {
		user  string
		start int64
	}
	type agg struct {
		n     int
		total float64
	}
	wantWin := map[winKey]*agg{}
	srcByRef := map[string]crashEvent{}
	for _, r := range src {
		var e crashEvent
		if err := json.Unmarshal(r.Value, &e); err != nil {
			t.Fatalf("source record %s: %v", r.Value, err)
		}
		ref := fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset)
		srcByRef[ref] = e
		if e.ID%5 != 0 {
			wantOut[ref] = e.ID
		}
	}

	// Every kept record is in the sink at least once; repeats carry the
	// same rtproxy-source and come only from replay (at most one per kill).
	var out []*kgo.Record
	Eventually(t, 60*time.Second, "every kept record reaches the sink", func() error {
		out = readAll(t, k.Addrs, topic+".out")
		seen := map[string]bool{}
		for _, r := range out {
			seen[hdr(r, "rtproxy-source")] = true
		}
		missing := 0
		for ref := range wantOut {
			if !seen[ref] {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d kept records missing from the sink", missing, len(wantOut))
		}
		return nil
	})
	count := map[string]int{}
	for _, r := range out {
		ref := hdr(r, "rtproxy-source")
		id, ok := wantOut[ref]
		if !ok {
			t.Fatalf("sink record %s has rtproxy-source %q, which names no kept source record", r.Value, ref)
		}
		var v map[string]any
		json.Unmarshal(r.Value, &v)
		if v["tag"] != "kept" || v["id"] != float64(id) {
			t.Fatalf("sink record for %s = %s, want id %d tagged kept", ref, r.Value, id)
		}
		count[ref]++
	}
	repeats := 0
	for ref, c := range count {
		if c > 1+3 {
			t.Errorf("%s is in the sink %d times; replay after 3 kills can repeat it at most 3 times", ref, c)
		}
		repeats += c - 1
	}
	t.Logf("sink: %d outputs for %d kept records (%d repeats from replay after 3 kills)", len(out), len(wantOut), repeats)

	// Window results: the last emission per window equals the recomputation
	// (records the window route dead-lettered as late are not in it).
	lateRefs := map[string]bool{}
	for _, r := range ConsumeQuiet(t, k.Addrs, topic+".win.dlq", 0, time.Second, 10*time.Second) {
		if hdr(r, "rtproxy-reason") != "late" {
			t.Errorf("window route dead letter with reason %q: %s", hdr(r, "rtproxy-reason"), r.Value)
		}
		lateRefs[hdr(r, "rtproxy-source")] = true
	}
	for ref, e := range srcByRef {
		if lateRefs[ref] {
			continue
		}
		wk := winKey{e.User, e.TS - e.TS%1000}
		a := wantWin[wk]
		if a == nil {
			a = &agg{}
			wantWin[wk] = a
		}
		a.n++
		a.total += e.Amount
	}
	var lastErr string
	Eventually(t, 30*time.Second, "last window emissions equal the recomputation", func() error {
		rows := readAll(t, k.Addrs, topic+".win")
		// Rows of one key land in one partition in emission order, so the
		// last one read per window is the last emitted.
		sort.SliceStable(rows, func(i, j int) bool {
			if rows[i].Partition != rows[j].Partition {
				return rows[i].Partition < rows[j].Partition
			}
			return rows[i].Offset < rows[j].Offset
		})
		last := map[winKey]map[string]any{}
		for _, r := range rows {
			var v map[string]any
			if err := json.Unmarshal(r.Value, &v); err != nil {
				return fmt.Errorf("window row %s: %v", r.Value, err)
			}
			last[winKey{v["key"].(string), int64(v["window_start"].(float64))}] = v
		}
		var bad []string
		for wk, a := range wantWin {
			v := last[wk]
			if v == nil {
				bad = append(bad, fmt.Sprintf("%v: no row", wk))
				continue
			}
			if int(v["n"].(float64)) != a.n || fmt.Sprintf("%.1f", v["total"].(float64)) != fmt.Sprintf("%.1f", a.total) {
				bad = append(bad, fmt.Sprintf("%v: n=%v total=%v, want n=%d total=%.1f", wk, v["n"], v["total"], a.n, a.total))
			}
		}
		if len(last) != len(wantWin) {
			bad = append(bad, fmt.Sprintf("%d windows in the sink, want %d", len(last), len(wantWin)))
		}
		if len(bad) > 0 {
			sort.Strings(bad)
			lastErr = strings.Join(bad[:min(len(bad), 5)], "; ")
			return fmt.Errorf("%d windows differ: %s", len(bad), lastErr)
		}
		return nil
	})
	t.Logf("windows: %d match the recomputation (%d late records dead-lettered)", len(wantWin), len(lateRefs))
}

// TestPipelineBrokerRestart restarts kfake on its data dir mid-stream; the
// route resumes by itself and every kept record reaches the sink.
func TestPipelineBrokerRestart(t *testing.T) {
	const n, rate = 6000, 1000
	topic := "brst"
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{topic: 3}, DataDir: t.TempDir()})
	rulesDir := t.TempDir()
	WriteRuleFile(t, rulesDir, "filter.yaml", fmt.Sprintf(strings.Replace(crashFilterRule, "crash-filter", "brst-filter", 1), topic))
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rulesDir})

	var produced atomic.Int64
	prodDone := make(chan struct{})
	go func() {
		defer close(prodDone)
		// Straight to the brokers: this test is about the pipeline's own
		// connections riding out the restart.
		produceThrough(t, k.Addrs, topic, n, rate, &produced)
	}()
	time.Sleep(2 * time.Second)
	t.Logf("restarting kfake at %d records produced", produced.Load())
	k.Restart()
	select {
	case <-prodDone:
	case <-time.After(60 * time.Second):
		t.Fatalf("producer did not finish: %d of %d acked", produced.Load(), n)
	}
	src := readAll(t, k.Addrs, topic)
	want := map[string]bool{}
	for _, r := range src {
		var e crashEvent
		json.Unmarshal(r.Value, &e)
		if e.ID%5 != 0 {
			want[fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset)] = true
		}
	}
	if len(want) < n*4/5 {
		t.Fatalf("source holds %d kept records, want %d", len(want), n*4/5)
	}
	Eventually(t, 45*time.Second, "every kept record reaches the sink after the broker restart", func() error {
		seen := map[string]bool{}
		for _, r := range readAll(t, k.Addrs, topic+".out") {
			seen[hdr(r, "rtproxy-source")] = true
		}
		missing := 0
		for ref := range want {
			if !seen[ref] {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d missing", missing, len(want))
		}
		return nil
	})
	var routes []struct {
		Name  string `json:"name"`
		State string `json:"state"`
	}
	Eventually(t, 20*time.Second, "/routes shows the route running", func() error {
		p.GetJSON(t, "/routes", &routes)
		for _, r := range routes {
			if r.Name == "brst-filter" && r.State == "running" {
				return nil
			}
		}
		return fmt.Errorf("routes: %+v", routes)
	})
	metrics := p.Metrics(t)
	for _, want := range []string{
		`rtproxy_pipeline_records_out_total{route="brst-filter"}`,
		`rtproxy_pipeline_records_in_total{partition="0",route="brst-filter"}`,
		`rtproxy_checkpoint_last_timestamp_seconds{route="brst-filter"}`,
		`rtproxy_pipeline_lag_records{partition="2",route="brst-filter"} 0`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(metrics, `rtproxy_pipeline_records_out_total{route="brst-filter"} 0`) {
		t.Errorf("records_out_total is 0 after %d outputs", len(want))
	}
}
