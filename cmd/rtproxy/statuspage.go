package main

// The status page: GET / on the admin listener, a small server-rendered
// HTML view of what /routes and /metrics say, for people, and a page per
// route (GET /route/NAME, routepage.go). They refresh themselves every
// 5 s; rates are computed between two loads of the page.

import (
	"embed"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/rtproxy/rtproxy/pipeline"
)

//go:embed statuspage/*.html
var statusFS embed.FS

// statusTmpl holds both pages ("status.html", "route.html") and the parts
// they share (style.html). They are parsed on the first page served, not at
// the start: parsing allocated 0.16 MB and ran html/template's parser in
// every process, most of which never serve the page (docs/BENCHMARKS.md,
// footprint).
var statusTmpl = sync.OnceValue(func() *template.Template {
	return template.Must(template.New("status").Funcs(template.FuncMap{
		// pathEscape makes a route's page name one path segment ("#" or "?"
		// in a refused file's name included).
		"pathEscape": url.PathEscape,
		// trendTable is the data of the "trends" table (style.html).
		"trendTable": func(caption, window string, ts []trendView) map[string]any {
			return map[string]any{"Caption": caption, "Window": window, "Trends": ts}
		},
	}).ParseFS(statusFS, "statuspage/*.html"))
})

// statusPage renders GET /.
type statusPage struct {
	reg     prometheus.Gatherer
	started time.Time

	mu   sync.Mutex
	prev map[string]float64 // counters at the last load, for rates
	at   time.Time

	// trends samples the series of the sparklines (statuspage_trends.go);
	// nil: no trends.
	trends *trends
}

type statusView struct {
	Version, Uptime, Now, NotReady string
	Ready                          bool
	Proxy                          proxyView
	ProxyTrends                    []trendView
	TrendWindow                    string
	Routes                         []routeView
	Guards                         []guardView
	Views                          []viewStatus
}

type proxyView struct {
	Connections                            string
	RequestRate, BytesInRate, BytesOutRate string
	APIs                                   []apiView
}

type apiView struct{ Name, Total, Rate string }

type routeView struct {
	// Page is the route's page: /route/Page, its name, or its rule file's
	// base name for a file that never compiled (no name).
	Page string
	// ErrorAt is where in the rule file its error points ("6:35"); empty
	// when it points nowhere in it. ErrorLine is that line.
	ErrorAt                                                                string
	ErrorLine                                                              int
	Name, State, StateClass, Source, Sink, Delivery, File, Group, Protocol string
	Generation                                                             int32
	Owned                                                                  int
	Lag                                                                    int64
	LastCheckpoint, Pause, Latency, LastError, RuleError                   string
	Watermark, Restore, Txn                                                string
	Partitions                                                             []partView
	AssignmentError                                                        string
	StateKeys, DeadLetters                                                 []namedValue
	// Sinks are the route's sinks (one, or a switch's branches) with their
	// counts since the route started.
	Sinks []sinkView
	// Trends are the route's sparklines (records in and out per second,
	// lag, processing p99); none before its first sample.
	Trends []trendView
}

// partView is one partition of a route's topics: its owner in the group,
// and for this instance's partitions their progress.
type partView struct {
	Topic                string
	Partition            int32
	Owner                string
	Self                 bool
	Done, Lag, Watermark string
	// HeldBy names the upstream partition a keyed partition's watermark
	// waits for (pipeline.OwnedPartition.HeldBy).
	HeldBy string
}

// partViews lists the group's assignment with this instance's progress on
// the partitions it owns; without an assignment, this instance's own.
func partViews(rs pipeline.RouteStatus) []partView {
	type tp struct {
		t string
		p int32
	}
	owned := map[tp]pipeline.OwnedPartition{}
	for _, o := range rs.Owned {
		owned[tp{o.Topic, o.Partition}] = o
	}
	var out []partView
	fill := func(v partView) partView {
		if o, ok := owned[tp{v.Topic, v.Partition}]; ok {
			v.Done, v.Lag = strconv.FormatInt(o.DoneOffset, 10), strconv.FormatInt(o.Lag, 10)
			if o.Watermark != nil {
				v.Watermark = o.Watermark.UTC().Format(time.RFC3339Nano)
			}
			if h := o.HeldBy; h != nil {
				v.HeldBy = fmt.Sprintf("writer %d, not heard from yet", h.Writer)
				if h.Frontier != nil {
					v.HeldBy = fmt.Sprintf("writer %d at %s", h.Writer, h.Frontier.UTC().Format(time.RFC3339Nano))
				}
			}
			delete(owned, tp{v.Topic, v.Partition})
		}
		return v
	}
	for _, a := range rs.Assignment {
		v := partView{Topic: a.Topic, Partition: a.Partition, Owner: a.Owner, Self: a.Self, Done: "–", Lag: "–"}
		if a.Self {
			v.Owner = "this instance"
		}
		out = append(out, fill(v))
	}
	for _, o := range rs.Owned {
		if _, ok := owned[tp{o.Topic, o.Partition}]; ok {
			out = append(out, fill(partView{Topic: o.Topic, Partition: o.Partition, Owner: "this instance", Self: true}))
		}
	}
	return out
}

