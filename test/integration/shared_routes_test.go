package integration

// Shared routes (issue 9, docs/ARCHITECTURE.md): several real rtproxy
// binaries with the same rules and upstream, each with its own state dir
// and ports, share every route through its consumer group rtproxy.<route>;
// keyed steps read through <route>.<NN>-<kind>.repartition and log their
// state to <route>.<NN>-<kind>.changelog. kfake runs as its own process.
//
// Windows are checked against a brute-force recomputation from what the
// source topic really holds; per-record outputs by their rtproxy-source
// header; drop_duplicates by the set of source records it passed per key.
// Windows close on flush records (srFlush) rather than on idleness, so no
// test waits for an idle_timeout.

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestSharedRoutesThreeInstancesStateless: three instances share a
// filter + set route over 8 partitions; the outputs are exactly the kept
// records, each once but for at most 2% repeats, while the group forms.
func TestSharedRoutesThreeInstancesStateless(t *testing.T) {
	const source, n = "sr1", 3000
	k := StartKfake(t, KfakeOpts{Topics: srTopics(source, 8)})
	rules := t.TempDir()
	rec := srStateless(t, rules, source)
	ps := srStartProxies(t, k, rules, 3)
	col := srCollect(t, k.Addrs, rec.Sink)
	gen := srGen(1, 0)

	// Half while the group forms (three members joining one after the
	// other: cooperative revokes), half once it has settled.
	var evs []srEvent
	for i := 0; i < n; i++ {
		evs = append(evs, gen(i))
	}
	srProduce(t, k.Addrs, source, evs[:n/2])
	owned := srWaitOwned(t, rec, map[string]int{source: 8}, ps, 60*time.Second)
	t.Logf("owned: %v", owned)
	srProduce(t, k.Addrs, source, evs[n/2:])

	src := srSource(t, k.Addrs, source)
	kept := srKept(src)
	srWait(t, 60*time.Second, "every kept record output", func() error {
		if m, ex := srCoverage(col.Records(rec.Sink), kept); m > 0 {
			return fmt.Errorf("%d of %d missing (e.g. %s)", m, len(kept), ex)
		}
		return nil
	})
	srWaitCaughtUp(t, k.Addrs, rec, 30*time.Second)
	outs := srRead(t, k.Addrs, rec.Sink)
	count := srCheckStateless(t, outs, kept)
	limit := len(kept) * 102 / 100
	t.Logf("%d outputs for %d kept records (%d repeats; limit %d outputs)", len(outs), len(kept), srRepeats(count), limit)
	if len(outs) > limit {
		t.Errorf("%d outputs for %d kept records: more than 1.02 times the expected count (three instances each running the route?)", len(outs), len(kept))
	}
	srCheckNoDLQ(t, k.Addrs, rec.DLQ)

	// Each instance says what it owns, in /routes and in the metrics.
	total := 0.0
	for i, p := range ps {
		m, err := srMetrics(p)
		if err != nil {
			t.Fatalf("instance %d /metrics: %v", i, err)
		}
		v, ok := srMetric(m, "rtproxy_route_partitions_owned", `route="`+rec.Name+`"`)
		if !ok || v < 1 {
			t.Errorf("instance %d: rtproxy_route_partitions_owned{route=%q} = %v (found %v), want ≥ 1", i, rec.Name, v, ok)
		}
		total += v
		if _, ok := srMetric(m, "rtproxy_route_rebalances_total", `route="`+rec.Name+`"`); !ok {
			t.Errorf("instance %d: no rtproxy_route_rebalances_total{route=%q}", i, rec.Name)
		}
	}
	if total != 8 {
		t.Errorf("rtproxy_route_partitions_owned summed over the instances = %v, want the 8 source partitions", total)
	}

	// Each instance shows the whole group's assignment (the status page's
	// owner column): every source partition once, with an owner, and
	// "self" exactly on the partitions that instance owns.
	srWait(t, 30*time.Second, "every instance's /routes shows the group's assignment", func() error {
		for i, p := range ps {
			rs, err := srRoutes(p)
			if err != nil {
				return err
			}
			st := rs[rec.Name]
			seen, self := map[int32]bool{}, map[int32]bool{}
			for _, a := range st.Assignment {
				if a.Topic != source {
					continue
				}
				if seen[a.Partition] || a.Owner == "" {
					return fmt.Errorf("instance %d: assignment %+v", i, st.Assignment)
				}
				seen[a.Partition] = true
				if a.Self {
					self[a.Partition] = true
				}
			}
			if len(seen) != 8 {
				return fmt.Errorf("instance %d: %d of the 8 source partitions in its assignment %+v", i, len(seen), st.Assignment)
			}
			owned := srOwnedOf(st.Owned, source)
			if len(owned) != len(self) {
				return fmt.Errorf("instance %d: owns %v, assignment marks %v as its own", i, owned, self)
			}
			for _, p := range owned {
				if !self[p] {
					return fmt.Errorf("instance %d: owns %d, not marked its own in %+v", i, p, st.Assignment)
				}
			}
		}
		return nil
	})
}

