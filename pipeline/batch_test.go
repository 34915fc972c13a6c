package pipeline

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// batchCounter counts, on every client of a route, the record batches
// fetched from the source and the produce requests that carried sink
// records (the sink has one partition, so one batch per request).
type batchCounter struct {
	src, sink    string
	fetched      atomic.Int64
	sinkRequests atomic.Int64
	sinkRecords  atomic.Int64
	mu           sync.Mutex
	from         map[int32]bool // brokers that delivered source batches
}

func (c *batchCounter) OnFetchBatchRead(m kgo.BrokerMetadata, topic string, _ int32, _ kgo.FetchBatchMetrics) {
	if topic == c.src {
		c.fetched.Add(1)
		c.mu.Lock()
		if c.from == nil {
			c.from = map[int32]bool{}
		}
		c.from[m.NodeID] = true
		c.mu.Unlock()
	}
}

func (c *batchCounter) OnProduceBatchWritten(_ kgo.BrokerMetadata, topic string, _ int32, m kgo.ProduceBatchMetrics) {
	if topic == c.sink {
		c.sinkRequests.Add(1)
		c.sinkRecords.Add(int64(m.NumRecords))
	}
}

// TestFetchWritesLeaveTogether: the outputs of what one poll delivered
// leave in one produce request per broker (batch.go), not as each task
// makes them. A backlog of 100 records on each of 4 source partitions,
// one batch each, written before the route starts, reaches the route in
// one fetch response per broker that leads a source partition; the 400
// outputs go to a one-partition sink in at most that many produce
// requests. With linger 0 the four tasks each started requests of their
// own (2-7 in the runs of this test before the change), however few
// responses their records came in.
func TestFetchWritesLeaveTogether(t *testing.T) {
	for _, tc := range []struct {
		name   string
		window time.Duration
	}{{"5ms window", 5 * time.Millisecond}, {"window off", 0}} {
		t.Run(tc.name, func(t *testing.T) { fetchWritesLeaveTogether(t, tc.window) })
	}
}

// fetchWritesLeaveTogether runs the test with Config.BatchWindow window;
// with the window off only the outputs and their order are checked.
func fetchWritesLeaveTogether(t *testing.T, window time.Duration) {
	const parts, per = 4, 100
	const n = parts * per
	b := startBroker(t, map[string]int{"bt": parts, "bt.out": 1})
	var rs []*kgo.Record
	for i := range n {
		r := jsonRecord("bt", fmt.Sprint(i), map[string]any{"n": i})
		r.Partition = int32(i % parts)
		rs = append(rs, r)
	}
	pcl := b.tmpClient(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	err := pcl.ProduceSync(context.Background(), rs...).FirstErr() // one batch per partition
	pcl.Close()
	if err != nil {
		t.Fatal(err)
	}
	c := &batchCounter{src: "bt", sink: "bt.out"}
	def := newRouteDef("bt", "v1", "bt", "bt.out", filterStep(t, 0, "value.n >= 0"))
	// No checkpoint during the test: a checkpoint flushes what lingers
	// (waitEpoch), which would split the poll's writes on purpose.
	def.CheckpointInterval = time.Hour
	runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), BatchWindow: window, ClientOpts: []kgo.Opt{kgo.WithHooks(c)}}, def)

	out := b.consume(t, "bt.out", n, 20*time.Second, 0)
	// Per source partition, the outputs keep the source's order.
	next := map[int]int{}
	for _, r := range out {
		var i int
		fmt.Sscan(string(r.Key), &i)
		p := i % parts
		if want := next[p]*parts + p; i != want {
			t.Fatalf("output of source partition %d: key %d, want %d", p, i, want)
		}
		next[p]++
	}
	waitFor(t, 10*time.Second, "every output counted as written", func() bool { return c.sinkRecords.Load() >= n })
	c.mu.Lock()
	brokers := int64(len(c.from))
	c.mu.Unlock()
	fetched, reqs := c.fetched.Load(), c.sinkRequests.Load()
	t.Logf("%d source batches fetched from %d brokers; %d produce requests carried the %d outputs", fetched, brokers, reqs, c.sinkRecords.Load())
	if brokers == 0 {
		t.Fatal("no source batch counted")
	}
	if window > 0 && reqs > brokers {
		t.Errorf("%d outputs left in %d produce requests; want at most one per broker that delivered the source's records (%d)", n, reqs, brokers)
	}
}
