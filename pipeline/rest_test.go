package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/rtproxy/rtproxy/rules"
)

// wireCount counts, through hooks given to every client the pipeline
// makes, the requests written by API key and the clients alive.
type wireCount struct {
	mu      sync.Mutex
	reqs    map[int16]int
	clients map[*kgo.Client]bool
	made    int
}

func newWireCount() *wireCount {
	return &wireCount{reqs: map[int16]int{}, clients: map[*kgo.Client]bool{}}
}

func (w *wireCount) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, _ error) {
	w.mu.Lock()
	w.reqs[key]++
	w.mu.Unlock()
}

func (w *wireCount) OnNewClient(cl *kgo.Client) {
	w.mu.Lock()
	w.clients[cl] = true
	w.made++
	w.mu.Unlock()
}

func (w *wireCount) OnClientClosed(cl *kgo.Client) {
	w.mu.Lock()
	delete(w.clients, cl)
	w.mu.Unlock()
}

func (w *wireCount) snapshot() map[int16]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[int16]int, len(w.reqs))
	for k, v := range w.reqs {
		out[k] = v
	}
	return out
}

func (w *wireCount) alive() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.clients)
}

func routeOf(m *Manager, name string) *route {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.routes[name]
}

// A route at rest writes no checkpoint: once nothing moves, a checkpoint
// tick commits nothing to pebble (no fdatasync) and nothing to the group
// (no OffsetCommit), and asks the coordinator nothing (the owners are
// described when the assignment moves or the status asks), while its
// checkpoint time still advances. The first record after the rest is
// checkpointed and committed as before. A stateless route and a keyed one
// with state (issue 29: each idle route committed every 5 s).
func TestIdleRouteSkipsCheckpoint(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		name := "rest-filter"
		if keyed {
			name = "rest-dedup"
		}
		t.Run(name, func(t *testing.T) {
			b := startBroker(t, map[string]int{name: 2})
			wc := newWireCount()
			var steps []rules.StepSpec
			if keyed {
				steps = append(steps, dedupStep(t, 0, "value.id"))
			} else {
				steps = append(steps, filterStep(t, 0, "value.n >= 0"))
			}
			def := newRouteDef(name, "v1", name, name+".out", steps...)
			def.CheckpointInterval = 100 * time.Millisecond
			m, _ := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), ClientOpts: []kgo.Opt{kgo.WithHooks(wc)}}, def)
			for i := 0; i < 4; i++ {
				b.produce(t, jsonRecord(name, string(rune('a'+i)), map[string]any{"n": i, "id": i}))
			}
			b.consume(t, name+".out", 4, 20*time.Second, 0)
			adm := kadm.NewClient(b.client(t))
			committed := func() int64 {
				offs, err := adm.FetchOffsets(context.Background(), def.GroupID())
				if err != nil {
					return -1
				}
				var sum int64
				offs.Each(func(o kadm.OffsetResponse) {
					if o.Topic == name {
						sum += o.At
					}
				})
				return sum
			}
			waitFor(t, 20*time.Second, "the four records committed to the group", func() bool { return committed() == 4 })
			r := routeOf(m, name)
			// Every output is out and committed: once two ticks in a row
			// found nothing moved, the route is at rest.
			skipped := func() float64 { return testutil.ToFloat64(m.met.checkpointSkipped.WithLabelValues(name)) }
			s0 := skipped()
			waitFor(t, 20*time.Second, "two checkpoint ticks with nothing moved", func() bool { return skipped() >= s0+2 })
			// A status read may ask for the owners (an async describe):
			// it is sent before the rest is counted (a loaded machine may
			// take longer than the 200 ms that was slept here).
			describes := func() int {
				w := wc.snapshot()
				return w[int16(kmsg.ConsumerGroupDescribe)] + w[int16(kmsg.DescribeGroups)]
			}
			r.grp.mu.Lock()
			asks := r.ownersStaleLocked()
			r.grp.mu.Unlock()
			d0 := describes()
			lc0 := *m.Routes()[0].LastCheckpoint
			t.Logf("the status read asks for the owners: %v", asks)
			if asks {
				waitFor(t, 20*time.Second, "the describe the status read asked for", func() bool { return describes() > d0 })
			}
			time.Sleep(200 * time.Millisecond)
			seq0, w0, sk0 := r.cp.seq.Load(), wc.snapshot(), skipped()
			time.Sleep(1500 * time.Millisecond) // fifteen checkpoint intervals
			// A loaded machine may run fewer ticks in that time: the rest
			// lasts until five more ticks were skipped (the assertions below
			// hold over the whole of it). Only the metric is read meanwhile:
			// a status read could start a describe of the group.
			waitFor(t, 20*time.Second, "five checkpoint ticks skipped at rest", func() bool { return skipped() >= sk0+5 })
			seq1, w1 := r.cp.seq.Load(), wc.snapshot()
			if seq1 != seq0 {
				t.Errorf("%d checkpoints written at rest, want none", seq1-seq0)
			}
			for _, k := range []kmsg.Key{kmsg.OffsetCommit, kmsg.TxnOffsetCommit, kmsg.ConsumerGroupDescribe, kmsg.DescribeGroups, kmsg.Produce} {
				if n := w1[int16(k)] - w0[int16(k)]; n != 0 {
					t.Errorf("%d %s requests at rest, want none", n, k.Name())
				}
			}
			if n := testutil.ToFloat64(m.met.checkpointSkipped.WithLabelValues(name)); n < 5 {
				t.Errorf("rtproxy_checkpoint_skipped_total %v after fifteen checkpoint intervals at rest, want at least 5", n)
			}
			if lc1 := *m.Routes()[0].LastCheckpoint; !lc1.After(lc0) {
				t.Errorf("last checkpoint %v did not advance at rest (was %v): the age alert would fire", lc1, lc0)
			}
			// The status asks for the owners (older than ownersMaxAge by
			// now or not): shown as described. A describe that timed out
			// (2 s; a starved machine) is asked again by a status read once
			// the owners are older than ownersRestAge.
			waitFor(t, ownersRestAge+30*time.Second, "the assignment shown as described, with the source's 2 partitions owned here", func() bool {
				src := 0
				for _, a := range m.Routes()[0].Assignment {
					if a.Topic == name && a.Self {
						src++
					}
				}
				return src == 2
			})

			// A record after the rest is checkpointed and committed.
			b.produce(t, jsonRecord(name, "z", map[string]any{"n": 9, "id": 9}))
			b.consume(t, name+".out", 5, 20*time.Second, 0)
			waitFor(t, 20*time.Second, "the record after the rest committed to the group", func() bool {
				return committed() == 5 && r.cp.seq.Load() > seq1
			})
		})
	}
}

