package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

// docsRuleFile returns the rule file shown in docs/RULES.md under the
// marker <!-- rule-file: name -->.
func docsRuleFile(t *testing.T, name string) string {
	t.Helper()
	f, err := os.Open(filepath.Join(ModuleRoot(t), "docs", "RULES.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	marker := "<!-- rule-file: " + name + " -->"
	var b strings.Builder
	state := 0 // 0: looking for the marker, 1: for the fence, 2: in the block
	for sc.Scan() {
		line := sc.Text()
		switch {
		case state == 0 && line == marker:
			state = 1
		case state == 1 && strings.HasPrefix(line, "```"):
			state = 2
		case state == 2 && line == "```":
			return b.String()
		case state == 2:
			b.WriteString(line + "\n")
		}
	}
	t.Fatalf("docs/RULES.md has no %s block", marker)
	return ""
}

type orderEvent struct {
	ID     int     `json:"id"`
	Amount float64 `json:"amount"`
}

// TestHTTPSinkThroughKills runs the HTTP sink example of docs/RULES.md
// ("An HTTP sink") through the rtproxy binary against kfake, writing to
// test/httpsinkserver in its own process. While records flow the endpoint
// answers 500s and resets connections, and the proxy is SIGKILLed twice.
// Then: every record the filter keeps reached the endpoint with a 2xx at
// least once; every request for a record carries the one idempotency key
// of that record (a repeat is always a key seen before, with the same
// body); and within each life of the proxy each partition's requests
// arrived in offset order. The secret header came from the environment
// the config allows.
//
// The producer runs until the last life has begun, and each kill waits
// until the endpoint has given its armed 500s and resets: on a slow
// machine the group's rebalance after a SIGKILL once outlasted a
// fixed-size producer, the route had nothing left to send, and the
// armed failures never happened (CI, stop 31).
func TestHTTPSinkThroughKills(t *testing.T) {
	const rate = 1000
	srv := testkit.StartHTTPSinkServer(t, false)
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{"orders": 4}})
	rulesDir := t.TempDir()
	rule := docsRuleFile(t, "orders-webhook.yaml")
	rule = strings.Replace(rule, "http://hooks.internal:8080", srv.URL, 1)
	rule += "checkpoint_interval: 500ms\n"
	WriteRuleFile(t, rulesDir, "orders-webhook.yaml", rule)
	cfg := filepath.Join(t.TempDir(), "rtproxy.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("rules:\n  allow:\n    urls: [%q]\n    env: [HOOKS_TOKEN]\n", srv.URL)), 0o644); err != nil {
		t.Fatal(err)
	}
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rulesDir, ExtraArgs: []string{"--config", cfg},
		Env: []string{"HOOKS_TOKEN=tok-123"}})

	var produced atomic.Int64
	stopProducing := make(chan struct{})
	prodDone := make(chan struct{})
	go func() {
		defer close(prodDone)
		produceOrders(t, []string{p.Addr}, rate, stopProducing, &produced)
	}()
	failures := func() (int, int) {
		st := map[int]int{}
		for _, r := range srv.Requests(t) {
			st[r.Status]++
		}
		return st[500], st[0]
	}
	writesAgain := func() {
		from := produced.Load()
		Eventually(t, 30*time.Second, "the producer writes again", func() error {
			if got := produced.Load(); got < from+rate/3 {
				return fmt.Errorf("%d records produced since the last restart", got-from)
			}
			return nil
		})
		seen := len(srv.Requests(t))
		Eventually(t, 60*time.Second, "the route writes to the endpoint again", func() error {
			if got := len(srv.Requests(t)); got < seen+50 {
				return fmt.Errorf("%d requests since", got-seen)
			}
			return nil
		})
	}
	var lifeEnds []int // request count at each kill
	for kill := 1; kill <= 2; kill++ {
		writesAgain()
		fails, resets := failures()
		srv.Control(t, map[string]any{"fail": 5, "reset": 2})
		Eventually(t, 30*time.Second, "the endpoint gives its armed 500s and resets", func() error {
			if f, r := failures(); f < fails+5 || r < resets+2 {
				return fmt.Errorf("%d of 5 500s and %d of 2 resets given", f-fails, r-resets)
			}
			return nil
		})
		p.Kill()
		lifeEnds = append(lifeEnds, len(srv.Requests(t)))
		t.Logf("kill %d at %d records produced, %d requests", kill, produced.Load(), lifeEnds[len(lifeEnds)-1])
		p.Restart()
	}
	writesAgain()
	close(stopProducing)
	select {
	case <-prodDone:
	case <-time.After(60 * time.Second):
		t.Fatalf("producer did not finish: %d acked", produced.Load())
	}

	src := readAll(t, k.Addrs, "orders")
	want := map[string]orderEvent{} // rtproxy-source → event the filter keeps
	for _, r := range src {
		var e orderEvent
		if err := json.Unmarshal(r.Value, &e); err != nil {
			t.Fatalf("source record %s: %v", r.Value, err)
		}
		if e.Amount > 0 {
			want[fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset)] = e
		}
	}
	var reqs []testkit.HTTPSinkRequest
	Eventually(t, 90*time.Second, "every kept record acknowledged by the endpoint", func() error {
		reqs = srv.Requests(t)
		got := map[string]bool{}
		for _, r := range testkit.Acked(reqs) {
			got[r.Headers["Rtproxy-Source"]] = true
		}
		missing := 0
		for ref := range want {
			if !got[ref] {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d kept records not acknowledged (%d requests)", missing, len(want), len(reqs))
		}
		return nil
	})
	keyOf := map[string]string{}  // source → key
	bodyOf := map[string]string{} // key → body
	repeats := 0
	for _, r := range reqs {
		ref := r.Headers["Rtproxy-Source"]
		e, ok := want[ref]
		if !ok {
			t.Fatalf("request %v names no kept source record", r)
		}
		if r.Headers["Authorization"] != "Bearer tok-123" || r.Headers["X-Source"] != "rtproxy" {
			t.Fatalf("request headers %v", r.Headers)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(r.Body), &v); err != nil || v["id"] != float64(e.ID) || v["amount_cents"] != e.Amount*100 {
			t.Fatalf("request body %s for %s: want id %d with amount_cents %v", r.Body, ref, e.ID, e.Amount*100)
		}
		if k, ok := keyOf[ref]; ok {
			repeats++
			if k != r.Key {
				t.Fatalf("%s sent under key %s, then %s: a repeat must carry the key already seen", ref, k, r.Key)
			}
		}
		keyOf[ref] = r.Key
		if b, ok := bodyOf[r.Key]; ok && b != r.Body {
			t.Fatalf("key %s carried %s, then %s", r.Key, b, r.Body)
		}
		bodyOf[r.Key] = r.Body
		if !strings.HasPrefix(r.Key, "orders-webhook/orders/") {
			t.Fatalf("key %q: want orders-webhook/orders/<partition>/<offset>/<index>", r.Key)
		}
	}
	// Per life of the proxy, each partition's requests come in offset
	// order (a retry repeats the last one; a replay starts a new life).
	start := 0
	for i, end := range append(lifeEnds, len(reqs)) {
		last := map[string]int64{}
		for _, r := range reqs[start:end] {
			f := strings.Split(r.Key, "/")
			off, _ := strconv.ParseInt(f[3], 10, 64)
			if prev, ok := last[f[2]]; ok && off < prev {
				t.Errorf("life %d, partition %s: offset %d after %d", i+1, f[2], off, prev)
			}
			last[f[2]] = off
		}
		start = end
	}
	statuses := map[int]int{}
	for _, r := range reqs {
		statuses[r.Status]++
	}
	t.Logf("%d kept records, %d requests (answers %v), %d repeats under a key already seen", len(want), len(reqs), statuses, repeats)
	if statuses[500] < 10 || statuses[0] < 4 {
		t.Errorf("answers %v: the endpoint's 500s and resets did not happen", statuses)
	}
	if m := p.Metrics(t); !strings.Contains(m, `rtproxy_sink_http_requests_total{class="5xx",route="orders-webhook",sink="http"}`) {
		t.Errorf("metrics lack the sink's 5xx count")
	}
}

