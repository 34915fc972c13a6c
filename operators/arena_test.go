package operators

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
)

// equalBits is reflect.DeepEqual for the values a table holds, except that
// numbers must be the same bits (DeepEqual says 0 == -0).
func equalBits(a, b any) bool {
	switch x := a.(type) {
	case float64:
		y, ok := b.(float64)
		return ok && math.Float64bits(x) == math.Float64bits(y)
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) || (x == nil) != (y == nil) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !equalBits(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) || (x == nil) != (y == nil) {
			return false
		}
		for i := range x {
			if !equalBits(x[i], y[i]) {
				return false
			}
		}
		return true
	case string, bool, nil:
		return a == b
	}
	return false
}

// checkSameRows fails unless tab holds exactly the rows of want: the old
// representation of a table, a map of the decoded rows.
func checkSameRows(t testing.TB, want map[string]map[string]any, tab interface {
	Lookup(string) (map[string]any, bool)
	Len() int
}) {
	t.Helper()
	if tab.Len() != len(want) {
		t.Fatalf("table has %d rows, the map %d", tab.Len(), len(want))
	}
	for k, row := range want {
		got, ok := tab.Lookup(k)
		if !ok || !equalBits(row, got) {
			t.Fatalf("key %q: table has %#v (%v), the map %#v", k, got, ok, row)
		}
	}
	for _, k := range []string{"", "absent", "\x00", "ü-absent"} {
		if _, inMap := want[k]; !inMap {
			if row, ok := tab.Lookup(k); ok {
				t.Fatalf("key %q is not in the map, the table has %v", k, row)
			}
		}
	}
}

