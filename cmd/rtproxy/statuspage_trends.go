package main

// Trends on the status page: whether lag is growing, whether records still
// flow. A sampler takes the proxy's and each route's numbers every
// trendInterval into a ring per series, holding the last trendWindow, in
// memory only; the pages draw each ring as a small inline SVG sparkline
// (no script) with its last, lowest and highest value written beside it and
// in the graphic's title and aria-label, so it reads without colour, and
// without the graphic.

import (
	"fmt"
	"html/template"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtproxy/rtproxy/pipeline"
)

const (
	// trendInterval is how often the sampler takes a sample.
	trendInterval = 5 * time.Second
	// trendWindow is how far back the sparklines reach.
	trendWindow = 15 * time.Minute
	// trendPoints is the ring size: trendWindow of samples.
	trendPoints = int(trendWindow / trendInterval)
	// maxTrendRoutes bounds the routes followed; routes past it (by name)
	// have no trends. A rules directory this large is unusual.
	maxTrendRoutes = 500
)

// point is one sample; v is NaN when there was no value (a rate before its
// second sample, a p99 of an interval without records).
type point struct {
	at time.Time
	v  float64
}

// ring holds the last len(pts) points of a series.
type ring struct {
	pts  []point
	next int
	full bool
}

func newRing(n int) *ring { return &ring{pts: make([]point, n)} }

// add appends p, dropping the oldest point when the ring is full.
func (r *ring) add(p point) {
	r.pts[r.next] = p
	r.next++
	if r.next == len(r.pts) {
		r.next, r.full = 0, true
	}
}

// points returns the points held, oldest first (a copy).
func (r *ring) points() []point {
	if !r.full {
		return append([]point(nil), r.pts[:r.next]...)
	}
	out := make([]point, 0, len(r.pts))
	out = append(out, r.pts[r.next:]...)
	return append(out, r.pts[:r.next]...)
}

// routeTrend is the series of one route.
type routeTrend struct {
	in, out, lag, p99 *ring
	seen              time.Time // last sample the route was there
}

// trends samples the registry and the routes into rings.
type trends struct {
	reg      prometheus.Gatherer
	interval time.Duration
	window   time.Duration
	size     int

	mu      sync.Mutex
	started time.Time        // the first sample
	proxy   map[string]*ring // requests, bytes_in, bytes_out
	routes  map[string]*routeTrend
	prevAt  time.Time
	prev    map[string]float64 // counters at the previous sample
	prevH   map[string][]uint64
}

func newTrends(reg prometheus.Gatherer, interval, window time.Duration) *trends {
	n := int(window / interval)
	return &trends{reg: reg, interval: interval, window: window, size: n,
		proxy:  map[string]*ring{"requests": newRing(n), "bytes_in": newRing(n), "bytes_out": newRing(n)},
		routes: map[string]*routeTrend{}}
}

// run samples now and every interval until the returned stop is called.
// routes gives the pipeline's status (nil or not a []pipeline.RouteStatus:
// no routes).
func (tr *trends) run(routes func() func() any) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(tr.interval)
		defer t.Stop()
		for {
			tr.sampleNow(routes)
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); <-finished }) }
}

func (tr *trends) sampleNow(routes func() func() any) {
	fams, err := tr.reg.Gather()
	if err != nil && len(fams) == 0 {
		return
	}
	var rs []pipeline.RouteStatus
	if f := routes(); f != nil {
		rs, _ = f().([]pipeline.RouteStatus)
	}
	tr.sample(time.Now(), indexMetrics(fams), rs)
}