type namedValue struct {
	Name  string
	Value string
}

type guardView struct{ Guard, Check, Value string }

// sinkView is one sink of a route on its page.
type sinkView struct{ Name, Target, Format, Out, Errors string }

func (s *statusPage) serve(w http.ResponseWriter, r *http.Request, ready func() (bool, string), routes func() any, views func() []viewStatus) {
	if r.URL.Path != "/" {
		http.NotFound(w, r)
		return
	}
	now := time.Now()
	v := statusView{Version: version, Uptime: time.Since(s.started).Round(time.Second).String(),
		Now: now.UTC().Format(time.RFC3339)}
	v.Ready, v.NotReady = ready()
	fams, err := s.reg.Gather()
	if err != nil && len(fams) == 0 {
		http.Error(w, "gather metrics: "+err.Error(), http.StatusInternalServerError)
		return
	}
	m := indexMetrics(fams)
	v.Proxy = s.proxyView(m, now)
	v.ProxyTrends = s.trends.proxyTrends(now)
	v.TrendWindow = s.trends.spanText(now)
	if routes != nil {
		if rs, ok := routes().([]pipeline.RouteStatus); ok {
			for _, rs := range rs {
				rv := routeViewOf(rs, m, now)
				rv.Trends = s.trends.routeTrends(rs.Name, now)
				v.Routes = append(v.Routes, rv)
			}
		}
	}
	for _, smp := range m["rtproxy_guard_rejected_records_total"] {
		v.Guards = append(v.Guards, guardView{Guard: smp.labels["guard"], Check: smp.labels["check"], Value: count(smp.value)})
	}
	sort.Slice(v.Guards, func(i, j int) bool {
		return v.Guards[i].Guard+"\x00"+v.Guards[i].Check < v.Guards[j].Guard+"\x00"+v.Guards[j].Check
	})
	if views != nil {
		v.Views = views()
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := statusTmpl().ExecuteTemplate(w, "status.html", v); err != nil {
		// The header is out; the page ends where it failed.
		fmt.Fprintf(w, "<p>render: %s</p>", template.HTMLEscapeString(err.Error()))
	}
}

// proxyView reads the proxy's counters, and their rates since the last
// load of the page.
func (s *statusPage) proxyView(m metricIndex, now time.Time) proxyView {
	cur := map[string]float64{}
	var reqs float64
	for _, smp := range m["rtproxy_proxy_requests_total"] {
		cur["api:"+smp.labels["api"]] = smp.value
		reqs += smp.value
	}
	cur["requests"] = reqs
	for _, smp := range m["rtproxy_proxy_bytes_total"] {
		cur["bytes:"+smp.labels["direction"]] = smp.value
	}
	s.mu.Lock()
	prev, at := s.prev, s.at
	s.prev, s.at = cur, now
	s.mu.Unlock()
	rate := func(k string) string {
		if prev == nil || !now.After(at) {
			return "–"
		}
		return fmt.Sprintf("%.1f", max(cur[k]-prev[k], 0)/now.Sub(at).Seconds())
	}
	pv := proxyView{RequestRate: rate("requests"), BytesInRate: rate("bytes:client_to_broker"), BytesOutRate: rate("bytes:broker_to_client")}
	if c := m["rtproxy_proxy_connections_open"]; len(c) > 0 {
		pv.Connections = count(c[0].value)
	}
	for _, smp := range m["rtproxy_proxy_requests_total"] {
		api := smp.labels["api"]
		pv.APIs = append(pv.APIs, apiView{Name: api, Total: count(smp.value), Rate: rate("api:" + api)})
	}
	slices.SortFunc(pv.APIs, func(a, b apiView) int { return strings.Compare(a.Name, b.Name) })
	return pv
}

func routeViewOf(rs pipeline.RouteStatus, m metricIndex, now time.Time) routeView {
	rv := routeView{Name: rs.Name, State: rs.State, Source: rs.Source, Sink: rs.Sink, Delivery: rs.Delivery,
		File: rs.File, Group: rs.Group, Protocol: rs.Protocol, Generation: rs.Generation, Owned: len(rs.Owned),
		LastError: rs.LastError, RuleError: rs.RuleError, Partitions: partViews(rs), AssignmentError: rs.AssignmentError,
		Pause: fmt.Sprintf("%.2f / %.2f ms", rs.CheckpointPauseMs, rs.MaxCheckpointPauseMs)}
	rv.Page = pageOf(rs)
	if refs := errorRefs(rs.File, rs.RuleError+"\n"+rs.LastError); len(refs) > 0 {
		rv.ErrorLine, rv.ErrorAt = refs[0].Line, strconv.Itoa(refs[0].Line)
		if refs[0].Col > 0 {
			rv.ErrorAt += ":" + strconv.Itoa(refs[0].Col)
		}
	}
	switch rs.State {
	case "running":
		rv.StateClass = "state-running"
	case "error":
		rv.StateClass = "state-error"
	default:
		rv.StateClass = "state-other"
	}
	if rv.Delivery == "" {
		rv.Delivery = "–"
	}
	for _, o := range rs.Owned {
		rv.Lag += o.Lag
	}
	rv.LastCheckpoint = "never"
	if rs.LastCheckpoint != nil {
		rv.LastCheckpoint = now.Sub(*rs.LastCheckpoint).Round(time.Millisecond).String() + " ago"
	}
	if rs.Watermark != nil {
		rv.Watermark = rs.Watermark.UTC().Format(time.RFC3339Nano)
	}
	rv.Restore = fmt.Sprintf("%s (%d changelog records, %.1f s)", rs.Restore.State, rs.Restore.Records, rs.Restore.Seconds)
	if t := rs.Transaction; t != nil {
		rv.Txn = fmt.Sprintf("%s, %d commits, %d aborts", t.State, t.Commits, t.Aborts)
		if t.LastAbort != "" {
			rv.Txn += " (last abort: " + t.LastAbort + ")"
		}
	}
	rv.Latency = "–"
	for _, smp := range m["rtproxy_pipeline_processing_latency_seconds"] {
		if smp.labels["route"] == rs.Name && smp.hist != nil {
			rv.Latency = fmt.Sprintf("%s / %s", seconds(quantileOf(smp.hist, 0.5)), seconds(quantileOf(smp.hist, 0.99)))
		}
	}
	for _, smp := range m["rtproxy_state_keys"] {
		if smp.labels["route"] == rs.Name {
			rv.StateKeys = append(rv.StateKeys, namedValue{smp.labels["step"], count(smp.value)})
		}
	}
	for _, s := range rs.Sinks {
		rv.Sinks = append(rv.Sinks, sinkView{Name: s.Name, Target: s.Target, Format: s.Format,
			Out: count(float64(s.Out)), Errors: count(float64(s.Errors))})
	}
	for _, smp := range m["rtproxy_pipeline_dead_letters_total"] {
		if smp.labels["route"] == rs.Name && smp.value > 0 {
			rv.DeadLetters = append(rv.DeadLetters, namedValue{smp.labels["reason"], count(smp.value)})
		}
	}
	return rv
}

// metricIndex is the gathered samples by metric name.
type metricIndex map[string][]sample

type sample struct {
	labels map[string]string
	value  float64
	hist   *dto.Histogram
}

func indexMetrics(fams []*dto.MetricFamily) metricIndex {
	out := metricIndex{}
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			s := sample{labels: map[string]string{}}
			for _, lp := range mt.GetLabel() {
				s.labels[lp.GetName()] = lp.GetValue()
			}
			switch {
			case mt.Counter != nil:
				s.value = mt.GetCounter().GetValue()
			case mt.Gauge != nil:
				s.value = mt.GetGauge().GetValue()
			case mt.Histogram != nil:
				s.hist = mt.GetHistogram()
			}
			out[f.GetName()] = append(out[f.GetName()], s)
		}
	}
	return out
}

// quantileOf estimates quantile q of a histogram: the upper bound of the
// first bucket holding it (what the buckets can say without interpolation);
// NaN when it is empty.
func quantileOf(h *dto.Histogram, q float64) float64 {
	n := h.GetSampleCount()
	if n == 0 {
		return math.NaN()
	}
	want := uint64(math.Ceil(q * float64(n)))
	for _, b := range h.GetBucket() {
		if b.GetCumulativeCount() >= want {
			return b.GetUpperBound()
		}
	}
	return math.Inf(1)
}

func seconds(s float64) string {
	switch {
	case math.IsNaN(s):
		return "–"
	case math.IsInf(s, 1):
		return "> 10 s"
	case s < 1:
		return fmt.Sprintf("≤ %.2f ms", s*1000)
	}
	return fmt.Sprintf("≤ %.2f s", s)
}

func count(v float64) string { return fmt.Sprintf("%.0f", v) }
