package pipeline

// What each route costs, on /metrics: the memory held for it (its keyed
// state not yet committed, and the records its group client holds fetched
// or waiting to be produced), besides rtproxy_route_busy_seconds_total
// (metrics.go) for its processing time. Read at scrape time, so a route at
// rest costs no timer for them. The state store's shared memory (block
// cache, memtables) is the instance's, not a route's.
//
// The route's goroutines also carry the pprof label route=<name> (start),
// as do its group client's: `go tool pprof -tagfocus route=NAME` on a CPU
// profile shows one route's share; the shared client's goroutines carry
// pipeline=shared.

import (
	"github.com/prometheus/client_golang/prometheus"
)

// costCollector reports routeMemory and stateMemory.
type costCollector struct {
	m           *Manager
	routeMemory *prometheus.Desc
	stateMemory *prometheus.Desc
}

func newCostCollector(m *Manager) *costCollector {
	return &costCollector{m: m,
		routeMemory: prometheus.NewDesc("rtproxy_route_memory_bytes",
			"Memory held for one route, by part: state_uncommitted (keyed-state writes kept in memory until a checkpoint commits them), fetch_buffered (records its group client fetched and the route has not taken yet), produce_buffered (outputs, dead letters and repartition records waiting in its producer).",
			[]string{"route", "part"}, nil),
		stateMemory: prometheus.NewDesc("rtproxy_state_memory_bytes",
			"Memory the state store (pebble) holds for every route together, by part: block_cache, memtables.",
			[]string{"part"}, nil),
	}
}

func (c *costCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.routeMemory
	ch <- c.stateMemory
}

func (c *costCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	db := m.store() // nil while no route has opened it: nothing held
	m.mu.Lock()
	rs := make([]*route, 0, len(m.mu.routes))
	for _, r := range m.mu.routes {
		rs = append(rs, r)
	}
	m.mu.Unlock()
	for _, r := range rs {
		if !r.ready.Load() || db == nil {
			continue
		}
		var fetched, produce int64
		if cl := r.cl; cl != nil {
			fetched, produce = cl.BufferedFetchBytes(), cl.BufferedProduceBytes()
		}
		ch <- prometheus.MustNewConstMetric(c.routeMemory, prometheus.GaugeValue, float64(db.PendingBytes(r.name)), r.name, "state_uncommitted")
		ch <- prometheus.MustNewConstMetric(c.routeMemory, prometheus.GaugeValue, float64(fetched), r.name, "fetch_buffered")
		ch <- prometheus.MustNewConstMetric(c.routeMemory, prometheus.GaugeValue, float64(produce), r.name, "produce_buffered")
	}
	var cache, mem int64
	if db != nil {
		cache, mem = db.Memory()
	}
	ch <- prometheus.MustNewConstMetric(c.stateMemory, prometheus.GaugeValue, float64(cache), "block_cache")
	ch <- prometheus.MustNewConstMetric(c.stateMemory, prometheus.GaugeValue, float64(mem), "memtables")
}
