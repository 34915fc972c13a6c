package pipeline

import (
	"maps"
	"strings"
	"testing"
)

func TestJournalRoundTrip(t *testing.T) {
	cases := []struct {
		wm      int64
		applied map[int32]int64
	}{
		{0, map[int32]int64{}},
		{2500, map[int32]int64{0: 1, 1: 3001}},
		{-5, map[int32]int64{7: 0, 2147483647: 1 << 40}},
	}
	for _, c := range cases {
		b := encodeJournal(c.wm, c.applied)
		wm, applied, err := decodeJournal(b)
		if err != nil {
			t.Fatalf("decode %x: %v", b, err)
		}
		if wm != c.wm || !maps.Equal(applied, c.applied) {
			t.Fatalf("round trip of %d %v: %d %v", c.wm, c.applied, wm, applied)
		}
	}
	for _, bad := range []struct {
		b    []byte
		want string
	}{
		{nil, "bad version or length"},
		{append([]byte{2}, make([]byte, 9)...), "bad version or length"},
		{append(encodeJournal(1, map[int32]int64{0: 1}), 0), "1 trailing bytes"},
		{encodeJournal(1, map[int32]int64{0: 1, 1: 2})[:12], "bad"},
	} {
		if _, _, err := decodeJournal(bad.b); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("decode %x: %v, want an error with %q", bad.b, err, bad.want)
		}
	}
}

// FuzzDecodeJournal: any bytes decode to an error or to a journal whose
// encoding decodes to the same journal (inputs need not be canonical:
// a partition may repeat, a uvarint may be padded).
func FuzzDecodeJournal(f *testing.F) {
	f.Add(encodeJournal(2500, map[int32]int64{0: 1, 1: 3001}))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		wm, applied, err := decodeJournal(b)
		if err != nil {
			return
		}
		again := encodeJournal(wm, applied)
		wm2, applied2, err := decodeJournal(again)
		if err != nil || wm2 != wm || !maps.Equal(applied2, applied) {
			t.Fatalf("%x decoded to %d %v; its encoding %x decoded to %d %v (%v)", b, wm, applied, again, wm2, applied2, err)
		}
	})
}
