package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/rtproxy/rtproxy/internal/testkit"
	"github.com/rtproxy/rtproxy/rules"
)

// loadHTTPRoute writes yaml as a rule file and loads it under the proxy's
// allow-list allow (rules.allow).
func loadHTTPRoute(t *testing.T, yaml string, allow *rules.Allow) *rules.Route {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, "r.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	def, err := rules.LoadFileWith(p, rules.Options{Allow: allow})
	if err != nil {
		t.Fatal(err)
	}
	return def
}

// parseOutputID splits an Idempotency-Key route/topic/partition/offset/index.
func parseOutputID(t *testing.T, k string) (route, topic string, part int32, off int64, idx int) {
	t.Helper()
	f := strings.Split(k, "/")
	if len(f) != 5 {
		t.Fatalf("Idempotency-Key %q is not route/topic/partition/offset/index", k)
	}
	p, err1 := strconv.Atoi(f[2])
	o, err2 := strconv.ParseInt(f[3], 10, 64)
	i, err3 := strconv.Atoi(f[4])
	if err1 != nil || err2 != nil || err3 != nil {
		t.Fatalf("Idempotency-Key %q: bad number", k)
	}
	return f[0], f[1], int32(p), o, i
}

// checkHTTPOrder holds that each partition's requests arrive in offset
// order, a retry repeating the request before it and nothing overtaking,
// and that a key always carries the same body.
func checkHTTPOrder(t *testing.T, reqs []testkit.HTTPSinkRequest) {
	t.Helper()
	last := map[string]string{} // partition → last key
	lastOff := map[string][2]int64{}
	body := map[string]string{}
	for _, r := range reqs {
		_, topic, p, o, idx := parseOutputID(t, r.Key)
		off := [2]int64{o, int64(idx)}
		part := fmt.Sprintf("%s/%d", topic, p)
		if b, ok := body[r.Key]; ok && b != r.Body {
			t.Errorf("key %s carried %s, then %s", r.Key, b, r.Body)
		}
		body[r.Key] = r.Body
		if prev, ok := last[part]; ok && r.Key != prev && (off[0] < lastOff[part][0] || off == lastOff[part] || (off[0] == lastOff[part][0] && off[1] < lastOff[part][1])) {
			t.Errorf("partition %s: %s arrived after %s", part, r.Key, prev)
		}
		last[part], lastOff[part] = r.Key, off
	}
}

// An HTTP sink over TLS (ca_file) against a real server in its own
// process that answers 500s, answers too slowly, resets connections and
// refuses one body with 422: every record is acknowledged at least once,
// in order per partition, each repeat under the key its first send
// carried; the refused one is a dead letter with reason sink and its
// status; the secret header comes from the environment; the metrics count
// what happened.
func TestHTTPSinkFaults(t *testing.T) {
	srv := testkit.StartHTTPSinkServer(t, true)
	b := startBroker(t, map[string]int{"hs": 3})
	t.Setenv("HS_TOKEN", "s3cret")
	def := loadHTTPRoute(t, fmt.Sprintf(`
route: hs
source: { topic: hs }
sink:
  http:
    url: %s/events
    timeout: 300ms
    max_in_flight: 2
    ca_file: %s
    headers:
      X-Tenant: acme
      Authorization: { env: HS_TOKEN, prefix: "Bearer " }
checkpoint_interval: 200ms
steps:
  - set: { seen: true }
`, srv.URL, srv.CAFile), &rules.Allow{URLs: []string{srv.URL}, EnvNames: []string{"HS_TOKEN"}, Files: []string{srv.CAFile}})
	srv.Control(t, map[string]any{"fail": 4, "fail_status": 503, "slow": 2, "delay": "1s", "reset": 2,
		"refuse": `"poison"`, "refuse_status": 422})

	reg := prometheus.NewRegistry()
	m, err := New(testConfig(Config{Seeds: b.addrs, StateDir: t.TempDir(), Registerer: reg, StopTimeout: 5 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	m.Apply([]*rules.Route{def})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() { cancel(); <-done }()

	const n = 60
	want := map[string]bool{} // source refs of records that must be acknowledged
	poisonRef := ""
	for i := 0; i < n; i++ {
		v := map[string]any{"n": i}
		if i == 17 {
			v["kind"] = "poison"
		}
		r := jsonRecord("hs", fmt.Sprint(i%7), v)
		b.produce(t, r)
		if i == 17 {
			poisonRef = srcRef(r)
		} else {
			want[srcRef(r)] = true
		}
	}
	var reqs []testkit.HTTPSinkRequest
	waitFor(t, 60*time.Second, "every record acknowledged by the endpoint", func() bool {
		reqs = srv.Requests(t)
		got := map[string]bool{}
		for _, r := range testkit.Acked(reqs) {
			got[r.Headers["Rtproxy-Source"]] = true
		}
		for ref := range want {
			if !got[ref] {
				return false
			}
		}
		return true
	})
	checkHTTPOrder(t, reqs)
	statuses := map[int]int{}
	for _, r := range reqs {
		statuses[r.Status]++
		if r.Headers["Authorization"] != "Bearer s3cret" || r.Headers["X-Tenant"] != "acme" {
			t.Fatalf("request headers %v: want the configured ones", r.Headers)
		}
		if r.Method != "POST" || r.Path != "/events" || r.Headers["Content-Type"] != "application/json" {
			t.Fatalf("request %v", r)
		}
		route, topic, _, _, _ := parseOutputID(t, r.Key)
		if route != "hs" || topic != "hs" {
			t.Fatalf("key %q: want route hs, topic hs", r.Key)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(r.Body), &v); err != nil || v["seen"] != true {
			t.Fatalf("body %q: want the set step's output", r.Body)
		}
	}
	if statuses[503] != 4 || statuses[0] != 2 || statuses[422] != 1 {
		t.Errorf("answers %v: want 4×503, 2 resets, 1×422", statuses)
	}
	// The refused record: a dead letter, reason sink, with the status.
	dl := b.consume(t, "hs.dlq", 1, 20*time.Second, 200*time.Millisecond)
	if len(dl) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dl))
	}
	if header(dl[0], HeaderReason) != reasonSink || header(dl[0], HeaderHTTPStatus) != "422" ||
		header(dl[0], HeaderTarget) != srv.URL+"/events" || header(dl[0], HeaderSource) != poisonRef ||
		!strings.Contains(header(dl[0], HeaderError), "422") {
		t.Errorf("dead letter headers %v", dl[0].Headers)
	}
	for name, min := range map[string]float64{
		"rtproxy_sink_http_retries_total":     6, // 4×503, 2 resets (timeouts retry too)
		"rtproxy_sink_http_requests_total":    float64(n + 6),
		"rtproxy_pipeline_dead_letters_total": 1,
	} {
		if got := gathered(t, reg, name); got < min {
			t.Errorf("%s = %v, want at least %v", name, got, min)
		}
	}
	if got := gatheredLabel(t, reg, "rtproxy_sink_http_requests_total", "class", "timeout"); got < 2 {
		t.Errorf("timeouts counted %v, want at least 2 (two slow answers)", got)
	}
	if got := gatheredLabel(t, reg, "rtproxy_sink_http_requests_total", "class", "4xx"); got != 1 {
		t.Errorf("4xx counted %v, want 1", got)
	}
}

