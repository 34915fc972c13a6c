package protocol

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

// viewPartitionOn rewrites in through v with w workers (view_par.go), as
// viewFetchResponse does for a response of one partition; each worker's
// meter is newMeter's.
func viewPartitionOn(w int, v View, in []byte, newMeter func() *decodeMeter, sc *viewScratch, c *viewCounts) ([]byte, error) {
	return viewPartitionHeld(w, nil, v, in, newMeter, sc, c)
}

// viewPartitionHeld is viewPartitionOn with the batches rewritten ahead
// held in held.
func viewPartitionHeld(w int, held *heldBudget, v View, in []byte, newMeter func() *decodeMeter, sc *viewScratch, c *viewCounts) ([]byte, error) {
	var jobs []*viewJob
	eachViewBatch(in, func(b []byte) {
		jobs = append(jobs, &viewJob{v: v, b: b, done: make(chan struct{})})
	})
	if len(jobs) > 0 {
		sc.jobs = startViewJobsN(jobs, w, held, newMeter)
		defer func() { sc.jobs.stop(); sc.jobs = nil }()
	}
	return viewPartition(nil, v, 0, in, newMeter(), sc, c)
}

// randomViewInput is a partition's batches drawn from every case
// viewPartition tells apart: kept, filtered, failed and null records,
// whole batches filtered out (runs of them, at the start and the end),
// each codec, control batches, a bad CRC, an old message format, a batch
// over the decode budget, and a trailing partial batch.
// overBudget reports whether it holds the batch over the budget (which
// comes out as an error record, not as the view makes its records).
func randomViewInput(tb testing.TB, rng *rand.Rand) (in []byte, overBudget bool) {
	codecs := []kgo.CompressionCodec{kgo.NoCompression(), kgo.GzipCompression(), kgo.SnappyCompression(), kgo.Lz4Compression(), kgo.ZstdCompression()}
	vals := []string{"ab", "abc", "abc", "!x", "", "<nil>", "abcd", "secret-xy"}
	off := int64(rng.IntN(5))
	for range 1 + rng.IntN(8) {
		switch k := rng.IntN(12); {
		case k == 0:
			in = append(in, controlBatch(tb, off)...)
			off++
		case k == 1:
			b := viewBatchSeed(tb, off, kgo.NoCompression(), "secret-ab", "secret-cd")
			b[len(b)-1] ^= 1 // bad CRC
			in = append(in, b...)
			off += 4
		case k == 2:
			legacy := make([]byte, 12+14+4)
			binary.BigEndian.PutUint64(legacy, uint64(off))
			binary.BigEndian.PutUint32(legacy[8:], uint32(len(legacy)-12))
			legacy[16] = 1
			in = append(in, legacy...)
			off++
		case k == 3:
			in = append(in, viewBatchSeed(tb, off, kgo.GzipCompression(), strings.Repeat("s", 8<<10))...) // over the budget
			off += 2
			overBudget = true
		case k <= 6:
			// All filtered out.
			n := 1 + rng.IntN(3)
			in = append(in, viewBatchSeed(tb, off, codecs[rng.IntN(len(codecs))], slices.Repeat([]string{"abc"}, n)...)...)
			off += int64(2 * n)
		default:
			n := 1 + rng.IntN(20)
			vs := make([]string, n)
			for i := range vs {
				vs[i] = vals[rng.IntN(len(vals))]
			}
			in = append(in, viewBatchSeed(tb, off, codecs[rng.IntN(len(codecs))], vs...)...)
			off += int64(2 * n)
		}
	}
	if rng.IntN(4) == 0 {
		b := viewBatchSeed(tb, off, kgo.NoCompression(), "ab", "ab")
		in = append(in, b[:len(b)/2]...) // cut by the broker's byte limit
	}
	return in, overBudget
}

// TestViewWorkersSameAsInLine: the workers write exactly the bytes the
// rewrite in line writes, and count the same, for random partitions of
// every kind of batch, for clients that can and cannot read an empty
// batch; the in-line output is itself checked against an independent
// decode (checkViewOutput).
func TestViewWorkersSameAsInLine(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 28))
	newMeter := func() *decodeMeter { return testMeter(4<<10, 100) }
	for i := range 300 {
		in, overBudget := randomViewInput(t, rng)
		noEmpty := i%2 == 1
		var c1, c2 viewCounts
		sc1 := &viewScratch{noEmpty: noEmpty}
		want, err := viewPartition(nil, oddView{}, 0, in, newMeter(), sc1, &c1)
		if err != nil {
			t.Fatal(err)
		}
		sc2 := &viewScratch{noEmpty: noEmpty}
		got, err := viewPartitionOn(1+i%4, oddView{}, in, newMeter, sc2, &c2)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) || c1 != c2 || sc1.dropped != sc2.dropped {
			t.Fatalf("input %d (%d bytes): with workers %d bytes %+v dropped %d, in line %d bytes %+v dropped %d", i, len(in), len(got), c2, sc2.dropped, len(want), c1, sc1.dropped)
		}
		if bytes.Contains(got, []byte("secret")) {
			t.Fatalf("input %d: an undecodable batch passed through", i)
		}
		if ref, ok := refDecode(bytes.Clone(in)); ok && !noEmpty && !overBudget {
			out, ok := refDecode(got)
			if !ok {
				t.Fatalf("input %d: the output does not decode", i)
			}
			checkViewOutput(t, ref, out)
		}
	}
}

