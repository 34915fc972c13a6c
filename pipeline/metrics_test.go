package pipeline

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestForgetRouteDeletesItsSeries: a route whose state retention dropped
// leaves no series on /metrics, its HTTP sinks' included; other routes
// keep theirs (issue 14).
func TestForgetRouteDeletesItsSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"gone", "stays"} {
		m.recordsIn.WithLabelValues(r, "0").Inc()
		m.recordsOut.WithLabelValues(r).Inc()
		m.dropped.WithLabelValues(r, "0:filter").Inc()
		m.lag.WithLabelValues(r, "0").Set(3)
		m.checkpointDur.WithLabelValues(r).Observe(0.1)
		m.partitionsOwned.WithLabelValues(r).Set(2)
		// An HTTP sink's series, per sink (sink_http.go).
		hm, err := httpMetricsOn(reg)
		if err != nil {
			t.Fatal(err)
		}
		h := hm.of(r, "http-2")
		h.retries.Inc()
		h.latency.Observe(0.01)
	}
	m.forgetRoute("gone")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	stays := 0
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "route" && l.GetValue() == "gone" {
					t.Errorf("%s still has a series of the dropped route", mf.GetName())
				}
				if l.GetName() == "route" && l.GetValue() == "stays" {
					stays++
				}
			}
		}
	}
	// 6 above, and the HTTP sink's 5 request classes, retries, latency.
	if stays != 6+5+2 {
		t.Errorf("%d series of the other route, want %d", stays, 6+5+2)
	}
}