// mapRows reads a table file into the old representation.
func mapRows(t testing.TB, path, key string) map[string]map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := map[string]map[string]any{}
	if err := readTable(f, path, key, func(k string, row map[string]any) error {
		rows[k] = row
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return rows
}

// Pools the random tables draw from: few keys, so rows repeat keys and the
// later one must win; unicode, empty strings, numbers that are keys too.
var (
	randKeys  = []string{"a", "b", "ü", "日本", "a b", "1", "1.5", "-0", "0", "007", "k,\"q\"", "\u00e9", "e\u0301", "x\ty"}
	randWords = []string{"", " ", "true", "false", "TRUE", "1", "1.0", "-0", "0x1f", "1e3", "NaN", "Inf", "1_000",
		".5", "héllo", "𝄞", "a,b", "\"q\"", "line\nbreak", "DE", "DE", "FR", strings.Repeat("long", 20)}
)

func randFloat(r *rand.Rand) float64 {
	switch r.IntN(6) {
	case 0:
		return float64(r.IntN(1000))
	case 1:
		return math.Copysign(0, -1)
	case 2:
		return float64(r.Int64N(1<<60)) * []float64{1, -1}[r.IntN(2)]
	case 3:
		return r.NormFloat64() * 1e6
	case 4:
		return math.Ldexp(r.Float64(), r.IntN(2000)-1000)
	}
	return float64(r.IntN(500)) + 0.5
}

func randJSONValue(r *rand.Rand, depth int) any {
	n := 6
	if depth < 3 {
		n = 8
	}
	switch r.IntN(n) {
	case 0:
		return nil
	case 1:
		return r.IntN(2) == 0
	case 2, 3:
		return randFloat(r)
	case 4, 5:
		return randWords[r.IntN(len(randWords))]
	case 6:
		a := make([]any, r.IntN(4))
		for i := range a {
			a[i] = randJSONValue(r, depth+1)
		}
		return a
	}
	m := map[string]any{}
	for range r.IntN(4) {
		m[randWords[r.IntN(len(randWords))]] = randJSONValue(r, depth+1)
	}
	return m
}

// writeRandomJSONL writes rows random JSON lines keyed by "id".
func writeRandomJSONL(t testing.TB, r *rand.Rand, path string, rows int) {
	var b []byte
	for i := range rows {
		obj := map[string]any{}
		for range r.IntN(6) {
			obj[randWords[r.IntN(len(randWords))]] = randJSONValue(r, 0)
		}
		switch r.IntN(4) {
		case 0:
			obj["id"] = float64(r.IntN(20))
		case 1:
			obj["id"] = fmt.Sprintf("u%d", i)
		default:
			obj["id"] = randKeys[r.IntN(len(randKeys))]
		}
		var err error
		if b, err = jsoncodec.Append(b, obj); err != nil {
			t.Fatal(err)
		}
		b = append(b, '\n')
		if r.IntN(10) == 0 {
			b = append(b, " \n"...)
		}
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeRandomCSV writes a random CSV table keyed by column "id"; column
// names may repeat (the later cell wins).
func writeRandomCSV(t testing.TB, r *rand.Rand, path string, rows int) {
	var buf bytes.Buffer
	w := csv.NewWriter(&buf)
	cols := []string{"id"}
	for range 1 + r.IntN(5) {
		cols = append(cols, []string{"name", "amount", "flag", "ü", "", "name"}[r.IntN(6)])
	}
	r.Shuffle(len(cols), func(i, j int) { cols[i], cols[j] = cols[j], cols[i] })
	if err := w.Write(cols); err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		rec := make([]string, len(cols))
		for c, name := range cols {
			switch {
			case name == "id" && r.IntN(3) == 0:
				rec[c] = fmt.Sprintf("u%d", i)
			case name == "id":
				rec[c] = randKeys[r.IntN(len(randKeys))]
			case r.IntN(2) == 0:
				rec[c] = strconv.FormatFloat(randFloat(r), 'g', -1, 64)
			default:
				rec[c] = randWords[r.IntN(len(randWords))]
			}
		}
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
	}
	w.Flush()
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestFileTableMatchesMaps: for random JSON-lines and CSV files, a
// FileTable binds exactly the values the old representation (a map of the
// decoded rows) bound, also after a reload, and a failed reload keeps them.
func TestFileTableMatchesMaps(t *testing.T) {
	dir := t.TempDir()
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 13))
		for _, ext := range []string{".jsonl", ".csv"} {
			path := filepath.Join(dir, fmt.Sprintf("t%d%s", seed, ext))
			write := writeRandomJSONL
			if ext == ".csv" {
				write = writeRandomCSV
			}
			write(t, r, path, r.IntN(300))
			ft, err := LoadFileTable(path, "id")
			if err != nil {
				t.Fatalf("seed %d %s: %v", seed, ext, err)
			}
			want := mapRows(t, path, "id")
			checkSameRows(t, want, ft)

			write(t, r, path, r.IntN(300))
			if err := ft.Reload(); err != nil {
				t.Fatal(err)
			}
			want = mapRows(t, path, "id")
			checkSameRows(t, want, ft)

			if err := os.WriteFile(path, []byte("id\n\n"+`"unterminated`), 0o644); err != nil {
				t.Fatal(err)
			}
			if ext == ".jsonl" {
				if err := os.WriteFile(path, []byte(`{"id":"a"}`+"\n[1]\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := ft.Reload(); err == nil {
				t.Fatalf("seed %d %s: a broken file reloaded", seed, ext)
			}
			checkSameRows(t, want, ft)
		}
	}
}

// TestArenaTableManyRows: a table that grows its index many times and
// compacts after most rows were replaced still holds exactly the map's rows.
func TestArenaTableManyRows(t *testing.T) {
	want := map[string]map[string]any{}
	b := newArenaBuilder()
	for i := range 50_000 {
		k := strconv.Itoa(i % 20_000) // 30k replaced rows: compaction
		row := map[string]any{"id": k, "n": float64(i), "name": "name " + k, "c": []any{"DE", float64(i % 7)}}
		want[k] = row
		if err := b.add(k, row); err != nil {
			t.Fatal(err)
		}
	}
	checkSameRows(t, want, b.finish())
}

// TestArenaTableCollisions: keys whose hashes collide are told apart by
// their bytes. A table whose seed and index are forced into one slot
// chain cannot be built through maphash, so every key is given hash 0.
func TestArenaTableCollisions(t *testing.T) {
	tab := &arenaTable{slots: make([]uint64, 2*64)}
	var enc rowEncoder
	enc.seen = map[string]int32{}
	keys := []string{"a", "b", "", "ab", "ba", "a\x00"}
	for i, k := range keys {
		row, err := enc.appendValue(nil, map[string]any{"i": float64(i)}, 0)
		if err != nil {
			t.Fatal(err)
		}
		slot, found := tab.find(0, k)
		if found {
			t.Fatalf("%q found before it was added", k)
		}
		off := len(tab.arena)
		tab.arena = append(append(append(append(tab.arena, byte(len(k))), k...), byte(len(row))), row...)
		tab.slots[2*slot], tab.slots[2*slot+1] = 0, uint64(off)+1
		tab.n++
	}
	tab.consts = enc.consts
	for i, k := range keys {
		slot, found := tab.find(0, k)
		row, err := decodeRow(tab.rowAt(int(tab.slots[2*slot+1]-1)), tab.consts)
		if !found || err != nil || row.(map[string]any)["i"] != float64(i) {
			t.Fatalf("%q: found %v, row %v, %v", k, found, row, err)
		}
	}
	if _, found := tab.find(0, "c"); found {
		t.Fatal(`"c" found`)
	}
}

// TestFileTableRowsAreNotShared: every lookup is a map of its own, so a
// record that changes its bound row changes no other record's.
func TestFileTableRowsAreNotShared(t *testing.T) {
	p := filepath.Join(t.TempDir(), "t.jsonl")
	if err := os.WriteFile(p, []byte(`{"id":"a","v":1,"tags":["x"]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ft, err := LoadFileTable(p, "id")
	if err != nil {
		t.Fatal(err)
	}
	a, _ := ft.Lookup("a")
	a["v"] = 2.0
	a["tags"].([]any)[0] = "y"
	if b, _ := ft.Lookup("a"); b["v"] != 1.0 || b["tags"].([]any)[0] != "x" {
		t.Fatalf("second lookup sees the first one's change: %v", b)
	}
}

// TestFileTableLookupDuringReload: lookups running while the file is
// reloaded over and over see one version of a row or the other, whole
// (run with -race).
func TestFileTableLookupDuringReload(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "t.jsonl")
	version := func(v int) []byte {
		var b []byte
		for i := range 500 {
			b = fmt.Appendf(b, `{"id":"k%d","v":%d,"also":%d}`+"\n", i, v, v)
		}
		return b
	}
	if err := os.WriteFile(p, version(1), 0o644); err != nil {
		t.Fatal(err)
	}
	ft, err := LoadFileTable(p, "id")
	if err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				k := fmt.Sprintf("k%d", (i*7+w)%500)
				row, ok := ft.Lookup(k)
				if !ok || row["id"] != k || row["v"] != row["also"] || (row["v"] != 1.0 && row["v"] != 2.0) {
					errs <- fmt.Sprintf("%s: %v %v", k, row, ok)
					return
				}
			}
		}()
	}
	for i := range 30 {
		if err := os.WriteFile(p, version(1+i%2), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := ft.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	if ft.Len() != 500 {
		t.Fatalf("len %d", ft.Len())
	}
}

// TestRowDecodeRefusesCorrupt: truncated and altered encodings are errors,
// never a panic or a wrong length.
func TestRowDecodeRefusesCorrupt(t *testing.T) {
	enc := newRowEncoder()
	var b []byte
	for range 2 { // twice, so the second has constants
		var err error
		b, err = enc.appendValue(nil, map[string]any{"a": []any{1.5, "x", nil, true}, "b": map[string]any{"c": -0.0}}, 0)
		if err != nil {
			t.Fatal(err)
		}
	}
	for n := range len(b) {
		if _, err := decodeRow(b[:n], enc.consts); err == nil {
			t.Fatalf("prefix of %d bytes decoded", n)
		}
	}
	if _, err := decodeRow(append(b, tagNull), enc.consts); err == nil {
		t.Fatal("trailing byte accepted")
	}
	if _, err := decodeRow(b, nil); err == nil {
		t.Fatal("constants that are not there accepted")
	}
	if _, err := enc.appendValue(nil, map[string]any{"x": 1}, 0); err == nil || !strings.Contains(err.Error(), "type int") {
		t.Fatalf("an int row value: %v", err)
	}
}

// FuzzRowCodec: any JSON value encodes and decodes back to the same value
// (twice, the second time through constants), and decoding arbitrary
// bytes never panics.
func FuzzRowCodec(f *testing.F) {
	f.Add([]byte(`{"id":"m-1","name":"Merchant","avg":10.5,"tags":["a",null,true,false,-0,1e300],"n":{"x":{}}}`))
	f.Add([]byte(`[1,2.5,-9007199254740993,9007199254740992,"日本",""]`))
	f.Add([]byte{tagObject, 1, tagConst, 0, tagArray, 1, tagInt, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		// Arbitrary bytes: an error or a value, never a panic.
		_, _ = decodeRow(b, []any{"name", 1.5})
		v, err := jsoncodec.Decode(b)
		if err != nil {
			return
		}
		enc := newRowEncoder()
		for range 3 {
			row, err := enc.appendValue(nil, v, 0)
			if err != nil {
				t.Fatal(err)
			}
			got, err := decodeRow(row, enc.consts)
			if err != nil || !equalBits(v, got) {
				t.Fatalf("%s: got %#v, %v", b, got, err)
			}
		}
	})
}