// TestViewWorkersStopOnError: when the connection closes while a worker
// waits for the global decode budget, the partition's rewrite returns
// the error, no worker outlives it (the response's buffer is given back
// to the pool right after, so a worker still reading it would read
// another response), and no room in proxy.max_held_bytes stays taken.
func TestViewWorkersStopOnError(t *testing.T) {
	var in []byte
	for i := range 6 {
		in = append(in, viewBatchSeed(t, int64(100*i), kgo.ZstdCompression(), strings.Repeat("ab", 2<<10), "ab")...)
	}
	before := runtime.NumGoroutine()
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	global := &heldBudget{max: 1 << 20, gauge: m.decodedBytes, waits: m.decodedWaits}
	global.acquire(1<<20, nil) // all of it, by another request: every decode waits
	done := make(chan struct{})
	newMeter := func() *decodeMeter {
		return &decodeMeter{global: global, done: done, maxCost: 1 << 20, maxRecs: 100, bufs: &decompressBufs{}}
	}
	held := &heldBudget{max: 64 << 20, gauge: m.heldBytes, waits: m.heldWaits}
	errc := make(chan error, 1)
	go func() {
		_, err := viewPartitionHeld(3, held, oddView{}, in, newMeter, &viewScratch{}, &viewCounts{})
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	close(done)
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "connection closed") {
			t.Fatalf("err %v, want the closed connection's", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the rewrite did not end when the connection closed")
	}
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > before; {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after the rewrite, %d before", runtime.NumGoroutine(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The room the batches rewritten ahead took is all given back.
	held.mu.Lock()
	used := held.used
	held.mu.Unlock()
	if used != 0 {
		t.Errorf("%d bytes of proxy.max_held_bytes still held", used)
	}
}

// TestViewWorkerPanicRaisedInConnection: a panic in a worker is not lost
// and does not kill the process: it is raised again in the goroutine that
// waits for that batch (the connection's, which survive() turns into a
// closed connection), with the worker's stack.
func TestViewWorkerPanicRaisedInConnection(t *testing.T) {
	var in []byte
	for i := range 4 {
		in = append(in, viewBatchSeed(t, int64(10*i), kgo.NoCompression(), "ab")...)
	}
	jobs := []*viewJob{}
	eachViewBatch(in, func(b []byte) { jobs = append(jobs, &viewJob{v: oddView{}, b: b, done: make(chan struct{})}) })
	j := startViewJobsN(jobs, 2, nil, func() *decodeMeter { return nil }) // a nil meter: viewBatch panics
	defer j.stop()
	sc := &viewScratch{jobs: j}
	defer func() {
		p := recover()
		if p == nil || !strings.Contains(p.(string), "view worker") {
			t.Fatalf("recovered %v, want the worker's panic", p)
		}
	}()
	_, _ = viewPartition(nil, oddView{}, 0, in, testMeter(1<<20, 100), sc, &viewCounts{})
	t.Fatal("no panic")
}

// TestViewWorkersWithinHeldBytes: a batch rewritten ahead takes room for
// its output in proxy.max_held_bytes, without waiting for it; with no
// room the connection rewrites it in line. The output is the same
// whatever the room, every byte taken is given back, and the budget is
// never passed.
func TestViewWorkersWithinHeldBytes(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	var in []byte
	for i := range 8 {
		in = append(in, viewBatchSeed(t, int64(100*i), kgo.ZstdCompression(), strings.Repeat("ab", 200), "abc", "ab")...)
	}
	newMeter := func() *decodeMeter { return testMeter(1<<20, 100) }
	want, err := viewPartition(nil, oddView{}, 0, in, newMeter(), &viewScratch{}, &viewCounts{})
	if err != nil {
		t.Fatal(err)
	}
	one := viewOutCap(in[:len(in)/8])
	for _, room := range []int64{0, one, 3 * one, 100 * one} {
		held := &heldBudget{max: 1 << 20, gauge: m.heldBytes, waits: m.heldWaits}
		held.acquire(held.max-room, nil) // the rest is held by responses
		base := held.used
		got, err := viewPartitionHeld(4, held, oddView{}, in, newMeter, &viewScratch{}, &viewCounts{})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("room %d: the output differs from the in-line rewrite's", room)
		}
		if held.used != base || held.peakBytes() > held.max {
			t.Errorf("room %d: %d bytes held after (%d before), peak %d of %d", room, held.used, base, held.peakBytes(), held.max)
		}
	}
}

// TestViewWorkersThroughProxy: a group consuming a view through the proxy
// gets exactly what the view makes of each record when its fetch
// responses are large enough to be rewritten on workers (several
// partitions, several batches each, uncompressed and zstd).
func TestViewWorkersThroughProxy(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	upstream := startKfake(t, "-topics", "big:3")
	tp := startProxy(t, upstream, func(c *Config) { c.MaxHeldBytes = 64 << 20 })
	tp.SetViews(testViews{{name: "big.view", topic: "big"}})
	at := map[pOff]int{}
	for k, codec := range []kgo.CompressionCodec{kgo.NoCompression(), kgo.ZstdCompression(), kgo.NoCompression()} {
		for o, i := range produceDirect(t, upstream, "big", 2000*k, 2000, codec) {
			at[o] = i
		}
	}
	want := 0
	for _, i := range at {
		if _, kept, _ := viewExpect(i); kept {
			want++
		}
	}
	before := viewJobsStarted.Load()
	got := consumeView(t, tp.Addr(), "c1", "gw", "big.view", want)
	checkViewRecords(t, got, at, "big.view", 0)
	if viewJobsStarted.Load() == before {
		t.Errorf("no fetch response was rewritten on workers")
	}
}

// blockingView holds each record until release is closed.
type blockingView struct{ entered, release chan struct{} }

func (blockingView) Name() string  { return "b" }
func (blockingView) Topic() string { return "t" }
func (v blockingView) Apply(*ViewRecord) (bool, error) {
	select {
	case v.entered <- struct{}{}:
	default:
	}
	<-v.release
	return true, nil
}

// TestViewWorkersStopGivesBackRoom: stopping the workers (the connection
// answered or closed) gives back the room in proxy.max_held_bytes of
// every batch that took some: taken, rewritten and not taken, and taken
// but fed to no worker yet.
func TestViewWorkersStopGivesBackRoom(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	held := &heldBudget{max: 64 << 20, gauge: m.heldBytes, waits: m.heldWaits}
	v := blockingView{entered: make(chan struct{}, 1), release: make(chan struct{})}
	var jobs []*viewJob
	for i := range 4 {
		b := viewBatchSeed(t, int64(10*i), kgo.NoCompression(), "ab")
		jobs = append(jobs, &viewJob{v: v, b: b, done: make(chan struct{})})
	}
	j := startViewJobsN(jobs, 1, held, func() *decodeMeter { return testMeter(1<<20, 100) })
	<-v.entered // the one worker holds the first batch; the dispatcher waits to feed the second
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		held.mu.Lock()
		used := held.used
		held.mu.Unlock()
		if used == viewOutCap(jobs[0].b)+viewOutCap(jobs[1].b) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes held, want the first two batches' room", used)
		}
	}
	stopped := make(chan struct{})
	go func() { j.stop(); close(stopped) }()
	time.Sleep(20 * time.Millisecond)
	close(v.release)
	<-stopped
	if held.used != 0 {
		t.Errorf("%d bytes of proxy.max_held_bytes still held after stop", held.used)
	}
}

