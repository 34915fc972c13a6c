package integration

// Exactly-once routes (`sink.delivery: exactly_once`) under SIGKILL, with
// instances sharing the routes, and with a zombie: a read_committed reader
// of every sink sees each expected output once, windows included.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// eoRoutes writes the three routes of srStateless, srWindow and srDedup
// as exactly-once routes (their default checkpoint_interval, 100ms).
func eoRoutes(t *testing.T, dir, source, idle string) (rec, win, dd srRoute) {
	t.Helper()
	rec = srRoute{Name: source + "-rec", Source: source, Sink: source + ".rec", DLQ: source + ".rec.dlq"}
	win = srRoute{Name: source + "-win", Source: source, Sink: source + ".win", DLQ: source + ".win.dlq", Keyed: true}
	dd = srRoute{Name: source + "-dd", Source: source, Sink: source + ".dd", DLQ: source + ".dd.dlq", Keyed: true}
	WriteRuleFile(t, dir, rec.Name+".yaml", fmt.Sprintf(`route: %s
source: { topic: %s, format: json, event_time: value.ts, idle_timeout: %s }
sink: { topic: %s, delivery: exactly_once }
dead_letter: %s
steps:
  - filter: int(value.id) %% 5 != 0
  - set: { tag: '"kept"' }
`, rec.Name, source, idle, rec.Sink, rec.DLQ))
	WriteRuleFile(t, dir, win.Name+".yaml", fmt.Sprintf(`route: %s
source: { topic: %s, format: json, event_time: value.ts, watermark: 0s, idle_timeout: %s }
sink: { topic: %s, delivery: exactly_once }
dead_letter: %s
steps:
  - window: { kind: tumbling, size: 1s, key: value.user, aggregate: { n: count(), total: sum(value.amount) } }
`, win.Name, source, idle, win.Sink, win.DLQ))
	WriteRuleFile(t, dir, dd.Name+".yaml", fmt.Sprintf(`route: %s
source: { topic: %s, format: json, event_time: value.ts, idle_timeout: %s }
sink: { topic: %s, delivery: exactly_once }
dead_letter: %s
steps:
  - drop_duplicates: { key: value.dk }
`, dd.Name, source, idle, dd.Sink, dd.DLQ))
	return rec, win, dd
}

// eoCheck reads the three sinks read_committed and checks them exactly:
// each kept record output once, each window one row equal to the
// recomputation, each dedup key passed once and output once, no dead
// letter. It returns the window rows.
func eoCheck(t *testing.T, seeds []string, rec, win, dd srRoute) map[srWinKey][]string {
	t.Helper()
	src := srSource(t, seeds, rec.Source)
	kept, wantWin, wantDD := srKept(src), srWantWindows(src), srWantDedup(src)
	var recOut, winOut, ddOut []*kgo.Record
	srWait(t, 120*time.Second, "every committed output of every route", func() error {
		recOut = srRead(t, seeds, rec.Sink)
		winOut = srRead(t, seeds, win.Sink)
		ddOut = srRead(t, seeds, dd.Sink)
		mr, _ := srCoverage(recOut, kept)
		mw := srWindowsMissing(winOut, wantWin)
		md := srDedupMissing(ddOut, wantDD)
		if mr+mw+md > 0 {
			return fmt.Errorf("%d of %d kept records, %d of %d windows, %d of %d dedup keys missing", mr, len(kept), mw, len(wantWin), md, len(wantDD))
		}
		return nil
	})
	recCount := srCheckStateless(t, recOut, kept)
	rows := srCheckWindows(t, winOut, wantWin)
	ddCount := srCheckDedup(t, ddOut, src)
	var rr []string
	for ref, n := range recCount {
		if n > 1 {
			rr = append(rr, fmt.Sprintf("%s×%d", ref, n))
		}
	}
	sort.Strings(rr)
	if len(rr) > 0 {
		t.Errorf("read_committed: %d per-record outputs repeated, e.g. %v", len(rr), rr[:min(len(rr), 8)])
	}
	if n := srRepeats(srCountRows(rows)); n > 0 {
		t.Errorf("read_committed: %d window rows repeated", n)
	}
	if n := srRepeats(ddCount); n > 0 {
		t.Errorf("read_committed: %d drop_duplicates outputs repeated", n)
	}
	for _, r := range []srRoute{rec, win, dd} {
		if dls := srRead(t, seeds, r.DLQ); len(dls) > 0 {
			t.Errorf("%s holds %d dead letters, want none; first: %s %v", r.DLQ, len(dls), dls[0].Value, dls[0].Headers)
		}
	}
	t.Logf("read_committed exact: %d kept records, %d windows, %d dedup keys, zero repeats", len(kept), len(wantWin), len(wantDD))
	return rows
}

