package integration

// Hot reload through the binary, beyond TestReloadUnderLoad (reload_test.go):
// a broken edit followed by a fix, delete and restore, state retention, and
// half-written files. Every rule version stamps its number with `set`, so the
// sink shows which version judged each record.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// hrRule is a route that passes every record and stamps ver.
func hrRule(route string, ver int) string {
	return fmt.Sprintf(`route: %s
source: { topic: %s, format: json, start: earliest }
sink: { topic: %s.out }
checkpoint_interval: 1s
steps:
  - filter: int(value.id) >= 0
  - set: { ver: %d }
`, route, route, route, ver)
}

// hrOut is one sink record.
type hrOut struct {
	ID  int
	Ver *int // nil: the record carries no marker
	Src string
}

// hrSink reads a route's sink topic from the start.
type hrSink struct {
	cl  *kgo.Client
	mu  sync.Mutex
	out []hrOut
}

func newHRSink(t *testing.T, addrs []string, topic string) *hrSink {
	return &hrSink{cl: NewClient(t, addrs, kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))}
}

// poll reads for d.
func (s *hrSink) poll(t *testing.T, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for ctx.Err() == nil {
		fs := s.cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) {
			var v struct {
				ID  int
				Ver *int
			}
			if err := json.Unmarshal(r.Value, &v); err != nil {
				t.Errorf("sink record %q is not JSON: %v", r.Value, err)
			}
			s.mu.Lock()
			s.out = append(s.out, hrOut{ID: v.ID, Ver: v.Ver, Src: hdr(r, "rtproxy-source")})
			s.mu.Unlock()
		})
	}
}

func (s *hrSink) records() []hrOut {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]hrOut(nil), s.out...)
}

// until polls until cond holds on the records read so far.
func (s *hrSink) until(t *testing.T, timeout time.Duration, what string, cond func([]hrOut) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond(s.records()) {
		if time.Now().After(deadline) {
			t.Fatalf("sink: %s: not true after %v (%d records read)", what, timeout, len(s.records()))
		}
		s.poll(t, 50*time.Millisecond)
	}
}

func hasVer(v int) func([]hrOut) bool {
	return func(rs []hrOut) bool {
		for _, r := range rs {
			if r.Ver != nil && *r.Ver == v {
				return true
			}
		}
		return false
	}
}

// hrFeed produces {"id":i} at a steady rate until stopped.
type hrFeed struct {
	stop chan struct{}
	done chan []*kgo.Record
}

func startHRFeed(t *testing.T, addrs []string, topic string, perSec int) *hrFeed {
	f := &hrFeed{stop: make(chan struct{}), done: make(chan []*kgo.Record, 1)}
	cl := NewClient(t, addrs)
	go func() {
		var mu sync.Mutex
		var acked []*kgo.Record
		start := time.Now()
		for i := 0; ; i++ {
			select {
			case <-f.stop:
				if err := cl.Flush(context.Background()); err != nil {
					t.Errorf("flush: %v", err)
				}
				mu.Lock()
				f.done <- acked
				mu.Unlock()
				return
			default:
			}
			if due := start.Add(time.Duration(i) * time.Second / time.Duration(perSec)); time.Until(due) > 0 {
				time.Sleep(time.Until(due))
			}
			cl.Produce(context.Background(), &kgo.Record{Topic: topic, Value: fmt.Appendf(nil, `{"id":%d}`, i)}, func(r *kgo.Record, err error) {
				if err != nil {
					t.Errorf("produce: %v", err)
					return
				}
				mu.Lock()
				acked = append(acked, r)
				mu.Unlock()
			})
		}
	}()
	return f
}

// Stop ends the feed and returns every acknowledged record.
func (f *hrFeed) Stop() []*kgo.Record {
	close(f.stop)
	return <-f.done
}