// One instance with several routes holds one group client per route and
// one more client for all of them (admin, metadata, changelog): each route
// used to open a client of its own besides its group client, and one more
// for every setup attempt (issue 29). The routes still work side by side,
// keyed ones writing their changelogs through the shared client.
func TestRoutesShareOneClient(t *testing.T) {
	const n = 4
	topics := map[string]int{}
	var defs []*rules.Route
	for i := 0; i < n; i++ {
		name := "share" + string(rune('a'+i))
		topics[name] = 2
		var step rules.StepSpec
		if i%2 == 0 {
			step = dedupStep(t, 0, "value.id")
		} else {
			step = filterStep(t, 0, "value.id >= 0")
		}
		defs = append(defs, newRouteDef(name, "v1", name, name+".out", step))
	}
	b := startBroker(t, topics)
	wc := newWireCount()
	m, stop := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), ClientOpts: []kgo.Opt{kgo.WithHooks(wc)}}, defs...)
	for _, d := range defs {
		for i := 0; i < 3; i++ {
			b.produce(t, jsonRecord(d.Name, string(rune('a'+i)), map[string]any{"id": i}))
		}
	}
	for _, d := range defs {
		b.consume(t, d.Name+".out", 3, 20*time.Second, 0)
	}
	waitFor(t, 20*time.Second, "every route running", func() bool {
		st := m.Routes()
		for _, s := range st {
			if s.State != "running" {
				return false
			}
		}
		return len(st) == n
	})
	if got := wc.alive(); got != n+1 {
		t.Errorf("%d kgo clients alive with %d routes, want %d (a group client each and one shared)", got, n, n+1)
	}
	wc.mu.Lock()
	made := wc.made
	wc.mu.Unlock()
	if made != n+1 {
		t.Errorf("%d kgo clients made for %d routes, want %d", made, n, n+1)
	}
	// The keyed routes' changelogs were written (by the shared client).
	for i := 0; i < n; i += 2 {
		cl := defs[i].Name + ".00-drop_duplicates.changelog"
		b.consume(t, cl, 3, 20*time.Second, 0)
	}
	stop()
	if got := wc.alive(); got != 0 {
		t.Errorf("%d kgo clients alive after Run returned, want 0", got)
	}
}

