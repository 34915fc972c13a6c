package integration

// Session windows (issue 27) through the rtproxy binary on kfake: a
// session window keyed by value.user while the records' Kafka keys are
// random, so every user's records come from every source partition and
// meet (and merge) only behind the window's repartition topic. The rows,
// read back by a franz-go consumer, are compared with a brute-force
// recomputation from what the source topic holds: per user, the records
// sorted by event time, split wherever two are at least the gap apart.
// That recomputation is the route's result because no record can be late
// (each partition's event times rise, watermark 0s) and there is no
// max_duration (so the order in which the partitions' records reach the
// session does not matter).

import (
	"encoding/json"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ssGap is the routes' session gap, in milliseconds.
const ssGap = 300

// ssGen makes events 2 ms of event time apart. Time runs in phases of 250
// ids (500 ms); user k (of 12) is active in the phases p with (p+k)%3 != 0,
// so each user's sessions last two phases (1 s) and end with a pause of
// one (500 ms, more than the gap); the ids of a phase go round its 8
// active users.
func ssGen(id int) srEvent {
	phase := id / 250
	var active []int
	for k := 0; k < 12; k++ {
		if (phase+k)%3 != 0 {
			active = append(active, k)
		}
	}
	u := active[id%len(active)]
	return srEvent{ID: id, User: fmt.Sprintf("u%02d", u), Amount: id%13 + 1, TS: srBaseTS + int64(id)*2, DK: fmt.Sprint("d", id)}
}

// ssRoute is the session route of source: gap ssGap, keyed by value.user;
// delivery is the sink's (at_least_once or exactly_once).
func ssRoute(t *testing.T, dir, source, idle, delivery string) srRoute {
	r := srRoute{Name: source + "-sess", Source: source, Sink: source + ".sess", DLQ: source + ".sess.dlq", Keyed: true}
	WriteRuleFile(t, dir, r.Name+".yaml", fmt.Sprintf(`route: %s
source: { topic: %s, format: json, event_time: value.ts, watermark: 0s, idle_timeout: %s }
sink: { topic: %s, delivery: %s }
dead_letter: %s
checkpoint_interval: 1s
steps:
  - window:
      kind: session
      gap: %dms
      key: value.user
      aggregate: { n: count(), total: sum(value.amount), first_id: first(value.id), last_id: last(value.id) }
`, r.Name, r.Source, idle, r.Sink, delivery, r.DLQ, ssGap))
	return r
}

func ssTopics(source string, parts int) map[string]int {
	return map[string]int{source: parts, source + ".sess": 3, source + ".sess.dlq": 1}
}

// ssWant recomputes every session from the source by brute force: its row
// as "end=.. n=.. total=.. first=.. last=..", and how many of the
// sessions hold records of more than one source partition.
func ssWant(src map[string]srSrc) (map[srWinKey]string, int) {
	by := map[string][]srSrc{}
	for _, s := range src {
		if s.E.User != srFlushUser {
			by[s.E.User] = append(by[s.E.User], s)
		}
	}
	out := map[srWinKey]string{}
	mixed := 0
	for user, rs := range by {
		sort.Slice(rs, func(i, j int) bool { return rs[i].E.TS < rs[j].E.TS })
		for i := 0; i < len(rs); {
			j := i + 1
			for j < len(rs) && rs[j].E.TS-rs[j-1].E.TS < ssGap {
				j++
			}
			n, total := 0, 0
			parts := map[int32]bool{}
			for _, s := range rs[i:j] {
				n++
				total += s.E.Amount
				parts[s.Rec.Partition] = true
			}
			if len(parts) > 1 {
				mixed++
			}
			out[srWinKey{user, rs[i].E.TS}] = fmt.Sprintf("end=%d n=%d total=%d first=%d last=%d",
				rs[j-1].E.TS+ssGap, n, total, rs[i].E.ID, rs[j-1].E.ID)
			i = j
		}
	}
	return out, mixed
}

// ssRows decodes the session sink: every emission per session, in the
// form of ssWant, and what is wrong with rows that are not session rows.
func ssRows(outs []*kgo.Record) (map[srWinKey][]string, []string) {
	rows := map[srWinKey][]string{}
	var problems []string
	for _, r := range outs {
		var v struct {
			Key     string   `json:"key"`
			Start   int64    `json:"window_start"`
			End     int64    `json:"window_end"`
			N       *float64 `json:"n"`
			Total   *float64 `json:"total"`
			FirstID *float64 `json:"first_id"`
			LastID  *float64 `json:"last_id"`
		}
		if err := json.Unmarshal(r.Value, &v); err != nil || v.N == nil || v.Total == nil || v.FirstID == nil || v.LastID == nil {
			problems = append(problems, fmt.Sprintf("session row %s: not a session row (%v)", r.Value, err))
			continue
		}
		if v.Key == srFlushUser {
			continue
		}
		if h, want := srHdr(r, "rtproxy-window"), fmt.Sprintf("%d-%d", v.Start, v.End); h != want {
			problems = append(problems, fmt.Sprintf("session row %s: rtproxy-window %q, want %q", r.Value, h, want))
		}
		if string(r.Key) != v.Key {
			problems = append(problems, fmt.Sprintf("session row %s: Kafka key %q, want the session key", r.Value, r.Key))
		}
		k := srWinKey{v.Key, v.Start}
		rows[k] = append(rows[k], fmt.Sprintf("end=%d n=%d total=%d first=%d last=%d",
			v.End, int(*v.N), int(*v.Total), int(*v.FirstID), int(*v.LastID)))
	}
	return rows, problems
}

func ssMissing(outs []*kgo.Record, want map[srWinKey]string) int {
	rows, _ := ssRows(outs)
	n := 0
	for k := range want {
		if len(rows[k]) == 0 {
			n++
		}
	}
	return n
}

// ssCheck compares every row with the recomputation: each session emitted,
// every emission (a repeat included) equal to the recomputed one, no row
// for a session the source does not hold. It returns the emissions per
// session.
func ssCheck(t *testing.T, outs []*kgo.Record, want map[srWinKey]string) map[srWinKey]int {
	t.Helper()
	rows, problems := ssRows(outs)
	srCompareRows(t, "session", rows, problems, want)
	count := map[srWinKey]int{}
	for k, rs := range rows {
		count[k] = len(rs)
	}
	return count
}

// TestSessionWindowThroughBinary: one rtproxy binary, a session window over
// a 3-partition source, 3000 records of 12 users whose Kafka keys are
// random: every session row read back from the sink equals the
// recomputation, once, and nothing is dead-lettered.
func TestSessionWindowThroughBinary(t *testing.T) {
	const source, n = "ss1", 3000
	k := StartKfake(t, KfakeOpts{Topics: ssTopics(source, 3)})
	rules := t.TempDir()
	r := ssRoute(t, rules, source, "20s", "at_least_once")
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules, StateDir: t.TempDir()})
	srWaitOwned(t, r, srGroupTopics(t, k.Addrs, r), []*Proxy{p}, 60*time.Second)

	evs := make([]srEvent, n)
	for i := range evs {
		evs[i] = ssGen(i)
	}
	srProduce(t, k.Addrs, source, evs)
	srFlush(t, k.Addrs, source, 3, ssGen(n).TS+3_600_000)

	src := srSource(t, k.Addrs, source)
	want, mixed := ssWant(src)
	col := srCollect(t, k.Addrs, r.Sink)
	srWait(t, 60*time.Second, "every session output", func() error {
		if m := ssMissing(col.Records(r.Sink), want); m > 0 {
			return fmt.Errorf("%d of %d sessions missing", m, len(want))
		}
		return nil
	})
	srWaitCaughtUp(t, k.Addrs, r, 30*time.Second)
	count := ssCheck(t, srRead(t, k.Addrs, r.Sink), want)
	srCheckNoDLQ(t, k.Addrs, r.DLQ)
	if rep := srRepeats(count); rep > 0 {
		t.Errorf("%d sessions emitted more than once with no failure at all", rep)
	}
	if mixed < len(want)/2 {
		t.Errorf("only %d of %d sessions hold records of several source partitions: the test does not merge across partitions", mixed, len(want))
	}
	t.Logf("%d sessions of %d records, %d of them from several source partitions, each row as recomputed", len(want), n, mixed)
}