// eoConfluentWindows reads the window sink with confluent-kafka
// (librdkafka) at read_committed and checks every window appears once.
func eoConfluentWindows(t *testing.T, bootstrap string, win srRoute, rows map[srWinKey][]string) {
	t.Helper()
	RequireTool(t, "python3-confluent-kafka")
	var res struct {
		Values []string `json:"values"`
		Errors []string `json:"errors"`
	}
	runJSONClient(t, &res, 120*time.Second, DebianPython, "clients/confluent_consume.py",
		mustJSON(map[string]any{"bootstrap": bootstrap, "topic": win.Sink, "group": "eo-confluent", "isolation": "read_committed", "timeout": 90}))
	if len(res.Errors) > 0 {
		t.Errorf("confluent-kafka read_committed errors: %v", res.Errors)
	}
	seen := map[srWinKey]int{}
	for _, v := range res.Values {
		var w struct {
			Key   string `json:"key"`
			Start int64  `json:"window_start"`
		}
		if err := json.Unmarshal([]byte(v), &w); err != nil {
			t.Fatalf("confluent-kafka read %q: %v", v, err)
		}
		if w.Key != srFlushUser {
			seen[srWinKey{w.Key, w.Start}]++
		}
	}
	for k := range rows {
		if seen[k] != 1 {
			t.Errorf("confluent-kafka read_committed: window %v seen %d times, want once", k, seen[k])
		}
	}
	if len(seen) != len(rows) {
		t.Errorf("confluent-kafka read_committed: %d windows, franz-go %d", len(seen), len(rows))
	}
}

// Three SIGKILLs of the only instance during 200k records: twice it comes
// back on its state directory (and fences its previous incarnation, whose
// open transaction aborts at once), once on an empty one (its state comes
// back from the changelogs, and the dead incarnation's transaction times
// out). A read_committed reader sees every output exactly once.
func TestExactlyOnceThroughKills(t *testing.T) {
	const source, n, rate = "eo1", 200_000, 10_000
	k := StartKfake(t, KfakeOpts{Topics: srTopics(source, 8)})
	rules := t.TempDir()
	rec, win, dd := eoRoutes(t, rules, source, "2m")
	dir := t.TempDir()
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules, StateDir: dir})
	// 1ms of event time per id: a window of each user closes every 100ms
	// of producing.
	gen := srGen(1, 1000)
	load := srStartLoad(t, k.Addrs, source, rate, n, gen)
	for i, at := range []int64{n / 4, n / 2, 3 * n / 4} {
		load.WaitAcked(t, at, 120*time.Second)
		p.Kill()
		t.Logf("SIGKILL %d at %d records produced", i+1, load.acked.Load())
		if i == 2 {
			dir = t.TempDir() // an emptyDir: restored from the changelogs
		}
		p = StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules, StateDir: dir})
	}
	load.Wait(t, 120*time.Second)
	srFlush(t, k.Addrs, source, 8, gen(n+1).TS+3_600_000)
	rows := eoCheck(t, k.Addrs, rec, win, dd)
	eoConfluentWindows(t, p.Addr, win, rows)
	// A read_uncommitted reader (kafka-python: Debian's 2.0.2 reads
	// nothing else) sees every committed output, and may see aborted ones.
	eoKafkaPythonSuperset(t, p.Addr, rec)
}

