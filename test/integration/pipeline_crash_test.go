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

const (
	crashBaseTS = int64(1_700_000_000_000)
	// crashN records at crashRate records/s; event time moves at the
	// producer's pace (1s of event time per crashRate records), so the
	// watermark's 5s lateness is 5s of producing.
	crashN, crashRate = 200000, 20000
)

func crashEventOf(id int) crashEvent {
	return crashEvent{ID: id, User: "u" + strconv.Itoa(id%7), Amount: float64(id%13) + 0.5, TS: crashBaseTS + int64(id)*1000/crashRate}
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
	const n, rate = crashN, crashRate
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
	// over the records the window route did not dead-letter as late. A
	// record late in one life of the proxy can be on time in the replay of
	// the next (the watermark is rebuilt by the replay, in another
	// interleaving of the partitions; see the known gap below), so in a
	// window holding such records the last emission must lie between the
	// recomputation without them and with all of them; every other window
	// must equal it exactly.
	lateRefs := map[string]bool{}
	for _, r := range ConsumeQuiet(t, k.Addrs, topic+".win.dlq", 0, time.Second, 10*time.Second) {
		if hdr(r, "rtproxy-reason") != "late" {
			t.Errorf("window route dead letter with reason %q: %s", hdr(r, "rtproxy-reason"), r.Value)
		}
		lateRefs[hdr(r, "rtproxy-source")] = true
	}
	lateWin := map[winKey]*agg{} // the late records of each window
	for ref, e := range srcByRef {
		wk := winKey{e.User, e.TS - e.TS%1000}
		into := wantWin
		if lateRefs[ref] {
			into = lateWin
		}
		a := into[wk]
		if a == nil {
			a = &agg{}
			into[wk] = a
		}
		a.n++
		a.total += e.Amount
	}
	var lastErr string
	bounded := 0
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
		bounded = 0
		for wk, a := range wantWin {
			v := last[wk]
			if v == nil {
				bad = append(bad, fmt.Sprintf("%v: no row", wk))
				continue
			}
			gotN, gotTotal := int(v["n"].(float64)), v["total"].(float64)
			if l := lateWin[wk]; l != nil {
				bounded++
				if gotN < a.n || gotN > a.n+l.n || gotTotal < a.total-0.01 || gotTotal > a.total+l.total+0.01 {
					bad = append(bad, fmt.Sprintf("%v: n=%d total=%v, want n in [%d,%d] total in [%.1f,%.1f] (%d late records)",
						wk, gotN, gotTotal, a.n, a.n+l.n, a.total, a.total+l.total, l.n))
				}
				continue
			}
			if gotN != a.n || fmt.Sprintf("%.1f", gotTotal) != fmt.Sprintf("%.1f", a.total) {
				bad = append(bad, fmt.Sprintf("%v: n=%v total=%v, want n=%d total=%.1f", wk, v["n"], v["total"], a.n, a.total))
			}
		}
		for wk := range last {
			if wantWin[wk] == nil && lateWin[wk] == nil {
				bad = append(bad, fmt.Sprintf("%v: a row for a window no source record falls in", wk))
			}
		}
		if len(bad) > 0 {
			sort.Strings(bad)
			lastErr = strings.Join(bad[:min(len(bad), 5)], "; ")
			return fmt.Errorf("%d windows differ: %s", len(bad), lastErr)
		}
		return nil
	})
	t.Logf("windows: %d match the recomputation, %d of them within bounds for their late records (%d late records dead-lettered)", len(wantWin), bounded, len(lateRefs))
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
	// Restart mid-stream: once about 2s worth of records are acked (polled,
	// so a loaded machine that produces slower still restarts mid-stream
	// rather than before the flow has begun).
	Eventually(t, 30*time.Second, "2s worth of records produced before the restart", func() error {
		if got := produced.Load(); got < 2*rate {
			return fmt.Errorf("%d records produced", got)
		}
		return nil
	})
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

