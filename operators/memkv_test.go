package operators

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestMemKVModel: random Sets, Deletes, Gets and Scans against a plain map,
// with values large enough that the arena is compacted many times; values
// returned before a compaction must stay as they were.
func TestMemKVModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	m := NewMemKV()
	model := map[string][]byte{}
	type held struct{ got, want []byte }
	var kept []held
	for i := range 20_000 {
		k := []byte(fmt.Sprintf("k%03d", r.IntN(400)))
		switch op := r.IntN(10); {
		case op < 5:
			v := bytes.Repeat([]byte{byte(i)}, r.IntN(600))
			if r.IntN(20) == 0 {
				v = nil
			}
			if err := m.Set(k, v); err != nil {
				t.Fatal(err)
			}
			model[string(k)] = append([]byte{}, v...)
			v = append(v[:0:0], 'x') // the caller's slice is its own
		case op < 7:
			if err := m.Delete(k); err != nil {
				t.Fatal(err)
			}
			delete(model, string(k))
		case op < 9:
			got, ok, err := m.Get(k)
			want, inModel := model[string(k)]
			if err != nil || ok != inModel || !bytes.Equal(got, want) || (ok && got == nil) {
				t.Fatalf("Get %s: %q %v %v, want %q %v", k, got, ok, err, want, inModel)
			}
			if ok && r.IntN(50) == 0 {
				kept = append(kept, held{got, want})
				_ = append(got, 'z') // must not write into the KV
			}
		default:
			lo := []byte(fmt.Sprintf("k%03d", r.IntN(400)))
			hi := []byte(fmt.Sprintf("k%03d", r.IntN(400)))
			if r.IntN(4) == 0 {
				hi = nil
			}
			var got []string
			if err := m.Scan(lo, hi, func(k, v []byte) bool {
				if !bytes.Equal(v, model[string(k)]) {
					t.Fatalf("Scan %s: %q, want %q", k, v, model[string(k)])
				}
				got = append(got, string(k))
				return len(got) < 50
			}); err != nil {
				t.Fatal(err)
			}
			var want []string
			for k := range model {
				if k >= string(lo) && (hi == nil || k < string(hi)) {
					want = append(want, k)
				}
			}
			slices.Sort(want)
			want = want[:min(len(want), 50)]
			if !slices.Equal(got, want) {
				t.Fatalf("Scan [%s, %s): %q, want %q", lo, hi, got, want)
			}
		}
		if m.Len() != len(model) {
			t.Fatalf("Len %d, model %d", m.Len(), len(model))
		}
	}
	if m.compactions == 0 || m.released == 0 {
		t.Fatalf("%d compactions, %d chunks let go: the test does not cover both", m.compactions, m.released)
	}
	for _, h := range kept {
		if !bytes.Equal(h.got, h.want) {
			t.Fatalf("a value returned earlier changed: %q, want %q", h.got, h.want)
		}
	}
}

// TestMemKVExpiry: the expiry pattern of drop_duplicates (collect in a
// Scan whose callback reads the KV, then delete), which compacts the arena.
func TestMemKVExpiry(t *testing.T) {
	m := NewMemKV()
	big := make([]byte, 4096)
	for i := range 1000 {
		if err := m.Set([]byte(fmt.Sprintf("t%04d", i)), big); err != nil {
			t.Fatal(err)
		}
	}
	var expired [][]byte
	if err := m.Scan([]byte("t"), []byte("u"), func(k, v []byte) bool {
		if got, ok, _ := m.Get(k); !ok || len(got) != len(big) || len(v) != len(big) {
			t.Fatalf("%s: Get inside Scan: %d bytes, %v", k, len(got), ok)
		}
		expired = append(expired, append([]byte(nil), k...))
		return true
	}); err != nil {
		t.Fatal(err)
	}
	for _, k := range expired {
		if err := m.Delete(k); err != nil {
			t.Fatal(err)
		}
	}
	if len(expired) != 1000 || m.Len() != 0 {
		t.Fatalf("scanned %d, %d left", len(expired), m.Len())
	}
	// 4 MB were written; the chunks whose entries are all gone are let
	// go (all but the one appended to).
	if m.held() > chunkMax {
		t.Fatalf("%d bytes held after everything was deleted", m.held())
	}
}