// eoKafkaPythonSuperset reads the stateless sink with kafka-python, which
// reads read_uncommitted, and checks it holds every committed output.
func eoKafkaPythonSuperset(t *testing.T, bootstrap string, rec srRoute) {
	t.Helper()
	RequireTool(t, "python3-kafka")
	committed := srRead(t, []string{bootstrap}, rec.Sink)
	ends := srMustEnds(t, []string{bootstrap}, rec.Sink)[rec.Sink]
	total := 0
	for _, e := range ends {
		total += int(e)
	}
	var res struct {
		Records []scriptRecord `json:"records"`
	}
	// Data records are at most the end offsets minus the markers; ask for
	// what read_committed saw and let the rest arrive within the timeout.
	runJSONClient(t, &res, 180*time.Second, DebianPython, "clients/kafka_python_group.py",
		mustJSON(map[string]any{"bootstrap": bootstrap, "topic": rec.Sink, "group": "eo-kafka-python", "want": total, "timeout": 40}))
	got := map[string]int{}
	for _, r := range res.Records {
		got[r.Value]++
	}
	missing := 0
	for _, r := range committed {
		if got[string(r.Value)] == 0 {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("kafka-python (read_uncommitted) misses %d of %d committed outputs", missing, len(committed))
	}
	t.Logf("kafka-python read_uncommitted: %d records, read_committed: %d (the difference is aborted transactions)", len(res.Records), len(committed))
}

// Three instances share the exactly-once routes; one is SIGKILLed under
// load (its open transaction times out at the brokers) and a fourth
// joins: read_committed readers see every output once.
func TestExactlyOnceSharedKillJoin(t *testing.T) {
	const source, rate = "eo2", 2000
	k := StartKfake(t, KfakeOpts{Topics: srTopics(source, 8)})
	rules := t.TempDir()
	rec, win, dd := eoRoutes(t, rules, source, "2m")
	routes := []srRoute{rec, win, dd}
	ps := srStartProxies(t, k, rules, 3)
	topics := map[string]map[string]int{}
	for _, r := range routes {
		topics[r.Name] = srGroupTopics(t, k.Addrs, r)
		srWaitOwned(t, r, topics[r.Name], ps, 90*time.Second)
	}
	gen := srGen(1, 1000)
	load := srStartLoad(t, k.Addrs, source, rate, 1<<30, gen)
	load.WaitAcked(t, 5*rate, 60*time.Second)
	ps[0].Kill()
	t.Logf("SIGKILL A at %d records produced", load.acked.Load())
	at := load.acked.Load()
	load.WaitAcked(t, at+3*rate, 60*time.Second)
	d := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules, StateDir: t.TempDir()})
	for _, r := range routes {
		srWaitOwned(t, r, topics[r.Name], []*Proxy{ps[1], ps[2], d}, 120*time.Second)
	}
	at = load.acked.Load()
	load.WaitAcked(t, at+3*rate, 60*time.Second)
	load.Stop(t)
	srFlush(t, k.Addrs, source, 8, gen(int(load.acked.Load())+1).TS+3_600_000)
	rows := eoCheck(t, k.Addrs, rec, win, dd)
	eoConfluentWindows(t, d.Addr, win, rows)
}

// A zombie: instance A stops (SIGSTOP) with a transaction open, the group
// gives its partitions to B, then A continues (SIGCONT). A's transaction
// commits nothing: the group refuses its offsets (its generation is
// gone), so it aborts, and A rejoins as a member like any other. The
// read_committed sinks hold every output once.
func TestExactlyOnceZombieFenced(t *testing.T) {
	const source, rate = "eo3", 1000
	k := StartKfake(t, KfakeOpts{Topics: srTopics(source, 8)})
	rules := t.TempDir()
	rec, win, dd := eoRoutes(t, rules, source, "2m")
	routes := []srRoute{rec, win, dd}
	env := []string{"RTPROXY_GROUP_SESSION_TIMEOUT=3s"}
	ps := srStartProxies(t, k, rules, 2, env...)
	a, b := ps[0], ps[1]
	topics := map[string]map[string]int{}
	for _, r := range routes {
		topics[r.Name] = srGroupTopics(t, k.Addrs, r)
		srWaitOwned(t, r, topics[r.Name], ps, 90*time.Second)
	}
	gen := srGen(1, 1000)
	load := srStartLoad(t, k.Addrs, source, rate, 1<<30, gen)
	load.WaitAcked(t, 3*rate, 60*time.Second)
	if err := a.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGSTOP A at %d records produced", load.acked.Load())
	for _, r := range routes {
		// B alone owns everything: A's session timed out.
		srWaitOwned(t, r, topics[r.Name], []*Proxy{b}, 90*time.Second)
	}
	at := load.acked.Load()
	load.WaitAcked(t, at+2*rate, 60*time.Second)
	if err := a.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGCONT A at %d records produced", load.acked.Load())
	for _, r := range routes {
		srWaitOwned(t, r, topics[r.Name], ps, 90*time.Second)
	}
	at = load.acked.Load()
	load.WaitAcked(t, at+2*rate, 60*time.Second)
	load.Stop(t)
	srFlush(t, k.Addrs, source, 8, gen(int(load.acked.Load())+1).TS+3_600_000)
	eoCheck(t, k.Addrs, rec, win, dd)
	// The zombie's commit was refused and counted as an abort.
	m, err := srMetrics(a)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := srMetric(m, "rtproxy_route_txn_aborts_total"); v < 1 {
		t.Errorf("A aborted no transaction after SIGCONT; want its stale transaction aborted:\n%s", grepLines(m, "rtproxy_route_txn"))
	}
}

