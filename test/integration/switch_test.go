package integration

// A route with a `switch` to three sinks (two JSON topics and one Avro
// topic through the fake schema registry), at least once and exactly once,
// through the binary with two SIGKILLs: every source record is in exactly
// the sink an independent reference routes it to (at least once: repeats
// only; exactly once: none), and a record no branch takes is nowhere.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

const swAvsc = `{"type":"record","name":"Pay","namespace":"rtproxy.it.sw","fields":[
	{"name":"id","type":"double"},{"name":"amount","type":"double"},{"name":"user","type":"string"}]}`

type swPay struct {
	ID     float64 `avro:"id"`
	Amount float64 `avro:"amount"`
	User   string  `avro:"user"`
}

// swRule is the switch route; its reference is swRef.
const swRule = `route: %[1]s
source: { topic: %[2]s }
sink: { delivery: %[3]s }
dead_letter: %[1]s.dlq
steps:
  - map: { id: value.id, amount: value.amount, user: value.user }
  - switch:
      - when: value.amount > 9
        sink: { topic: %[1]s.big, key: value.user }
      - when: value.user == "u3"
        sink: { topic: %[1]s.u3 }
      - when: int(value.id) %% 11 != 0
        sink: { topic: %[1]s.rest, format: avro, schema: sw.avsc }
`

// swRef routes e by brute force: the sink suffix, "" for none.
func swRef(e srEvent) string {
	switch {
	case e.Amount > 9:
		return "big"
	case e.User == "u3":
		return "u3"
	case e.ID%11 != 0:
		return "rest"
	}
	return ""
}

func TestSwitchThreeSinksThroughKills(t *testing.T) {
	const source, n, rate = "swsrc", 12_000, 3_000
	reg := testkit.StartRegistry(t, "")
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{source: 4}})
	rulesDir := swRules(t, source)
	dir := t.TempDir()
	env := []string{"RTPROXY_SCHEMA_REGISTRY_URL=" + reg.URL}
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rulesDir, StateDir: dir, Env: env})
	load := srStartLoad(t, k.Addrs, source, rate, n, srGen(1, 0))
	for i, at := range []int64{n / 3, 2 * n / 3} {
		load.WaitAcked(t, at, 120*time.Second)
		p.Kill()
		t.Logf("SIGKILL %d at %d records produced", i+1, load.acked.Load())
		p = StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rulesDir, StateDir: dir, Env: env})
	}
	load.Wait(t, 120*time.Second)
	swCheck(t, k.Addrs, reg.URL, source, 2)
}

// Three instances share both switch routes (one group each); one is
// killed with SIGKILL mid-load and comes back on an empty state
// directory: the same checks, its partitions' records replayed by whoever
// takes them over.
func TestSwitchThreeInstancesKill(t *testing.T) {
	const source, n, rate = "sw3src", 9_000, 3_000
	reg := testkit.StartRegistry(t, "")
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{source: 6}})
	rulesDir := swRules(t, source)
	env := []string{"RTPROXY_SCHEMA_REGISTRY_URL=" + reg.URL}
	ps := srStartProxies(t, k, rulesDir, 3, env...)
	load := srStartLoad(t, k.Addrs, source, rate, n, srGen(1, 0))
	load.WaitAcked(t, n/2, 120*time.Second)
	ps[1].Kill()
	t.Logf("SIGKILL of instance 2 at %d records produced", load.acked.Load())
	ps[1] = StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rulesDir, StateDir: t.TempDir(), Env: env})
	load.Wait(t, 120*time.Second)
	swCheck(t, k.Addrs, reg.URL, source, 1)
}

// swRules writes both switch routes (swal: at least once, sweo: exactly
// once) over source, and the Avro schema, into a fresh rules directory.
func swRules(t *testing.T, source string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "sw.avsc"), []byte(swAvsc), 0o644); err != nil {
		t.Fatal(err)
	}
	WriteRuleFile(t, dir, "swal.yaml", fmt.Sprintf(swRule, "swal", source, "at_least_once"))
	WriteRuleFile(t, dir, "sweo.yaml", fmt.Sprintf(swRule, "sweo", source, "exactly_once"))
	return dir
}

