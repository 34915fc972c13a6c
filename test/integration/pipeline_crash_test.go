package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
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
// random moments while 200k records (the full size; about 20s here,
// producing at 20k records/s) flow through it, then checks the sink against
// an independent recomputation from the source, and that every repeat lies
// in the replay range of a kill: from the offsets of the checkpoint the
// next start restored (its "route restored from checkpoint" log line) up to
// the source's end at the kill.
func TestPipelineCrashRecovery(t *testing.T) {
	const n, rate = 200000, 20000
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
	var kills []crashKill
	for kill := 1; kill <= 3; kill++ {
		// A random moment inside the produce run, once the producer has
		// found the restarted proxy again (so every kill hits a flow).
		from := produced.Load()
		Eventually(t, 30*time.Second, "the producer writes again", func() error {
			if got := produced.Load(); got < min(from+rate/4, n) {
				return fmt.Errorf("%d records produced since the last restart", got-from)
			}
			return nil
		})
		time.Sleep(time.Duration(300+rng.IntN(1500)) * time.Millisecond)
		t.Logf("kill %d: SIGKILL at %d records produced", kill, produced.Load())
		p.Kill()
		// The producer writes through the proxy, so nothing reaches the
		// source while it is down: the end offsets now bound what the dead
		// proxy can have read (a request it forwarded just before dying is
		// given a moment to land).
		time.Sleep(200 * time.Millisecond)
		kp := crashKill{end: endOffsets(t, k.Addrs, topic)}
		mark := len(p.Logs())
		p.Restart()
		kp.restored = restoredOffsets(t, p, mark, "crash-filter")
		t.Logf("kill %d: source end %v, crash-filter restored from checkpoint offsets %v", kill, kp.end, kp.restored)
		for part, off := range kp.restored {
			if off > kp.end[part] {
				t.Errorf("kill %d: checkpoint offset %d of partition %d is past the source end %d", kill, off, part, kp.end[part])
			}
			if len(kills) > 0 && off < kills[len(kills)-1].restored[part] {
				t.Errorf("kill %d: checkpoint offset of partition %d went back from %d to %d", kill, part, kills[len(kills)-1].restored[part], off)
			}
		}
		kills = append(kills, kp)
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
	// A record output in two lives of the proxy was read again after the
	// kill between them: it lies in that kill's replay range, from the
	// restored checkpoint's offset up to the source end at the kill. Each
	// repeat needs a kill of its own, so a record in the sink c times lies
	// in the replay ranges of at least c-1 kills.
	repeats := 0
	for ref, c := range count {
		if c == 1 {
			continue
		}
		repeats += c - 1
		part, off := parseSourceRef(t, ref)
		var in []int
		for i, kp := range kills {
			if off >= kp.restored[part] && off < kp.end[part] {
				in = append(in, i+1)
			}
		}
		if len(in) < c-1 {
			t.Errorf("%s is in the sink %d times but lies in the replay range of only %d kills %v (ranges: %s)", ref, c, len(in), in, replayRanges(kills, part))
		}
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

// crashKill is what the crash test knows of one SIGKILL: the source's end
// offsets right after it and the checkpoint offsets the next start restored.
type crashKill struct {
	end, restored map[int32]int64
}

func endOffsets(t *testing.T, brokers []string, topic string) map[int32]int64 {
	t.Helper()
	adm := kadm.NewClient(NewClient(t, brokers))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lo, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = lo.Error()
	}
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	out := map[int32]int64{}
	lo.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out
}

// restoredRE reads the offsets of "route restored from checkpoint" in text
// (offsets=0:1,1:2) or JSON ("offsets":"0:1,1:2") logs.
var restoredRE = regexp.MustCompile(`offsets"?[=:]"?([0-9:,]*)`)

// restoredOffsets waits until route has started after the log position
// mark and returns the checkpoint offsets it logged restoring; a route
// that found no checkpoint logs none and starts at the source's start (0).
func restoredOffsets(t *testing.T, p *Proxy, mark int, route string) map[int32]int64 {
	t.Helper()
	var offs map[int32]int64
	Eventually(t, 30*time.Second, route+" restored after the restart", func() error {
		for _, line := range strings.Split(p.Logs()[mark:], "\n") {
			if !strings.Contains(line, "route restored from checkpoint") || !strings.Contains(line, route) {
				continue
			}
			m := restoredRE.FindStringSubmatch(line)
			if m == nil {
				return fmt.Errorf("no offsets in %q", line)
			}
			offs = map[int32]int64{}
			for _, kv := range strings.Split(m[1], ",") {
				ps, os, ok := strings.Cut(kv, ":")
				part, err1 := strconv.ParseInt(ps, 10, 32)
				off, err2 := strconv.ParseInt(os, 10, 64)
				if !ok || err1 != nil || err2 != nil {
					return fmt.Errorf("bad offsets in %q", line)
				}
				offs[int32(part)] = off
			}
			return nil
		}
		var routes []struct {
			Name  string `json:"name"`
			State string `json:"state"`
		}
		p.GetJSON(t, "/routes", &routes)
		for _, r := range routes {
			if r.Name == route && r.State == "running" {
				offs = map[int32]int64{} // no checkpoint: from offset 0
				return nil
			}
		}
		return fmt.Errorf("%s not started yet", route)
	})
	return offs
}

func parseSourceRef(t *testing.T, ref string) (int32, int64) {
	t.Helper()
	parts := strings.Split(ref, "/")
	if len(parts) != 3 {
		t.Fatalf("rtproxy-source %q is not topic/partition/offset", ref)
	}
	part, err1 := strconv.ParseInt(parts[1], 10, 32)
	off, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("rtproxy-source %q is not topic/partition/offset", ref)
	}
	return int32(part), off
}

func replayRanges(kills []crashKill, part int32) string {
	var s []string
	for i, kp := range kills {
		s = append(s, fmt.Sprintf("kill %d: [%d,%d)", i+1, kp.restored[part], kp.end[part]))
	}
	return strings.Join(s, " ")
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