// Each route's cost is on /metrics: the memory held for it by part, its
// busy time, the state store's shared memory; its goroutines carry its
// name as a pprof label, and the shared client's do not (issue 29).
func TestRouteCostMetrics(t *testing.T) {
	b := startBroker(t, map[string]int{"cost": 2})
	reg := prometheus.NewRegistry()
	def := newRouteDef("cost", "v1", "cost", "cost.out", dedupStep(t, 0, "value.id"))
	m, _ := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), Registerer: reg}, def)
	for i := 0; i < 20; i++ {
		b.produce(t, jsonRecord("cost", fmt.Sprint(i), map[string]any{"id": i}))
	}
	b.consume(t, "cost.out", 20, 20*time.Second, 0)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	parts := map[string]bool{}
	var busy float64
	state := map[string]bool{}
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range mt.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch f.GetName() {
			case "rtproxy_route_memory_bytes":
				if labels["route"] == "cost" && mt.GetGauge().GetValue() >= 0 {
					parts[labels["part"]] = true
				}
			case "rtproxy_route_busy_seconds_total":
				if labels["route"] == "cost" {
					busy = mt.GetCounter().GetValue()
				}
			case "rtproxy_state_memory_bytes":
				state[labels["part"]] = true
			}
		}
	}
	for _, p := range []string{"state_uncommitted", "fetch_buffered", "produce_buffered"} {
		if !parts[p] {
			t.Errorf("rtproxy_route_memory_bytes{route=cost,part=%s} missing (have %v)", p, parts)
		}
	}
	if busy <= 0 {
		t.Errorf("rtproxy_route_busy_seconds_total{route=cost} = %v after 20 records, want > 0", busy)
	}
	if !state["block_cache"] || !state["memtables"] {
		t.Errorf("rtproxy_state_memory_bytes parts %v, want block_cache and memtables", state)
	}
	var prof bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&prof, 1); err != nil {
		t.Fatal(err)
	}
	p := prof.String()
	if !strings.Contains(p, `"route":"cost"`) || !strings.Contains(p, "pipeline.(*route).pollLoop") {
		t.Errorf("no goroutine labelled route=cost in the goroutine profile")
	}
	if !strings.Contains(p, `labels: {"pipeline":"shared"}`) {
		t.Errorf("the shared client's goroutines are not labelled pipeline=shared")
	}
	_ = m
}

// A resting lag loop wakes when a fetch brings records: with dispatch held
// (cut), records fetched after the rest show as lag (the fetch sets it),
// and once they are done the gauge falls back to 0, which only the lag
// loop sets: one that stayed asleep leaves the gauge at 5.
func TestLagGaugeWakesFromRest(t *testing.T) {
	b := startBroker(t, map[string]int{"lagrest": 1})
	def := newRouteDef("lagrest", "v1", "lagrest", "lagrest.out", filterStep(t, 0, "value.n >= 0"))
	m, _ := runManager(t, b, t.TempDir(), def)
	b.produce(t, jsonRecord("lagrest", "a", map[string]any{"n": 0}))
	b.consume(t, "lagrest.out", 1, 20*time.Second, 0)
	r := routeOf(m, "lagrest")
	waitFor(t, 10*time.Second, "the lag loop at rest", func() bool { return r.lagResting.Load() })
	gauge := m.met.lag.WithLabelValues("lagrest", "0")
	r.cut.Lock() // no task dispatches a record meanwhile
	held := true
	defer func() {
		if held {
			r.cut.Unlock()
		}
	}()
	for i := 1; i <= 5; i++ {
		b.produce(t, jsonRecord("lagrest", "a", map[string]any{"n": i}))
	}
	waitFor(t, 10*time.Second, "the lag gauge showing the 5 records fetched", func() bool { return testutil.ToFloat64(gauge) == 5 })
	r.cut.Unlock()
	held = false
	b.consume(t, "lagrest.out", 6, 20*time.Second, 0)
	waitFor(t, 10*time.Second, "the lag gauge back to 0", func() bool { return testutil.ToFloat64(gauge) == 0 })
}