// sample records one sample at now: rates of the counters since the
// previous sample, the p99 of the records processed since then, and each
// route's lag now.
func (tr *trends) sample(now time.Time, m metricIndex, rs []pipeline.RouteStatus) {
	cur := map[string]float64{}
	curH := map[string][]uint64{}
	bounds := map[string][]float64{}
	for _, s := range m["rtproxy_proxy_requests_total"] {
		cur["requests"] += s.value
	}
	for _, s := range m["rtproxy_proxy_bytes_total"] {
		switch s.labels["direction"] {
		case "client_to_broker":
			cur["bytes_in"] += s.value
		case "broker_to_client":
			cur["bytes_out"] += s.value
		}
	}
	for _, s := range m["rtproxy_pipeline_records_in_total"] {
		cur["in:"+s.labels["route"]] += s.value
	}
	for _, s := range m["rtproxy_pipeline_records_out_total"] {
		cur["out:"+s.labels["route"]] += s.value
	}
	for _, s := range m["rtproxy_pipeline_processing_latency_seconds"] {
		if s.hist == nil {
			continue
		}
		r := s.labels["route"]
		for _, b := range s.hist.GetBucket() {
			curH[r] = append(curH[r], b.GetCumulativeCount())
			bounds[r] = append(bounds[r], b.GetUpperBound())
		}
		// The +Inf bucket is implicit: its cumulative count is the total.
		curH[r] = append(curH[r], s.hist.GetSampleCount())
		bounds[r] = append(bounds[r], math.Inf(1))
	}

	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.started.IsZero() {
		tr.started = now
	}
	dt := now.Sub(tr.prevAt).Seconds()
	rate := func(k string) float64 {
		p, ok := tr.prev[k]
		c, ok2 := cur[k]
		if tr.prev == nil || !ok2 || dt <= 0 {
			return math.NaN()
		}
		if !ok {
			p = 0 // a series born since the previous sample counted from 0
		}
		return max(c-p, 0) / dt
	}
	for k, r := range tr.proxy {
		r.add(point{now, rate(k)})
	}
	names := make([]string, 0, len(rs))
	lags := map[string]float64{}
	for _, r := range rs {
		if r.Name == "" {
			continue // a file that never compiled: no route to follow
		}
		var lag int64
		for _, o := range r.Owned {
			lag += o.Lag
		}
		if _, dup := lags[r.Name]; !dup {
			names = append(names, r.Name)
		}
		lags[r.Name] += float64(lag)
	}
	sort.Strings(names)
	for _, name := range names {
		rt := tr.routes[name]
		if rt == nil {
			if len(tr.routes) >= maxTrendRoutes {
				continue
			}
			rt = &routeTrend{in: newRing(tr.size), out: newRing(tr.size), lag: newRing(tr.size), p99: newRing(tr.size)}
			tr.routes[name] = rt
		}
		rt.seen = now
		rt.in.add(point{now, rate("in:" + name)})
		rt.out.add(point{now, rate("out:" + name)})
		rt.lag.add(point{now, lags[name]})
		rt.p99.add(point{now, intervalQuantile(tr.prevH[name], curH[name], bounds[name], 0.99)})
	}
	// A route gone for a whole window has nothing left to show.
	for name, rt := range tr.routes {
		if now.Sub(rt.seen) > tr.window {
			delete(tr.routes, name)
		}
	}
	tr.prev, tr.prevH, tr.prevAt = cur, curH, now
}

// intervalQuantile is quantile q of the observations between two readings
// of a histogram's cumulative bucket counts (the last bucket +Inf, holding
// the total): the upper bound of the first bucket holding it (the highest
// finite bound when it is past them all); NaN when nothing was observed in
// between or there is no earlier reading.
func intervalQuantile(prev, cur []uint64, bounds []float64, q float64) float64 {
	n := len(cur)
	if n == 0 || len(prev) != n || len(bounds) != n || cur[n-1] < prev[n-1] {
		return math.NaN() // no earlier reading, or the histogram was reset
	}
	total := cur[n-1] - prev[n-1]
	if total == 0 {
		return math.NaN()
	}
	want := uint64(math.Ceil(q * float64(total)))
	for i := range cur {
		if cur[i] >= prev[i] && cur[i]-prev[i] >= want && !math.IsInf(bounds[i], 1) {
			return bounds[i]
		}
	}
	if n >= 2 {
		return bounds[n-2]
	}
	return math.NaN()
}

// trendView is one series as a page shows it.
type trendView struct {
	Label          string
	SVG            template.HTML
	Last, Min, Max string
	Samples        int
}

// trendKind says how a series' values are written.
type trendKind int

const (
	kindRate trendKind = iota
	kindBytes
	kindCount
	kindSeconds
)

func formatTrend(v float64, k trendKind) string {
	if math.IsNaN(v) {
		return "–"
	}
	switch k {
	case kindRate:
		return strconv.FormatFloat(v, 'f', 1, 64) + "/s"
	case kindBytes:
		return humanBytes(v) + "/s"
	case kindCount:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case kindSeconds:
		return seconds(v)
	}
	return fmt.Sprint(v)
}

func humanBytes(v float64) string {
	switch {
	case v >= 1<<30:
		return fmt.Sprintf("%.1f GiB", v/(1<<30))
	case v >= 1<<20:
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	case v >= 1<<10:
		return fmt.Sprintf("%.1f KiB", v/(1<<10))
	}
	return fmt.Sprintf("%.0f B", v)
}

// Sparkline geometry, in CSS pixels.
const (
	sparkW = 180
	sparkH = 36
	sparkP = 3 // padding, so the line and the last point's dot are not cut
)

// trendOf renders a series: its sparkline over [now − span, now] and its
// last, lowest and highest value there; window is what the sampler keeps
// (span is shorter while the proxy is younger than it).
func trendOf(label string, pts []point, k trendKind, now time.Time, span, window time.Duration) trendView {
	tv := trendView{Label: label, Last: "–", Min: "–", Max: "–"}
	lo, hi := math.Inf(1), math.Inf(-1)
	last := math.NaN()
	for _, p := range pts {
		if math.IsNaN(p.v) || p.at.Before(now.Add(-span)) {
			continue
		}
		lo, hi, last = math.Min(lo, p.v), math.Max(hi, p.v), p.v
		tv.Samples++
	}
	if tv.Samples > 0 {
		tv.Last, tv.Min, tv.Max = formatTrend(last, k), formatTrend(lo, k), formatTrend(hi, k)
	}
	desc := fmt.Sprintf("%s over the last %s: ", label, spanLabel(span, window))
	if tv.Samples == 0 {
		desc += "no samples yet"
	} else {
		desc += fmt.Sprintf("last %s, lowest %s, highest %s (%d samples)", tv.Last, tv.Min, tv.Max, tv.Samples)
	}
	tv.SVG = sparkline(desc, pts, lo, hi, now, span)
	return tv
}