// TestSharedRoutesThreeInstancesWindows: three instances share a tumbling
// window keyed by a value field (not the Kafka key; so through a
// repartition topic) and a drop_duplicates; every window row equals the
// brute-force recomputation and each dedup key passes exactly one record.
func TestSharedRoutesThreeInstancesWindows(t *testing.T) {
	const source, n, rate = "sr2", 2400, 1000
	k := StartKfake(t, KfakeOpts{Topics: srTopics(source, 8)})
	rules := t.TempDir()
	win := srWindow(t, rules, source, "20s")
	dd := srDedup(t, rules, source, "20s")
	ps := srStartProxies(t, k, rules, 3)
	col := srCollect(t, k.Addrs, win.Sink, dd.Sink)
	for _, r := range []srRoute{win, dd} {
		t.Logf("%s owned: %v", r.Name, srWaitOwned(t, r, srGroupTopics(t, k.Addrs, r), ps, 60*time.Second))
	}

	// 5ms of event time per id: 12s, 84 windows of 7 users, closing as the
	// load goes; every dedup key three times, on random partitions.
	gen := srGen(5, n/3)
	srStartLoad(t, k.Addrs, source, rate, n, gen).Wait(t, 60*time.Second)
	srFlush(t, k.Addrs, source, 8, gen(n).TS+3_600_000)

	src := srSource(t, k.Addrs, source)
	wantWin, wantDD := srWantWindows(src), srWantDedup(src)
	srWait(t, 60*time.Second, "every window and every dedup key output", func() error {
		mw := srWindowsMissing(col.Records(win.Sink), wantWin)
		md := srDedupMissing(col.Records(dd.Sink), wantDD)
		if mw+md > 0 {
			return fmt.Errorf("%d of %d windows, %d of %d dedup keys missing", mw, len(wantWin), md, len(wantDD))
		}
		return nil
	})
	srWaitCaughtUp(t, k.Addrs, win, 30*time.Second)
	srWaitCaughtUp(t, k.Addrs, dd, 30*time.Second)
	rows := srCheckWindows(t, srRead(t, k.Addrs, win.Sink), wantWin)
	ddCount := srCheckDedup(t, srRead(t, k.Addrs, dd.Sink), src)
	srCheckNoDLQ(t, k.Addrs, win.DLQ, dd.DLQ)
	t.Logf("%d windows (%d repeated emissions), %d dedup keys (%d repeated outputs)",
		len(wantWin), srRepeats(srCountRows(rows)), len(wantDD), srRepeats(ddCount))
	if r := srRepeats(srCountRows(rows)); r > 0 {
		t.Errorf("%d windows emitted more than once with no failure at all", r)
	}
	if r := srRepeats(ddCount); r > 0 {
		t.Errorf("%d dedup outputs repeated with no failure at all", r)
	}
}

