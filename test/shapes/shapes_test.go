package shapes

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
	dir := t.TempDir()
	for name, text := range s.Files() {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(dir, s.Name+".yaml")
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
// returns what it wrote; with a switch, it checks that the route counted
// as dropped the records the reference's switch took no branch for.
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
		got = append(got, fromWritten(o.Topic, o.DeadLetter, o.Key, o.Value, func(k string) string {
			for _, h := range o.Headers {
				if h.Key == k {
					return string(h.Value)
				}
			}
			return ""
		}))
	}
	if s.Branches != nil {
		s.Expected() // counts the reference's drops
		want, _ := s.SwitchDrops()
		if got := SwitchDropped(t, d.Metrics(), s); got != float64(want) {
			t.Errorf("the switch dropped %v records, the reference's %d\n%s", got, want, s.Describe())
		}
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
	seams := map[string]int{}
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
		countSeams(seams, s)
	}
	if ran >= 30 {
		checkSeams(t, seams, "window", "drop_duplicates", "join", "table")
	}
	t.Logf("%d shapes run, %d outputs and dead letters compared, switches after %v, in %v", ran, outs, seams, time.Since(start).Round(time.Millisecond))
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
	seams := map[string]int{}
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
		countSeams(seams, s)
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
	if ran >= 20 {
		checkSeams(t, seams, "session")
	}
	t.Logf("%d shapes run, %d outputs and dead letters compared, %d session merges, %d records max_duration kept apart, %d late, switches after %v, in %v",
		ran, outs, merged, capped, late, seams, time.Since(start).Round(time.Millisecond))
}

// countSeams counts s's switch by the step it follows, and "table" for a
// switch after a join in its table (maybe with a set between).
func countSeams(seams map[string]int, s *Shape) {
	if s.Branches == nil {
		return
	}
	seams[s.Seam()]++
	if s.Table != nil {
		seams["table"]++
	}
}

// checkSeams fails unless the shapes had a switch right after each of
// kinds: the seams a run must have crossed.
func checkSeams(t *testing.T, seams map[string]int, kinds ...string) {
	t.Helper()
	for _, k := range kinds {
		if seams[k] == 0 {
			t.Errorf("no shape put a switch after %s (switches after %v): the seeds do not test that seam", k, seams)
		}
	}
}

// SwitchDropped is what the route counted in
// rtproxy_pipeline_records_dropped_total for s's switch step.
func SwitchDropped(t testing.TB, g prometheus.Gatherer, s *Shape) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	step := fmt.Sprintf("%d:switch", len(s.Steps)-1)
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "rtproxy_pipeline_records_dropped_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["route"] == s.Name && l["step"] == step {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}
