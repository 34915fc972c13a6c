package pipeline

import (
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/state"
)

// TestStoreTable: a topic table's rows live in the state store, not the
// heap: only the most recently used rows (and misses) are cached decoded,
// a write replaces a cached row at once, a tombstone removes it, and a
// value that is not a JSON object is reported and left out (issue 10).
func TestStoreTable(t *testing.T) {
	db, err := state.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows := db.Rows("r", "shops")
	if err := rows.Reset(); err != nil {
		t.Fatal(err)
	}
	tb := newStoreTable(rows, 3)
	var skipped []string
	skip := func(rec *kgo.Record, err error) { skipped = append(skipped, fmt.Sprintf("%s: %v", rec.Key, err)) }
	var recs []*kgo.Record
	for i := range 10 {
		recs = append(recs, &kgo.Record{Key: []byte(fmt.Sprint("s", i)), Value: []byte(fmt.Sprintf(`{"n":%d}`, i))})
	}
	recs = append(recs, &kgo.Record{Key: []byte("bad"), Value: []byte(`[1]`)}, &kgo.Record{Key: []byte("worse"), Value: []byte(`{`)})
	if err := tb.apply(recs, skip); err != nil {
		t.Fatal(err)
	}
	if len(skipped) != 2 || !strings.Contains(skipped[0], "not a JSON object") {
		t.Errorf("skipped: %v", skipped)
	}
	for i := range 10 {
		row, ok := tb.Lookup(fmt.Sprint("s", i))
		if !ok || row["n"] != float64(i) {
			t.Errorf("s%d: %v %v", i, row, ok)
		}
	}
	if _, ok := tb.Lookup("bad"); ok {
		t.Error("a row that is not an object was stored")
	}
	if n := tb.lru.Len(); n != 3 || len(tb.cache) != 3 {
		t.Errorf("%d rows cached (%d in the map), want the 3 most recent", n, len(tb.cache))
	}

	// s9 is cached: an update and a delete reach the cache.
	if err := tb.apply([]*kgo.Record{
		{Key: []byte("s9"), Value: []byte(`{"n":99}`)},
		{Key: []byte("s8")}, // tombstone
	}, skip); err != nil {
		t.Fatal(err)
	}
	if row, ok := tb.Lookup("s9"); !ok || row["n"] != float64(99) {
		t.Errorf("s9 after update: %v %v", row, ok)
	}
	if row, ok := tb.Lookup("s8"); ok {
		t.Errorf("s8 after its tombstone: %v", row)
	}
	// A row evicted from the cache is read back from the store.
	if row, ok := tb.Lookup("s0"); !ok || row["n"] != float64(0) {
		t.Errorf("s0 read back: %v %v", row, ok)
	}
	// Reset empties the table (a route start rebuilds it from the topic).
	if err := rows.Reset(); err != nil {
		t.Fatal(err)
	}
	if _, ok := newStoreTable(rows, 3).Lookup("s1"); ok {
		t.Error("a row survived Reset")
	}
}

// BenchmarkTableLookup is the join's per-record lookup: a file table
// (operators.MapTable, in the heap) against a topic table (storeTable),
// its rows in the LRU cache and, with more rows than the cache holds, read
// back from pebble. Parallel, as tasks look up concurrently:
//
//	go test -run '^$' -bench BenchmarkTableLookup -benchmem ./pipeline
func BenchmarkTableLookup(b *testing.B) {
	db, err := state.Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	const rowsN = 100000
	keys := make([]string, rowsN)
	mt := operators.NewMapTable()
	rows := db.Rows("r", "t")
	st := newStoreTable(rows, tableCacheRows)
	var recs []*kgo.Record
	for i := range rowsN {
		keys[i] = fmt.Sprint("k", i)
		v := fmt.Sprintf(`{"id":%d,"name":"merchant %d","avg":%d.5,"country":"FR"}`, i, i, i%100)
		row, _ := jsoncodec.Decode([]byte(v))
		mt.Set(keys[i], row.(map[string]any))
		recs = append(recs, &kgo.Record{Key: []byte(keys[i]), Value: []byte(v)})
	}
	if err := st.apply(recs, func(*kgo.Record, error) {}); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		t    operators.Table
		n    int // distinct keys looked up
	}{
		{"map/hot1000", mt, 1000},
		{"store/hot1000", st, 1000},
		{"store/all100k", st, rowsN}, // beyond the 65,536-row cache: pebble reads
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					if _, ok := c.t.Lookup(keys[(i*7919)%c.n]); !ok {
						b.Fatal("missing row")
					}
					i++
				}
			})
		})
	}
}