// TestSharedRoutesKillJoinLeave: three instances under load; one is
// SIGKILLed, a fourth joins, one leaves by SIGTERM. Windows and
// drop_duplicates stay exact; per-record repeats lie only in the killed
// instance's replay range (from the group's committed offset at the kill
// to the source's end at the kill, on the partitions it owned); the join
// and the SIGTERM leave repeat nothing (no output of any route is repeated
// between the reading taken once the kill's replay is committed and the
// end).
func TestSharedRoutesKillJoinLeave(t *testing.T) {
	const source, rate = "sr3", 500
	k := StartKfake(t, KfakeOpts{Topics: srTopics(source, 8)})
	rules := t.TempDir()
	rec := srStateless(t, rules, source)
	// A long idle_timeout: the killed instance's source partitions are
	// silent until the group gives them to another instance; they must
	// hold the watermark back meanwhile, or their replayed records would
	// be late. (The last windows close on flush records, not on idleness.)
	win := srWindow(t, rules, source, "2m")
	dd := srDedup(t, rules, source, "2m")
	routes := []srRoute{rec, win, dd}
	ps := srStartProxies(t, k, rules, 3)
	a, b, c := ps[0], ps[1], ps[2]
	col := srCollect(t, k.Addrs, rec.Sink, win.Sink, dd.Sink)
	topics := map[string]map[string]int{}
	for _, r := range routes {
		topics[r.Name] = srGroupTopics(t, k.Addrs, r)
	}
	ownedBy := func(procs ...*Proxy) map[string][][]srTP {
		out := map[string][][]srTP{}
		for _, r := range routes {
			out[r.Name] = srWaitOwned(t, r, topics[r.Name], procs, 90*time.Second)
		}
		return out
	}
	allTopics := func() []string {
		var ts []string
		seen := map[string]bool{}
		for _, r := range routes {
			for tp := range topics[r.Name] {
				if !seen[tp] {
					seen[tp] = true
					ts = append(ts, tp)
				}
			}
		}
		sort.Strings(ts)
		return ts
	}
	owned := ownedBy(a, b, c)

	// 2ms of event time per id at 500 records/s: event time keeps pace with
	// the wall clock, one window of each user closes per second.
	gen := srGen(1000/rate, 1000)
	load := srStartLoad(t, k.Addrs, source, rate, 1<<30, gen)
	srWait(t, 30*time.Second, "the route works under load", func() error {
		if n := col.Len(rec.Sink); n < rate {
			return fmt.Errorf("%d outputs", n)
		}
		return nil
	})

	// SIGKILL A (the first member). Right after, the group's commits are
	// where its replacement will resume, and A cannot have read past the
	// ends: its replay range.
	owned = ownedBy(a, b, c)
	victim := map[string][]srTP{}
	for _, r := range routes {
		victim[r.Name] = owned[r.Name][0]
	}
	a.Kill()
	endAtKill := srMustEnds(t, k.Addrs, allTopics()...)
	committedAtKill := map[string]srOffsets{}
	for _, r := range routes {
		got, err := srCommitted(k.Addrs, r.Group())
		if err != nil {
			t.Fatalf("committed offsets of %s: %v", r.Group(), err)
		}
		committedAtKill[r.Name] = got
	}
	killedAt := time.Now()
	t.Logf("SIGKILL A at %d records produced; A owned %v; ends %v; committed %v", load.acked.Load(), victim, endAtKill, committedAtKill)
	ownedBy(b, c)
	t.Logf("A's partitions reassigned %v after the kill", time.Since(killedAt).Round(time.Millisecond))
	for _, r := range routes {
		want := srOffsets{}
		for tp := range topics[r.Name] {
			want[tp] = endAtKill[tp]
		}
		srWaitCommittedAtLeast(t, k.Addrs, r.Group(), want, 60*time.Second)
	}
	t.Logf("A's replay committed %v after the kill", time.Since(killedAt).Round(time.Millisecond))
	type reading struct {
		rec, dd map[string]int
		win     map[srWinKey]int
	}
	read := func() reading {
		return reading{
			rec: srCountBySource(srRead(t, k.Addrs, rec.Sink)),
			dd:  srCountBySource(srRead(t, k.Addrs, dd.Sink)),
			win: srCountRows(srCheckWindowRowsOnly(t, srRead(t, k.Addrs, win.Sink))),
		}
	}
	// newRepeats compares two readings: outputs repeated in between.
	newRepeats := func(what string, before, after reading) {
		t.Helper()
		if r := srNewRepeats(before.rec, after.rec); len(r) > 0 {
			sort.Strings(r)
			t.Errorf("%s repeated %d per-record outputs (by rtproxy-source), e.g. %v", what, len(r), r[:min(len(r), 8)])
		}
		if r := srNewRepeats(before.dd, after.dd); len(r) > 0 {
			sort.Strings(r)
			t.Errorf("%s repeated %d drop_duplicates outputs (by rtproxy-source), e.g. %v", what, len(r), r[:min(len(r), 8)])
		}
		var rw []string
		for wk, n := range after.win {
			if before.win[wk] > 0 && n > before.win[wk] {
				rw = append(rw, fmt.Sprintf("%v emitted %d times, %d before", wk, n, before.win[wk]))
			}
		}
		if len(rw) > 0 {
			sort.Strings(rw)
			t.Errorf("%s emitted %d closed windows again, e.g. %v", what, len(rw), rw[:min(len(rw), 8)])
		}
	}
	afterKill := read()

	// A fourth instance joins under load: a graceful, cooperative move.
	d := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules, StateDir: t.TempDir()})
	ownedBy(b, c, d)
	at := load.acked.Load()
	load.WaitAcked(t, at+rate, 30*time.Second)
	for _, r := range routes {
		srWaitCommittedAtLeast(t, k.Addrs, r.Group(), srMustEnds(t, k.Addrs, srTopicNames(topics[r.Name])...), 60*time.Second)
	}
	afterJoin := read()
	newRepeats("D's join", afterKill, afterJoin)

	// B leaves by SIGTERM under load: a final checkpoint of its tasks
	// before they are released.
	t.Logf("SIGTERM B at %d records produced", load.acked.Load())
	if code := b.Stop(); code != 0 {
		t.Errorf("B exited %d after SIGTERM, want 0", code)
	}
	ownedBy(c, d)
	at = load.acked.Load()
	load.WaitAcked(t, at+rate, 30*time.Second)
	load.Stop(t)
	srFlush(t, k.Addrs, source, 8, gen(int(load.acked.Load())+1).TS+3_600_000)

	src := srSource(t, k.Addrs, source)
	kept, wantWin, wantDD := srKept(src), srWantWindows(src), srWantDedup(src)
	srWait(t, 90*time.Second, "every output of every route", func() error {
		mr, _ := srCoverage(col.Records(rec.Sink), kept)
		mw := srWindowsMissing(col.Records(win.Sink), wantWin)
		md := srDedupMissing(col.Records(dd.Sink), wantDD)
		if mr+mw+md > 0 {
			return fmt.Errorf("%d of %d kept records, %d of %d windows, %d of %d dedup keys missing", mr, len(kept), mw, len(wantWin), md, len(wantDD))
		}
		return nil
	})
	for _, r := range routes {
		srWaitCaughtUp(t, k.Addrs, r, 60*time.Second)
	}
	final := read()
	newRepeats("B's SIGTERM leave", afterJoin, final)

	// Exact results.
	recCount := srCheckStateless(t, srRead(t, k.Addrs, rec.Sink), kept)
	rows := srCheckWindows(t, srRead(t, k.Addrs, win.Sink), wantWin)
	ddCount := srCheckDedup(t, srRead(t, k.Addrs, dd.Sink), src)
	srCheckNoDLQ(t, k.Addrs, rec.DLQ, win.DLQ, dd.DLQ)

	// Per-record repeats only inside A's replay range.
	inRange := map[int32][2]int64{}
	for _, p := range srOwnedOf(victim[rec.Name], source) {
		inRange[p] = [2]int64{committedAtKill[rec.Name][source][p], endAtKill[source][p]}
	}
	bad := 0
	for ref, c := range recCount {
		if c == 1 {
			continue
		}
		_, p, off, _ := srParseRef(ref)
		rg, ok := inRange[p]
		if c > 2 || !ok || off < rg[0] || off >= rg[1] {
			if bad++; bad <= 8 {
				t.Errorf("%s output %d times; only records in A's replay range repeat, once (A's ranges: %v)", ref, c, inRange)
			}
		}
	}
	// drop_duplicates repeats come from A's keyed tasks replaying their
	// repartition partitions: at most the records in those ranges.
	ddBound := int64(0)
	for _, tp := range victim[dd.Name] {
		if tp.Topic != source {
			ddBound += endAtKill[tp.Topic][tp.Partition] - committedAtKill[dd.Name][tp.Topic][tp.Partition]
		}
	}
	if r := srRepeats(ddCount); int64(r) > ddBound {
		t.Errorf("%d drop_duplicates outputs repeated, more than the %d records in A's repartition replay ranges", r, ddBound)
	}
	t.Logf("stateless: %d kept, %d repeats (A's ranges %v); windows: %d, %d repeated emissions; dedup: %d keys, %d repeats (bound %d)",
		len(kept), srRepeats(recCount), inRange, len(wantWin), srRepeats(srCountRows(rows)), len(wantDD), srRepeats(ddCount), ddBound)
}

