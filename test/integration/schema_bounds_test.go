package integration

// Issue 25, findings 5 and 6, through the binary: a hostile schema
// registry (an HTTP server in this test) answers with an Avro fixed of
// size 1e11, a body of gigabytes, one that announces 2 GB, a Protobuf
// schema of 300k nested messages (3 MB of text) and one of 30k (under the
// size bound, over the depth bound). Every record becomes a dead letter
// naming the bound, the process stays up, and its peak RSS stays under
// 300 MiB.

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// peakRSSKiB is VmHWM of process pid: its peak resident set.
func peakRSSKiB(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("proxy status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return n
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

func TestHostileRegistryAnswersAreBounded(t *testing.T) {
	nested := func(n int) string {
		return "syntax = \"proto3\";\n" + strings.Repeat("message M {\n", n) + strings.Repeat("}\n", n)
	}
	answer := func(typ, schema string) []byte {
		b, _ := json.Marshal(map[string]any{"schema": schema, "schemaType": typ})
		return b
	}
	var streamed atomic.Int64
	answers := map[string]func(w http.ResponseWriter){
		"/schemas/ids/1": func(w http.ResponseWriter) {
			w.Write(answer("AVRO", `{"type":"fixed","name":"F","size":100000000000}`))
		},
		// Up to 2 GB, streamed until the reader hangs up.
		"/schemas/ids/2": func(w http.ResponseWriter) {
			w.Write([]byte(`{"schemaType":"AVRO","schema":"`))
			chunk := []byte(strings.Repeat("x", 1<<20))
			for range 2048 {
				n, err := w.Write(chunk)
				streamed.Add(int64(n))
				if err != nil {
					return
				}
			}
			w.Write([]byte(`"}`))
		},
		"/schemas/ids/3": func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", "2000000000")
			w.WriteHeader(200)
		},
		"/schemas/ids/4": func(w http.ResponseWriter) { w.Write(answer("PROTOBUF", nested(300000))) },
		"/schemas/ids/5": func(w http.ResponseWriter) { w.Write(answer("PROTOBUF", nested(30000))) },
	}
	hits := map[string]*atomic.Int64{}
	for p := range answers {
		hits[p] = new(atomic.Int64)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a := answers[r.URL.Path]; a != nil {
			hits[r.URL.Path].Add(1)
			a(w)
			return
		}
		w.WriteHeader(404)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	rulesDir := t.TempDir()
	WriteRuleFile(t, rulesDir, "avro.yaml", "route: hostile-avro\nsource: { topic: h.avro, format: avro }\nsink: { topic: h.avro.out }\ndead_letter: h.avro.dlq\n")
	WriteRuleFile(t, rulesDir, "pb.yaml", "route: hostile-pb\nsource: { topic: h.pb, format: protobuf }\nsink: { topic: h.pb.out }\ndead_letter: h.pb.dlq\n")
	s := StartStack(t, KfakeOpts{Topics: map[string]int{"h.avro": 1, "h.pb": 1}},
		ProxyOpts{RulesDir: rulesDir, Env: []string{"RTPROXY_SCHEMA_REGISTRY_URL=http://" + ln.Addr().String()}})
	if s.Proxy == nil {
		t.Skip("RTPROXY_IT_DIRECT: no proxy to measure")
	}
	cl := NewClient(t, s.Bootstrap)
	produce := func(topic, key string, id int) {
		t.Helper()
		v := append([]byte{0, 0, 0, 0, byte(id)}, "xyz"...) // the finding's record
		if err := cl.ProduceSync(t.Context(), &kgo.Record{Topic: topic, Key: []byte(key), Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	deadLetters := func(topic string, n int) map[string]map[string]string {
		t.Helper()
		out := map[string]map[string]string{}
		for _, r := range ConsumeQuiet(t, s.Bootstrap, topic, n, 300*time.Millisecond, 60*time.Second) {
			h := map[string]string{}
			for _, x := range r.Headers {
				h[x.Key] = string(x.Value)
			}
			out[string(r.Key)] = h
		}
		return out
	}
	// Finding 5 first: before the bound it killed the process.
	produce("h.avro", "fixed", 1)
	dl := deadLetters("h.avro.dlq", 1)
	if !s.Proxy.Running() {
		t.Fatalf("rtproxy died on the fixed of size 1e11")
	}
	produce("h.avro", "stream", 2)
	produce("h.avro", "announced", 3)
	produce("h.pb", "nested-300k", 4)
	produce("h.pb", "nested-30k", 5)
	produce("h.avro", "fixed-again", 1)
	dl = deadLetters("h.avro.dlq", 4)
	for k, v := range deadLetters("h.pb.dlq", 2) {
		dl[k] = v
	}
	want := map[string]string{
		"fixed":       "only 3 are left in the record",
		"fixed-again": "only 3 are left in the record",
		"stream":      "schema_registry.max_response_bytes",
		"announced":   "schema_registry.max_response_bytes",
		"nested-300k": "schema_registry.max_schema_bytes",
		"nested-30k":  "schema_registry.max_schema_depth",
	}
	for k, w := range want {
		h := dl[k]
		if h == nil || h["rtproxy-reason"] != "decode" || !strings.Contains(h["rtproxy-error"], w) {
			t.Errorf("dead letter %s: %v, want reason decode and an error with %q", k, h, w)
		}
	}
	if !s.Proxy.Running() {
		t.Fatal("rtproxy died")
	}
	peak := peakRSSKiB(t, s.Proxy.PID())
	t.Logf("peak RSS %d MiB; the stream sent %d MiB before the proxy hung up", peak>>10, streamed.Load()>>20)
	if peak > 300<<10 {
		t.Errorf("peak RSS %d MiB, want under 300 MiB", peak>>10)
	}
	// Each refused id was asked once (the refusal is cached), the
	// fixed's id too (it compiled and stays cached).
	for p, n := range hits {
		if n.Load() != 1 {
			t.Errorf("%s asked %d times", p, n.Load())
		}
	}
	m := scrapeMetric(t, s.Proxy.AdminURL, "rtproxy_schema_registry_refused_total")
	for bound, n := range map[string]string{"max_response_bytes": "2", "max_schema_bytes": "1", "max_schema_depth": "1"} {
		if got := m[`bound="`+bound+`"`]; got != n {
			t.Errorf("rtproxy_schema_registry_refused_total{bound=%q} = %q, want %s (all: %v)", bound, got, n, m)
		}
	}
}

// scrapeMetric is the samples of metric on the admin /metrics page, by
// their label text.
func scrapeMetric(t *testing.T, adminURL, metric string) map[string]string {
	t.Helper()
	resp, err := http.Get(adminURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	out := map[string]string{}
	for _, line := range strings.Split(sb.String(), "\n") {
		if rest, ok := strings.CutPrefix(line, metric+"{"); ok {
			labels, val, _ := strings.Cut(rest, "} ")
			out[labels] = val
		}
	}
	return out
}
