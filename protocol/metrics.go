package protocol

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// metrics are the proxy's collectors. Children for every API key are
// resolved once at construction so that the per-request cost is an atomic
// add, not a label lookup.
type metrics struct {
	connsOpen  prometheus.Gauge
	connsTotal prometheus.Counter
	// connsRefused counts connections closed at accept (MaxConnections).
	connsRefused prometheus.Counter
	// acceptErrors counts failed accepts (out of descriptors, ...).
	acceptErrors *prometheus.CounterVec
	bytesC2B     prometheus.Counter
	bytesB2C     prometheus.Counter
	frameErrors  *prometheus.CounterVec
	panics       prometheus.Counter
	heldBytes    prometheus.Gauge
	heldWaits    prometheus.Counter
	// Decode budgets (decode.go).
	decodedBytes  prometheus.Gauge
	decodedWaits  prometheus.Counter
	decodeLimited *prometheus.CounterVec
	// endpointsPadded counts node endpoints of streamed Fetch responses
	// rewritten in place with padding (stream.go).
	endpointsPadded prometheus.Counter

	reqs *prometheus.CounterVec
	errs *prometheus.CounterVec
	lat  *prometheus.HistogramVec
	// apis caches the children per API key (last slot: unknown keys). They
	// are resolved on first use so that /metrics lists only APIs seen.
	apis [maxKnownKey + 2]atomic.Pointer[apiMetrics]
}

type apiMetrics struct {
	requests prometheus.Counter
	errors   prometheus.Counter
	latency  prometheus.Observer
}

func (m *metrics) api(k int16) *apiMetrics {
	s := keySlot(k)
	if a := m.apis[s].Load(); a != nil {
		return a
	}
	l := apiLabel(s)
	a := &apiMetrics{
		requests: m.reqs.WithLabelValues(l),
		errors:   m.errs.WithLabelValues(l),
		latency:  m.lat.WithLabelValues(l),
	}
	m.apis[s].Store(a)
	return a
}

func apiLabel(k int) string {
	if k > maxKnownKey {
		return "unknown"
	}
	if n := kmsg.NameForKey(int16(k)); n != "" && n != "Unknown" {
		return n
	}
	return "unknown"
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		connsOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rtproxy_proxy_connections_open", Help: "Client connections currently open through the proxy.",
		}),
		connsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtproxy_proxy_connections_total", Help: "Client connections accepted since start.",
		}),
		connsRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtproxy_proxy_connections_refused_total", Help: "Client connections closed at accept because max_connections were open.",
		}),
		acceptErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_proxy_accept_errors_total", Help: "Accepts that failed on a client listener, by reason (out_of_descriptors: EMFILE or ENFILE; other); each is retried after a backoff of up to a second.",
		}, []string{"reason"}),
		frameErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_proxy_frame_errors_total", Help: "Client connections closed for a malformed frame, by reason.",
		}, []string{"reason"}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtproxy_proxy_panics_total", Help: "Client connections closed because the proxy's own code panicked while serving them (a bug: the process and the other connections go on; the log has the stack).",
		}),
		heldBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rtproxy_proxy_held_bytes", Help: "Bytes of frames held whole in memory to be rewritten, all connections together (bounded by proxy.max_held_bytes).",
		}),
		endpointsPadded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtproxy_proxy_endpoints_padded_total", Help: "KIP-951 node endpoints of streamed Fetch responses rewritten in place, padded with an unknown tagged field to keep the frame's length.",
		}),
		heldWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtproxy_proxy_held_waits_total", Help: "Frames that waited for proxy.max_held_bytes to be read whole.",
		}),
		decodedBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rtproxy_proxy_decoded_bytes", Help: "What the decodes of guarded and tapped produce requests in progress hold, decompressed and decoded, all connections together (bounded by proxy.max_decoded_bytes_total).",
		}),
		decodedWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtproxy_proxy_decoded_waits_total", Help: "Partitions of guarded produce requests whose decode waited for room under proxy.max_decoded_bytes_total.",
		}),
		decodeLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_proxy_decode_limited_total",
			Help: "Produce requests over a decode budget, by path (guard: refused with MESSAGE_TOO_LARGE; tap: left to the fetch) and bound (bytes: proxy.max_decoded_bytes, records: proxy.max_records_per_request, total: no room under proxy.max_decoded_bytes_total, tap only).",
		}, []string{"path", "bound"}),
	}
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rtproxy_proxy_bytes_total", Help: "Bytes forwarded, by direction.",
	}, []string{"direction"})
	m.bytesC2B = bytes.WithLabelValues("client_to_broker")
	m.bytesB2C = bytes.WithLabelValues("broker_to_client")
	reqs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rtproxy_proxy_requests_total", Help: "Requests forwarded, by API.",
	}, []string{"api"})
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rtproxy_proxy_request_errors_total",
		Help: "Requests that got no response through the proxy (upstream failed, connection closed with the request in flight, or the response could not be rewritten), by API.",
	}, []string{"api"})
	lat := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rtproxy_proxy_upstream_latency_seconds",
		Help:    "Time from forwarding a request upstream to receiving its response, by API.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2.5, 14),
	}, []string{"api"})
	m.reqs, m.errs, m.lat = reqs, errs, lat
	for _, c := range []prometheus.Collector{m.connsOpen, m.connsTotal, m.connsRefused, m.acceptErrors, m.frameErrors, m.panics, m.heldBytes, m.heldWaits, m.decodedBytes, m.decodedWaits, m.decodeLimited, m.endpointsPadded, bytes, reqs, errs, lat} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func keySlot(k int16) int {
	if k < 0 || int(k) > maxKnownKey {
		return maxKnownKey + 1
	}
	return int(k)
}
