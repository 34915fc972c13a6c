package state

import (
	"fmt"
	"runtime"
	"testing"
	"weak"
)

// TestCommittedCutIsReleased: once a cut is committed, nothing in the
// state store keeps it alive (the pending list's backing array did, until
// a later append moved it), and a caller that keeps it does not keep its
// overlays, every write of a checkpoint interval.
func TestCommittedCutIsReleased(t *testing.T) {
	db, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	kv := db.Namespace("r", "s")
	var (
		cuts     []weak.Pointer[Frozen]
		overlays []weak.Pointer[overlay]
		kept     []*Frozen // as a caller's list of cuts would
	)
	for round := range 3 {
		for i := range 100 {
			if err := kv.Set(fmt.Appendf(nil, "k%d-%d", round, i), []byte("v")); err != nil {
				t.Fatal(err)
			}
		}
		// Two cuts pending at once, as the pipeline has while outputs are
		// acknowledged, then committed in order.
		f1, err := db.Freeze("r")
		if err != nil {
			t.Fatal(err)
		}
		if err := kv.Set([]byte("x"), []byte("y")); err != nil {
			t.Fatal(err)
		}
		f2, err := db.Freeze("r")
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range f1.layers {
			overlays = append(overlays, weak.Make(o))
		}
		kept = append(kept, f2)
		for _, f := range []*Frozen{f1, f2} {
			if err := f.Commit(map[int32]int64{0: int64(round)}, nil); err != nil {
				t.Fatal(err)
			}
		}
		cuts = append(cuts, weak.Make(f1))
	}
	runtime.GC()
	for i, w := range cuts {
		if w.Value() != nil {
			t.Fatalf("committed cut %d of %d is still reachable", i+1, len(cuts))
		}
	}
	if len(overlays) == 0 {
		t.Fatal("the cuts held no overlays: the test checks nothing")
	}
	for i, w := range overlays {
		if w.Value() != nil {
			t.Fatalf("overlay %d of %d is still reachable after its commit", i+1, len(overlays))
		}
	}
	for _, f := range kept {
		if len(f.layers) != 0 {
			t.Fatal("a committed cut that its caller keeps still holds its overlays")
		}
	}
	runtime.KeepAlive(kept)
	if v, ok, err := kv.Get([]byte("k2-99")); err != nil || !ok || string(v) != "v" {
		t.Fatalf("k2-99 after the commits: %q %v %v", v, ok, err)
	}
}