// TestSharedRoutesDedupAcrossMove: dedup keys remembered by instance A are
// still remembered after A leaves (SIGTERM) and its partitions move to B.
func TestSharedRoutesDedupAcrossMove(t *testing.T) {
	const source, keys = "sr4", 40
	k := StartKfake(t, KfakeOpts{Topics: srTopics(source, 4)})
	rules := t.TempDir()
	dd := srDedup(t, rules, source, "20s")
	ps := srStartProxies(t, k, rules, 2)
	a, b := ps[0], ps[1]
	col := srCollect(t, k.Addrs, dd.Sink)
	topics := srGroupTopics(t, k.Addrs, dd)
	srWaitOwned(t, dd, topics, ps, 60*time.Second)

	// Keys k0..k39, each once, spread over every repartition partition.
	mk := func(id int, dk string) srEvent {
		return srEvent{ID: id, User: "u", Amount: 1, TS: srBaseTS + int64(id), DK: dk}
	}
	var first []srEvent
	for i := 0; i < keys; i++ {
		first = append(first, mk(i, fmt.Sprintf("k%d", i)))
	}
	srProduce(t, k.Addrs, source, first)
	srWait(t, 30*time.Second, "every first record passed", func() error {
		if n := col.Len(dd.Sink); n < keys {
			return fmt.Errorf("%d of %d", n, keys)
		}
		return nil
	})
	srWaitCaughtUp(t, k.Addrs, dd, 30*time.Second)
	owned := srWaitOwned(t, dd, topics, ps, 30*time.Second)
	// A is the instance that owns keyed (repartition) partitions: the one
	// whose remembered keys must move. The group decides which that is.
	keyedOf := func(i int) []srTP {
		var out []srTP
		for _, tp := range owned[i] {
			if tp.Topic != source {
				out = append(out, tp)
			}
		}
		return out
	}
	if len(keyedOf(0)) < len(keyedOf(1)) {
		a, b = b, a
		owned[0], owned[1] = owned[1], owned[0]
	}
	aKeyed := keyedOf(0)
	if len(aKeyed) == 0 {
		t.Fatalf("no instance owns a repartition partition (%v), so none remembers a key: nothing would move", owned)
	}
	onA := srKeysOn(t, k.Addrs, aKeyed)
	t.Logf("A owns %v; keys on A's partitions (by the repartition records' keys): %v", aKeyed, onA)

	if code := a.Stop(); code != 0 {
		t.Errorf("A exited %d after SIGTERM, want 0", code)
	}
	srWaitOwned(t, dd, topics, []*Proxy{b}, 60*time.Second)

	// The duplicates, now all owned by B, and 5 new keys as a control.
	var second []srEvent
	for i := 0; i < keys; i++ {
		second = append(second, mk(1000+i, fmt.Sprintf("k%d", i)))
	}
	for i := 0; i < 5; i++ {
		second = append(second, mk(2000+i, fmt.Sprintf("new%d", i)))
	}
	srProduce(t, k.Addrs, source, second)
	srWait(t, 30*time.Second, "the new keys passed", func() error {
		if n := col.Len(dd.Sink); n < keys+5 {
			return fmt.Errorf("%d of %d", n, keys+5)
		}
		return nil
	})
	srWaitCaughtUp(t, k.Addrs, dd, 30*time.Second)
	src := srSource(t, k.Addrs, source)
	outs := srRead(t, k.Addrs, dd.Sink)
	count := srCheckDedup(t, outs, src)
	var leaked []string
	for ref, c := range count {
		if s := src[ref]; c > 0 && s.E.ID >= 1000 && s.E.ID < 2000 {
			leaked = append(leaked, s.E.DK)
		}
	}
	sort.Strings(leaked)
	if len(leaked) > 0 {
		t.Errorf("after the move the duplicates of %d keys passed: %v (keys on A: %v); changelog: %s", len(leaked), leaked, onA, srChangelogSummary(t, k.Addrs, dd))
	}
	if r := srRepeats(count); r > 0 {
		t.Errorf("%d outputs repeated across A's graceful leave", r)
	}
}

