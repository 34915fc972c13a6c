package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metricsql"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

const dashboardPath = "grafana/rtproxy.json"

// agreedMetrics are the metric names the project agreed on (one owner each);
// the dashboard may query only these.
var agreedMetrics = []string{
	"rtproxy_proxy_connections_open",
	"rtproxy_proxy_connections_total",
	"rtproxy_proxy_requests_total",
	"rtproxy_proxy_request_errors_total",
	"rtproxy_proxy_bytes_total",
	"rtproxy_proxy_upstream_latency_seconds",
	"rtproxy_proxy_frame_errors_total",
	"rtproxy_pipeline_records_in_total",
	"rtproxy_pipeline_records_out_total",
	"rtproxy_pipeline_records_dropped_total",
	"rtproxy_pipeline_dead_letters_total",
	"rtproxy_pipeline_processing_latency_seconds",
	"rtproxy_pipeline_end_to_end_latency_seconds",
	"rtproxy_pipeline_lag_records",
	"rtproxy_pipeline_watermark_seconds",
	"rtproxy_pipeline_sink_errors_total",
	"rtproxy_state_keys",
	"rtproxy_state_bytes",
	"rtproxy_checkpoint_duration_seconds",
	"rtproxy_checkpoint_last_timestamp_seconds",
	"rtproxy_rules_reload_total",
	"rtproxy_rules_routes",
	// Shared routes (docs/ARCHITECTURE.md): group membership and state restore.
	"rtproxy_route_partitions_owned",
	"rtproxy_route_tapped_records_total",
	"rtproxy_route_rebalances_total",
	"rtproxy_state_restore_records_total",
	"rtproxy_state_restore_seconds",
}

// histograms among agreedMetrics: queried through _bucket (and _sum/_count).
var histograms = []string{
	"rtproxy_proxy_upstream_latency_seconds",
	"rtproxy_pipeline_processing_latency_seconds",
	"rtproxy_pipeline_end_to_end_latency_seconds",
	"rtproxy_checkpoint_duration_seconds",
	"rtproxy_state_restore_seconds",
}

// query is one PromQL expression found in the dashboard.
type query struct {
	where string // panel title or template variable
	expr  string
}

// dashboardQueries returns every target expr and every query variable's
// selector (label_values(SELECTOR, label) → SELECTOR).
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s is not JSON: %v", dashboardPath, err)
	}
	var qs []query
	var walk func(v any, where string)
	walk = func(v any, where string) {
		switch v := v.(type) {
		case map[string]any:
			if title, ok := v["title"].(string); ok {
				where = title
			}
			if e, ok := v["expr"].(string); ok {
				qs = append(qs, query{where, e})
			}
			for _, c := range v {
				walk(c, where)
			}
		case []any:
			for _, c := range v {
				walk(c, where)
			}
		}
	}
	walk(dash["panels"], "")
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)
	tmpl, _ := dash["templating"].(map[string]any)
	vars, _ := tmpl["list"].([]any)
	for _, v := range vars {
		vm := v.(map[string]any)
		if vm["type"] != "query" {
			continue
		}
		q, _ := vm["query"].(map[string]any)
		s, _ := q["query"].(string)
		m := labelValues.FindStringSubmatch(s)
		if m == nil {
			t.Errorf("template variable %v: query %q is not label_values(SELECTOR, label)", vm["name"], s)
			continue
		}
		qs = append(qs, query{fmt.Sprintf("variable $%v", vm["name"]), m[1]})
	}
	sort.Slice(qs, func(i, j int) bool { return qs[i].where+qs[i].expr < qs[j].where+qs[j].expr })
	return qs
}

// grafanaVars stands in for Grafana's interval variables, which are not
// PromQL until Grafana substitutes them; $job and the like sit inside
// quoted label values and parse as they are.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// parsedQuery is a query with the metric names it selects.
type parsedQuery struct {
	query
	metrics []string
}

