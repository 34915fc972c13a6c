package pipeline

import (
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"
)

func TestEventMillis(t *testing.T) {
	ts := time.Date(2026, 11, 29, 9, 0, 0, 123e6, time.UTC)
	for _, c := range []struct {
		in   any
		want int64
		err  bool
	}{
		{float64(1700000000123), 1700000000123, false},
		{int64(42), 42, false},
		{int(7), 7, false},
		{json.Number("1700000000123"), 1700000000123, false},
		{json.Number("12.9"), 12, false},
		{"2026-11-29T09:00:00.123Z", ts.UnixMilli(), false},
		{"2026-11-29T10:00:00.123+01:00", ts.UnixMilli(), false},
		{ts, ts.UnixMilli(), false},
		{"yesterday", 0, true},
		{math.NaN(), 0, true},
		{math.Inf(1), 0, true},
		{true, 0, true},
		{nil, 0, true},
		{map[string]any{}, 0, true},
	} {
		got, err := eventMillis(c.in)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("eventMillis(%#v) = %d, %v; want %d, error %v", c.in, got, err, c.want, c.err)
		}
		if err != nil && !errors.Is(err, errNoEventTime) {
			t.Errorf("eventMillis(%#v) error %v does not wrap errNoEventTime", c.in, err)
		}
	}
}

// FuzzEventMillis feeds event_time strings and numbers: the parser must
// never panic, and a success must round-trip through RFC 3339.
func FuzzEventMillis(f *testing.F) {
	f.Add("2026-11-29T09:00:00Z", 1.5e12)
	f.Add("2026-11-29T09:00:00.999999999+14:00", -1.0)
	f.Add("", math.MaxFloat64)
	f.Fuzz(func(t *testing.T, s string, x float64) {
		if ms, err := eventMillis(s); err == nil {
			p, perr := time.Parse(time.RFC3339Nano, s)
			if perr != nil || p.UnixMilli() != ms {
				t.Fatalf("%q: got %d, time.Parse says %v %v", s, ms, p, perr)
			}
		}
		if ms, err := eventMillis(x); err == nil && math.Abs(float64(ms)-x) >= 1 {
			t.Fatalf("%v: got %d", x, ms)
		}
	})
}
