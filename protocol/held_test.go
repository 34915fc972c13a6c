package protocol

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestHeldBytesBounded: fetch responses from v12 on that are larger than
// the streaming threshold are held whole to rewrite their broker
// endpoints. With four consumers fetching megabytes at once, the bytes
// held across every connection never pass proxy.max_held_bytes: frames
// wait for each other instead, and every consumer still gets every
// record, byte for byte (issue 10).
func TestHeldBytesBounded(t *testing.T) {
	const budget = 64 << 10 // under any held frame (> streamAbove): two at once must wait
	upstream := startKfake(t, "-topics", "held:2")
	tp := startProxy(t, upstream, func(c *Config) { c.MaxHeldBytes = budget })
	tp.holdFetches = true // the held path; streaming has TestFetchStreams
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pc, err := kgo.NewClient(kgo.SeedBrokers(upstream...), kgo.ProducerLinger(0), kgo.DefaultProduceTopic("held"))
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	want := make([][]byte, n)
	for i := range n {
		v := make([]byte, 40<<10)
		rand.Read(v)
		want[i] = v
		pc.Produce(ctx, &kgo.Record{Key: []byte(fmt.Sprint(i)), Value: v}, nil)
	}
	if err := pc.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	pc.Close()

	// Four consumers read the topic at once; on a loaded machine their
	// fetches can happen not to overlap, so a round repeats (at most five)
	// until one frame has waited for the budget. The bound must hold in
	// every round.
	for round := 0; round < 5 && metricValue(t, tp.m.heldWaits) == 0; round++ {
		var wg sync.WaitGroup
		for c := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ConsumeTopics("held"),
					kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(4<<20), kgo.FetchMaxPartitionBytes(2<<20))
				if err != nil {
					t.Error(err)
					return
				}
				defer cl.Close()
				got := 0
				for got < n && ctx.Err() == nil {
					fs := cl.PollFetches(ctx)
					for _, e := range fs.Errors() {
						t.Errorf("consumer %d: %v", c, e.Err)
					}
					fs.EachRecord(func(r *kgo.Record) {
						var i int
						fmt.Sscan(string(r.Key), &i)
						if !bytes.Equal(r.Value, want[i]) {
							t.Errorf("consumer %d: record %d differs", c, i)
						}
						got++
					})
				}
				if got != n {
					t.Errorf("consumer %d got %d of %d records", c, got, n)
				}
			}()
		}
		wg.Wait()
		if peak := tp.held.peakBytes(); peak > budget || peak == 0 {
			t.Errorf("round %d: peak held bytes %d, want between 1 and %d", round, peak, budget)
		}
	}
	if w := metricValue(t, tp.m.heldWaits); w == 0 {
		t.Error("no frame waited in five rounds: the budget was never the limit, so the test shows nothing")
	}
	if h := metricValue(t, tp.m.heldBytes); h != 0 {
		t.Errorf("rtproxy_proxy_held_bytes = %v after every response was written, want 0", h)
	}
}

