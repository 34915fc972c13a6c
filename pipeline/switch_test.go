package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/hamba/avro/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/rtproxy/rtproxy/internal/serde"

	"github.com/rtproxy/rtproxy/internal/testkit"
	"github.com/rtproxy/rtproxy/rules"
)

// payment is one input of the switch tests and where an independent
// reference routes it.
type payment struct {
	Amount   float64 `json:"amount"`
	Currency string  `json:"currency"`
	Account  string  `json:"account"`
}

// refRoute routes p by brute force, as the rule files of these tests
// say, written without the pipeline: the first branch that holds.
// "" is dropped.
func refRoute(p payment, branches []func(payment) bool, sinks []string) string {
	for i, b := range branches {
		if b(p) {
			return sinks[i]
		}
	}
	return ""
}

func randomPayments(seed int64, n int) []payment {
	rng := rand.New(rand.NewSource(seed))
	cur := []string{"EUR", "USD", "GBP", "EUR"}
	out := make([]payment, n)
	for i := range out {
		out[i] = payment{Amount: float64(rng.Intn(3000)) - 100, Currency: cur[rng.Intn(len(cur))], Account: fmt.Sprint("a", rng.Intn(9))}
	}
	return out
}

// A switch to two topics and an HTTP endpoint, at least once: each record
// lands in exactly the sink an independent reference routes it to (read
// back with a real client, and from the endpoint's log), with its
// branch's key; a record the endpoint refuses becomes a dead letter; the
// per-sink metrics and /routes count each sink.
func TestSwitchSinksAtLeastOnce(t *testing.T) {
	srv := testkit.StartHTTPSinkServer(t, false)
	b := startBroker(t, map[string]int{"sw": 3})
	def := loadHTTPRoute(t, fmt.Sprintf(`
route: sw
source: { topic: sw }
checkpoint_interval: 200ms
steps:
  - filter: value.amount >= 0
  - switch:
      - when: value.amount > 1000
        sink: { topic: sw.large, key: value.account }
      - when: value.currency != "EUR"
        sink: { http: { url: %s/foreign } }
      - sink: { topic: sw.rest }
`, srv.URL), &rules.Allow{URLs: []string{srv.URL}})
	srv.Control(t, map[string]any{"refuse": `"poison"`, "refuse_status": 422})

	pays := randomPayments(1, 150)
	pays[7] = payment{Amount: 5, Currency: "USD", Account: "poison"} // refused by the endpoint
	branches := []func(payment) bool{
		func(p payment) bool { return p.Amount > 1000 },
		func(p payment) bool { return p.Currency != "EUR" },
		func(payment) bool { return true },
	}
	sinks := []string{"sw.large", "http-2", "sw.rest"}
	want := map[string]map[string]payment{} // sink -> source ref -> input
	var rs []*kgo.Record
	for i, p := range pays {
		r := jsonRecord("sw", fmt.Sprint("k", i), p)
		r.Partition = int32(i % 3)
		rs = append(rs, r)
	}
	cl := b.client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	dropped := 0
	for i, p := range pays {
		if p.Amount < 0 {
			dropped++
			continue
		}
		s := refRoute(p, branches, sinks)
		if want[s] == nil {
			want[s] = map[string]payment{}
		}
		if i != 7 {
			want[s][srcRef(rs[i])] = p
		}
	}
	reg := prometheus.NewRegistry()
	m, _ := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), Registerer: reg}, def)

	for _, topic := range []string{"sw.large", "sw.rest"} {
		out := b.consume(t, topic, len(want[topic]), 30*time.Second, 500*time.Millisecond)
		got := map[string]bool{}
		for _, r := range out {
			ref := header(r, HeaderSource)
			p, ok := want[topic][ref]
			if !ok {
				t.Errorf("%s holds %s (from %s), which the reference routes elsewhere", topic, r.Value, ref)
				continue
			}
			if got[ref] {
				t.Errorf("%s holds %s twice", topic, ref)
			}
			got[ref] = true
			var v payment
			if err := json.Unmarshal(r.Value, &v); err != nil || v != p {
				t.Errorf("%s: %s is %s, want %+v", topic, ref, r.Value, p)
			}
			if topic == "sw.large" && string(r.Key) != p.Account {
				t.Errorf("sw.large: key %q, want the account %q (the branch's sink.key)", r.Key, p.Account)
			}
			if topic == "sw.rest" && !strings.HasPrefix(string(r.Key), "k") {
				t.Errorf("sw.rest: key %q, want the source key", r.Key)
			}
		}
		if len(got) != len(want[topic]) {
			t.Errorf("%s: %d records, want %d", topic, len(got), len(want[topic]))
		}
	}
	var acked []testkit.HTTPSinkRequest
	waitFor(t, 30*time.Second, "the endpoint acknowledged its branch's records", func() bool {
		acked = testkit.Acked(srv.Requests(t))
		return len(acked) >= len(want["http-2"])
	})
	for _, r := range acked {
		ref := r.Headers["Rtproxy-Source"]
		if _, ok := want["http-2"][ref]; !ok {
			t.Errorf("the endpoint got %s (from %s), which the reference routes elsewhere", r.Body, ref)
		}
	}
	dls := b.consume(t, "sw.dlq", 1, 20*time.Second, 300*time.Millisecond)
	if len(dls) != 1 || header(dls[0], HeaderReason) != "sink" || header(dls[0], HeaderTarget) != srv.URL+"/foreign" {
		t.Fatalf("dead letters %v, want the refused one with reason sink", dls)
	}
	waitFor(t, 10*time.Second, "per-sink metrics", func() bool {
		for _, s := range sinks {
			if gatheredLabels(t, reg, "rtproxy_pipeline_sink_records_out_total", map[string]string{"route": "sw", "sink": s}) != float64(len(want[s])) {
				return false
			}
		}
		return true
	})
	if e := gatheredLabels(t, reg, "rtproxy_pipeline_sink_output_errors_total", map[string]string{"sink": "http-2"}); e != 1 {
		t.Errorf("http-2 output errors = %v, want 1 (the refused output)", e)
	}
	if d := gatheredLabels(t, reg, "rtproxy_pipeline_records_dropped_total", map[string]string{"step": "0:filter"}); d != float64(dropped) {
		t.Errorf("dropped by the filter = %v, want %d", d, dropped)
	}
	st := m.Routes()
	if len(st) != 1 || len(st[0].Sinks) != 3 {
		t.Fatalf("/routes: %+v", st)
	}
	for i, s := range st[0].Sinks {
		if s.Name != sinks[i] || s.Out != int64(len(want[sinks[i]])) {
			t.Errorf("/routes sink %d: %+v, want %s with %d out", i, s, sinks[i], len(want[sinks[i]]))
		}
	}
	if !strings.Contains(st[0].Sink, "sw.large") || !strings.Contains(st[0].Sink, "sw.rest") {
		t.Errorf("/routes sink %q does not name the sinks", st[0].Sink)
	}
}

