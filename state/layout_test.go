package state

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
	"time"
)

// TestKeyLayout pins the documented byte layout.
func TestKeyLayout(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  []byte
		want string
	}{
		{"route prefix", routePrefix("pay"), "52" + "03" + "706179"},
		{"checkpoint", routeKey("pay", tagCheckpoint), "5203706179" + "63"},
		{"offsets", routeKey("pay", tagOffsets), "5203706179" + "6f"},
		{"kv", stepPrefix("pay", tagKV, "2-dd"), "5203706179" + "6b" + "04" + "322d6464"},
		{"meta", stepPrefix("pay", tagMeta, ""), "5203706179" + "6d" + "00"},
		{"prefixEnd", prefixEnd([]byte{0x52, 0x01, 0xff}), "5202"},
		{"checkpoint record", checkpointRecord{seq: 258, time: time.Unix(0, 1)}.encode(), "01" + "0000000000000102" + "0000000000000001"},
		{"meta record", stepMeta{kvKeys: 1, kvBytes: 300, snapKeys: 0, snapBytes: 2}.encode(), "01" + "01" + "ac02" + "00" + "02"},
	} {
		if h := hex.EncodeToString(tc.got); h != tc.want {
			t.Errorf("%s = %s, want %s", tc.name, h, tc.want)
		}
	}
	if prefixEnd([]byte{0xff, 0xff}) != nil {
		t.Error("prefixEnd of all 0xff should be nil (no upper bound)")
	}
	// Length prefixes keep routes apart even when one name extends another.
	a, ab := routePrefix("a"), routePrefix("ab")
	if bytes.HasPrefix(ab, a) || bytes.HasPrefix(a, ab) {
		t.Errorf("route prefixes %x and %x nest", a, ab)
	}
	r, n, err := parseRoutePrefix(stepPrefix("pay", tagKV, "s"))
	if err != nil || r != "pay" || n != 5 {
		t.Errorf("parseRoutePrefix = %q %d %v", r, n, err)
	}
}

// FuzzDecodeRecords: the stored-record decoders never panic, reject with
// ErrCorrupt, and what they accept re-encodes to the same bytes.
func FuzzDecodeRecords(f *testing.F) {
	f.Add(checkpointRecord{seq: 3, time: time.Unix(1700000000, 5)}.encode())
	f.Add(stepMeta{kvKeys: 10, kvBytes: 400, snapKeys: 1, snapBytes: 9}.encode())
	f.Add(stepPrefix("route", tagKV, "3-window-abcd"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if rec, err := decodeCheckpointRecord(b); err == nil {
			if re := rec.encode(); !bytes.Equal(re, b) {
				t.Fatalf("checkpoint record %x re-encodes to %x", b, re)
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("error %v does not wrap ErrCorrupt", err)
		}
		if m, err := decodeStepMeta(b); err == nil {
			if m2, err := decodeStepMeta(m.encode()); err != nil || m2 != m {
				t.Fatalf("step meta %x: round trip %v %v", b, m2, err)
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("error %v does not wrap ErrCorrupt", err)
		}
		if route, n, err := parseRoutePrefix(b); err == nil {
			if !bytes.Equal(b[:n], routePrefix(route)) && len(b) > 0 {
				// A padded length varint parses too; the name must still
				// be the bytes it covers.
				if string(b[n-len(route):n]) != route {
					t.Fatalf("route %q does not match its bytes %x", route, b[:n])
				}
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("error %v does not wrap ErrCorrupt", err)
		}
		if step, n, err := parseStepID(b); err == nil {
			if n > len(b) || string(b[n-len(step):n]) != step {
				t.Fatalf("step %q does not match its bytes %x", step, b[:n])
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("error %v does not wrap ErrCorrupt", err)
		}
	})
}