// srKeysOn reads the repartition partitions tps and returns the record keys
// found there (the dedup keys those partitions own), for the log.
func srKeysOn(t *testing.T, seeds []string, tps []srTP) []string {
	t.Helper()
	want := map[srTP]bool{}
	var topics []string
	for _, tp := range tps {
		if !want[srTP{tp.Topic, -1}] {
			topics = append(topics, tp.Topic)
			want[srTP{tp.Topic, -1}] = true
		}
		want[tp] = true
	}
	seen := map[string]bool{}
	for _, tp := range topics {
		for _, r := range srRead(t, seeds, tp) {
			if want[srTP{r.Topic, r.Partition}] && len(r.Key) > 0 {
				seen[strings.Trim(string(r.Key), `"`)] = true
			}
		}
	}
	var out []string
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// srOpenWindowBatch is records of window [srBaseTS, srBaseTS+1s) for users
// u0..u6 (so it stays open: no event time reaches its end) with dedup
// keys dkPrefix0.., ids from id0.
func srOpenWindowBatch(id0, n int, dkPrefix string) []srEvent {
	var evs []srEvent
	for i := 0; i < n; i++ {
		id := id0 + i
		evs = append(evs, srEvent{ID: id, User: "u" + fmt.Sprint(i%7), Amount: id%13 + 1, TS: srBaseTS + int64(i%1000), DK: fmt.Sprintf("%s%d", dkPrefix, i)})
	}
	return evs
}

// srWindowAcrossRestart is the body of the GOMAXPROCS and empty-state-dir
// tests: window [0,1s) of 7 users gets records before and after restart,
// and drop_duplicates keys seen before get duplicates after; the window
// emitted after the restart holds both halves and the duplicates are
// dropped. restart stops the first instance and returns the one that
// carries on.
func srWindowAcrossRestart(t *testing.T, source string, restart func(k *Kfake, rules string, p *Proxy, routes []srRoute) *Proxy) {
	k := StartKfake(t, KfakeOpts{Topics: srTopics(source, 8)})
	rules := t.TempDir()
	win := srWindow(t, rules, source, "20s")
	dd := srDedup(t, rules, source, "20s")
	routes := []srRoute{win, dd}
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules, StateDir: t.TempDir(), Env: []string{"GOMAXPROCS=4"}})
	col := srCollect(t, k.Addrs, win.Sink, dd.Sink)
	for _, r := range routes {
		srWaitOwned(t, r, srGroupTopics(t, k.Addrs, r), []*Proxy{p}, 60*time.Second)
	}

	const half = 140
	srProduce(t, k.Addrs, source, srOpenWindowBatch(0, half, "a"))
	srWait(t, 30*time.Second, "the first half's dedup outputs", func() error {
		if n := col.Len(dd.Sink); n < half {
			return fmt.Errorf("%d of %d", n, half)
		}
		return nil
	})
	for _, r := range routes {
		srWaitCaughtUp(t, k.Addrs, r, 30*time.Second)
	}
	if n := col.Len(win.Sink); n > 0 {
		t.Fatalf("window [0,1s) emitted %d rows before any event time reached its end", n)
	}

	p = restart(k, rules, p, routes)
	for _, r := range routes {
		srWaitOwned(t, r, srGroupTopics(t, k.Addrs, r), []*Proxy{p}, 60*time.Second)
	}

	// Second half: the same window, the first half's dedup keys again, and
	// as many new keys.
	second := srOpenWindowBatch(half, half, "a")
	second = append(second, srOpenWindowBatch(2*half, half, "b")...)
	srProduce(t, k.Addrs, source, second)
	srFlush(t, k.Addrs, source, 8, srBaseTS+3_600_000)
	src := srSource(t, k.Addrs, source)
	wantWin := srWantWindows(src)
	if len(wantWin) != 7 {
		t.Fatalf("recomputation has %d windows, want 7 (u0..u6 in [0,1s))", len(wantWin))
	}
	srWait(t, 60*time.Second, "window [0,1s) of every user emitted", func() error {
		if m := srWindowsMissing(col.Records(win.Sink), wantWin); m > 0 {
			return fmt.Errorf("%d of %d windows missing", m, len(wantWin))
		}
		return nil
	})
	for _, r := range routes {
		srWaitCaughtUp(t, k.Addrs, r, 30*time.Second)
	}
	rows := srCheckWindows(t, srRead(t, k.Addrs, win.Sink), wantWin)
	t.Logf("windows after the restart: %v (want %v)", rows, wantWin)
	count := srCheckDedup(t, srRead(t, k.Addrs, dd.Sink), src)
	if t.Failed() {
		t.Logf("changelogs: %s; %s", srChangelogSummary(t, k.Addrs, win), srChangelogSummary(t, k.Addrs, dd))
	}
	t.Logf("dedup: %d source records passed for %d keys (%d records in the source)", len(count), len(srWantDedup(src)), len(src))
	srCheckNoDLQ(t, k.Addrs, win.DLQ, dd.DLQ)
}

