package pipeline

// The HTTP sink (`sink: { http: { url, method, headers, timeout,
// max_in_flight, ca_file } }`): one request per output, its body the
// output's value. It is a sink behind the seam of writer.go and nothing
// more: a request is an output in flight until its answer, so a checkpoint
// waits for every 2xx before it, exactly as it waits for a topic's
// acknowledgements.
//
//   - Order: outputs of one task (one partition of the topic its segment
//     reads) are sent one after the other, each only once the one before
//     it was answered with a 2xx or given up as a dead letter; tasks send
//     side by side, at most max_in_flight requests at once in all.
//   - 5xx, 408, 429, a timeout or a broken connection: the same request is
//     sent again with backoff (100ms doubling to 5s), and the partition's
//     later outputs wait behind it. Offsets hold meanwhile.
//   - Any other 4xx (or a 3xx left after redirects): the endpoint refused the output itself. It becomes a
//     dead letter with reason "sink", its error the status line, and the
//     header rtproxy-http-status the code.
//   - Every request carries Idempotency-Key: route/topic/partition/offset/
//     index (outRecord.outputID). A replay after a crash sends the same
//     outputs with the same keys, so the endpoint can drop what it has.
//   - Secrets in headers are read once, at setup, from the file or
//     environment variable the rule file names (serde.Secret, the
//     registry's way; the rules allow-list confined which ones at load).

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/serde"
	"github.com/rtproxy/rtproxy/rules"
)

func init() { sinkKinds = append(sinkKinds, newHTTPSink) }

// HTTP headers of every request besides the configured ones.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderHTTPRoute      = "Rtproxy-Route"
	HeaderHTTPSource     = "Rtproxy-Source" // as rtproxy-source on a topic sink's outputs
	HeaderHTTPWindow     = "Rtproxy-Window" // as rtproxy-window
	HeaderHTTPKey        = "Rtproxy-Key"    // the output's key, percent-encoded
	// HeaderHTTPStatus is on the dead letter of an output the endpoint
	// refused: the status code, in decimal.
	HeaderHTTPStatus = "rtproxy-http-status"
)

// httpRetryMax bounds the backoff between attempts of one request.
const httpRetryMax = 5 * time.Second

type httpSink struct {
	r       *route
	spec    *rules.HTTPSink
	name    string // the `sink` label
	cl      *http.Client
	headers http.Header
	ctx     context.Context
	cancel  context.CancelFunc
	slots   chan struct{} // max_in_flight
	met     httpSinkMetrics

	mu    sync.Mutex
	lanes map[*task]*httpLane // under mu
	wg    sync.WaitGroup      // lane goroutines
}

// httpLane is one task's queue: its outputs in the order written; one
// goroutine sends them while it is not empty.
type httpLane struct {
	q []*outRecord
}

func newHTTPSink(r *route, snk *rules.Sink) (sink, bool, error) {
	spec := snk.HTTP
	if spec == nil {
		return nil, false, nil
	}
	s, err := buildHTTPSink(r, spec, sinkLabel(snk))
	return s, true, err
}