// FuzzViewDecompress: the one-call zstd decode of a view (viewDecompress)
// gives what the streaming decode gives (decompress), bytes and error
// alike, and charges the meter the same, for any input: frames with and
// without a declared size, several frames, frames that lie about their
// size, and garbage.
func FuzzViewDecompress(f *testing.F) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		f.Fatal(err)
	}
	plain := []byte(strings.Repeat(`{"card":"4111-1111-1111-1111","status":"ok"}`, 40))
	one := enc.EncodeAll(plain, nil) // declares its size
	f.Add(one)
	f.Add(append(slices.Clone(one), one...)) // two frames
	var stream bytes.Buffer
	sw, _ := zstd.NewWriter(&stream, zstd.WithEncoderConcurrency(1))
	sw.Write(plain)
	sw.Close()
	f.Add(stream.Bytes()) // no declared size
	lie := slices.Clone(one)
	lie[5]-- // a declared size one short (single-segment frame: the size byte after the descriptor)
	f.Add(lie)
	f.Add(enc.EncodeAll(nil, nil))
	f.Add([]byte{0x28, 0xb5, 0x2f, 0xfd})
	f.Fuzz(func(t *testing.T, in []byte) {
		m1, m2 := testMeter(64<<10, 100), testMeter(64<<10, 100)
		got, err1 := m1.viewDecompress(in, 4)
		want, err2 := m2.decompress(in, 4)
		if (err1 == nil) != (err2 == nil) || (err1 != nil && err1.Error() != err2.Error()) {
			t.Fatalf("errors: one call %v, streaming %v", err1, err2)
		}
		if err1 == nil && !bytes.Equal(got, want) {
			t.Fatalf("one call %d bytes, streaming %d", len(got), len(want))
		}
		if m1.cost != m2.cost {
			t.Fatalf("charged %d, streaming %d", m1.cost, m2.cost)
		}
	})
}