// The route watermark is not in the checkpoint; each window step keeps its
// own in its snapshot. TestPipelineWindowAfterKill checks what that must
// give across SIGKILLs: a window closed before a kill is emitted again only
// by the replay since the last checkpoint, and then with the same content;
// a record behind a window closed before the kill is still late after the
// restart. One partition, so the replayed records precede the late ones
// and the verdicts are deterministic; an idle timeout of 10m keeps the
// wall clock out of the watermark.
func TestPipelineWindowAfterKill(t *testing.T) {
	const topic = "wk"
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{topic: 1}})
	rulesDir := t.TempDir()
	WriteRuleFile(t, rulesDir, "wk.yaml", `route: wk
source: { topic: wk, format: json, event_time: value.ts, watermark: 0s, idle_timeout: 10m }
sink: { topic: wk.out }
dead_letter: wk.dlq
checkpoint_interval: 4s
steps:
  - window: { kind: tumbling, size: 1s, key: value.user, aggregate: { n: count(), total: sum(value.amount) } }
`)
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rulesDir})
	cl := NewClient(t, k.Addrs)
	type ev struct {
		User   string  `json:"user"`
		Amount float64 `json:"amount"`
		TS     int64   `json:"ts"`
		Late   bool    `json:"late,omitempty"`
	}
	type winKey struct {
		user  string
		start int64
	}
	type agg struct {
		n     int
		total float64
	}
	want := map[winKey]*agg{}
	var late []string // values of the records that must be late
	produce := func(evs ...ev) {
		t.Helper()
		var rs []*kgo.Record
		for _, e := range evs {
			b, _ := json.Marshal(e)
			rs = append(rs, &kgo.Record{Topic: topic, Key: []byte(e.User), Value: b})
			if e.Late {
				late = append(late, string(b))
				continue
			}
			wk := winKey{e.User, e.TS - e.TS%1000}
			if want[wk] == nil {
				want[wk] = &agg{}
			}
			want[wk].n++
			want[wk].total += e.Amount
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// rows reads the sink: every emission per window, in order.
	rows := func() map[winKey][]string {
		t.Helper()
		out := map[winKey][]string{}
		for _, r := range ConsumeQuiet(t, k.Addrs, topic+".out", 0, 500*time.Millisecond, 10*time.Second) {
			var v map[string]any
			if err := json.Unmarshal(r.Value, &v); err != nil {
				t.Fatalf("row %s: %v", r.Value, err)
			}
			wk := winKey{fmt.Sprint(v["key"]), int64(v["window_start"].(float64))}
			out[wk] = append(out[wk], fmt.Sprintf("n=%v total=%v", v["n"], v["total"]))
		}
		return out
	}
	waitRows := func(what string, wks ...winKey) {
		t.Helper()
		Eventually(t, 20*time.Second, what, func() error {
			got := rows()
			for _, wk := range wks {
				if len(got[wk]) == 0 {
					return fmt.Errorf("no row for %v yet", wk)
				}
			}
			return nil
		})
	}
	// waitCheckpointed waits for a checkpoint taken after every record in
	// the source is done.
	waitCheckpointed := func() {
		t.Helper()
		var since time.Time
		Eventually(t, 20*time.Second, "a checkpoint after all input is done", func() error {
			var routes []struct {
				Name           string     `json:"name"`
				LastCheckpoint *time.Time `json:"last_checkpoint"`
				Partitions     []struct {
					Lag int64 `json:"lag"`
				} `json:"partitions"`
			}
			p.GetJSON(t, "/routes", &routes)
			for _, r := range routes {
				if r.Name != "wk" || len(r.Partitions) != 1 || r.Partitions[0].Lag != 0 {
					continue
				}
				if since.IsZero() {
					since = time.Now()
				}
				if r.LastCheckpoint != nil && r.LastCheckpoint.After(since) {
					return nil
				}
			}
			return fmt.Errorf("not yet")
		})
	}

	// Windows [0,1s) and [1s,2s) of users a and b; [0,1s) closes.
	produce(ev{"a", 1, 100, false}, ev{"b", 2, 200, false}, ev{"a", 3, 900, false},
		ev{"a", 4, 1100, false}, ev{"b", 5, 1500, false})
	waitRows("window [0,1s) closes", winKey{"a", 0}, winKey{"b", 0})
	// Kill 1 after a checkpoint that holds the close: the window's own
	// watermark comes back from its snapshot, while the route's restarts.
	waitCheckpointed()
	p.Kill()
	p.Restart()
	produce(ev{"a", 100, 300, true}, ev{"b", 5, 2100, false})
	waitRows("window [1s,2s) closes after restart 1", winKey{"a", 1000}, winKey{"b", 1000})
	// Kill 2 at once after [1s,2s) closed, most likely before a checkpoint
	// (every 4s) holds it: the replay closes it again.
	p.Kill()
	p.Restart()
	produce(ev{"b", 200, 1999, true}, ev{"a", 300, 50, true}, ev{"a", 6, 3100, false})
	waitRows("window [2s,3s) closes after restart 2", winKey{"b", 2000})

	dlq := ConsumeQuiet(t, k.Addrs, topic+".dlq", len(late), 500*time.Millisecond, 20*time.Second)
	gotLate := map[string]int{}
	for _, r := range dlq {
		if hdr(r, "rtproxy-reason") != "late" {
			t.Errorf("dead letter %s: reason %q, want late", r.Value, hdr(r, "rtproxy-reason"))
		}
		gotLate[string(r.Value)]++
	}
	for _, v := range late {
		if gotLate[v] == 0 {
			t.Errorf("%s was not judged late after the restart", v)
		}
	}
	got := rows()
	for wk, a := range want {
		if wk.start >= 3000 {
			continue // still open
		}
		ems := got[wk]
		if len(ems) == 0 {
			t.Errorf("window %v never emitted", wk)
			continue
		}
		wantRow := fmt.Sprintf("n=%v total=%v", a.n, a.total)
		for i, e := range ems {
			if e != wantRow {
				t.Errorf("window %v emission %d of %d: %s, want %s (every emission the same)", wk, i+1, len(ems), e, wantRow)
			}
		}
		if len(ems) > 2 {
			t.Errorf("window %v emitted %d times; only the replay after kill 2 may repeat it", wk, len(ems))
		}
		if wk.start == 0 && len(ems) != 1 {
			t.Errorf("window %v closed and checkpointed before kill 1 but emitted %d times", wk, len(ems))
		}
	}
	t.Logf("windows: %v; late dead letters: %d; [1s,2s) re-emitted by the replay after kill 2: %v",
		got, len(dlq), len(got[winKey{"a", 1000}]) > 1)
}

// TestPipelineWindowLateAcrossPartitionsAfterKill: the route's watermark
// starts over after a kill, and a window closed after the last checkpoint
// is open again in the restored state. A record written while the proxy was
// down, on a partition whose replay is short, would then be judged against
// a watermark that the other partitions' replay has not raised yet: it
// would join a window already emitted before the kill, and the replay
// would emit that window again with other content (a@1000 n=2 then n=3).
// The window workers' close journal (pipeline/journal.go: the watermark and
// the source positions applied, written durably when windows close) keeps
// those windows closed: replayed records already counted are skipped, and
// the new record is dead-lettered as late.
func TestPipelineWindowLateAcrossPartitionsAfterKill(t *testing.T) {
	const topic = "wl"
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{topic: 2}})
	rulesDir := t.TempDir()
	WriteRuleFile(t, rulesDir, "wl.yaml", `route: wl
source: { topic: wl, format: json, event_time: value.ts, watermark: 0s, idle_timeout: 10m }
sink: { topic: wl.out }
dead_letter: wl.dlq
checkpoint_interval: 4s
steps:
  - window: { kind: tumbling, size: 1s, key: value.user, aggregate: { n: count(), total: sum(value.amount) } }
`)
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rulesDir})
	cl := NewClient(t, k.Addrs, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	rec := func(part int32, user string, amount float64, ts int64) *kgo.Record {
		b, _ := json.Marshal(map[string]any{"user": user, "amount": amount, "ts": ts})
		return &kgo.Record{Topic: topic, Partition: part, Key: []byte(user), Value: b}
	}
	produce := func(rs ...*kgo.Record) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// rows: every emission per window "user@start", in sink order.
	rows := func(quiet time.Duration) map[string][]string {
		t.Helper()
		out := map[string][]string{}
		recs := ConsumeQuiet(t, k.Addrs, topic+".out", 0, quiet, 10*time.Second)
		sort.SliceStable(recs, func(i, j int) bool { return recs[i].Offset < recs[j].Offset })
		for _, r := range recs {
			var v map[string]any
			if err := json.Unmarshal(r.Value, &v); err != nil {
				t.Fatalf("row %s: %v", r.Value, err)
			}
			wk := fmt.Sprintf("%v@%v", v["key"], v["window_start"])
			out[wk] = append(out[wk], fmt.Sprintf("n=%v total=%v", v["n"], v["total"]))
		}
		return out
	}
	waitRow := func(what, wk string) {
		t.Helper()
		Eventually(t, 30*time.Second, what, func() error {
			if len(rows(100 * time.Millisecond)[wk]) == 0 {
				return fmt.Errorf("no row for %s yet", wk)
			}
			return nil
		})
	}

	// Window [1s,2s) of user a opens on both partitions; [0,1s) closes.
	produce(rec(0, "a", 1, 100), rec(1, "a", 2, 200), rec(0, "a", 3, 1100), rec(1, "a", 4, 1200))
	waitRow("window a@0 closes", "a@0")
	// A checkpoint while a@1000 is open: wait for one taken after all input
	// so far is done (polling /routes, rather than sleeping one 4s interval
	// and hoping a loaded machine has taken it by then).
	var since time.Time
	Eventually(t, 30*time.Second, "a checkpoint while a@1000 is open", func() error {
		var routes []struct {
			Name           string     `json:"name"`
			LastCheckpoint *time.Time `json:"last_checkpoint"`
			Partitions     []struct {
				Lag int64 `json:"lag"`
			} `json:"partitions"`
		}
		p.GetJSON(t, "/routes", &routes)
		for _, r := range routes {
			if r.Name != "wl" || len(r.Partitions) != 2 || r.Partitions[0].Lag != 0 || r.Partitions[1].Lag != 0 {
				continue
			}
			if since.IsZero() {
				since = time.Now()
			}
			if r.LastCheckpoint != nil && r.LastCheckpoint.After(since) {
				return nil
			}
		}
		return fmt.Errorf("not yet")
	})
	// Partition 1 gets a long run before the event time that closes
	// a@1000, so that its replay after the kill takes a while.
	var long []*kgo.Record
	for i := 0; i < 3000; i++ {
		long = append(long, rec(1, "c", 1, 1200+int64(i%700)))
	}
	long = append(long, rec(1, "a", 5, 2500))
	produce(append(long, rec(0, "a", 6, 2600))...)
	waitRow("window a@1000 closes", "a@1000")
	p.Kill()
	// Written while the proxy is down, behind a@1000, which closed before
	// the kill: it should be late. Partition 0 replays only its 2600
	// before it, partition 1 its 3001 records.
	lateRec := rec(0, "a", 1000, 1300)
	produce(lateRec)
	p.Restart()
	produce(rec(0, "a", 7, 3600), rec(1, "a", 8, 3700))
	waitRow("window a@2000 closes after the restart", "a@2000")

	dlq := ConsumeQuiet(t, k.Addrs, topic+".dlq", 0, 500*time.Millisecond, 10*time.Second)
	isLate := false
	for _, r := range dlq {
		if string(r.Value) == string(lateRec.Value) && hdr(r, "rtproxy-reason") == "late" {
			isLate = true
		}
	}
	got := rows(500 * time.Millisecond)
	want := map[string]string{"a@0": "n=2 total=3", "a@1000": "n=2 total=7", "c@1000": "n=3000 total=3000", "a@2000": "n=2 total=11"}
	for wk, w := range want {
		if len(got[wk]) == 0 {
			t.Errorf("window %s never emitted", wk)
		}
		for i, e := range got[wk] {
			if e != w {
				t.Errorf("window %s emission %d of %d: %s, want %s (the same every time)", wk, i+1, len(got[wk]), e, w)
			}
		}
	}
	if !isLate {
		t.Errorf("%s (behind window a@1000, closed before the kill) was not dead-lettered as late after the restart", lateRec.Value)
	}
	t.Logf("windows: %v", got)
}
