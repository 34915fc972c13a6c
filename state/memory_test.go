package state

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// splitmix64 spreads sequential ids over the key space like random ids do.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// dedupKey writes a 32-byte hex id (the size of a UUID without dashes).
func dedupKey(dst []byte, i uint64) []byte {
	var raw [16]byte
	binary.BigEndian.PutUint64(raw[:8], splitmix64(i))
	binary.BigEndian.PutUint64(raw[8:], splitmix64(^i))
	return hex.AppendEncode(dst[:0], raw[:])
}

func vmHWM(t testing.TB) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// TestStateMemory inserts N unique keys the way drop_duplicates without a
// ttl does (Get, miss, Set), checkpointing every 100k records (10k
// records/s with a 10s interval), and checks that every key is kept while
// the Go heap stays small: overlays hold only the writes since the last
// checkpoint. N is 1M by default; RTPROXY_STATE_KEYS=10000000 runs the
// full-size case (docs/BENCHMARKS.md, "State (pebble)").
func TestStateMemory(t *testing.T) {
	n := uint64(1_000_000)
	if s := os.Getenv("RTPROXY_STATE_KEYS"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("RTPROXY_STATE_KEYS: %v", err)
		}
		n = v
	} else if raceEnabled {
		n = 40_000
	} else if testing.Short() {
		n = 200_000
	}
	every := min(uint64(100_000), n/4)
	db := openTest(t, t.TempDir())
	defer db.Close()
	kv := db.Namespace("mem", "2-drop_duplicates-0123abcd")

	var peakHeap uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			peakHeap = max(peakHeap, ms.HeapInuse)
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()

	// The route's way of checkpointing: Freeze in line (the only stall),
	// Commit on a committer goroutine while records keep flowing.
	type cut struct {
		f    *Frozen
		offs map[int32]int64
	}
	cuts := make(chan cut, 4)
	var (
		commits   []time.Duration
		commitErr error
		cwg       sync.WaitGroup
	)
	cwg.Add(1)
	go func() {
		defer cwg.Done()
		for c := range cuts {
			t0 := time.Now()
			if err := c.f.Commit(c.offs, nil); err != nil && commitErr == nil {
				commitErr = err
			}
			commits = append(commits, time.Since(t0))
		}
	}()

	var (
		key     []byte
		val     [8]byte
		freezes []time.Duration
		lat     latencyHist
		start   = time.Now()
	)
	for i := uint64(0); i < n; i++ {
		t0 := time.Now()
		key = dedupKey(key, i)
		if _, ok, err := kv.Get(key); err != nil || ok {
			t.Fatalf("key %d: Get = %t, %v before it was set", i, ok, err)
		}
		binary.BigEndian.PutUint64(val[:], i)
		if err := kv.Set(key, val[:]); err != nil {
			t.Fatal(err)
		}
		if (i+1)%every == 0 || i+1 == n {
			t1 := time.Now()
			f, err := db.Freeze("mem")
			if err != nil {
				t.Fatal(err)
			}
			freezes = append(freezes, time.Since(t1))
			cuts <- cut{f, map[int32]int64{0: int64(i + 1)}}
		}
		lat.add(time.Since(t0))
	}
	close(cuts)
	cwg.Wait()
	if commitErr != nil {
		t.Fatal(commitErr)
	}
	elapsed := time.Since(start)
	close(stop)
	wg.Wait()

	keys, bytes := db.Stats("mem")
	if keys != int64(n) || bytes != int64(n)*40 {
		t.Fatalf("Stats = %d keys %d bytes, want %d keys %d bytes", keys, bytes, n, n*40)
	}
	// Every key is still there (sampled), with its value.
	for _, i := range []uint64{0, 1, n / 3, n / 2, n - 1} {
		key = dedupKey(key, i)
		v, ok, err := kv.Get(key)
		if err != nil || !ok || binary.BigEndian.Uint64(v) != i {
			t.Fatalf("key %d after run: %x %t %v", i, v, ok, err)
		}
	}
	slices.Sort(freezes)
	slices.Sort(commits)
	m := db.pdb.Metrics()
	t.Logf("%d keys in %v (%.0f keys/s incl. Get+Set+checkpoints), %d checkpoints of %d",
		n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), len(commits), every)
	t.Logf("freeze (route stall) p50 %v max %v; commit (in background) p50 %v max %v",
		freezes[len(freezes)/2], freezes[len(freezes)-1], commits[len(commits)/2], commits[len(commits)-1])
	t.Logf("per record Get+Set(+Freeze) latency: p50 %v p99 %v p99.9 %v max %v",
		lat.quantile(0.5), lat.quantile(0.99), lat.quantile(0.999), lat.max)
	t.Logf("peak Go heap in use %.1f MiB; process peak RSS (VmHWM) %.1f MiB; pebble disk %.1f MiB, block cache %.1f MiB",
		float64(peakHeap)/(1<<20), float64(vmHWM(t))/(1<<20), float64(m.DiskSpaceUsage())/(1<<20), float64(m.BlockCache.Size)/(1<<20))
	if peakHeap > 256<<20 {
		t.Errorf("peak Go heap %d MiB, want under 256 MiB", peakHeap>>20)
	}
}

func BenchmarkKVSetGet(b *testing.B) {
	db := openTest(b, b.TempDir())
	defer db.Close()
	kv := db.Namespace("bench", "s")
	var key []byte
	val := []byte("12345678")
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		key = dedupKey(key, uint64(i))
		if _, _, err := kv.Get(key); err != nil {
			b.Fatal(err)
		}
		if err := kv.Set(key, val); err != nil {
			b.Fatal(err)
		}
		if i%50_000 == 49_999 {
			if err := db.Checkpoint("bench", map[int32]int64{0: int64(i)}, nil); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkKVGetOverlayHit is the cost of a read served by the overlay
// (a window's aggregate updated since the last checkpoint).
func BenchmarkKVGetOverlayHit(b *testing.B) {
	db := openTest(b, b.TempDir())
	defer db.Close()
	kv := db.Namespace("bench", "s")
	keys := make([][]byte, 1024)
	for i := range keys {
		keys[i] = dedupKey(nil, uint64(i))
		kv.Set(keys[i], []byte("v"))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, ok, _ := kv.Get(keys[i&1023]); !ok {
			b.Fatal("miss")
		}
	}
}

// latencyHist counts latencies in 1µs buckets up to 100ms, without
// allocating per sample (10M samples must not distort the heap figure).
type latencyHist struct {
	buckets [100_000]int64
	n       int64
	max     time.Duration
}

func (h *latencyHist) add(d time.Duration) {
	i := int(d / time.Microsecond)
	if i >= len(h.buckets) {
		i = len(h.buckets) - 1
	}
	h.buckets[i]++
	h.n++
	h.max = max(h.max, d)
}

// quantile returns the upper edge of the bucket holding quantile q.
func (h *latencyHist) quantile(q float64) time.Duration {
	target := int64(q * float64(h.n))
	var seen int64
	for i, c := range h.buckets {
		seen += c
		if seen > target {
			return time.Duration(i+1) * time.Microsecond
		}
	}
	return h.max
}