// TestSharedRoutesGOMAXPROCSChange: an instance restarted with another
// GOMAXPROCS (another CPU limit) keeps its open windows and dedup keys:
// state belongs to partitions, not to workers.
func TestSharedRoutesGOMAXPROCSChange(t *testing.T) {
	srWindowAcrossRestart(t, "sr5", func(k *Kfake, rules string, p *Proxy, routes []srRoute) *Proxy {
		if code := p.Stop(); code != 0 {
			t.Errorf("exit %d after SIGTERM, want 0", code)
		}
		p.Opts.Env = []string{"GOMAXPROCS=1"}
		p.Restart()
		return p
	})
}

// TestSharedRoutesEmptyStateDirRestores: an instance that takes over on an
// EMPTY state dir (emptyDir after a rollout) restores the keyed state from
// the changelog: /routes or the metrics show restored records, and the
// window and dedup results are exact.
func TestSharedRoutesEmptyStateDirRestores(t *testing.T) {
	srWindowAcrossRestart(t, "sr6", func(k *Kfake, rules string, p *Proxy, routes []srRoute) *Proxy {
		for _, r := range routes {
			cl, err := srTopicsLike(k.Addrs, r.Name+".", ".changelog")
			if err != nil || len(cl) == 0 {
				t.Errorf("%s: no changelog topic %s.<NN>-<kind>.changelog (%v)", r.Name, r.Name, err)
			}
		}
		if code := p.Stop(); code != 0 {
			t.Errorf("exit %d after SIGTERM, want 0", code)
		}
		empty := t.TempDir()
		np := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules, StateDir: empty})
		srWait(t, 60*time.Second, "the new instance restored state from the changelog", func() error {
			rs, err := srRoutes(np)
			if err != nil {
				return err
			}
			m, err := srMetrics(np)
			if err != nil {
				return err
			}
			var got []string
			ok := true
			for _, r := range routes {
				st := rs[r.Name]
				recs := int64(-1)
				if st.Restore != nil {
					recs = st.Restore.Records
				}
				mv, _ := srMetric(m, "rtproxy_state_restore_records_total", `route="`+r.Name+`"`)
				got = append(got, fmt.Sprintf("%s: /routes restore %+v, metric %v", r.Name, st.Restore, mv))
				if recs <= 0 && mv <= 0 {
					ok = false
				}
			}
			if !ok {
				return fmt.Errorf("%s", strings.Join(got, "; "))
			}
			t.Logf("restore: %s", strings.Join(got, "; "))
			return nil
		})
		// Restore seconds: a histogram (its _count) or a plain gauge.
		srWait(t, 30*time.Second, "rtproxy_state_restore_seconds observed", func() error {
			m := srMustMetrics(t, np)
			for _, name := range []string{"rtproxy_state_restore_seconds_count", "rtproxy_state_restore_seconds"} {
				if v, ok := srMetric(m, name); ok && v > 0 {
					return nil
				}
			}
			return fmt.Errorf("no rtproxy_state_restore_seconds sample > 0")
		})
		return np
	})
}