// TestSessionWindowThreeInstancesKill: three instances share the session
// route under load (500 records/s over 8 partitions, event time keeping
// pace with the clock); one is SIGKILLed. The survivors take its
// partitions over, restore the sessions from the changelog and replay:
// every session is emitted, every emission (repeats of the replay
// included) equals the recomputation, nothing is dead-lettered.
func TestSessionWindowThreeInstancesKill(t *testing.T) {
	ssKill(t, "ss2", "at_least_once")
}

// TestSessionWindowThreeInstancesKillExactlyOnce is the same with
// `delivery: exactly_once`: a read_committed reader sees every session
// once, none repeated.
func TestSessionWindowThreeInstancesKillExactlyOnce(t *testing.T) {
	ssKill(t, "ss3", "exactly_once")
}

func ssKill(t *testing.T, source, delivery string) {
	const rate = 500
	k := StartKfake(t, KfakeOpts{Topics: ssTopics(source, 8)})
	rules := t.TempDir()
	// A long idle_timeout: the killed instance's source partitions are
	// silent until the group hands them on; they must hold the watermark
	// back meanwhile, or their replayed records would be late.
	r := ssRoute(t, rules, source, "2m", delivery)
	ps := srStartProxies(t, k, rules, 3)
	topics := srGroupTopics(t, k.Addrs, r)
	owned := srWaitOwned(t, r, topics, ps, 90*time.Second)
	col := srCollect(t, k.Addrs, r.Sink)

	load := srStartLoad(t, k.Addrs, source, rate, 1<<30, ssGen)
	srWait(t, 30*time.Second, "sessions under load", func() error {
		if n := col.Len(r.Sink); n < 20 {
			return fmt.Errorf("%d rows", n)
		}
		return nil
	})
	// The victim is the instance owning the most partitions of the
	// repartition topic: it holds open sessions, which the survivors
	// must restore from the changelog.
	owned = srWaitOwned(t, r, topics, ps, 60*time.Second)
	victim, most := 0, -1
	for i, tps := range owned {
		n := 0
		for _, tp := range tps {
			if tp.Topic != source {
				n++
			}
		}
		if n > most {
			victim, most = i, n
		}
	}
	ps[victim].Kill()
	killedAt := time.Now()
	t.Logf("SIGKILL instance %d at %d records produced; it owned %v", victim, load.acked.Load(), owned[victim])
	var rest []*Proxy
	for i, p := range ps {
		if i != victim {
			rest = append(rest, p)
		}
	}
	srWaitOwned(t, r, topics, rest, 90*time.Second)
	t.Logf("its partitions reassigned %v after the kill", time.Since(killedAt).Round(time.Millisecond))
	at := load.acked.Load()
	load.WaitAcked(t, at+2*rate, 30*time.Second)
	load.Stop(t)
	srFlush(t, k.Addrs, source, 8, ssGen(int(load.acked.Load())+1).TS+3_600_000)

	src := srSource(t, k.Addrs, source)
	want, mixed := ssWant(src)
	// What a read_committed reader sees (srRead), until every session is
	// there; an at-least-once route then until its group has caught up,
	// so that no repeat is still on its way. (An exactly-once route's
	// commits stop short of the ends, at the transactions' markers.)
	var outs []*kgo.Record
	srWait(t, 120*time.Second, "every session output", func() error {
		outs = srRead(t, k.Addrs, r.Sink)
		if m := ssMissing(outs, want); m > 0 {
			return fmt.Errorf("%d of %d sessions missing", m, len(want))
		}
		return nil
	})
	if delivery != "exactly_once" {
		srWaitCaughtUp(t, k.Addrs, r, 60*time.Second)
		outs = srRead(t, k.Addrs, r.Sink)
	}
	count := ssCheck(t, outs, want)
	srCheckNoDLQ(t, k.Addrs, r.DLQ)
	t.Logf("%s: %d sessions of %d records (%d from several partitions), %d emitted more than once (the replay after the kill)",
		delivery, len(want), len(src), mixed, srRepeats(count))
	if rep := srRepeats(count); delivery == "exactly_once" && rep > 0 {
		t.Errorf("exactly_once: %d sessions emitted more than once to a read_committed reader", rep)
	}
}