// produceIDs writes {"id":i} for i in [from, to) and waits for the acks.
func produceIDs(t *testing.T, cl *kgo.Client, topic string, from, to int) {
	t.Helper()
	var rs []*kgo.Record
	for i := from; i < to; i++ {
		rs = append(rs, &kgo.Record{Topic: topic, Key: []byte(strconv.Itoa(i)), Value: fmt.Appendf(nil, `{"id":%d}`, i)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce ids %d..%d: %v", from, to-1, err)
	}
}

// hrRoute is the part of a /routes entry these tests read.
type hrRoute struct {
	Name      string `json:"name"`
	File      string `json:"file"`
	State     string `json:"state"`
	RuleError string `json:"rule_error"`
	LastError string `json:"last_error"`
}

// routeEntries returns every /routes entry for the route name or file.
func routeEntries(t *testing.T, p *Proxy, name, file string) []hrRoute {
	t.Helper()
	var all []hrRoute
	p.GetJSON(t, "/routes", &all)
	var out []hrRoute
	for _, r := range all {
		if r.Name == name || r.File == file {
			out = append(out, r)
		}
	}
	return out
}

// seriesValue reads one series (name with its labels, as /metrics prints
// it) from the metrics text; -1 when absent.
func seriesValue(text, series string) float64 {
	if v, ok := metricValue(text, series); ok {
		return v
	}
	return -1
}

// grepLines returns the lines of text that contain s.
func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// exactlyOnce fails unless the sink holds every produced record's output
// exactly once (by rtproxy-source), and nothing else.
func exactlyOnce(t *testing.T, produced []*kgo.Record, out []hrOut) {
	t.Helper()
	seen := map[string]int{}
	for _, r := range out {
		seen[r.Src]++
	}
	for src, n := range seen {
		if n > 1 {
			t.Errorf("%s is in the sink %d times", src, n)
		}
	}
	missing := 0
	for _, r := range produced {
		src := fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset)
		if seen[src] == 0 {
			if missing < 5 {
				t.Errorf("%s (value %s) is missing from the sink", src, r.Value)
			}
			missing++
		}
		delete(seen, src)
	}
	if missing > 0 || len(seen) > 0 {
		t.Errorf("%d produced records missing from the sink, %d sink records name no produced record", missing, len(seen))
	}
}

// TestHotReloadBrokenThenFixed: a running route gets a filter that does not
// compile, then a YAML syntax error, then a fix. The route never stops, the
// errors (file:line:col) show in /routes and in the error counter, and the
// fix clears them and takes over.
func TestHotReloadBrokenThenFixed(t *testing.T) {
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{"hb": 2}})
	dir := t.TempDir()
	file := WriteRuleFile(t, dir, "hb.yaml", hrRule("hb", 1))
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: dir})
	sink := newHRSink(t, k.Addrs, "hb.out")
	feed := startHRFeed(t, k.Addrs, "hb", 500)
	sink.until(t, 20*time.Second, "v1 records arrive", hasVer(1))

	errSeries := `rtproxy_rules_reload_total{result="error"}`
	okSeries := `rtproxy_rules_reload_total{result="ok"}`
	broken := []struct {
		name, body, want string
	}{
		{"filter that does not compile", strings.Replace(hrRule("hb", 9), "int(value.id) >= 0", "int(value.id) >= nope(", 1),
			file + ":6:"},
		{"YAML syntax error", strings.Replace(hrRule("hb", 9), "{ ver: 9 }", "{ ver: 9", 1),
			file + ":7:"},
	}
	wantText := []string{"does not compile", "YAML syntax error"}
	for i, b := range broken {
		errBefore := seriesValue(p.Metrics(t), errSeries)
		WriteRuleFile(t, dir, "hb.yaml", b.body)
		var shown string
		Eventually(t, 15*time.Second, b.name+" shows in /routes next to the route", func() error {
			es := routeEntries(t, p, "hb", file)
			if len(es) != 1 {
				return fmt.Errorf("want one /routes entry for hb, got %+v", es)
			}
			if es[0].Name != "hb" || !strings.Contains(es[0].RuleError, b.want) || !strings.Contains(es[0].RuleError, wantText[i]) {
				return fmt.Errorf("entry %+v lacks %q / %q", es[0], b.want, wantText[i])
			}
			shown = es[0].RuleError
			return nil
		})
		t.Logf("%s: /routes rule_error = %s", b.name, shown)
		if after := seriesValue(p.Metrics(t), errSeries); after != errBefore+1 {
			t.Errorf("%s: %s went %v -> %v, want +1", b.name, errSeries, errBefore, after)
		}
		// The running version keeps going: count the records that arrive
		// while the file is broken; all carry v1.
		n0 := len(sink.records())
		for end := time.Now().Add(time.Second); time.Now().Before(end); {
			sink.poll(t, 100*time.Millisecond)
			if es := routeEntries(t, p, "hb", file); len(es) != 1 || es[0].State != "running" {
				t.Fatalf("%s: route not running: %+v", b.name, es)
			}
		}
		// The file stays broken until the next step rewrites it, so a
		// loaded machine (a pause of the pipeline or of this reader) may
		// take up to 5s more to show the old version still running.
		for began := time.Now(); len(sink.records())-n0 < 250 && time.Since(began) < 5*time.Second; {
			sink.poll(t, 100*time.Millisecond)
		}
		during := sink.records()[n0:]
		if len(during) < 250 { // 500 rec/s for 1s, allowing for a slow machine
			t.Errorf("%s: only %d records reached the sink in the 6s after the broken edit", b.name, len(during))
		}
		for _, r := range during {
			if r.Ver == nil || *r.Ver != 1 {
				t.Fatalf("%s: record id %d judged by version %v, want the running v1", b.name, r.ID, r.Ver)
			}
		}
		t.Logf("%s: %d records reached the sink, all v1, after the edit", b.name, len(during))
	}

	okBefore := seriesValue(p.Metrics(t), okSeries)
	WriteRuleFile(t, dir, "hb.yaml", hrRule("hb", 2))
	sink.until(t, 10*time.Second, "v2 records arrive after the fix", hasVer(2))
	Eventually(t, 15*time.Second, "the error clears from /routes", func() error {
		es := routeEntries(t, p, "hb", file)
		if len(es) != 1 || es[0].RuleError != "" || es[0].State != "running" {
			return fmt.Errorf("entries %+v", es)
		}
		return nil
	})
	if after := seriesValue(p.Metrics(t), okSeries); after < okBefore+1 {
		t.Errorf("%s went %v -> %v after the fix, want +1", okSeries, okBefore, after)
	}

	produced := feed.Stop()
	sink.until(t, 20*time.Second, "every produced record in the sink", func(rs []hrOut) bool { return len(rs) >= len(produced) })
	sink.poll(t, 500*time.Millisecond)
	out := sink.records()
	exactlyOnce(t, produced, out)
	// Per partition, v1 then v2, never back.
	last := map[string]int{}
	for _, r := range out {
		part := r.Src[:strings.LastIndexByte(r.Src, '/')]
		if r.Ver == nil || (*r.Ver != 1 && *r.Ver != 2) {
			t.Fatalf("record %s carries version %v; only v1 and v2 ever ran", r.Src, r.Ver)
		}
		if *r.Ver < last[part] {
			t.Errorf("%s: v%d after v%d", r.Src, *r.Ver, last[part])
		}
		last[part] = *r.Ver
	}
	t.Logf("%d records produced at 500/s across two broken edits and a fix; %d in the sink, each once", len(produced), len(out))
}