// gatheredLabel sums the series of a metric family with label=value.
func gatheredLabel(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

// While the endpoint answers 500, checkpoints keep being taken but the
// group's offsets never move past an unacknowledged request; once it
// answers 2xx again, every record is delivered and the offsets reach the
// end.
func TestHTTPSinkCheckpointWaitsForAcks(t *testing.T) {
	srv := testkit.StartHTTPSinkServer(t, false)
	b := startBroker(t, map[string]int{"hw": 2})
	def := loadHTTPRoute(t, fmt.Sprintf(`
route: hw
source: { topic: hw }
sink: { http: { url: %s/in, method: PUT } }
checkpoint_interval: 100ms
steps:
  - filter: value.n >= 0
`, srv.URL), &rules.Allow{URLs: []string{srv.URL}})
	m, err := New(testConfig(Config{Seeds: b.addrs, StateDir: t.TempDir(), Registerer: prometheus.NewRegistry(), StopTimeout: 2 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	m.Apply([]*rules.Route{def})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// Two records acknowledged first, so the group has offsets to hold.
	for i := 0; i < 2; i++ {
		r := jsonRecord("hw", "k", map[string]any{"n": i})
		b.produce(t, r)
	}
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
	waitFor(t, 30*time.Second, "the first records committed", func() bool { return committed() == 2 })

	srv.Control(t, map[string]any{"down": true})
	for i := 2; i < 12; i++ {
		b.produce(t, jsonRecord("hw", fmt.Sprint(i), map[string]any{"n": i}))
	}
	waitFor(t, 30*time.Second, "requests answered 500", func() bool {
		n := 0
		for _, r := range srv.Requests(t) {
			if r.Status == 500 {
				n++
			}
		}
		return n >= 6
	})
	// Ten checkpoint intervals with nothing acknowledged: the offsets hold.
	time.Sleep(time.Second)
	if got := committed(); got != 2 {
		t.Fatalf("committed offsets sum to %d while the endpoint answers 500; want 2 (no commit past an unacknowledged request)", got)
	}
	if st := m.Routes(); len(st) != 1 || !strings.Contains(st[0].LastError, "HTTP 500") {
		t.Errorf("route status %+v: want the 500 as last error", st)
	}
	srv.Control(t, map[string]any{"down": false})
	waitFor(t, 30*time.Second, "every record committed once the endpoint recovers", func() bool { return committed() == 12 })
	acked := map[string]bool{}
	for _, r := range testkit.Acked(srv.Requests(t)) {
		acked[r.Key] = true
		if r.Method != "PUT" || r.Path != "/in" {
			t.Fatalf("request %v: want PUT /in", r)
		}
	}
	if len(acked) != 12 {
		t.Errorf("%d distinct outputs acknowledged, want 12", len(acked))
	}
	checkHTTPOrder(t, srv.Requests(t))
}

// The Driver (`rtproxy test`) keeps an HTTP sink's outputs in memory,
// named by the URL, and calls no endpoint.
func TestHTTPSinkDriver(t *testing.T) {
	def := loadHTTPRoute(t, `
route: hd
source: { topic: hd }
sink: { http: { url: "http://127.0.0.1:1/never" } }
steps:
  - filter: value.n > 0
`, &rules.Allow{URLs: []string{"http://127.0.0.1:1"}})
	d, err := NewDriver(def, DriverConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for i := 0; i < 3; i++ {
		if err := d.Send(DriverInput{Offset: -1, Value: []byte(fmt.Sprintf(`{"n":%d}`, i))}); err != nil {
			t.Fatal(err)
		}
	}
	out := d.Outputs()
	if len(out) != 2 || out[0].Topic != "http://127.0.0.1:1/never" || out[0].DeadLetter || string(out[1].Value) != `{"n":2}` {
		t.Fatalf("outputs %+v", out)
	}
}
