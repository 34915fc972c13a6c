package operators

import (
	"errors"
	"testing"
	"time"
)

// TestWindowsPerRecordRoundsUp: a record is in up to ceil(size / slide)
// windows, counted in the whole milliseconds the step works in.
func TestWindowsPerRecordRoundsUp(t *testing.T) {
	for _, tc := range []struct {
		size, slide time.Duration
		want        int64
	}{
		{time.Minute, time.Minute, 1},
		{10 * time.Second, 5 * time.Second, 2},
		{10 * time.Second, 3 * time.Second, 4},
		{10000500 * time.Millisecond, time.Second, 10001},
		{10 * time.Second, 1500 * time.Microsecond, 10000}, // the step slides by 1ms
	} {
		if got := WindowsPerRecord(tc.size, tc.slide); got != tc.want {
			t.Errorf("WindowsPerRecord(%v, %v) = %d, want %d", tc.size, tc.slide, got, tc.want)
		}
	}
	// And that is what the step does: count the windows one record opens.
	spec := WindowSpec{Kind: "sliding", Size: 10500 * time.Millisecond, Slide: time.Second, Aggregates: []Aggregate{{Name: "n", Func: AggCount}}}
	most := 0
	for ts := int64(0); ts < 1000; ts += 100 {
		w := NewWindow(spec)
		w.Process(&Record{EventTime: ts}, &oneDead{})
		most = max(most, w.(StateSizer).StateKeys())
	}
	if most != int(WindowsPerRecord(spec.Size, spec.Slide)) || most != 11 {
		t.Errorf("a record opened at most %d windows of 10.5s sliding by 1s, WindowsPerRecord says %d", most, WindowsPerRecord(spec.Size, spec.Slide))
	}
}

// TestValidateWindow: the problems, the rule-file key each is about, and
// what the step dead-letters with. The 10000500ms window of issue 17 is
// refused: 10000.5 windows per record round up to 10001.
func TestValidateWindow(t *testing.T) {
	for _, tc := range []struct {
		kind        string
		size, slide time.Duration
		keys        string // the Key of each problem
		msg         string
	}{
		{"sliding", 10000500 * time.Millisecond, time.Second, "slide",
			"sliding window of size 2h46m40.5s and slide 1s puts each record in 10001 windows, more than 10000: use a larger slide"},
		{"sliding", 10000 * time.Second, time.Second, "", ""},
		{"tumbling", time.Minute, 0, "", ""},
		{"tumbling", time.Second, time.Second, "", ""}, // a tumbling window ignores its slide
		{"sliding", time.Minute, 0, "slide", "sliding window slide 0s must be between 1ms and the size 1m0s"},
		{"sliding", 1700 * time.Microsecond, 1900 * time.Microsecond, "slide", "sliding window slide 1.9ms must be between 1ms and the size 1.7ms"},
		{"sliding", 500 * time.Microsecond, 500 * time.Microsecond, "size slide",
			"window size 500µs must be at least 1ms; sliding window slide 500µs must be between 1ms and the size 500µs"},
		{"", 0, time.Second, "size kind", `window size 0s must be at least 1ms; window kind "" must be tumbling or sliding`},
	} {
		err := ValidateWindow(tc.kind, tc.size, tc.slide)
		var problems WindowErrors
		if err != nil && !errors.As(err, &problems) {
			t.Fatalf("%T", err)
		}
		keys := ""
		for i, p := range problems {
			if i > 0 {
				keys += " "
			}
			keys += p.Key
			if p.Rule == "" {
				t.Errorf("%s %v/%v: problem %q without a rule-file message", tc.kind, tc.size, tc.slide, p)
			}
		}
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if keys != tc.keys || msg != tc.msg {
			t.Errorf("%s %v/%v: keys %q, %q; want keys %q, %q", tc.kind, tc.size, tc.slide, keys, msg, tc.keys, tc.msg)
		}
		var o oneDead
		NewWindow(WindowSpec{Kind: tc.kind, Size: tc.size, Slide: tc.slide}).Process(&Record{EventTime: 5}, &o)
		if dead := o.err != nil; dead != (err != nil) || (dead && o.err.Error() != "window: "+tc.msg) {
			t.Errorf("%s %v/%v: the step dead-letters with %v, ValidateWindow says %v", tc.kind, tc.size, tc.slide, o.err, err)
		}
	}
}
