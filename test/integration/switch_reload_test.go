package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// switchReloadRule is version v of the route: 0 and 2 write one sink,
// 1 a switch to two (amount > 100 to swr.large, the rest to swr.rest).
// Every version stamps its number.
func switchReloadRule(v int) string {
	if v == 1 {
		return `route: swr
source: { topic: swr, format: json }
checkpoint_interval: 300ms
steps:
  - set: { ver: 1 }
  - switch:
      - when: value.amount > 100
        sink: { topic: swr.large }
      - sink: { topic: swr.rest }
`
	}
	return fmt.Sprintf(`route: swr
source: { topic: swr, format: json }
sink: { topic: swr.out }
checkpoint_interval: 300ms
steps:
  - set: { ver: %d }
`, v)
}

// swrTopic is where version ver sends a record of amount.
func swrTopic(ver, amount int) string {
	switch {
	case ver != 1:
		return "swr.out"
	case amount > 100:
		return "swr.large"
	}
	return "swr.rest"
}

// TestHotReloadSingleSinkToSwitchAndBack: a route edited from one sink to a
// switch of two and back while records flow, through the binary on kfake
// (at least once). Every record is written at least once, and every
// output is where the version that wrote it (stamped in the value) sends
// it; the records produced while a version runs, before the next edit,
// are in that version's topics.
func TestHotReloadSingleSinkToSwitchAndBack(t *testing.T) {
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{"swr": 3, "swr.out": 2, "swr.large": 2, "swr.rest": 2}})
	dir := t.TempDir()
	WriteRuleFile(t, dir, "swr.yaml", switchReloadRule(0))
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: dir})

	type seen struct {
		topic string
		ver   int
	}
	var mu sync.Mutex
	outs := map[int][]seen{} // id → every output of it
	bad := []string{}
	rd := NewClient(t, k.Addrs, kgo.ConsumeTopics("swr.out", "swr.large", "swr.rest"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	read := func(d time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		rd.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			var v struct{ ID, Amount, Ver int }
			if err := json.Unmarshal(r.Value, &v); err != nil {
				t.Errorf("%s holds %q: %v", r.Topic, r.Value, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			outs[v.ID] = append(outs[v.ID], seen{r.Topic, v.Ver})
			if want := swrTopic(v.Ver, v.Amount); r.Topic != want {
				bad = append(bad, fmt.Sprintf("%s holds %s; version %d sends it to %s", r.Topic, r.Value, v.Ver, want))
			}
		})
	}
	// in waits until every id of ids has an output of version ver (in the
	// topic that version sends it to, which read checks).
	in := func(ids []int, ver int, timeout time.Duration) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for {
			read(200 * time.Millisecond)
			mu.Lock()
			missing := 0
			for _, id := range ids {
				ok := false
				for _, s := range outs[id] {
					ok = ok || s.ver == ver
				}
				if !ok {
					missing++
				}
			}
			mu.Unlock()
			if missing == 0 {
				return
			}
			if time.Now().After(deadline) {
				st, _ := srHTTP.Get(p.AdminURL + "/routes")
				var b []byte
				if st != nil {
					b, _ = io.ReadAll(st.Body)
					st.Body.Close()
				}
				per := map[string]int{}
				mu.Lock()
				for _, ss := range outs {
					for _, s := range ss {
						per[fmt.Sprint(s.topic, "/", s.ver)]++
					}
				}
				mu.Unlock()
				t.Fatalf("%d of %d records (%v) have no output of version %d after %v (outputs read: %v, wrong topic: %d); /routes: %s", missing, len(ids), ids[:min(len(ids), 3)], ver, timeout, per, len(bad), b)
			}
		}
	}

	// running waits until some output of version ver is read: the edit
	// took, and the version before it has stopped.
	running := func(ver int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			read(200 * time.Millisecond)
			mu.Lock()
			found := false
			for _, ss := range outs {
				for _, s := range ss {
					found = found || s.ver == ver
				}
			}
			mu.Unlock()
			if found {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no output of version %d 30s after the edit", ver)
			}
		}
	}

	cl := NewClient(t, k.Addrs, kgo.ProducerLinger(0))
	var pmu sync.Mutex
	next := 0
	produce := func(n int) []int {
		pmu.Lock()
		defer pmu.Unlock()
		var rs []*kgo.Record
		var ids []int
		for range n {
			rs = append(rs, &kgo.Record{Topic: "swr", Key: fmt.Append(nil, next), Value: fmt.Appendf(nil, `{"id":%d,"amount":%d}`, next, next%200)})
			ids = append(ids, next)
			next++
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Errorf("produce: %v", err)
		}
		return ids
	}
	// A trickle of records all along, across both edits.
	stop := make(chan struct{})
	done := make(chan []int, 1)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			close(stop)
			<-done
		}
	})
	go func() {
		var ids []int
		for {
			select {
			case <-stop:
				done <- ids
				return
			case <-time.After(5 * time.Millisecond):
				ids = append(ids, produce(3)...)
			}
		}
	}()

	v0 := produce(200)
	in(v0, 0, 60*time.Second)
	time.Sleep(700 * time.Millisecond)

	WriteRuleFile(t, dir, "swr.yaml", switchReloadRule(1))
	running(1) // the switch runs
	v1 := produce(200)
	time.Sleep(700 * time.Millisecond) // the trickle under the switch, over checkpoints
	in(v1, 1, 30*time.Second)

	WriteRuleFile(t, dir, "swr.yaml", switchReloadRule(2))
	running(2) // one sink again
	v2 := produce(200)
	time.Sleep(700 * time.Millisecond)
	in(v2, 2, 30*time.Second)

	close(stop)
	stopped = true
	trickle := <-done
	// Every record of the trickle, whichever version took it: at least
	// once, each output in its version's topic.
	deadline := time.Now().Add(30 * time.Second)
	for {
		read(200 * time.Millisecond)
		mu.Lock()
		missing := 0
		for _, id := range trickle {
			if len(outs[id]) == 0 {
				missing++
			}
		}
		mu.Unlock()
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the %d records produced across the edits were never written", missing, len(trickle))
		}
	}
	read(time.Second)
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("%d outputs in the wrong topic, e.g. %v", len(bad), bad[:min(len(bad), 5)])
	}
	per := map[seen]int{}
	repeats := 0
	for _, ss := range outs {
		for _, s := range ss {
			per[s]++
		}
		repeats += len(ss) - 1
	}
	for _, s := range []seen{{"swr.out", 0}, {"swr.large", 1}, {"swr.rest", 1}, {"swr.out", 2}} {
		if per[s] == 0 {
			t.Errorf("no output of version %d in %s (outputs by topic and version: %v)", s.ver, s.topic, per)
		}
	}
	t.Logf("%d records (%d across the edits), outputs by topic and version %v, %d repeats (at least once)", next, len(trickle), per, repeats)
}