// TestFetchStreams: a Fetch response before v16 cannot carry KIP-951
// endpoints, so it streams raw however large it is; from v16 on it
// streams too, its endpoints rewritten in place, when every known broker's
// host allows that at the same length. Otherwise it is held whole.
func TestFetchStreams(t *testing.T) {
	upstream := startKfake(t, "-topics", "fv:1")
	tp := startProxy(t, upstream, func(c *Config) { c.MaxHeldBytes = 64 << 20 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pc, err := kgo.NewClient(kgo.SeedBrokers(upstream...), kgo.ProducerLinger(0), kgo.DefaultProduceTopic("fv"))
	if err != nil {
		t.Fatal(err)
	}
	v := make([]byte, 64<<10)
	rand.Read(v)
	for range 16 { // 1 MiB
		pc.Produce(ctx, &kgo.Record{Value: v}, nil)
	}
	if err := pc.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	details, err := kadm.NewClient(pc).ListTopics(ctx, "fv")
	if err != nil {
		t.Fatal(err)
	}
	id := details["fv"].ID
	pc.Close()
	c, err := net.Dial("tcp", leaderAddr(t, tp.Addr(), "fv"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	corr := int32(0)
	fetch := func(version int16) *kmsg.FetchResponse {
		f := kmsg.NewPtrFetchRequest()
		f.SetVersion(version)
		f.MaxWaitMillis, f.MinBytes, f.MaxBytes = 100, 1, 4<<20
		ft := kmsg.NewFetchRequestTopic()
		ft.Topic = "fv"
		ft.TopicID = id
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.PartitionMaxBytes = 4 << 20
		ft.Partitions = append(ft.Partitions, fp)
		f.Topics = append(f.Topics, ft)
		corr++
		if _, err := c.Write(rawRequest(f, corr)); err != nil {
			t.Fatal(err)
		}
		got, body := readResponse(t, c)
		if got != corr {
			t.Fatalf("v%d: correlation id %d, want %d", version, got, corr)
		}
		if len(body) <= streamAbove {
			t.Fatalf("v%d: a %d-byte response, want one over the %d bytes that stream", version, len(body), streamAbove)
		}
		resp := kmsg.NewPtrFetchResponse()
		resp.SetVersion(version)
		if err := resp.ReadFrom(skipResponseHeaderTags(body)); err != nil {
			t.Fatalf("v%d: the response does not decode: %v", version, err)
		}
		if n := len(resp.Topics[0].Partitions[0].RecordBatches); n < 64<<10 {
			t.Fatalf("v%d: %d bytes of batches", version, n)
		}
		return resp
	}
	for _, version := range []int16{12, 13, 15, 16, 17} {
		fetch(version)
	}
	if p := tp.held.peakBytes(); p != 0 {
		t.Errorf("responses held %d bytes whole; they must stream", p)
	}
	tp.holdFetches = true
	fetch(16)
	if p := tp.held.peakBytes(); p <= streamAbove {
		t.Errorf("with streaming off a v16 response held %d bytes, want it whole", p)
	}
}

// skipResponseHeaderTags returns the body of a flexible response from the
// payload readResponse gives (correlation id, header tags, body).
func skipResponseHeaderTags(payload []byte) []byte {
	s := skipper{p: payload}
	s.skip(4)
	s.tags()
	return payload[s.off:]
}

// TestHeldBudgetWaits: the budget itself, without sockets: a frame waits
// while the bytes are taken and goes on once they are given back; one
// larger than the whole budget takes all of it; a closed connection stops
// the wait.
func TestHeldBudgetWaits(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	b := &heldBudget{max: 100, gauge: m.heldBytes, waits: m.heldWaits}
	first, ok := b.acquire(1000, nil) // larger than the budget: all of it
	if !ok || first != 100 {
		t.Fatalf("acquire(1000) took %d", first)
	}
	got := make(chan int64)
	go func() { n, _ := b.acquire(30, nil); got <- n }()
	select {
	case n := <-got:
		t.Fatalf("a second frame took %d bytes while the budget was used up", n)
	case <-time.After(100 * time.Millisecond):
	}
	b.release(first)
	if n := <-got; n != 30 {
		t.Fatalf("after the release it took %d, want 30", n)
	}
	if w := metricValue(t, m.heldWaits); w != 1 {
		t.Errorf("held_waits_total = %v, want 1", w)
	}
	done := make(chan struct{})
	aborted := make(chan bool)
	go func() { _, ok := b.acquire(80, done); aborted <- !ok }()
	close(done)
	if !<-aborted {
		t.Error("a wait did not end when its connection closed")
	}
	if h := metricValue(t, m.heldBytes); h != 30 || b.peakBytes() != 100 {
		t.Errorf("held_bytes = %v, peak %d; want 30 and 100", h, b.peakBytes())
	}
}

// slowProduce opens a raw connection to addr and sends the first send
// bytes of a Produce request to topic that announces announce bytes: a
// slow (or hostile) sender that never finishes its request.
func slowProduce(t *testing.T, addr, topic string, announce, send int) net.Conn {
	t.Helper()
	frame := produceFrame(topic, announce)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write(frame[:send]); err != nil {
		t.Fatal(err)
	}
	return c
}

// produceFrame is a Produce v7 request frame to topic whose records are n
// zero bytes.
func produceFrame(topic string, n int) []byte {
	req := kmsg.NewPtrProduceRequest()
	req.SetVersion(7)
	req.Acks, req.TimeoutMillis = -1, 5000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = make([]byte, n)
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	return rawRequest(req, 1)
}

// TestSlowSendersDoNotStarveHeldBytes is finding 8 of issue 25: with a
// guard loaded, four connections that each announce a large Produce and
// send 5 KB of it must not hold proxy.max_held_bytes for bytes that never
// came: a produce to an unguarded topic, and a small one to a guarded
// topic, go through at once (before, they waited for the senders'
// request_read_timeout).
func TestSlowSendersDoNotStarveHeldBytes(t *testing.T) {
	upstream := startKfake(t, "-topics", "gslow:1,plain:1")
	const budget = 8 << 20
	tp := startProxy(t, upstream, func(c *Config) {
		c.MaxHeldBytes = budget
		c.RequestReadTimeout = time.Minute
	})
	tp.SetGuards(&testGuards{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "plain", Value: []byte("warm")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	leader := leaderAddr(t, tp.Addr(), "gslow")
	// Four frames of exactly a quarter of the budget each.
	over := len(produceFrame("gslow", 0))
	for range 4 {
		slowProduce(t, leader, "gslow", budget/4-over, 5<<10)
	}
	time.Sleep(200 * time.Millisecond) // the four are read and waiting
	for _, topic := range []string{"plain", "gslow"} {
		start := time.Now()
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		err := cl.ProduceSync(pctx, &kgo.Record{Topic: topic, Value: []byte("small")}).FirstErr()
		pcancel()
		if err != nil {
			t.Errorf("produce to %s beside four slow senders: %v after %v", topic, err, time.Since(start).Round(time.Millisecond))
		}
	}
	if h := metricValue(t, tp.m.heldBytes); h > 4*(128<<10) {
		t.Errorf("four senders of 5 KB each hold %v bytes", h)
	}
}

// TestHeldHoldsGrowSafely: the growing reservations of requests still
// arriving never deadlock. A grant that would leave no order in which
// every such request can complete waits; one that completes its request
// is made whenever the bytes are free; a small request is never kept
// waiting by large ones that have sent little.
func TestHeldHoldsGrowSafely(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	b := &heldBudget{max: 100, gauge: m.heldBytes, waits: m.heldWaits}
	a := b.begin(80)
	if !a.grow(50, nil) {
		t.Fatal("a")
	}
	c := b.begin(80)
	granted := make(chan bool)
	go func() { granted <- c.grow(40, nil) }()
	select {
	case <-granted:
		t.Fatal("c took 40 while a needs 30 more and only 10 would be left: a deadlock")
	case <-time.After(100 * time.Millisecond):
	}
	if !c.grow(5, nil) { // c may still take what leaves a room to finish
		t.Fatal("c could not take 5")
	}
	small := b.begin(10)
	if !small.grow(10, nil) { // completes its request: never waits for a and c
		t.Fatal("small")
	}
	small.release()
	if !a.grow(30, nil) { // completes a
		t.Fatal("a could not complete")
	}
	a.release()
	if !<-granted {
		t.Fatal("c's wait ended without its bytes")
	}
	if !c.grow(35, nil) {
		t.Fatal("c could not complete")
	}
	c.release()
	if h := metricValue(t, m.heldBytes); h != 0 || b.peakBytes() > 100 {
		t.Errorf("held_bytes %v, peak %d", h, b.peakBytes())
	}
	// A closed connection ends a wait, and its hold gives everything back.
	d := b.begin(100)
	d.grow(60, nil)
	e := b.begin(100)
	done := make(chan struct{})
	close(done)
	if e.grow(60, done) {
		t.Error("e took 60 of the 40 free")
	}
	e.release()
	d.release()
	if h := metricValue(t, m.heldBytes); h != 0 {
		t.Errorf("held_bytes %v after every release", h)
	}
}

// TestProduceSoleTopic: the head scan agrees with franz-go's encoding of
// Produce requests at every version, with and without a transactional
// id, for one topic and for two.
func TestProduceSoleTopic(t *testing.T) {
	for v := int16(0); v <= kmsg.NewPtrProduceRequest().MaxVersion(); v++ {
		for _, topics := range [][]string{{"orders"}, {"orders", "payments"}, {""}} {
			for _, txn := range []bool{false, true} {
				req := kmsg.NewPtrProduceRequest()
				req.SetVersion(v)
				req.Acks = -1
				if txn && v >= 3 {
					id := "txn-1"
					req.TransactionID = &id
				}
				var ids [][16]byte
				for i, name := range topics {
					rt := kmsg.NewProduceRequestTopic()
					rt.Topic = name
					rt.TopicID = [16]byte{byte(i + 1), 7}
					ids = append(ids, rt.TopicID)
					rt.Partitions = append(rt.Partitions, kmsg.NewProduceRequestTopicPartition())
					req.Topics = append(req.Topics, rt)
				}
				frame := rawRequest(req, 1)
				h, err := ParseRequestHeader(frame[4:])
				if err != nil {
					t.Fatal(err)
				}
				name, id, ok := produceSoleTopic(frame[4:], h)
				if want := len(topics) == 1; ok != want {
					t.Fatalf("v%d %v: ok %v", v, topics, ok)
				}
				if !ok {
					continue
				}
				if v >= 13 && id != ids[0] || v < 13 && name != topics[0] {
					t.Errorf("v%d: %q %x, want %q %x", v, name, id, topics[0], ids[0])
				}
				// A head cut anywhere never reads past it.
				for cut := 0; cut < len(frame)-4; cut++ {
					produceSoleTopic(frame[4:4+cut], h)
				}
			}
		}
	}
}

// FuzzProduceSoleTopic: the head scan never panics, and what it reads
// agrees with franz-go's decoder whenever that decodes the request.
func FuzzProduceSoleTopic(f *testing.F) {
	for _, v := range []int16{3, 8, 9, 12, 13} {
		req := kmsg.NewPtrProduceRequest()
		req.SetVersion(v)
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic = "t"
		req.Topics = append(req.Topics, rt)
		f.Add(rawRequest(req, 1)[4:])
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		h, err := ParseRequestHeader(payload)
		if err != nil || h.APIKey != int16(kmsg.Produce) {
			return
		}
		name, id, ok := produceSoleTopic(payload, h)
		req := kmsg.NewPtrProduceRequest()
		req.SetVersion(h.APIVersion)
		if req.ReadFrom(payload[h.BodyOffset:]) != nil || !ok {
			return
		}
		if len(req.Topics) != 1 || (h.APIVersion >= 13 && req.Topics[0].TopicID != id) || (h.APIVersion < 13 && req.Topics[0].Topic != name) {
			t.Fatalf("scan: %q %x; franz-go: %+v", name, id, req.Topics)
		}
	})
}

// TestUnguardedSoleTopicStreams: with guards in force, a Produce request
// to one unguarded topic streams as without guards: it takes nothing of
// max_held_bytes, so guarded traffic can never keep it waiting.
func TestUnguardedSoleTopicStreams(t *testing.T) {
	upstream := startKfake(t, "-topics", "gx:1,plain:1")
	tp := startProxy(t, upstream, func(c *Config) { c.MaxHeldBytes = 8 << 20 })
	tp.SetGuards(&testGuards{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ProducerLinger(0), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	big := bytes.Repeat([]byte("x"), 200<<10)
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "plain", Value: big}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if p := tp.held.peakBytes(); p != 0 {
		t.Errorf("a 200 KiB produce to an unguarded topic held %d bytes", p)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "gx", Value: big}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if p := tp.held.peakBytes(); p < 200<<10 {
		t.Errorf("a 200 KiB produce to a guarded topic held %d bytes, want it read whole", p)
	}
}

// TestEffectiveMaxConns: the cap in force is the configured one, at most
// half of what the descriptor limit leaves after its reserve; no limit
// known leaves the configured one.
func TestEffectiveMaxConns(t *testing.T) {
	for _, c := range []struct {
		configured int
		limit      uint64
		want       int64
	}{
		{10000, 1200, 525},      // (1200 - 150) / 2
		{100, 1200, 100},        // under what fits
		{0, 1200, 525},          // no cap configured: the limit's
		{10000, 1 << 20, 10000}, // a large limit
		{0, 0, 0},               // unknown limit, no cap
		{500, 0, 500},           // unknown limit
		{10000, 100, 1},         // a limit under the reserve still lets one in
		{10000, 1 << 62, 10000}, // RLIM_INFINITY
	} {
		if got := effectiveMaxConns(c.configured, c.limit); got != c.want {
			t.Errorf("configured %d, limit %d: %d, want %d", c.configured, c.limit, got, c.want)
		}
	}
}