// swCheck reads the source and every sink of both routes and checks each
// record is in exactly the sink swRef names, with its branch's key, an
// Avro value that decodes by the registered schema where the sink is Avro;
// at least once at most kills repeats of a record, exactly once
// (read_committed) none; no dead letter.
func swCheck(t *testing.T, seeds []string, registry, source string, kills int) {
	t.Helper()
	src := srSource(t, seeds, source)
	want := map[string]map[string]srEvent{} // sink suffix -> source ref -> event
	dropped := 0
	for ref, s := range src {
		w := swRef(s.E)
		if w == "" {
			dropped++
			continue
		}
		if want[w] == nil {
			want[w] = map[string]srEvent{}
		}
		want[w][ref] = s.E
	}
	if dropped == 0 || len(want) != 3 {
		t.Fatalf("the load covers %d sinks and drops %d; the test needs all three and drops", len(want), dropped)
	}
	avroDec := swAvroDecoder(t, registry)
	for _, route := range []string{"swal", "sweo"} {
		eo := route == "sweo"
		for _, sink := range []string{"big", "u3", "rest"} {
			topic := route + "." + sink
			var out []*kgo.Record
			srWait(t, 120*time.Second, topic+" holds every record routed there", func() error {
				if eo {
					out = srRead(t, seeds, topic)
				} else {
					out = readAll(t, seeds, topic)
				}
				seen := map[string]bool{}
				for _, r := range out {
					seen[srHdr(r, "rtproxy-source")] = true
				}
				missing := 0
				for ref := range want[sink] {
					if !seen[ref] {
						missing++
					}
				}
				if missing > 0 {
					return fmt.Errorf("%d of %d missing (%d records read)", missing, len(want[sink]), len(out))
				}
				return nil
			})
			count := map[string]int{}
			for _, r := range out {
				ref := srHdr(r, "rtproxy-source")
				e, ok := want[sink][ref]
				if !ok {
					t.Fatalf("%s holds %s from %s, which the reference routes to %q", topic, r.Value, ref, swRef(src[ref].E))
				}
				count[ref]++
				var id float64
				if sink == "rest" {
					var v swPay
					if err := avroDec.Decode(r.Value, &v); err != nil {
						t.Fatalf("%s: %s is no Avro of the registered schema: %v", topic, ref, err)
					}
					id = v.ID
					if v.User != e.User || v.Amount != float64(e.Amount) {
						t.Fatalf("%s: %s decodes to %+v, want %+v", topic, ref, v, e)
					}
				} else {
					var v struct {
						ID   float64 `json:"id"`
						User string  `json:"user"`
					}
					if err := json.Unmarshal(r.Value, &v); err != nil {
						t.Fatalf("%s: %s: %v", topic, r.Value, err)
					}
					id = v.ID
				}
				if id != float64(e.ID) {
					t.Fatalf("%s: %s holds id %v, want %d", topic, ref, id, e.ID)
				}
				if sink == "big" && string(r.Key) != e.User {
					t.Fatalf("%s: key %q, want the branch's key value.user = %q", topic, r.Key, e.User)
				}
			}
			repeats := 0
			for ref, c := range count {
				repeats += c - 1
				if c > 1+kills {
					t.Errorf("%s holds %s %d times; %d kills replay it at most %d times", topic, ref, c, kills, kills)
				}
			}
			if eo && repeats > 0 {
				t.Errorf("%s (exactly once, read_committed): %d repeats, want none", topic, repeats)
			}
			t.Logf("%s: %d records, each in its sink, %d repeats", topic, len(count), repeats)
		}
		dlq := route + ".dlq"
		var dls []*kgo.Record
		if eo {
			dls = srRead(t, seeds, dlq)
		} else {
			dls = ConsumeQuiet(t, seeds, dlq, 0, 500*time.Millisecond, 10*time.Second)
		}
		if len(dls) > 0 {
			t.Errorf("%s holds %d dead letters, want none; first: %s %v", dlq, len(dls), dls[0].Value, dls[0].Headers)
		}
	}
	t.Logf("%d source records: %d big, %d u3, %d rest, %d taken by no branch", len(src), len(want["big"]), len(want["u3"]), len(want["rest"]), dropped)
}

// swAvroDecoder decodes the Avro sink's values by the schema the routes
// registered under its subject (both routes register the same schema).
func swAvroDecoder(t *testing.T, url string) *sr.Serde {
	t.Helper()
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		t.Fatal(err)
	}
	var s sr.Serde
	sch := avro.MustParse(swAvsc)
	for _, subj := range []string{"swal.rest-value", "sweo.rest-value"} {
		ss, err := cl.SchemaByVersion(context.Background(), subj, -1)
		if err != nil {
			t.Fatalf("registry: %s: %v", subj, err)
		}
		s.Register(ss.ID, swPay{}, sr.DecodeFn(func(b []byte, v any) error { return avro.Unmarshal(sch, b, v) }))
	}
	return &s
}