// produceOrders writes orders (every seventh with amount 0, which the
// example's filter drops) through seeds at about rate records/s, retrying
// across proxy restarts, until stop is closed; it returns when every
// record is acked.
func produceOrders(t *testing.T, seeds []string, rate int, stop <-chan struct{}, progress *atomic.Int64) {
	cl := NewClient(t, seeds, kgo.RecordRetries(1<<30), kgo.RequestTimeoutOverhead(2*time.Second))
	var wg sync.WaitGroup
	var firstErr atomic.Value
	start := time.Now()
	for i := 0; ; i++ {
		select {
		case <-stop:
			wg.Wait()
			if e := firstErr.Load(); e != nil {
				t.Errorf("producer: %v", e)
			}
			return
		default:
		}
		if due := start.Add(time.Duration(i) * time.Second / time.Duration(rate)); time.Until(due) > 0 {
			time.Sleep(time.Until(due))
		}
		amount := float64(i%50) + 0.25
		if i%7 == 0 {
			amount = 0
		}
		b, _ := json.Marshal(orderEvent{ID: i, Amount: amount})
		wg.Add(1)
		cl.Produce(context.Background(), &kgo.Record{Topic: "orders", Key: []byte(strconv.Itoa(i)), Value: b}, func(_ *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				firstErr.CompareAndSwap(nil, err)
			}
			progress.Add(1)
		})
	}
}
