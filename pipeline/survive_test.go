package pipeline

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A panic in a route's own code is survived: one while a record is
// processed makes that record a dead letter (reason error, step
// internal); one in the poll loop restarts the route from its last
// checkpoint. Every record is accounted for, and both are counted.
func TestPanicsAreSurvived(t *testing.T) {
	b := startBroker(t, map[string]int{"pn": 2})
	const n = 40
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, jsonRecord("pn", fmt.Sprint(i), map[string]any{"n": i}))
	}
	b.produce(t, recs...)

	var polls, records atomic.Int64
	panicTestHook = func(route, where string) {
		switch {
		case where == "poll" && polls.Add(1) == 1:
			panic("test: the poll loop's bug")
		case where == "record" && records.Add(1) == 5:
			panic("test: a record's bug")
		}
	}
	t.Cleanup(func() { panicTestHook = nil })
	reg := prometheus.NewRegistry()
	runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), Registerer: reg},
		newRouteDef("pn", "v1", "pn", "pn.out", filterStep(t, 0, "value.n >= 0")))

	dl := b.consume(t, "pn.dlq", 1, 30*time.Second, 0)
	out := b.consume(t, "pn.out", n-1, 30*time.Second, 300*time.Millisecond)
	d := dl[0]
	if header(d, HeaderReason) != "error" || header(d, HeaderStep) != stepInternal ||
		!strings.Contains(header(d, HeaderError), "internal error: test: a record's bug") {
		t.Errorf("dead letter: reason %q step %q error %q", header(d, HeaderReason), header(d, HeaderStep), header(d, HeaderError))
	}
	seen := map[string]int{string(d.Value): 1}
	for _, r := range out {
		seen[string(r.Value)]++
	}
	for _, r := range recs {
		if seen[string(r.Value)] == 0 {
			t.Errorf("record %s is neither an output nor a dead letter", r.Value)
		}
	}
	if len(out) != n-1 {
		t.Errorf("%d outputs, want %d (the route restarted before processing anything)", len(out), n-1)
	}
	for where, want := range map[string]float64{"poll": 1, "record": 1} {
		if got := counterValue(t, reg, "rtproxy_route_panics_total", "pn", where); got != want {
			t.Errorf("rtproxy_route_panics_total{where=%q} = %v, want %v", where, got, want)
		}
	}
}

// counterValue is the value of the counter child of name with the route
// and where labels in reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name, route, where string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["route"] == route && labels["where"] == where {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no %s{route=%q,where=%q}", name, route, where)
	return 0
}

// A panic while a checkpoint holds its locks (taking the cut) restarts
// the route without leaving them held: the stop the restart makes
// returns, the new route runs, and every record reaches the sink.
func TestPanicInCheckpointRestartsTheRoute(t *testing.T) {
	b := startBroker(t, map[string]int{"pc": 2})
	const n = 40
	var cuts atomic.Int64
	panicTestHook = func(route, where string) {
		if where == "cut" && cuts.Add(1) == 1 {
			panic("test: a checkpoint's bug")
		}
	}
	t.Cleanup(func() { panicTestHook = nil })
	reg := prometheus.NewRegistry()
	m, _ := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), Registerer: reg},
		newRouteDef("pc", "v1", "pc", "pc.out", filterStep(t, 0, "value.n >= 0")))
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, jsonRecord("pc", fmt.Sprint(i), map[string]any{"n": i}))
	}
	b.produce(t, recs...)
	waitFor(t, 30*time.Second, "the route restarted after the panic", func() bool {
		return cuts.Load() > 1 && counterValue(t, reg, "rtproxy_route_panics_total", "pc", "checkpoint") == 1
	})
	more := []*kgo.Record{jsonRecord("pc", "late", map[string]any{"n": n})}
	b.produce(t, more...)
	out := b.consume(t, "pc.out", n+1, 30*time.Second, 300*time.Millisecond)
	seen := map[string]bool{}
	for _, r := range out {
		seen[string(r.Value)] = true
	}
	for _, r := range append(recs, more...) {
		if !seen[string(r.Value)] {
			t.Errorf("record %s never reached the sink", r.Value)
		}
	}
	for _, st := range m.Routes() {
		if st.Name == "pc" && st.State != "running" {
			t.Errorf("route state %q after the restart, want running", st.State)
		}
	}
}