// TestHotReloadDeleteRestore: deleting a route's file stops it after a
// final checkpoint; records produced meanwhile wait; restoring the file
// resumes from that checkpoint, so every record is processed exactly once.
func TestHotReloadDeleteRestore(t *testing.T) {
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{"hd": 2}})
	dir := t.TempDir()
	file := WriteRuleFile(t, dir, "hd.yaml", hrRule("hd", 1))
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: dir})
	prod := NewClient(t, k.Addrs)
	sink := newHRSink(t, k.Addrs, "hd.out")

	produceIDs(t, prod, "hd", 0, 300)
	sink.until(t, 20*time.Second, "300 records", func(rs []hrOut) bool { return len(rs) >= 300 })

	deleted := time.Now()
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 10*time.Second, "/routes shows hd stopped", func() error {
		es := routeEntries(t, p, "hd", file)
		if len(es) != 1 || es[0].State != "stopped" {
			return fmt.Errorf("entries %+v", es)
		}
		return nil
	})
	// The final checkpoint is written as the route stops (/routes lists it
	// as stopped as soon as the stop begins).
	Eventually(t, 10*time.Second, "a final checkpoint after the delete", func() error {
		mt := p.Metrics(t)
		cp := seriesValue(mt, `rtproxy_checkpoint_last_timestamp_seconds{route="hd"}`)
		if cp < float64(deleted.UnixNano())/1e9 {
			return fmt.Errorf("last checkpoint at %v, before the delete at %v:\n%s", cp, float64(deleted.UnixNano())/1e9, grepLines(mt, "checkpoint_last"))
		}
		return nil
	})

	produceIDs(t, prod, "hd", 300, 600)
	sink.poll(t, 1500*time.Millisecond)
	if n := len(sink.records()); n != 300 {
		t.Fatalf("the deleted route still processed records: sink holds %d, want 300", n)
	}

	WriteRuleFile(t, dir, "hd.yaml", hrRule("hd", 1))
	sink.until(t, 20*time.Second, "600 records after the restore", func(rs []hrOut) bool { return len(rs) >= 600 })
	sink.poll(t, time.Second)
	if es := routeEntries(t, p, "hd", file); len(es) != 1 || es[0].State != "running" {
		t.Errorf("after the restore: %+v", es)
	}
	if !strings.Contains(p.Logs(), "route restored from checkpoint") {
		t.Errorf("the restored route did not log that it restored its checkpoint")
	}
	out := sink.records()
	ids := map[int]int{}
	srcs := map[string]bool{}
	for _, r := range out {
		ids[r.ID]++
		if srcs[r.Src] {
			t.Errorf("%s (id %d) repeated by the delete/restore", r.Src, r.ID)
		}
		srcs[r.Src] = true
	}
	for i := 0; i < 600; i++ {
		if ids[i] != 1 {
			t.Errorf("id %d is in the sink %d times, want once", i, ids[i])
		}
	}
	if len(out) != 600 {
		t.Errorf("sink holds %d records, want 600", len(out))
	}
}

