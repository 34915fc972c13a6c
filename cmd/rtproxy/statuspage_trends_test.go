package main

import (
	"encoding/xml"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/rtproxy/rtproxy/pipeline"
)

// TestRing: a ring holds the last n points, oldest first, against a plain
// slice that keeps everything (the reference).
func TestRing(t *testing.T) {
	for _, n := range []int{1, 2, 5} {
		r := newRing(n)
		var all []point
		t0 := time.Unix(0, 0)
		for i := range 13 {
			p := point{t0.Add(time.Duration(i) * time.Second), float64(i)}
			r.add(p)
			all = append(all, p)
			got := r.points()
			want := all[max(0, len(all)-n):]
			if len(got) != len(want) {
				t.Fatalf("n=%d after %d: %d points, want %d", n, i+1, len(got), len(want))
			}
			for j := range want {
				if got[j] != want[j] {
					t.Fatalf("n=%d after %d: point %d = %v, want %v", n, i+1, j, got[j], want[j])
				}
			}
		}
		if len(r.pts) != n {
			t.Fatalf("the ring grew to %d", len(r.pts))
		}
	}
}

// TestIntervalQuantile: the p99 of what was observed between two
// readings, not since the start; NaN with nothing in between.
func TestIntervalQuantile(t *testing.T) {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x", Buckets: []float64{0.001, 0.01, 0.1, 1}})
	read := func() ([]uint64, []float64) {
		var m = &dtoMetric{}
		m.write(t, h)
		return m.counts, m.bounds
	}
	for range 1000 {
		h.Observe(0.5) // slow, before the first reading
	}
	prev, bounds := read()
	for range 100 {
		h.Observe(0.0005)
	}
	cur, _ := read()
	if q := intervalQuantile(prev, cur, bounds, 0.99); q != 0.001 {
		t.Fatalf("p99 of the interval = %v, want 0.001 (the slow records were before it)", q)
	}
	if q := intervalQuantile(cur, cur, bounds, 0.99); !math.IsNaN(q) {
		t.Fatalf("p99 of an empty interval = %v, want NaN", q)
	}
	if q := intervalQuantile(nil, cur, bounds, 0.99); !math.IsNaN(q) {
		t.Fatalf("p99 without an earlier reading = %v, want NaN", q)
	}
	h.Observe(5) // past every bound: the highest finite bound
	next, _ := read()
	if q := intervalQuantile(cur, next, bounds, 0.99); q != 1 {
		t.Fatalf("p99 past the buckets = %v, want 1", q)
	}
}

// TestSparkline: the SVG is well-formed, names itself (role, aria-label,
// title with last, lowest and highest), places points by time and value,
// breaks the line where a value is missing, and draws nothing but a base
// line with no samples.
func TestSparkline(t *testing.T) {
	now := time.Unix(10_000, 0)
	win := 10 * time.Second
	pts := []point{
		{now.Add(-20 * time.Second), 99}, // before the window: not drawn
		{now.Add(-10 * time.Second), 0},
		{now.Add(-5 * time.Second), 10},
		{now.Add(-4 * time.Second), math.NaN()},
		{now.Add(-2 * time.Second), 5},
		{now, 4},
	}
	tv := trendOf("lag <x>", pts, kindCount, now, win, win)
	if tv.Last != "4" || tv.Min != "0" || tv.Max != "10" || tv.Samples != 4 {
		t.Fatalf("last %s min %s max %s samples %d", tv.Last, tv.Min, tv.Max, tv.Samples)
	}
	var svg struct {
		XMLName xml.Name `xml:"svg"`
		Role    string   `xml:"role,attr"`
		Label   string   `xml:"aria-label,attr"`
		Title   string   `xml:"title"`
		Lines   []struct {
			Points string `xml:"points,attr"`
		} `xml:"polyline"`
		Dots []struct {
			Class string  `xml:"class,attr"`
			CX    float64 `xml:"cx,attr"`
			CY    float64 `xml:"cy,attr"`
		} `xml:"circle"`
	}
	if err := xml.Unmarshal([]byte(tv.SVG), &svg); err != nil {
		t.Fatalf("not well-formed: %v\n%s", err, tv.SVG)
	}
	want := "lag <x> over the last 10s: last 4, lowest 0, highest 10 (4 samples)"
	if svg.Role != "img" || svg.Label != want || svg.Title != want {
		t.Fatalf("role %q label %q title %q", svg.Role, svg.Label, svg.Title)
	}
	if strings.Contains(string(tv.SVG), "<x>") {
		t.Fatal("the label is not escaped")
	}
	// Two segments: [-10s, -5s] and [-2s, now]; the point before the window
	// and the missing one are neither drawn nor counted. The scale is 0..10,
	// so -10s (0) sits at the bottom.
	if len(svg.Lines) != 2 {
		t.Fatalf("%d polylines, want 2: %s", len(svg.Lines), tv.SVG)
	}
	first := strings.Fields(svg.Lines[0].Points)
	if len(first) != 2 || first[0] != "3.0,33.0" {
		t.Fatalf("first segment %q", svg.Lines[0].Points)
	}
	last := svg.Dots[len(svg.Dots)-1]
	if last.Class != "spark-last" || last.CX != sparkW-sparkP {
		t.Fatalf("the last point's dot %+v", last)
	}

	empty := trendOf("records in per second", nil, kindRate, now, win, win)
	if empty.Last != "–" || !strings.Contains(string(empty.SVG), "no samples yet") || strings.Contains(string(empty.SVG), "polyline") {
		t.Fatalf("empty series: %+v", empty)
	}
	flat := trendOf("x", []point{{now.Add(-time.Second), 3}, {now, 3}}, kindRate, now, win, win)
	if !strings.Contains(string(flat.SVG), ","+"18.0") || flat.Last != "3.0/s" {
		t.Fatalf("a flat series is not drawn in the middle: %s", flat.SVG)
	}
}