// The broker restarts (kfake keeps its data and transactions in DataDir)
// while exactly-once routes have transactions open under load: the open
// transactions abort or commit, the routes go back to their last commit
// where needed, and read_committed readers see every output once.
func TestExactlyOnceBrokerRestart(t *testing.T) {
	const source, n, rate = "eo4", 20_000, 2000
	k := StartKfake(t, KfakeOpts{Topics: srTopics(source, 8), DataDir: t.TempDir()})
	rules := t.TempDir()
	rec, win, dd := eoRoutes(t, rules, source, "2m")
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules, StateDir: t.TempDir()})
	gen := srGen(1, 1000)
	load := srStartLoad(t, k.Addrs, source, rate, n, gen)
	load.WaitAcked(t, n/3, 60*time.Second)
	t.Logf("restarting kfake at %d records produced", load.acked.Load())
	k.Restart()
	load.Wait(t, 120*time.Second)
	srFlush(t, k.Addrs, source, 8, gen(n+1).TS+3_600_000)
	eoCheck(t, k.Addrs, rec, win, dd)
	m, _ := srMetrics(p)
	for _, r := range []srRoute{rec, win, dd} {
		aborts, _ := srMetric(m, "rtproxy_route_txn_aborts_total", `route="`+r.Name+`"`)
		t.Logf("%s: %v transactions aborted across the restart", r.Name, aborts)
	}
}

// Rule files of exactly-once routes edited under load (a comment added:
// the content hash changes, the steps' fingerprints do not): each edit
// swaps the route at a record boundary through a final committed
// transaction, and read_committed readers see every output once.
func TestExactlyOnceHotReload(t *testing.T) {
	const source, n, rate = "eo5", 12_000, 2000
	k := StartKfake(t, KfakeOpts{Topics: srTopics(source, 8)})
	rules := t.TempDir()
	rec, win, dd := eoRoutes(t, rules, source, "2m")
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules, StateDir: t.TempDir()})
	gen := srGen(1, 1000)
	load := srStartLoad(t, k.Addrs, source, rate, n, gen)
	for i := 1; i <= 2; i++ {
		load.WaitAcked(t, int64(i*n/3), 60*time.Second)
		for _, r := range []srRoute{rec, win, dd} {
			path := filepath.Join(rules, r.Name+".yaml")
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			WriteRuleFile(t, rules, r.Name+".yaml", fmt.Sprintf("# edit %d\n%s", i, b))
		}
		t.Logf("edit %d of every rule file at %d records produced", i, load.acked.Load())
	}
	load.Wait(t, 60*time.Second)
	srFlush(t, k.Addrs, source, 8, gen(n+1).TS+3_600_000)
	eoCheck(t, k.Addrs, rec, win, dd)
	m, _ := srMetrics(p)
	if v, _ := srMetric(m, "rtproxy_rules_reload_total", `result="ok"`); v < 2 {
		t.Errorf("rtproxy_rules_reload_total{result=ok} = %v, want the 2 edits applied", v)
	}
}