// gatheredLabels sums the counters of name whose labels include want.
func gatheredLabels(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	sum := 0.0
	for _, m := range gatheredMatching(t, reg, name, want) {
		sum += m.GetCounter().GetValue()
	}
	return sum
}

// gatheredMatching is the series of name whose labels include want.
func gatheredMatching(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) []*dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []*dto.Metric
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue metric
				}
			}
			out = append(out, m)
		}
	}
	return out
}

// A switch to three topics, exactly once, through injected aborts and a
// restart: a read_committed reader of each sink sees each record the
// reference routes there exactly once, and nothing else; a record no
// branch takes (no default branch here) is dropped and counted.
func TestSwitchSinksExactlyOnce(t *testing.T) {
	b := startBroker(t, map[string]int{"swe": 3})
	def := loadHTTPRoute(t, `
route: swe
source: { topic: swe }
sink: { delivery: exactly_once }
checkpoint_interval: 100ms
steps:
  - switch:
      - when: value.amount > 1000
        sink: { topic: swe.large, key: value.account }
      - when: value.currency == "USD"
        sink: { topic: swe.usd }
      - when: value.amount >= 0
        sink: { topic: swe.rest }
`, nil)
	var commits, injected atomic.Int64
	txnTestHook = func(string) error {
		if commits.Add(1)%3 == 0 {
			injected.Add(1)
			return fmt.Errorf("test: injected abort")
		}
		return nil
	}
	t.Cleanup(func() { txnTestHook = nil })

	pays := randomPayments(2, 300)
	branches := []func(payment) bool{
		func(p payment) bool { return p.Amount > 1000 },
		func(p payment) bool { return p.Currency == "USD" },
		func(p payment) bool { return p.Amount >= 0 },
	}
	sinks := []string{"swe.large", "swe.usd", "swe.rest"}
	want := map[string]map[string]payment{}
	var rs []*kgo.Record
	dropped := 0
	for i, p := range pays {
		r := jsonRecord("swe", fmt.Sprint("k", i), p)
		r.Partition = int32(i % 3)
		rs = append(rs, r)
	}
	cl := b.client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	produce := func(rs []*kgo.Record) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	_, stop := runManagerWith(t, Config{Seeds: b.addrs, StateDir: dir, Registerer: reg}, def)
	for i := 0; i < 150; i += 30 {
		produce(rs[i : i+30])
		time.Sleep(120 * time.Millisecond)
	}
	stop()
	reg2 := prometheus.NewRegistry()
	_, stop = runManagerWith(t, Config{Seeds: b.addrs, StateDir: dir, Registerer: reg2}, def)
	defer stop()
	for i := 150; i < len(rs); i += 30 {
		produce(rs[i : i+30])
		time.Sleep(120 * time.Millisecond)
	}
	for i, p := range pays {
		s := refRoute(p, branches, sinks)
		if s == "" {
			dropped++
			continue
		}
		if want[s] == nil {
			want[s] = map[string]payment{}
		}
		want[s][srcRef(rs[i])] = p
	}
	if dropped == 0 {
		t.Fatal("the inputs drop nothing; the test would not see drops")
	}
	for _, topic := range sinks {
		out := b.consumeCommitted(t, topic, len(want[topic]), 60*time.Second, time.Second)
		got := map[string]int{}
		for _, r := range out {
			ref := header(r, HeaderSource)
			got[ref]++
			if p, ok := want[topic][ref]; !ok {
				t.Errorf("%s holds %s (from %s), which the reference routes elsewhere", topic, r.Value, ref)
			} else if topic == "swe.large" && string(r.Key) != p.Account {
				t.Errorf("swe.large: key %q, want %q", r.Key, p.Account)
			}
		}
		for ref, n := range got {
			if n != 1 {
				t.Errorf("%s holds %s %d times; exactly once means once", topic, ref, n)
			}
		}
		if len(got) != len(want[topic]) {
			t.Errorf("%s: %d records, want %d", topic, len(got), len(want[topic]))
		}
	}
	// Aborts replay records, and their drops count again: at least once.
	sw := map[string]string{"route": "swe", "step": "0:switch"}
	if d := gatheredLabels(t, reg, "rtproxy_pipeline_records_dropped_total", sw) + gatheredLabels(t, reg2, "rtproxy_pipeline_records_dropped_total", sw); d < float64(dropped) {
		t.Errorf("records no branch took, counted: %v, want at least %d", d, dropped)
	}
	if injected.Load() < 2 {
		t.Errorf("only %d aborts injected; the test did not exercise them", injected.Load())
	}
	t.Logf("%d large, %d usd, %d rest, %d dropped, %d aborts", len(want["swe.large"]), len(want["swe.usd"]), len(want["swe.rest"]), dropped, injected.Load())
}

