package pipeline

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/testkit"
	"github.com/rtproxy/rtproxy/rules"
)

// seriesOfSink lists the series on reg labelled route and sink, as
// "<metric>{class}" (class when the metric has one).
func seriesOfSink(t *testing.T, reg *prometheus.Registry, route, sink string) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			if have["route"] == route && have["sink"] == sink {
				out = append(out, mf.GetName()+"{"+have["class"]+"}")
			}
		}
	}
	sort.Strings(out)
	return out
}

// TestReloadDeletesSeriesOfRemovedSinks: a reload that removes a switch
// branch deletes that sink's series (its records and errors, and an HTTP
// sink's requests, retries and latencies), and so does one that turns
// the switch into a single sink, or a route removed and added again with
// other sinks; the sinks that stay keep counting from where they were.
func TestReloadDeletesSeriesOfRemovedSinks(t *testing.T) {
	srv := testkit.StartHTTPSinkServer(t, false)
	b := startBroker(t, map[string]int{"swr": 1})
	allow := &rules.Allow{URLs: []string{srv.URL}}
	v1 := loadHTTPRoute(t, fmt.Sprintf(`
route: swr
source: { topic: swr }
checkpoint_interval: 100ms
steps:
  - switch:
      - when: value.amount > 1000
        sink: { topic: swr.large }
      - when: value.currency != "EUR"
        sink: { http: { url: %s/foreign } }
      - sink: { topic: swr.rest }
`, srv.URL), allow)
	v2 := loadHTTPRoute(t, `
route: swr
source: { topic: swr }
checkpoint_interval: 100ms
steps:
  - switch:
      - when: value.amount > 1000
        sink: { topic: swr.large }
      - sink: { topic: swr.rest }
`, allow)
	v3 := loadHTTPRoute(t, `
route: swr
source: { topic: swr }
sink: { topic: swr.large }
checkpoint_interval: 100ms
`, allow)
	v4 := loadHTTPRoute(t, `
route: swr
source: { topic: swr }
sink: { topic: swr.rest }
checkpoint_interval: 100ms
`, allow)
	n := 0
	produce := func(pays ...payment) {
		t.Helper()
		var rs []*kgo.Record
		for _, p := range pays {
			rs = append(rs, jsonRecord("swr", fmt.Sprint("k", n), p))
			n++
		}
		b.produce(t, rs...)
	}
	reg := prometheus.NewRegistry()
	out := func(sink string) float64 {
		return gatheredLabels(t, reg, "rtproxy_pipeline_sink_records_out_total", map[string]string{"route": "swr", "sink": sink})
	}
	m, _ := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), Registerer: reg}, v1)

	large, usd, eur := payment{Amount: 5000, Currency: "EUR"}, payment{Amount: 5, Currency: "USD"}, payment{Amount: 5, Currency: "EUR"}
	produce(large, large, usd, usd, usd, eur)
	waitCounts := func(what string, want map[string]float64) {
		t.Helper()
		waitFor(t, 30*time.Second, what, func() bool {
			for s, w := range want {
				if out(s) != w {
					return false
				}
			}
			return true
		})
	}
	waitCounts("v1 wrote to its three sinks", map[string]float64{"swr.large": 2, "http-2": 3, "swr.rest": 1})
	if got := seriesOfSink(t, reg, "swr", "http-2"); len(got) != 2+5+2 {
		t.Fatalf("the HTTP branch has series %v, want its records, errors, 5 request classes, retries and latency", got)
	}

	// v2 drops the HTTP branch: its series go at the reload, the topic
	// branches keep theirs and count on.
	m.Apply([]*rules.Route{v2})
	if got := seriesOfSink(t, reg, "swr", "http-2"); len(got) != 0 {
		t.Errorf("after the reload without the HTTP branch, its series remain: %v", got)
	}
	produce(large, usd, eur)
	waitCounts("v2 wrote to its two sinks, counting on", map[string]float64{"swr.large": 3, "swr.rest": 3})
	if got := seriesOfSink(t, reg, "swr", "http-2"); len(got) != 0 {
		t.Errorf("the HTTP branch's series came back: %v", got)
	}

	// v3 is a single sink, one of the switch's: swr.rest goes.
	m.Apply([]*rules.Route{v3})
	if got := seriesOfSink(t, reg, "swr", "swr.rest"); len(got) != 0 {
		t.Errorf("after the reload to a single sink, swr.rest's series remain: %v", got)
	}
	produce(eur, usd)
	waitCounts("v3 wrote to its one sink, counting on", map[string]float64{"swr.large": 5})

	// Removed, then added again with another sink: the removed route
	// keeps its series while it is away (state_retention forgets it), the
	// version that comes back has only its own.
	m.Apply(nil)
	if got := seriesOfSink(t, reg, "swr", "swr.large"); len(got) != 2 {
		t.Errorf("a removed route's sink has series %v while away, want its 2 kept", got)
	}
	m.Apply([]*rules.Route{v4})
	if got := seriesOfSink(t, reg, "swr", "swr.large"); len(got) != 0 {
		t.Errorf("after the route came back with swr.rest only, swr.large's series remain: %v", got)
	}
	produce(large)
	waitCounts("v4 wrote to its sink", map[string]float64{"swr.rest": 1})
}