// TestHotReloadStateRetention: with state_retention set, a route deleted
// for longer than the retention loses its state, and restoring its file
// starts it from source.start (earliest): the old records are processed
// again, each once more, and the new ones once.
func TestHotReloadStateRetention(t *testing.T) {
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{"hr": 2}})
	dir := t.TempDir()
	file := WriteRuleFile(t, dir, "hr.yaml", hrRule("hr", 1))
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: dir, Env: []string{"RTPROXY_STATE_RETENTION=1500ms"}})
	prod := NewClient(t, k.Addrs)
	sink := newHRSink(t, k.Addrs, "hr.out")

	produceIDs(t, prod, "hr", 0, 200)
	sink.until(t, 20*time.Second, "200 records", func(rs []hrOut) bool { return len(rs) >= 200 })
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	dropped := regexp.MustCompile(`state retention: .*route=hr `)
	Eventually(t, 10*time.Second, "the state of hr is dropped after the retention", func() error {
		if !dropped.MatchString(p.Logs()) {
			return fmt.Errorf("no retention log line for hr")
		}
		if es := routeEntries(t, p, "hr", file); len(es) != 0 {
			return fmt.Errorf("/routes still lists %+v", es)
		}
		return nil
	})
	produceIDs(t, prod, "hr", 200, 300)
	WriteRuleFile(t, dir, "hr.yaml", hrRule("hr", 2))
	sink.until(t, 20*time.Second, "500 records after the restore", func(rs []hrOut) bool { return len(rs) >= 500 })
	sink.poll(t, time.Second)
	out := sink.records()
	if len(out) != 500 {
		t.Errorf("sink holds %d records, want 500 (200 before, all 300 again from source.start)", len(out))
	}
	// v1 saw 0..199 once; v2 restarted from earliest and saw 0..299 once.
	count := map[[2]int]int{}
	for _, r := range out {
		if r.Ver == nil {
			t.Fatalf("record id %d has no version marker", r.ID)
		}
		count[[2]int{*r.Ver, r.ID}]++
	}
	for i := 0; i < 300; i++ {
		if want := map[bool]int{true: 1, false: 0}[i < 200]; count[[2]int{1, i}] != want {
			t.Errorf("id %d under v1: %d times, want %d", i, count[[2]int{1, i}], want)
		}
		if count[[2]int{2, i}] != 1 {
			t.Errorf("id %d under v2 (restarted from source.start): %d times, want 1", i, count[[2]int{2, i}])
		}
	}
}