// A switch whose branches write JSON and Avro (through the registry,
// schema registered by the route): each branch's values are in its own
// format, decoded back by the schema the registry holds for its subject.
func TestSwitchAvroBranch(t *testing.T) {
	b := startBroker(t, map[string]int{"swa": 2})
	reg := testkit.StartRegistry(t, "")
	dir := t.TempDir()
	const avsc = `{"type":"record","name":"P","fields":[{"name":"amount","type":"double"},{"name":"account","type":"string"}]}`
	if err := os.WriteFile(filepath.Join(dir, "p.avsc"), []byte(avsc), 0o644); err != nil {
		t.Fatal(err)
	}
	def := writeRule(t, dir, "swa.yaml", `route: swa
source: { topic: swa }
steps:
  - map: { amount: value.amount, account: value.account }
  - switch:
      - when: value.amount > 1000
        sink: { topic: swa.large }
      - sink: { topic: swa.rest, format: avro, schema: p.avsc }
`)
	pays := randomPayments(3, 40)
	var rs []*kgo.Record
	nLarge := 0
	for i, p := range pays {
		rs = append(rs, jsonRecord("swa", fmt.Sprint("k", i), p))
		if p.Amount > 1000 {
			nLarge++
		}
	}
	b.produce(t, rs...)
	runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), SchemaRegistry: serde.Config{URL: reg.URL, Timeout: 2 * time.Second}}, def)
	large := b.consume(t, "swa.large", nLarge, 20*time.Second, 300*time.Millisecond)
	rest := b.consume(t, "swa.rest", len(pays)-nLarge, 20*time.Second, 300*time.Millisecond)
	if len(large) != nLarge || len(rest) != len(pays)-nLarge {
		t.Fatalf("large %d (want %d), rest %d (want %d)", len(large), nLarge, len(rest), len(pays)-nLarge)
	}
	for _, r := range large {
		if !json.Valid(r.Value) {
			t.Errorf("swa.large: %q is not JSON", r.Value)
		}
	}
	srcl, err := sr.NewClient(sr.URLs(reg.URL))
	if err != nil {
		t.Fatal(err)
	}
	ss, err := srcl.SchemaByVersion(context.Background(), "swa.rest-value", -1)
	if err != nil {
		t.Fatal(err)
	}
	var s sr.Serde
	sch := avro.MustParse(avsc)
	type p struct {
		Amount  float64 `avro:"amount"`
		Account string  `avro:"account"`
	}
	s.Register(ss.ID, p{}, sr.DecodeFn(func(b []byte, v any) error { return avro.Unmarshal(sch, b, v) }))
	for _, r := range rest {
		var v p
		if err := s.Decode(r.Value, &v); err != nil {
			t.Fatalf("swa.rest: %v", err)
		}
		if v.Amount > 1000 || v.Account == "" {
			t.Errorf("swa.rest holds %+v", v)
		}
	}
}