// buildHTTPSink builds the sink of spec; name is its `sink` label (http,
// or http-<branch> in a switch), the metrics' as the route's per-sink
// counters'.
func buildHTTPSink(r *route, spec *rules.HTTPSink, name string) (*httpSink, error) {
	if spec.URL == "" {
		return nil, errors.New("sink.http: no url")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	inFlight := max(spec.MaxInFlight, 1)
	tr.MaxIdleConnsPerHost = inFlight
	if spec.CAFile != "" {
		pem, err := os.ReadFile(spec.CAFile)
		if err != nil {
			return nil, fmt.Errorf("sink.http.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("sink.http.ca_file %s: no PEM certificate in it", spec.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	hs := http.Header{}
	hs.Set("Content-Type", "application/json")
	hs.Set("User-Agent", "rtproxy")
	for _, h := range spec.Headers {
		v := h.Value
		if h.File != "" || h.Env != "" {
			sec, err := serde.Secret(h.File, h.Env, os.LookupEnv)
			if err != nil {
				return nil, fmt.Errorf("sink.http.headers.%s: %w", h.Name, err)
			}
			v = h.Prefix + sec
		}
		hs.Set(h.Name, v)
	}
	timeout := spec.Timeout
	if timeout <= 0 {
		timeout = rules.DefaultHTTPTimeout
	}
	met := r.m.met.http
	s := &httpSink{r: r, spec: spec, name: name, headers: hs, slots: make(chan struct{}, inFlight),
		cl: &http.Client{Transport: tr, Timeout: timeout}, lanes: map[*task]*httpLane{},
		met: met.of(r.name, name)}
	s.ctx, s.cancel = context.WithCancel(r.out.ctx)
	return s, nil
}

func (s *httpSink) target() string { return s.spec.URL }

// put queues o on its task's lane, starting the lane's sender if idle.
func (s *httpSink) put(o *outRecord) {
	s.mu.Lock()
	l := s.lanes[o.t]
	if l == nil {
		l = &httpLane{}
		s.lanes[o.t] = l
		s.wg.Add(1)
		go s.drain(o.t, l)
	}
	l.q = append(l.q, o)
	s.mu.Unlock()
}

// drain sends a lane's outputs in order until it is empty.
func (s *httpSink) drain(t *task, l *httpLane) {
	defer s.wg.Done()
	for {
		s.mu.Lock()
		if len(l.q) == 0 {
			delete(s.lanes, t)
			s.mu.Unlock()
			return
		}
		o := l.q[0]
		l.q[0] = nil
		l.q = l.q[1:]
		s.mu.Unlock()
		s.deliver(o)
	}
}

// deliver sends o until it is answered with a 2xx (acknowledged) or
// refused (a dead letter), or the sink ends; then calls back, once.
func (s *httpSink) deliver(o *outRecord) {
	id := o.outputID(s.r.name)
	failed := false
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			s.met.retries.Inc()
			wait := min(100*time.Millisecond<<min(attempt-1, 6), httpRetryMax)
			select {
			case <-s.ctx.Done():
				o.w.cb(&o.kr, s.ctx.Err())
				return
			case <-time.After(wait):
			}
		}
		select {
		case s.slots <- struct{}{}:
		case <-s.ctx.Done():
			o.w.cb(&o.kr, s.ctx.Err())
			return
		}
		status, err := s.request(o, id)
		<-s.slots
		if s.ctx.Err() != nil {
			o.w.cb(&o.kr, s.ctx.Err())
			return
		}
		switch {
		case err == nil && status >= 200 && status < 300:
			if failed {
				s.r.sinkRecovered()
			}
			o.w.cb(&o.kr, nil)
			return
		case err == nil && status < 500 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests:
			// Refused for itself (4xx; or a 3xx left after redirects):
			// sending it again cannot succeed.
			o.w.cb(&o.kr, &httpRefusal{status: status, text: http.StatusText(status)})
			return
		}
		if err == nil {
			err = fmt.Errorf("HTTP %d %s", status, http.StatusText(status))
		}
		failed = true
		if o.w.to != nil {
			o.w.to.failed() // retried here, not through the write's callback
		}
		s.r.sinkError(fmt.Errorf("sink %s: %w; retrying, offsets hold", redactURL(s.spec.URL), err))
	}
}

// request sends one attempt of o; status is the answer's code.
func (s *httpSink) request(o *outRecord, id string) (int, error) {
	req, err := http.NewRequestWithContext(s.ctx, s.spec.Method, s.spec.URL, bytes.NewReader(o.kr.Value))
	if err != nil {
		return 0, err
	}
	for k, v := range s.headers {
		req.Header[k] = v
	}
	req.Header.Set(HeaderIdempotencyKey, id)
	req.Header.Set(HeaderHTTPRoute, s.r.name)
	for _, h := range o.kr.Headers {
		switch h.Key {
		case HeaderSource:
			req.Header.Set(HeaderHTTPSource, string(h.Value))
		case HeaderWindow:
			req.Header.Set(HeaderHTTPWindow, string(h.Value))
		}
	}
	if o.kr.Key != nil {
		req.Header.Set(HeaderHTTPKey, url.PathEscape(string(o.kr.Key)))
	}
	start := time.Now()
	resp, err := s.cl.Do(req)
	s.met.latency.Observe(time.Since(start).Seconds())
	if err != nil {
		class := "error"
		var ne interface{ Timeout() bool }
		if errors.As(err, &ne) && ne.Timeout() {
			class = "timeout"
		}
		s.met.requests.WithLabelValues(s.r.name, s.name, class).Inc()
		return 0, err
	}
	// Read (a bounded part of) the body, so the connection is reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	s.met.requests.WithLabelValues(s.r.name, s.name, strconv.Itoa(resp.StatusCode/100)+"xx").Inc()
	return resp.StatusCode, nil
}

// retry is never called: deliver retries itself and calls back only with
// an acknowledgement, a refusal or the sink's end.
func (s *httpSink) retry(*kgo.Record, func(*kgo.Record, error), error) bool { return false }

// send is the transport's: an HTTP sink takes outputs only (put).
func (s *httpSink) send(kr *kgo.Record, cb func(*kgo.Record, error)) {
	cb(kr, errors.New("sink.http takes outputs only"))
}

// close ends the lanes (what is unsent fails with the stop: abandoned) and
// waits for them.
func (s *httpSink) close() {
	s.cancel()
	s.wg.Wait()
	s.cl.CloseIdleConnections()
}

// httpRefusal is a 4xx answer: the output becomes a dead letter.
type httpRefusal struct {
	status int
	text   string
}

func (e *httpRefusal) Error() string { return fmt.Sprintf("HTTP %d %s", e.status, e.text) }
func (e *httpRefusal) Unwrap() error { return errRefused }
func (e *httpRefusal) deadLetterHeaders() []kgo.RecordHeader {
	return []kgo.RecordHeader{{Key: HeaderHTTPStatus, Value: strconv.AppendInt(nil, int64(e.status), 10)}}
}

func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return s
	}
	return u.Redacted()
}