// TestHotReloadHalfWritten: a rule file cut mid-line, or cut at a line
// boundary where the prefix is not a complete rule, and left alone far
// longer than the watcher's quiet period, never runs: the old version
// keeps judging every record. A valid cut without a final newline is held
// until complete. (A prefix that is itself a complete rule, cut exactly
// between two steps and left alone, is valid and would run: see
// docs/OPERATIONS.md — save by atomic rename.)
func TestHotReloadHalfWritten(t *testing.T) {
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{"hh": 2}})
	dir := t.TempDir()
	// Block style, so that line-boundary prefixes exist that are not rules.
	rule := func(v int) string {
		return fmt.Sprintf("route: hh\nsource:\n  topic: hh\n  format: json\nsink:\n  topic: hh.out\ncheckpoint_interval: 1s\nsteps:\n  - filter: int(value.id) >= 0\n  - set:\n      ver: %d\n", v)
	}
	file := WriteRuleFile(t, dir, "hh.yaml", rule(1))
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: dir})
	sink := newHRSink(t, k.Addrs, "hh.out")
	feed := startHRFeed(t, k.Addrs, "hh", 400)
	sink.until(t, 20*time.Second, "v1 records arrive", hasVer(1))

	v2 := rule(2)
	cutAfter := func(s string) string { return v2[:strings.Index(v2, s)+len(s)] }
	cuts := []struct{ name, body, want string }{
		{"cut mid-line in the filter", cutAfter("int(value.id"), ":9:24: filter does not compile"},
		{"cut mid-line in the set", cutAfter("    ve"), ":11:7: `set` must be a mapping"},
		{"prefix ending at `sink:`", cutAfter("sink:\n"), ":5:6: `sink` must be a mapping"},
		{"prefix ending at `- set:`", cutAfter("  - set:\n"), ":10:9: `set` must be a mapping"},
	}
	for _, c := range cuts {
		// In place, as a tool writing in chunks would: truncate, write part.
		if err := os.WriteFile(file, []byte(c.body), 0o644); err != nil {
			t.Fatal(err)
		}
		var shown string
		Eventually(t, 15*time.Second, c.name+": refused in /routes", func() error {
			es := routeEntries(t, p, "hh", file)
			if len(es) != 1 || es[0].State != "running" || !strings.HasPrefix(es[0].RuleError, file+":") || !strings.Contains(es[0].RuleError, c.want) {
				return fmt.Errorf("entries %+v", es)
			}
			shown = es[0].RuleError
			return nil
		})
		n0 := len(sink.records())
		sink.poll(t, 700*time.Millisecond) // 14 quiet periods
		// The file stays half written until the next step rewrites it, so a
		// loaded machine may take up to 5s in all to show the old version
		// still running (400 records/s are fed).
		for began := time.Now(); len(sink.records())-n0 < 100 && time.Since(began) < 5*time.Second; {
			sink.poll(t, 100*time.Millisecond)
		}
		during := sink.records()[n0:]
		if len(during) < 100 {
			t.Errorf("%s: only %d records in 5.7s while the file was half written", c.name, len(during))
		}
		t.Logf("%s: refused (%s); %d records meanwhile", c.name, shown, len(during))
		// Back to the running v1 (same content: no swap), so the next
		// cut's error is its own.
		WriteRuleFile(t, dir, "hh.yaml", rule(1))
		Eventually(t, 15*time.Second, "the error clears", func() error {
			if es := routeEntries(t, p, "hh", file); len(es) != 1 || es[0].RuleError != "" {
				return fmt.Errorf("entries %+v", es)
			}
			return nil
		})
	}
	// A cut mid-line that is itself a valid rule: version 31's marker cut
	// to `ver: 3`. It has no final newline, so the watcher holds it (1s)
	// instead of running a rule that stamps the wrong version; completing
	// the file within the hold is what a chunked writer does.
	v31 := rule(31)
	if err := os.WriteFile(file, []byte(v31[:strings.Index(v31, "ver: 3")+len("ver: 3")]), 0o644); err != nil {
		t.Fatal(err)
	}
	sink.poll(t, 600*time.Millisecond)
	if es := routeEntries(t, p, "hh", file); len(es) != 1 || es[0].RuleError != "" || es[0].State != "running" {
		t.Errorf("valid cut: %+v", es)
	}
	if err := os.WriteFile(file, []byte(v2), 0o644); err != nil {
		t.Fatal(err)
	}
	sink.until(t, 10*time.Second, "v2 records after the file is complete", hasVer(2))
	produced := feed.Stop()
	sink.until(t, 20*time.Second, "every produced record in the sink", func(rs []hrOut) bool { return len(rs) >= len(produced) })
	sink.poll(t, 500*time.Millisecond)
	out := sink.records()
	exactlyOnce(t, produced, out)
	vers := map[int]int{}
	for _, r := range out {
		if r.Ver == nil {
			t.Fatalf("record %s carries no version marker: a partial rule without its `set` step ran", r.Src)
		}
		if *r.Ver == 3 {
			t.Fatalf("record %s carries ver 3: the file cut mid-line at `ver: 3` ran", r.Src)
		}
		vers[*r.Ver]++
	}
	if len(vers) != 2 || vers[1] == 0 || vers[2] == 0 {
		t.Errorf("versions in the sink: %v, want only v1 and v2", vers)
	}
	if es := routeEntries(t, p, "hh", file); len(es) != 1 || es[0].RuleError != "" {
		t.Errorf("after the complete write: %+v", es)
	}
}