// A switch's checkpoints wait on every sink: while its HTTP branch's
// endpoint answers 500, records of its topic branch are written, but the
// group's offsets do not pass the first unacknowledged request; once the
// endpoint recovers, every record is committed and the topic branch holds
// each of its records once.
func TestSwitchCheckpointWaitsOnEverySink(t *testing.T) {
	srv := testkit.StartHTTPSinkServer(t, false)
	b := startBroker(t, map[string]int{"swc": 1})
	def := loadHTTPRoute(t, fmt.Sprintf(`
route: swc
source: { topic: swc }
checkpoint_interval: 100ms
steps:
  - switch:
      - when: int(value.n) %% 2 == 0
        sink: { topic: swc.even }
      - sink: { http: { url: %s/odd } }
`, srv.URL), &rules.Allow{URLs: []string{srv.URL}})
	m, stop := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), StopTimeout: 2 * time.Second}, def)
	defer stop()
	adm := kadm.NewClient(b.client(t))
	committed := func() int64 {
		offs, err := adm.FetchOffsets(context.Background(), def.GroupID())
		if err != nil {
			return -1
		}
		sum := int64(0)
		offs.Each(func(o kadm.OffsetResponse) {
			if o.Err == nil && o.At > 0 {
				sum += o.At
			}
		})
		return sum
	}
	b.produce(t, jsonRecord("swc", "k0", map[string]any{"n": 0}), jsonRecord("swc", "k1", map[string]any{"n": 1}))
	waitFor(t, 30*time.Second, "the first records committed", func() bool { return committed() == 2 })

	srv.Control(t, map[string]any{"down": true})
	for i := 2; i < 12; i++ {
		b.produce(t, jsonRecord("swc", fmt.Sprint("k", i), map[string]any{"n": i}))
	}
	// The even records reach their topic while the odd ones wait.
	even := b.consume(t, "swc.even", 6, 30*time.Second, 300*time.Millisecond)
	if len(even) != 6 {
		t.Fatalf("swc.even holds %d records, want 6 (n = 0, 2, ..., 10)", len(even))
	}
	time.Sleep(time.Second) // ten checkpoint intervals
	// Offset 3 is the first odd record after the endpoint went down: a
	// commit never passes it (2 or 3, as the cuts fell).
	if got := committed(); got < 2 || got > 3 {
		t.Fatalf("committed offsets sum to %d while the HTTP branch is down; want at most 3 (not past its first unacknowledged request)", got)
	}
	srv.Control(t, map[string]any{"down": false})
	waitFor(t, 30*time.Second, "every record committed once the endpoint recovers", func() bool { return committed() == 12 })
	acked := map[string]bool{}
	for _, r := range testkit.Acked(srv.Requests(t)) {
		acked[r.Headers["Rtproxy-Source"]] = true
	}
	if len(acked) != 6 {
		t.Errorf("the endpoint acknowledged %d distinct odd records, want 6", len(acked))
	}
	if st := m.Routes(); len(st) != 1 || len(st[0].Sinks) != 2 || st[0].Sinks[0].Out != 6 || st[0].Sinks[1].Out != 6 || st[0].Sinks[1].Errors < 1 {
		t.Errorf("/routes sinks: %+v, want 6 even and 6 odd acknowledged, the odd ones' failures counted", st)
	}
	if even = b.consume(t, "swc.even", 6, 10*time.Second, 500*time.Millisecond); len(even) != 6 {
		t.Errorf("swc.even holds %d records after recovery, want 6 (at least once, and no replay here)", len(even))
	}
}

