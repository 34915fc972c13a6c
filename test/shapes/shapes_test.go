package shapes

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/rtproxy/rtproxy/pipeline"
	"github.com/rtproxy/rtproxy/rules"
)

// shapeCount is how many shapes TestShapesDriver runs: SHAPES_COUNT, or
// 30 (a few seconds, in make test); with SHAPES_DURATION (make
// fuzz-shapes) it runs shapes for that long instead.
func shapeCount(t *testing.T) (int, time.Duration) {
	n, d := 30, time.Duration(0)
	if s := os.Getenv("SHAPES_COUNT"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("SHAPES_COUNT=%q: %v", s, err)
		}
		n = v
	}
	if s := os.Getenv("SHAPES_DURATION"); s != "" {
		v, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("SHAPES_DURATION=%q: %v", s, err)
		}
		d = v
	}
	return n, d
}

func shapeSeed0(t *testing.T) uint64 {
	if s := os.Getenv("SHAPES_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SHAPES_SEED=%q: %v", s, err)
		}
		return v
	}
	return 1
}

// load compiles the shape's rule file as `rtproxy run` would.
func load(t testing.TB, s *Shape) *rules.Route {
	t.Helper()
	p := filepath.Join(t.TempDir(), s.Name+".yaml")
	if err := os.WriteFile(p, []byte(s.YAML()), 0o644); err != nil {
		t.Fatal(err)
	}
	def, err := rules.LoadFile(p)
	if err != nil {
		t.Fatalf("%v\n%s", err, s.Describe())
	}
	return def
}

// runDriver runs the shape through the Driver of `rtproxy test` and
// returns what it wrote.
func runDriver(t testing.TB, s *Shape) []Output {
	t.Helper()
	d, err := pipeline.NewDriver(load(t, s), pipeline.DriverConfig{Partitions: s.Partitions})
	if err != nil {
		t.Fatalf("%v\n%s", err, s.Describe())
	}
	defer d.Close()
	for _, in := range s.Inputs {
		if err := d.Send(pipeline.DriverInput{Partition: in.Partition, Offset: -1, Key: in.Key, Value: in.Value}); err != nil {
			t.Fatal(err)
		}
	}
	if !s.Live {
		d.AdvanceWatermark(time.UnixMilli(s.Far))
	}
	if e := d.Errors(); e != "" {
		t.Errorf("route error: %s\n%s", e, s.Describe())
	}
	var got []Output
	for _, o := range d.Outputs() {
		got = append(got, fromWritten(o.DeadLetter, o.Key, o.Value, func(k string) string {
			for _, h := range o.Headers {
				if h.Key == k {
					return string(h.Value)
				}
			}
			return ""
		}))
	}
	return got
}

// TestShapesDriver: random shapes through the Driver, every output and
// dead letter equal to the reference's. SHAPES_SEED is the first seed
// (default 1), so a failure reported by make fuzz-shapes runs again with
// SHAPES_SEED=<its seed> SHAPES_COUNT=1.
func TestShapesDriver(t *testing.T) {
	n, dur := shapeCount(t)
	seed := shapeSeed0(t)
	start := time.Now()
	ran, outs := 0, 0
	for i := 0; ; i++ {
		if dur > 0 && time.Since(start) >= dur || dur == 0 && i >= n {
			break
		}
		s := Generate(seed+uint64(i), false, 1)
		want := s.Expected()
		got := runDriver(t, s)
		if d := Diff(want, got); d != "" {
			t.Fatalf("shape %s\n%s\nwant %d records, got %d:\n%s", s.Name, s.Describe(), len(want), len(got), d)
		}
		ran++
		outs += len(got)
	}
	t.Logf("%d shapes run, %d outputs and dead letters compared, in %v", ran, outs, time.Since(start).Round(time.Millisecond))
}

// TestShapesSessionsDriver is TestShapesDriver for shapes whose windows are
// session windows (GenerateSessions): merges of sessions fed from several
// partitions (the keys are not the partition key), late records, capped
// sessions, on_update rows, sessions of window rows. SHAPES_COUNT and
// SHAPES_DURATION apply as there (20 shapes by default).
func TestShapesSessionsDriver(t *testing.T) {
	n, dur := shapeCount(t)
	if os.Getenv("SHAPES_COUNT") == "" {
		n = 20
	}
	seed := shapeSeed0(t)
	start := time.Now()
	ran, outs, merged, capped, late := 0, 0, 0, 0, 0
	for i := 0; ; i++ {
		if dur > 0 && time.Since(start) >= dur || dur == 0 && i >= n {
			break
		}
		s := GenerateSessions(seed+uint64(i), false, 1)
		want := s.Expected()
		got := runDriver(t, s)
		if d := Diff(want, got); d != "" {
			t.Fatalf("shape %s\n%s\nwant %d records, got %d:\n%s", s.Name, s.Describe(), len(want), len(got), d)
		}
		ran++
		outs += len(got)
		merged += s.merges
		capped += s.capped
		for _, o := range want {
			if o.Reason == "late" {
				late++
			}
		}
	}
	if ran >= 20 && (merged == 0 || capped == 0 || late == 0) {
		t.Errorf("%d session shapes with %d merges, %d records max_duration kept apart, %d late: the inputs do not test all three", ran, merged, capped, late)
	}
	t.Logf("%d shapes run, %d outputs and dead letters compared, %d session merges, %d records max_duration kept apart, %d late, in %v",
		ran, outs, merged, capped, late, time.Since(start).Round(time.Millisecond))
}