func parseQueries(t *testing.T, qs []query) []parsedQuery {
	t.Helper()
	var out []parsedQuery
	for _, q := range qs {
		e, err := metricsql.Parse(grafanaVars.Replace(q.expr))
		if err != nil {
			t.Errorf("%s: %q does not parse: %v", q.where, q.expr, err)
			continue
		}
		pq := parsedQuery{query: q}
		metricsql.VisitAll(e, func(x metricsql.Expr) {
			switch x := x.(type) {
			case *metricsql.MetricExpr:
				name := ""
				for _, lfs := range x.LabelFilterss {
					for _, lf := range lfs {
						if lf.Label == "__name__" && !lf.IsRegexp && !lf.IsNegative {
							name = lf.Value
						}
					}
				}
				if name == "" {
					t.Errorf("%s: %q selects series without a metric name", q.where, q.expr)
				} else if !slices.Contains(pq.metrics, name) {
					pq.metrics = append(pq.metrics, name)
				}
			case *metricsql.FuncExpr:
				// PromQL (unlike MetricsQL) needs an explicit range here.
				if x.Name == "rate" || x.Name == "increase" {
					if r, ok := x.Args[0].(*metricsql.RollupExpr); !ok || r.Window == nil {
						t.Errorf("%s: %s(…) without a [range] in %q", q.where, x.Name, q.expr)
					}
				}
				if x.Name == "histogram_quantile" {
					a, ok := x.Args[1].(*metricsql.AggrFuncExpr)
					if !ok || !slices.Contains(a.Modifier.Args, "le") {
						t.Errorf("%s: histogram_quantile must aggregate by (le, …): %q", q.where, q.expr)
					}
				}
			}
		})
		out = append(out, pq)
	}
	return out
}

// baseName strips the suffixes Prometheus adds to histogram series.
func baseName(name string) string {
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(name, s); ok && slices.Contains(histograms, b) {
			return b
		}
	}
	return name
}

// TestDashboardQueries checks the dashboard on its own: every query parses,
// selects only agreed metrics, and the panels the issue asks for exist.
func TestDashboardQueries(t *testing.T) {
	qs := parseQueries(t, dashboardQueries(t))
	if len(qs) < 20 {
		t.Fatalf("found %d queries in %s, want the full dashboard (≥ 20)", len(qs), dashboardPath)
	}
	used := map[string]bool{}
	for _, q := range qs {
		for _, m := range q.metrics {
			b := baseName(m)
			used[b] = true
			if !slices.Contains(agreedMetrics, b) {
				t.Errorf("%s: queries %s, which is not an agreed metric name", q.where, m)
			}
			if slices.Contains(histograms, b) && m == b {
				t.Errorf("%s: %s is a histogram; query %s_bucket", q.where, m, m)
			}
		}
	}
	for _, m := range agreedMetrics {
		if !used[m] {
			t.Errorf("no panel shows %s", m)
		}
	}
	// The derived views the issue names, spelled the way they must be computed.
	for _, want := range []string{
		"time() - max by (route) (rtproxy_pipeline_watermark_seconds",        // watermark delay
		"time() - max by (route) (rtproxy_checkpoint_last_timestamp_seconds", // checkpoint age
		"histogram_quantile(0.5, sum by (le, route) (rate(rtproxy_pipeline_end_to_end_latency_seconds_bucket",
		"histogram_quantile(0.99, sum by (le, route) (rate(rtproxy_pipeline_end_to_end_latency_seconds_bucket",
		"sum by (api) (rate(rtproxy_proxy_requests_total", // traffic by API key
		`result="error"`, // reload errors
		// Shared routes: who owns what, how often the group moves, restores.
		"sum by (route, instance) (rtproxy_route_partitions_owned",
		"sum by (route) (rtproxy_route_partitions_owned", // the total: every partition has one owner
		"increase(rtproxy_route_rebalances_total",
		"rate(rtproxy_state_restore_records_total",
		"histogram_quantile(0.99, sum by (le, route) (rate(rtproxy_state_restore_seconds_bucket",
	} {
		found := false
		for _, q := range qs {
			found = found || strings.Contains(q.expr, want)
		}
		if !found {
			t.Errorf("no query contains %q", want)
		}
	}
}

// --- the real binary ----------------------------------------------------------

func TestMain(m *testing.M) {
	code := m.Run()
	testkit.Cleanup()
	os.Exit(code)
}

func scrape(t *testing.T, url string) (map[string]bool, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics is not the Prometheus text format: %v", err)
	}
	names := map[string]bool{}
	for n, f := range fams {
		if len(f.GetMetric()) > 0 {
			names[n] = true
		}
	}
	return names, string(body)
}