// TestSwitchHTTPSinkMetricsPerBranch: a switch with two HTTP branches; the
// HTTP sink's request metrics are per sink, labelled as
// rtproxy_pipeline_sink_records_out_total is (http-<branch>): the
// requests and answers of each endpoint, its retries and its latencies,
// apart from the other's.
func TestSwitchHTTPSinkMetricsPerBranch(t *testing.T) {
	var nA, nB atomic.Int64
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { nA.Add(1) }))
	defer a.Close()
	// B answers its first three requests 503 (retried), then 200.
	bsrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if nB.Add(1) <= 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer bsrv.Close()
	b := startBroker(t, map[string]int{"swh": 2})
	def := loadHTTPRoute(t, fmt.Sprintf(`
route: swh
source: { topic: swh }
checkpoint_interval: 200ms
steps:
  - switch:
      - when: value.amount > 1000
        sink: { http: { url: %s/large } }
      - sink: { http: { url: %s/rest } }
`, a.URL, bsrv.URL), &rules.Allow{URLs: []string{a.URL, bsrv.URL}})
	const large, rest = 20, 15
	var rs []*kgo.Record
	for i := range large + rest {
		amount := 5
		if i < large {
			amount = 5000
		}
		r := jsonRecord("swh", fmt.Sprint("k", i), map[string]any{"amount": amount})
		r.Partition = int32(i % 2)
		rs = append(rs, r)
	}
	b.produce(t, rs...)
	reg := prometheus.NewRegistry()
	runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), Registerer: reg}, def)
	waitFor(t, 30*time.Second, "every output acknowledged by its endpoint", func() bool {
		return gatheredLabels(t, reg, "rtproxy_pipeline_sink_records_out_total", map[string]string{"route": "swh"}) >= large+rest
	})
	for _, c := range []struct {
		name, sink, class string
		want              float64
	}{
		{"rtproxy_sink_http_requests_total", "http-1", "2xx", large},
		{"rtproxy_sink_http_requests_total", "http-1", "5xx", 0},
		{"rtproxy_sink_http_requests_total", "http-2", "2xx", rest},
		{"rtproxy_sink_http_requests_total", "http-2", "5xx", 3},
		{"rtproxy_sink_http_retries_total", "http-1", "", 0},
		{"rtproxy_sink_http_retries_total", "http-2", "", 3},
		{"rtproxy_pipeline_sink_records_out_total", "http-1", "", large},
		{"rtproxy_pipeline_sink_records_out_total", "http-2", "", rest},
	} {
		l := map[string]string{"route": "swh", "sink": c.sink}
		if c.class != "" {
			l["class"] = c.class
		}
		if got := gatheredLabels(t, reg, c.name, l); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, l, got, c.want)
		}
	}
	// Each request's latency under its sink: B's 18 attempts, A's 20.
	for sink, want := range map[string]uint64{"http-1": large, "http-2": rest + 3} {
		if got := histogramCount(t, reg, "rtproxy_sink_http_request_seconds", map[string]string{"route": "swh", "sink": sink}); got != want {
			t.Errorf("rtproxy_sink_http_request_seconds{sink=%q} counts %d requests, want %d", sink, got, want)
		}
	}
	if nA.Load() != large || nB.Load() != rest+3 {
		t.Errorf("endpoints got %d and %d requests, want %d and %d", nA.Load(), nB.Load(), large, rest+3)
	}
}

// histogramCount sums the sample counts of the histograms of name whose
// labels include want.
func histogramCount(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) uint64 {
	t.Helper()
	var n uint64
	for _, m := range gatheredMatching(t, reg, name, want) {
		n += m.GetHistogram().GetSampleCount()
	}
	return n
}
