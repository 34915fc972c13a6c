package protocol

import "github.com/prometheus/client_golang/prometheus"

// viewMetrics count what views did to fetched records.
type viewMetrics struct {
	// records{view, outcome}: kept, filtered, error (the record's value
	// replaced by null and the rtproxy-view-error header).
	records *prometheus.CounterVec
	// refused{api}: requests (or their topics or partitions) refused for
	// naming a view (view_admin.go, view_names.go, Produce in guard.go).
	refused *prometheus.CounterVec
}

func newViewMetrics(reg prometheus.Registerer) (*viewMetrics, error) {
	m := &viewMetrics{
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_proxy_view_records_total",
			Help: "Records fetched through a view, by view and outcome (kept, filtered, error: value replaced by null with the rtproxy-view-error header).",
		}, []string{"view", "outcome"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_proxy_view_refused_total",
			Help: "Requests (or their topics or partitions) refused because they name a view: produce to or changes of a virtual topic, share groups reading a view, a real topic under two names at odds in one commit or offset lookup.",
		}, []string{"api"}),
	}
	for _, c := range []prometheus.Collector{m.records, m.refused} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *viewMetrics) count(view string, c viewCounts) {
	if c.kept > 0 {
		m.records.WithLabelValues(view, "kept").Add(float64(c.kept))
	}
	if c.filtered > 0 {
		m.records.WithLabelValues(view, "filtered").Add(float64(c.filtered))
	}
	if c.errors > 0 {
		m.records.WithLabelValues(view, "error").Add(float64(c.errors))
	}
}
