package pipeline

import (
	"fmt"
	"math/rand"
	"runtime"
	rtmetrics "runtime/metrics"
	"strings"
	"testing"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/benchkit"
	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/state"
)

// BenchmarkStoreTableGC asks whether a topic table's LRU of decoded rows
// (tableCacheRows, 65,536) is a garbage-collection problem at 100k rows,
// the question issue 13 answered for file tables by moving their rows
// into a byte arena (operators/arena.go). Run with -cpu 1:
//
//	go test -run '^$' -bench StoreTableGC -cpu 1 ./pipeline
//
// gc/...: ns/op is one forced runtime.GC() with the cache full (every row
// looked up once) or empty, live-MB the heap the cache holds.
//
// lookup-all/... and lookup-zipf/...: one record's work in a join against the table with an LRU of
// the given size: decode the record's members (the ~1 KiB of garbage a
// record leaves), look its merchant up, every row in turn. With lru-1 every
// lookup reads pebble and decodes the row, which is what a table without a
// heap cache would cost; gc-cpu-% is the collector's share of the CPU.
func BenchmarkStoreTableGC(b *testing.B) {
	db, err := state.Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	const n = 100_000
	rows := db.Rows("r", "t")
	keys := make([]string, n)
	var recs []*kgo.Record
	for i := range n {
		keys[i] = fmt.Sprintf("m-%05d", i)
		v := fmt.Sprintf(`{"merchant_id":%q,"name":"Merchant %s","avg_amount":%d.5,"country":"DE"}`, keys[i], keys[i], i%500)
		recs = append(recs, &kgo.Record{Key: []byte(keys[i]), Value: []byte(v)})
	}
	st := newStoreTable(rows, tableCacheRows)
	if err := st.apply(recs, func(*kgo.Record, error) { b.Fatal("skipped") }); err != nil {
		b.Fatal(err)
	}
	recs = nil
	for _, full := range []bool{false, true} {
		name := "gc/lru-empty"
		if full {
			name = "gc/lru-full"
		}
		b.Run(name, func(b *testing.B) {
			runtime.GC()
			base := heapObjects()
			t := newStoreTable(rows, tableCacheRows)
			if full {
				for _, k := range keys {
					if _, ok := t.Lookup(k); !ok {
						b.Fatal("missing row")
					}
				}
			}
			runtime.GC()
			live := int64(heapObjects()) - int64(base)
			for b.Loop() {
				runtime.GC()
			}
			b.ReportMetric(float64(live)/(1<<20), "live-MB")
			runtime.KeepAlive(t)
		})
	}
	in := benchkit.Inputs(4096)
	const merchantAt = len(`{"txn_id":"txn-00000000","user_id":"user-00000","merchant_id":"m-`)
	want := jsoncodec.Fields{"merchant_id": {}}
	// zipf is a skewed order of the rows: row 0 most often, then row 1...
	zipf := make([]int, 1<<20)
	z := rand.NewZipf(rand.New(rand.NewSource(1)), 1.1, 1, n-1)
	for i := range zipf {
		zipf[i] = int(z.Uint64())
	}
	for _, c := range []struct {
		order string
		size  int
	}{{"all", tableCacheRows}, {"all", 4096}, {"all", 1}, {"zipf", tableCacheRows}, {"zipf", 4096}, {"zipf", 1}} {
		size := c.size
		b.Run(fmt.Sprintf("lookup-%s/lru-%d", c.order, size), func(b *testing.B) {
			t := newStoreTable(rows, size)
			for i := range keys { // a warm cache
				k := keys[i]
				if c.order == "zipf" {
					k = keys[zipf[i]]
				}
				t.Lookup(k)
			}
			runtime.GC()
			b.ReportAllocs()
			i := 0
			gc0, gcCPU0 := gcCounters()
			cpu0 := benchkit.CPUNow()
			for b.Loop() {
				raw := in[i%len(in)]
				k := i % n
				if c.order == "zipf" {
					k = zipf[i%len(zipf)]
				}
				for j := merchantAt + 4; j >= merchantAt; j-- {
					raw[j] = byte('0' + k%10)
					k /= 10
				}
				v, _, err := jsoncodec.DecodeMembers(raw, want)
				if err != nil {
					b.Fatal(err)
				}
				if _, ok := t.Lookup(v.(map[string]any)["merchant_id"].(string)); !ok {
					b.Fatal("missing row")
				}
				i++
			}
			benchkit.RecPerSec(b, cpu0)
			gc1, gcCPU1 := gcCounters()
			b.ReportMetric((gc1-gc0)*1e6/float64(b.N), "gc/Mrec")
			b.ReportMetric(100*(gcCPU1-gcCPU0)/(benchkit.CPUNow()-cpu0).Seconds(), "gc-cpu-%")
		})
	}
}

func heapObjects() uint64 {
	s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64()
}

// gcCounters is the collector's cycles and its estimated CPU seconds.
func gcCounters() (cycles, cpu float64) {
	s := []rtmetrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/cpu/classes/gc/total:cpu-seconds"}}
	rtmetrics.Read(s)
	return float64(s[0].Value.Uint64()), s[1].Value.Float64()
}

// TestStoreTableCopiesCachedKeys: the LRU keeps its own copy of a key, not
// the caller's string, which is often a view into a whole decoded record
// (a full cache of 7-byte rows looked up with keys of whole-decoded 1 KiB
// records held 93 MB of heap before the copy, 28 MB with it).
func TestStoreTableCopiesCachedKeys(t *testing.T) {
	db, err := state.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows := db.Rows("r", "t")
	st := newStoreTable(rows, 8)
	if err := st.apply([]*kgo.Record{{Key: []byte("m-1"), Value: []byte(`{"a":1}`)}}, func(*kgo.Record, error) {}); err != nil {
		t.Fatal(err)
	}
	record := `{"merchant_id":"m-1","padding":"` + strings.Repeat("x", 1024) + `"}`
	hit := record[len(`{"merchant_id":"`):][:len("m-1")]
	miss := record[len(record)-8:][:3]
	for _, k := range []string{hit, miss} {
		st.Lookup(k)
		e, ok := st.cache[k]
		if !ok {
			t.Fatalf("%q not cached", k)
		}
		if unsafe.StringData(e.Value.(*cachedRow).key) == unsafe.StringData(k) {
			t.Fatalf("the cache keeps the caller's string %q, a view into a 1 KiB record", k)
		}
		for ck := range st.cache {
			if ck == k && unsafe.StringData(ck) == unsafe.StringData(k) {
				t.Fatalf("the cache map's key %q is the caller's string", k)
			}
		}
	}
}