// TestDashboardMetricsExported runs the real binary in embedded mode with
// one route, drives traffic through it (produce, consume, a duplicate, a
// filtered record, a record that is not JSON, a malformed frame), scrapes
// /metrics and asserts that every metric the dashboard queries has series.
func TestDashboardMetricsExported(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the proxy binary")
	}
	qs := parseQueries(t, dashboardQueries(t))
	rules := t.TempDir()
	route, err := os.ReadFile("testdata/dashboard-route.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rules, "dashboard-route.yaml"), route, 0o644); err != nil {
		t.Fatal(err)
	}
	p := testkit.StartProxy(t, testkit.ProxyOpts{
		RulesDir:        rules,
		StateDir:        t.TempDir(),
		ExtraArgs:       []string{"--log-level", "debug"},
		BrokerPortCount: 16, // passed as RTPROXY_BROKER_PORT_COUNT
		ReadyTimeout:    30 * time.Second,
	})
	// The traffic's deadline starts once the proxy is ready: StartProxy
	// first waits for the binary's build, which takes minutes on a loaded
	// CI machine with a cold cache (with the deadline taken before it, a
	// 105-s build left too little for the topics to be created).
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	listen, admin := p.Addr, p.AdminAddr

	// Traffic through the proxy, as a client would send it.
	cl, err := kgo.NewClient(kgo.SeedBrokers(listen), kgo.ProducerLinger(0),
		kgo.ConsumeTopics("dash.sink"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for _, topic := range []string{"dash.src", "dash.sink", "dash.dlq"} {
		if _, err := adm.CreateTopic(ctx, 2, 1, nil, topic); err != nil && !strings.Contains(err.Error(), "TOPIC_ALREADY_EXISTS") {
			t.Fatalf("create %s: %v", topic, err)
		}
	}
	// Creating an existing topic again is a request the broker answers with
	// an error code: something for request_errors_total to count.
	adm.CreateTopic(ctx, 2, 1, nil, "dash.src")

	values := []string{
		`{"id":"a","amount":10}`,
		`{"id":"b","amount":20}`,
		`{"id":"a","amount":10}`, // duplicate: dropped
		`{"id":"c","amount":0}`,  // filtered: dropped
		`not json`,               // dead letter
		`{"id":"d","amount":5}`,
	}
	for _, v := range values {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "dash.src", Key: []byte("k"), Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("produce %s through the proxy: %v", v, err)
		}
	}

	// The route's output: one window row each for a, b and d (the duplicate
	// a and the zero amount never reach the window).
	var got []string
	deadline := time.Now().Add(45 * time.Second)
	for len(got) < 3 && time.Now().Before(deadline) {
		fctx, fcancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(fctx)
		fcancel()
		fs.EachRecord(func(r *kgo.Record) {
			var v map[string]any
			if err := json.Unmarshal(r.Value, &v); err != nil {
				t.Errorf("sink record %q is not JSON: %v", r.Value, err)
				return
			}
			got = append(got, fmt.Sprintf("%v n=%v total=%v", v["key"], v["n"], v["total"]))
		})
	}
	sort.Strings(got)
	if want := []string{"a n=1 total=10", "b n=1 total=20", "d n=1 total=5"}; !slices.Equal(got, want) {
		t.Errorf("sink dash.sink holds %q, want %q (the route did not run as written)", got, want)
	}

	// A frame larger than max_frame_bytes: the proxy closes the connection
	// and counts a frame error.
	if c, err := net.Dial("tcp", listen); err == nil {
		binary.Write(c, binary.BigEndian, int32(0x7fffffff))
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		bufio.NewReader(c).ReadByte()
		c.Close()
	}

	// One more record on each partition of the source: every partition
	// then has an event-time frontier of its own, so the window's
	// watermark (and its gauge) does not wait on the empty partition's
	// idle_timeout across two repartition hops. In three clean make test
	// runs in a row the gauge had no series 30 s after the traffic above,
	// which left one partition empty; the run alone always passed.
	pcl, err := kgo.NewClient(kgo.SeedBrokers(listen), kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer pcl.Close()
	for part, v := range []string{`{"id":"e","amount":1}`, `{"id":"f","amount":1}`} {
		if err := pcl.ProduceSync(ctx, &kgo.Record{Topic: "dash.src", Partition: int32(part), Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("produce %s to partition %d through the proxy: %v", v, part, err)
		}
	}

	// Every name the dashboard queries must be exported. Checkpoints run
	// every second, so give the slower series a few seconds to appear (the
	// window's watermark needs markers across two repartition hops: up to
	// 30 s on a loaded CI machine).
	var missing []string
	var body string
	for end := time.Now().Add(30 * time.Second); ; {
		var names map[string]bool
		names, body = scrape(t, "http://"+admin+"/metrics")
		missing = missing[:0]
		for _, q := range qs {
			for _, m := range q.metrics {
				b := baseName(m)
				if !names[b] && !names[m] && !slices.Contains(missing, b) {
					missing = append(missing, b)
				}
			}
		}
		if len(missing) == 0 || time.Now().After(end) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		var exported []string
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, "# TYPE rtproxy_") {
				exported = append(exported, strings.Fields(l)[2])
			}
		}
		t.Errorf("the dashboard queries %d metric(s) the binary does not export (with series) after traffic through a route:\n  %s\nexported rtproxy_ families:\n  %s",
			len(missing), strings.Join(missing, "\n  "), strings.Join(exported, "\n  "))
	}
}