// TestHotReloadStateRetentionAcrossRestart: the retention clock is the
// route's last checkpoint, so a route deleted while the proxy was down is
// dropped after a restart too; and while a rule file that runs no route
// is refused (it may be the absent route's own, broken), nothing is dropped.
func TestHotReloadStateRetentionAcrossRestart(t *testing.T) {
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{"hx": 1}})
	dir := t.TempDir()
	file := WriteRuleFile(t, dir, "hx.yaml", hrRule("hx", 1))
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: dir, Env: []string{"RTPROXY_STATE_RETENTION=1s"}})
	prod := NewClient(t, k.Addrs)
	sink := newHRSink(t, k.Addrs, "hx.out")
	produceIDs(t, prod, "hx", 0, 50)
	sink.until(t, 20*time.Second, "50 records", func(rs []hrOut) bool { return len(rs) >= 50 })

	// Stop the proxy (final checkpoint), delete the file, and leave a
	// broken file that claims no route behind.
	if code := p.Stop(); code != 0 {
		t.Fatalf("rtproxy exited %d", code)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	broken := WriteRuleFile(t, dir, "broken.yaml", "route: hx\nsource: { topic: hx\n")
	p.Restart()
	// Well past the retention: 25 sweeps of it (one every 100ms), counted
	// by the process itself rather than by our clock.
	Eventually(t, 30*time.Second, "25 retention sweeps", func() error {
		if v, _ := metricValue(p.Metrics(t), "rtproxy_state_retention_sweeps_total"); v < 25 {
			return fmt.Errorf("%v sweeps", v)
		}
		return nil
	})
	if strings.Contains(p.Logs(), "state retention:") {
		t.Fatalf("state dropped while a refused rule file had no running route; logs:\n%s", p.Logs())
	}
	if err := os.Remove(broken); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 10*time.Second, "hx's state dropped once no refused file is left", func() error {
		if !regexp.MustCompile(`state retention: .*route=hx `).MatchString(p.Logs()) {
			return fmt.Errorf("no retention log line for hx")
		}
		return nil
	})
	WriteRuleFile(t, dir, "hx.yaml", hrRule("hx", 2))
	sink.until(t, 20*time.Second, "the 50 records again under v2", func(rs []hrOut) bool { return len(rs) >= 100 })
	sink.poll(t, 500*time.Millisecond)
	n := map[int]int{}
	for _, r := range sink.records() {
		if r.Ver != nil && *r.Ver == 2 {
			n[r.ID]++
		}
	}
	for i := 0; i < 50; i++ {
		if n[i] != 1 {
			t.Errorf("id %d under v2: %d times, want 1 (restarted from source.start)", i, n[i])
		}
	}
	if got := len(sink.records()); got != 100 {
		t.Errorf("sink holds %d records, want 100", got)
	}
}