// TestTrendsSample: the sampler turns counters into rates between
// samples, sums a route's lag, forgets a route gone for a window, and
// holds at most trendPoints points a series.
func TestTrendsSample(t *testing.T) {
	reg := prometheus.NewRegistry()
	in := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rtproxy_pipeline_records_in_total", Help: "h"}, []string{"route", "partition"})
	out := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rtproxy_pipeline_records_out_total", Help: "h"}, []string{"route"})
	reqs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rtproxy_proxy_requests_total", Help: "h"}, []string{"api"})
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rtproxy_proxy_bytes_total", Help: "h"}, []string{"direction"})
	reg.MustRegister(in, out, reqs, bytes)
	tr := newTrends(reg, trendInterval, trendWindow)
	routes := []pipeline.RouteStatus{{Name: "r", Owned: []pipeline.OwnedPartition{{Lag: 3}, {Lag: 4}}}}
	t0 := time.Unix(1_000_000, 0)
	take := func(at time.Time, rs []pipeline.RouteStatus) {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		tr.sample(at, indexMetrics(fams), rs)
	}
	take(t0, routes)
	in.WithLabelValues("r", "0").Add(30)
	in.WithLabelValues("r", "1").Add(20)
	out.WithLabelValues("r").Add(25)
	reqs.WithLabelValues("Produce").Add(10)
	bytes.WithLabelValues("client_to_broker").Add(5000)
	take(t0.Add(5*time.Second), routes)
	rt := tr.routeTrends("r", t0.Add(5*time.Second))
	if len(rt) != 4 || rt[0].Last != "10.0/s" || rt[1].Last != "5.0/s" || rt[2].Last != "7" || rt[3].Last != "–" {
		t.Fatalf("route trends %+v", rt)
	}
	pt := tr.proxyTrends(t0.Add(5 * time.Second))
	if pt[0].Last != "2.0/s" || pt[1].Last != "1000 B/s" || pt[0].Samples != 1 {
		t.Fatalf("proxy trends %+v", pt)
	}
	// A young proxy: the lines span the time since the first sample.
	if got := tr.spanText(t0.Add(5 * time.Second)); got != "5s, since the start" {
		t.Fatalf("span at 5s: %q", got)
	}
	if !strings.Contains(string(pt[0].SVG), `aria-label="requests per second over the last 5s, since the start: last 2.0/s`) {
		t.Fatalf("young proxy's label: %s", pt[0].SVG)
	}
	// Many samples: bounded.
	at := t0.Add(5 * time.Second)
	for range 3 * trendPoints {
		at = at.Add(trendInterval)
		take(at, routes)
	}
	if n := len(tr.routes["r"].in.points()); n != trendPoints {
		t.Fatalf("%d points held, want %d", n, trendPoints)
	}
	if got := tr.spanText(at); got != "15 minutes" {
		t.Fatalf("span after an hour: %q", got)
	}
	// The route is gone: kept for a window, then forgotten.
	take(at.Add(trendInterval), nil)
	if tr.routeTrends("r", at) == nil {
		t.Fatal("a route that just left lost its trends")
	}
	take(at.Add(trendWindow+2*trendInterval), nil)
	if tr.routeTrends("r", at) != nil {
		t.Fatal("a route gone for a window still has trends")
	}
}

// dtoMetric reads a histogram's cumulative counts as the sampler does
// (the +Inf bucket last, holding the total).
type dtoMetric struct {
	counts []uint64
	bounds []float64
}

func (d *dtoMetric) write(t *testing.T, h prometheus.Histogram) {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	for _, b := range m.GetHistogram().GetBucket() {
		d.counts = append(d.counts, b.GetCumulativeCount())
		d.bounds = append(d.bounds, b.GetUpperBound())
	}
	d.counts = append(d.counts, m.GetHistogram().GetSampleCount())
	d.bounds = append(d.bounds, math.Inf(1))
}
