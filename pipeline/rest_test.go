package pipeline

import (
	"context"
	"sync"
	"testing"
	"time"

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
			time.Sleep(300 * time.Millisecond) // the keyed segment's last checkpoint
			seq0, w0 := r.cp.seq.Load(), wc.snapshot()
			lc0 := *m.Routes()[0].LastCheckpoint
			time.Sleep(1500 * time.Millisecond) // fifteen checkpoint intervals
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
			// now or not): shown as described.
			src := 0
			for _, a := range m.Routes()[0].Assignment {
				if a.Topic == name && a.Self {
					src++
				}
			}
			if src != 2 {
				t.Errorf("assignment %+v, want the source's 2 partitions, owned here", m.Routes()[0].Assignment)
			}

			// A record after the rest is checkpointed and committed.
			b.produce(t, jsonRecord(name, "z", map[string]any{"n": 9, "id": 9}))
			b.consume(t, name+".out", 5, 20*time.Second, 0)
			waitFor(t, 20*time.Second, "the record after the rest committed to the group", func() bool {
				return committed() == 5 && r.cp.seq.Load() > seq1
			})
		})
	}
}