// httpMetrics are the HTTP sinks' collectors, registered once per registry.
type httpMetrics struct {
	requests *prometheus.CounterVec   // route, sink, class: 2xx 3xx 4xx 5xx timeout error
	retries  *prometheus.CounterVec   // route, sink
	latency  *prometheus.HistogramVec // route, sink
}

// httpSinkMetrics are one sink's children (the route's sink, or a switch
// branch's: labelled as rtproxy_pipeline_sink_records_out_total is).
type httpSinkMetrics struct {
	requests *prometheus.CounterVec
	retries  prometheus.Counter
	latency  prometheus.Observer
}

func (m *httpMetrics) of(route, sink string) httpSinkMetrics {
	for _, c := range []string{"2xx", "4xx", "5xx", "timeout", "error"} {
		m.requests.WithLabelValues(route, sink, c) // zero series: alerts read 0, not "no data"
	}
	return httpSinkMetrics{requests: m.requests, retries: m.retries.WithLabelValues(route, sink),
		latency: m.latency.WithLabelValues(route, sink)}
}

// httpMetricsOn registers the collectors on reg, or finds them registered
// by an earlier route (one registry per Manager, many routes).
func httpMetricsOn(reg prometheus.Registerer) (*httpMetrics, error) {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_sink_http_requests_total", Help: "Requests of HTTP sinks, per sink (http, or http-<branch> in a switch), by answer class (2xx, 3xx, 4xx, 5xx) or timeout / error (no answer).",
		}, []string{"route", "sink", "class"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_sink_http_retries_total", Help: "Requests of HTTP sinks sent again after a 5xx, 408, 429, timeout or broken connection, per sink.",
		}, []string{"route", "sink"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rtproxy_sink_http_request_seconds", Help: "Time from sending an HTTP sink's request to its answer, per sink.",
			Buckets: latencyBuckets,
		}, []string{"route", "sink"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.requests, err = registerOnce(reg, m.requests); err != nil {
		return nil, err
	}
	if m.retries, err = registerOnce(reg, m.retries); err != nil {
		return nil, err
	}
	if m.latency, err = registerOnce(reg, m.latency); err != nil {
		return nil, err
	}
	return m, nil
}

// registerOnce registers c on reg, or returns the equal collector
// registered before.
func registerOnce[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if ex, ok := are.ExistingCollector.(T); ok {
			return ex, nil
		}
	}
	return c, err
}
