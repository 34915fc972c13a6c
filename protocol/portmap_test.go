package protocol

import (
	"errors"
	"testing"
)

func TestPortMapStableAndInRange(t *testing.T) {
	m := NewPortMap(30000, 10)
	want := map[int32]int{}
	for _, n := range []int32{0, 1, 2, 1001, 1002, 11, 2147483647, -1} {
		p, isNew, err := m.Assign(n)
		if err != nil || !isNew {
			t.Fatalf("node %d: %d %v %v", n, p, isNew, err)
		}
		if p < 30000 || p >= 30010 {
			t.Fatalf("node %d got port %d outside [30000,30010)", n, p)
		}
		want[n] = p
	}
	if want[0] != 30000 || want[1] != 30001 || want[2] != 30002 || want[1001] != 30003 {
		t.Errorf("preferred slots not used: %v", want)
	}
	seen := map[int]int32{}
	for n, p := range want {
		if o, dup := seen[p]; dup {
			t.Fatalf("nodes %d and %d share port %d", n, o, p)
		}
		seen[p] = n
	}
	// A refresh in another order changes nothing.
	for _, n := range []int32{1002, 2, 1001, 0, 11, 1} {
		p, isNew, err := m.Assign(n)
		if err != nil || isNew || p != want[n] {
			t.Fatalf("node %d moved: %d (was %d) new=%v err=%v", n, p, want[n], isNew, err)
		}
		if lp, ok := m.Lookup(n); !ok || lp != p {
			t.Fatalf("lookup %d = %d %v", n, lp, ok)
		}
	}
}

func TestPortMapExhaustedAndReassign(t *testing.T) {
	m := NewPortMap(40000, 3)
	for n := int32(0); n < 3; n++ {
		if _, _, err := m.Assign(n); err != nil {
			t.Fatal(err)
		}
	}
	_, _, err := m.Assign(7)
	if !errors.Is(err, ErrPortRangeExhausted) {
		t.Fatalf("err = %v, want ErrPortRangeExhausted", err)
	}
	if _, ok := m.Lookup(7); ok {
		t.Fatal("refused node must not be mapped")
	}

	m = NewPortMap(40000, 3)
	p, _, _ := m.Assign(0)
	p2, err := m.Reassign(0, p)
	if err != nil || p2 != 40001 {
		t.Fatalf("reassign = %d, %v; want 40001", p2, err)
	}
	// The busy port stays reserved: node 3 (preferred slot 0) skips it.
	p3, _, _ := m.Assign(3)
	if p3 != 40002 {
		t.Fatalf("node 3 got %d, want 40002", p3)
	}
}