func srMustMetrics(t *testing.T, p *Proxy) string {
	t.Helper()
	m, err := srMetrics(p)
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	return m
}

// TestSharedRoutesPartitionAdded: partitions added to the source while the
// routes run are picked up by the group (its metadata refresh) and their
// records processed, by a stateless and a keyed route.
func TestSharedRoutesPartitionAdded(t *testing.T) {
	const source = "sr7"
	k := StartKfake(t, KfakeOpts{Topics: srTopics(source, 2)})
	rules := t.TempDir()
	rec := srStateless(t, rules, source)
	dd := srDedup(t, rules, source, "20s")
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules, StateDir: t.TempDir()})
	col := srCollect(t, k.Addrs, rec.Sink, dd.Sink)
	for _, r := range []srRoute{rec, dd} {
		srWaitOwned(t, r, srGroupTopics(t, k.Addrs, r), []*Proxy{p}, 60*time.Second)
	}
	gen := srGen(1, 0)
	var evs []srEvent
	for i := 1; i <= 20; i++ {
		evs = append(evs, gen(i))
	}
	srProduce(t, k.Addrs, source, evs)
	srWait(t, 30*time.Second, "the first records processed", func() error {
		if n := col.Len(dd.Sink); n < 20 {
			return fmt.Errorf("%d of 20", n)
		}
		return nil
	})

	err := srAdmin(k.Addrs, func(ctx context.Context, adm *kadm.Client) error {
		rs, err := adm.CreatePartitions(ctx, 2, source)
		if err == nil {
			err = rs.Error()
		}
		return err
	})
	if err != nil {
		t.Fatalf("add 2 partitions to %s: %v", source, err)
	}
	added := time.Now()
	// A fresh producer, which sees 4 partitions, writes to the new ones.
	cl := NewClient(t, k.Addrs, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	var rs []*kgo.Record
	for i := 0; i < 20; i++ {
		r := srRecord(source, gen(100+i))
		r.Partition = int32(2 + i%2)
		rs = append(rs, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce to the new partitions: %v", err)
	}
	src := srSource(t, k.Addrs, source)
	newRefs := func(keep func(srEvent) bool) map[string]srEvent {
		out := map[string]srEvent{}
		for ref, s := range src {
			if s.Rec.Partition >= 2 && keep(s.E) {
				out[ref] = s.E
			}
		}
		return out
	}
	wantRec := newRefs(func(e srEvent) bool { return e.ID%5 != 0 })
	wantDD := newRefs(func(srEvent) bool { return true })
	if len(wantDD) != 20 {
		t.Fatalf("the new partitions hold %d records, want 20", len(wantDD))
	}
	srWait(t, 60*time.Second, "the records of the added partitions processed by both routes", func() error {
		mr, exr := srCoverage(col.Records(rec.Sink), wantRec)
		md, exd := srCoverage(col.Records(dd.Sink), wantDD)
		if mr+md > 0 {
			var owned []srTP
			if rs, err := srRoutes(p); err == nil {
				owned = append(rs[rec.Name].Owned, rs[dd.Name].Owned...)
			}
			return fmt.Errorf("stateless: %d of %d missing (e.g. %s); dedup: %d of %d missing (e.g. %s); owned now %v", mr, len(wantRec), exr, md, len(wantDD), exd, owned)
		}
		return nil
	})
	t.Logf("records of the added partitions processed %v after CreatePartitions", time.Since(added).Round(time.Millisecond))
	rsts, err := srRoutes(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []srRoute{rec, dd} {
		got := srOwnedOf(rsts[r.Name].Owned, source)
		sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
		if fmt.Sprint(got) != "[0 1 2 3]" {
			t.Errorf("%s owns source partitions %v, want [0 1 2 3]", r.Name, got)
		}
	}
	srWaitCaughtUp(t, k.Addrs, rec, 30*time.Second)
	srWaitCaughtUp(t, k.Addrs, dd, 30*time.Second)
	srCheckStateless(t, srRead(t, k.Addrs, rec.Sink), srKept(src))
	srCheckDedup(t, srRead(t, k.Addrs, dd.Sink), src)
}

// TestSharedRoutesBrokerRestartDuringRebalance: a second instance joins
// (a rebalance) and the broker restarts (on its data dir) while it does;
// afterwards both instances share the routes and every record is
// processed: nothing is lost.
func TestSharedRoutesBrokerRestartDuringRebalance(t *testing.T) {
	const source, n, rate = "sr8", 3000, 300
	k := StartKfake(t, KfakeOpts{Topics: srTopics(source, 6), DataDir: t.TempDir()})
	rules := t.TempDir()
	rec := srStateless(t, rules, source)
	dd := srDedup(t, rules, source, "20s")
	routes := []srRoute{rec, dd}
	a := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules, StateDir: t.TempDir()})
	col := srCollect(t, k.Addrs, rec.Sink, dd.Sink)
	topics := map[string]map[string]int{}
	for _, r := range routes {
		topics[r.Name] = srGroupTopics(t, k.Addrs, r)
		srWaitOwned(t, r, topics[r.Name], []*Proxy{a}, 60*time.Second)
	}
	load := srStartLoad(t, k.Addrs, source, rate, n, srGen(1, 0))
	srWait(t, 30*time.Second, "the routes work under load", func() error {
		if got := col.Len(dd.Sink); got < rate {
			return fmt.Errorf("%d outputs", got)
		}
		return nil
	})

	// B joins; restart the broker while the group rebalances (before B
	// has been given anything).
	b := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules, StateDir: t.TempDir()})
	var during []string
	if rs, err := srRoutes(b); err == nil {
		for _, r := range routes {
			during = append(during, fmt.Sprintf("%s: state %s generation %d owned %v", r.Name, rs[r.Name].State, rs[r.Name].Generation, rs[r.Name].Owned))
		}
	}
	t.Logf("restarting kfake at %d records produced; B: %v", load.acked.Load(), during)
	k.Restart()
	load.Wait(t, 60*time.Second)

	for _, r := range routes {
		srWaitOwned(t, r, topics[r.Name], []*Proxy{a, b}, 90*time.Second)
	}
	src := srSource(t, k.Addrs, source)
	if len(src) < n {
		t.Fatalf("source holds %d records, want %d", len(src), n)
	}
	kept := srKept(src)
	all := map[string]srEvent{}
	for ref, s := range src {
		all[ref] = s.E
	}
	srWait(t, 90*time.Second, "every record processed by both routes", func() error {
		mr, exr := srCoverage(col.Records(rec.Sink), kept)
		md, exd := srCoverage(col.Records(dd.Sink), all)
		if mr+md > 0 {
			return fmt.Errorf("stateless: %d of %d missing (e.g. %s); dedup: %d of %d missing (e.g. %s)", mr, len(kept), exr, md, len(all), exd)
		}
		return nil
	})
	for _, r := range routes {
		srWaitCaughtUp(t, k.Addrs, r, 60*time.Second)
	}
	recCount := srCheckStateless(t, srRead(t, k.Addrs, rec.Sink), kept)
	ddCount := srCheckDedup(t, srRead(t, k.Addrs, dd.Sink), src)
	t.Logf("stateless: %d kept, %d repeats; dedup: %d keys, %d repeats", len(kept), srRepeats(recCount), len(all), srRepeats(ddCount))
}
