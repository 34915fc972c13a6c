package offsets

import (
	"bytes"
	"encoding/hex"
	"errors"
	"maps"
	"math"
	"strings"
	"testing"
)

func TestEncodeLayout(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    map[int32]int64
		hex  string
	}{
		{"empty", map[int32]int64{}, "0100"},
		{"nil", nil, "0100"},
		// version 1, count 2, p0 → 0, p1 → 300 (zigzag 600 = d8 04)
		{"two", map[int32]int64{1: 300, 0: 0}, "0102" + "0000" + "02d804"},
		// sentinel -1 zigzags to 1
		{"negative offset", map[int32]int64{5: -1}, "0101" + "0a01"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := hex.EncodeToString(Encode(nil, tc.m))
			if got != tc.hex {
				t.Fatalf("Encode = %s, want %s", got, tc.hex)
			}
			b, _ := hex.DecodeString(tc.hex)
			m, err := Decode(b)
			if err != nil {
				t.Fatal(err)
			}
			if len(m) != len(tc.m) || !maps.Equal(m, tc.m) && len(tc.m) > 0 {
				t.Fatalf("Decode = %v, want %v", m, tc.m)
			}
		})
	}
}

func TestEncodeAppends(t *testing.T) {
	dst := []byte("prefix")
	got := Encode(dst, map[int32]int64{2: 7})
	if !bytes.HasPrefix(got, []byte("prefix")) || hex.EncodeToString(got[6:]) != "0101040e" {
		t.Fatalf("Encode appended %x", got)
	}
}

func TestRoundTripExtremes(t *testing.T) {
	m := map[int32]int64{math.MinInt32: math.MinInt64, -1: 0, 0: math.MaxInt64, math.MaxInt32: 1 << 40}
	got, err := Decode(Encode(nil, m))
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, m) {
		t.Fatalf("round trip = %v, want %v", got, m)
	}
}

func TestDecodeErrors(t *testing.T) {
	for _, tc := range []struct{ hex, want string }{
		{"", "empty"},
		{"02", "unknown version 2"},
		{"01", "bad count"},
		{"0180", "bad count"},
		{"018000", "bad count"},     // padded varint: two encodings of 0
		{"0105", "count 5 exceeds"}, // count larger than the input
		{"010100", "count 1 exceeds"},
		{"01010080", "bad offset"},
		{"010202000200", "not above the previous 1"},
		{"010204000200", "not above the previous 2"},
		{"01010000ff", "1 trailing bytes"},
		{"0101feffffff3f00", "outside int32"},
	} {
		b, err := hex.DecodeString(tc.hex)
		if err != nil {
			t.Fatal(err)
		}
		m, err := Decode(b)
		if err == nil {
			t.Errorf("Decode(%s) = %v, want error containing %q", tc.hex, m, tc.want)
			continue
		}
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Decode(%s) error %q, want ErrCorrupt containing %q", tc.hex, err, tc.want)
		}
	}
}

// FuzzDecode: Decode never panics, and whatever it accepts re-encodes to
// exactly the same bytes (one encoding per position).
func FuzzDecode(f *testing.F) {
	f.Add(Encode(nil, map[int32]int64{0: 0, 1: 300, 7: -1}))
	f.Add(Encode(nil, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if re := Encode(nil, m); !bytes.Equal(re, b) {
			t.Fatalf("Decode(%x) = %v re-encodes to %x", b, m, re)
		}
	})
}