func shortDuration(d time.Duration) string {
	if d%time.Minute == 0 {
		return strconv.Itoa(int(d/time.Minute)) + " minutes"
	}
	return d.String()
}

// sparkline draws pts (oldest first) as polylines, broken where a value is
// missing, scaled so lo is the bottom and hi the top (a flat series sits in
// the middle), x by time across the window ending at now. desc is its
// accessible name and title.
func sparkline(desc string, pts []point, lo, hi float64, now time.Time, window time.Duration) template.HTML {
	var b strings.Builder
	d := template.HTMLEscapeString(desc)
	fmt.Fprintf(&b, `<svg class="spark" role="img" aria-label="%s" width="%d" height="%d" viewBox="0 0 %d %d" xmlns="http://www.w3.org/2000/svg"><title>%s</title>`,
		d, sparkW, sparkH, sparkW, sparkH, d)
	fmt.Fprintf(&b, `<line class="spark-base" x1="0" y1="%d" x2="%d" y2="%d"/>`, sparkH-1, sparkW, sparkH-1)
	start := now.Add(-window)
	xy := func(p point) (float64, float64) {
		x := sparkP + float64(p.at.Sub(start))/float64(window)*float64(sparkW-2*sparkP)
		x = math.Min(math.Max(x, sparkP), sparkW-sparkP)
		y := float64(sparkH) / 2
		if hi > lo {
			y = sparkP + (hi-p.v)/(hi-lo)*float64(sparkH-2*sparkP)
		}
		return x, y
	}
	var seg []string
	flush := func() {
		switch len(seg) {
		case 0:
		case 1: // a lone point: a dot, a line needs two
			x, y, _ := strings.Cut(seg[0], ",")
			fmt.Fprintf(&b, `<circle class="spark-dot" cx="%s" cy="%s" r="1.5"/>`, x, y)
		default:
			fmt.Fprintf(&b, `<polyline class="spark-line" points="%s"/>`, strings.Join(seg, " "))
		}
		seg = seg[:0]
	}
	var lastX, lastY float64
	have := false
	for _, p := range pts {
		if math.IsNaN(p.v) || p.at.Before(start) {
			flush()
			continue
		}
		x, y := xy(p)
		seg = append(seg, fmt.Sprintf("%.1f,%.1f", x, y))
		lastX, lastY, have = x, y, true
	}
	flush()
	if have {
		fmt.Fprintf(&b, `<circle class="spark-last" cx="%.1f" cy="%.1f" r="2.5"/>`, lastX, lastY)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// span is the time the sparklines cover at now: the window, or, while the
// proxy has been up for less, the time since the first sample (at least
// one interval), so a young proxy's lines use the whole width. Must hold mu.
func (tr *trends) span(now time.Time) time.Duration {
	if tr.started.IsZero() {
		return tr.window
	}
	return min(tr.window, max(now.Sub(tr.started), tr.interval))
}

// spanText says what span covers, for the pages' column heading.
func (tr *trends) spanText(now time.Time) string {
	if tr == nil {
		return shortDuration(trendWindow)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return spanLabel(tr.span(now), tr.window)
}

func spanLabel(span, window time.Duration) string {
	if span >= window {
		return shortDuration(window)
	}
	return span.Round(time.Second).String() + ", since the start"
}

// proxyTrends is the proxy's series for the page.
func (tr *trends) proxyTrends(now time.Time) []trendView {
	if tr == nil {
		return nil
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	sp := tr.span(now)
	return []trendView{
		trendOf("requests per second", tr.proxy["requests"].points(), kindRate, now, sp, tr.window),
		trendOf("bytes per second client → broker", tr.proxy["bytes_in"].points(), kindBytes, now, sp, tr.window),
		trendOf("bytes per second broker → client", tr.proxy["bytes_out"].points(), kindBytes, now, sp, tr.window),
	}
}

// routeTrends is a route's series for the page; nil when it has none.
func (tr *trends) routeTrends(name string, now time.Time) []trendView {
	if tr == nil || name == "" {
		return nil
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	rt := tr.routes[name]
	if rt == nil {
		return nil
	}
	sp := tr.span(now)
	return []trendView{
		trendOf("records in per second", rt.in.points(), kindRate, now, sp, tr.window),
		trendOf("records out per second", rt.out.points(), kindRate, now, sp, tr.window),
		trendOf("lag (records)", rt.lag.points(), kindCount, now, sp, tr.window),
		trendOf("processing p99", rt.p99.points(), kindSeconds, now, sp, tr.window),
	}
}
