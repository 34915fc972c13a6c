package integration

// Per-record budgets on the wire (issue 25, finding 4 and the guard time
// bound): a real producer through the rtproxy binary, with guards whose
// checks would allocate hundreds of gigabytes or loop for seconds on one
// record.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

const budgetGuard = `guard: hostile
topic: gbud
format: raw
checks:
  - check: len(repeat(value, 1000000)) > 0
    name: repeat
  - check: len(split(value, ",")) < 1000000
    name: split
`

const budgetGuardNested = `guard: hostile-nested
topic: gnest
checks:
  - check: all(value.items, {all(value.items, {# >= 0})})
    name: nested
`

func TestGuardBudgetsOnTheWire(t *testing.T) {
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{"gbud": 1, "gnest": 1}})
	rules := t.TempDir()
	WriteRuleFile(t, rules, "gbud.yaml", budgetGuard)
	WriteRuleFile(t, rules, "gnest.yaml", budgetGuardNested)
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules})
	cl := NewClient(t, []string{p.Addr}, kgo.ProducerLinger(0), kgo.ProducerBatchMaxBytes(4<<20))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// Wait for the guards: the first 200 KB record would have been a
	// fatal out-of-memory (200 GB) before the budget.
	big := strings.Repeat("v", 200_000)
	srWait(t, 30*time.Second, "the guard is in force", func() error {
		err := cl.ProduceSync(ctx, &kgo.Record{Topic: "gbud", Value: []byte(big)}).FirstErr()
		if !errors.Is(err, kerr.InvalidRecord) {
			return errors.New("not refused yet")
		}
		return nil
	})
	items := "[" + strings.Repeat("1,", 3000) + "1]"
	start := time.Now()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "gnest", Value: []byte(`{"items":` + items + `}`)}).FirstErr(); !errors.Is(err, kerr.InvalidRecord) {
		t.Fatalf("3001 × 3001 steps: %v, want INVALID_RECORD", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the nested check took %v", d)
	}
	// The proxy is alive and well-behaved records pass.
	for topic, v := range map[string]string{"gbud": "a,b,c", "gnest": `{"items":[1,2,3]}`} {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("%s: %s refused: %v", topic, v, err)
		}
	}
	m, err := srMetrics(p)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := srMetric(m, "rtproxy_budget_exceeded_total", `budget="expr_memory"`); v < 1 {
		t.Errorf("rtproxy_budget_exceeded_total{budget=\"expr_memory\"} = %v", v)
	}
	steps, _ := srMetric(m, "rtproxy_budget_exceeded_total", `budget="expr_steps"`)
	timed, _ := srMetric(m, "rtproxy_budget_exceeded_total", `budget="expr_time"`)
	if steps+timed < 1 {
		t.Errorf("the nested check tripped neither expr_steps nor expr_time:\n%s", m)
	}
	if v, _ := srMetric(m, "rtproxy_guard_rejected_records_total", `guard="hostile"`, `check="repeat"`); v < 1 {
		t.Errorf("rtproxy_guard_rejected_records_total{check=repeat} = %v", v)
	}
	if v, _ := srMetric(m, "process_resident_memory_bytes"); v > 300<<20 {
		t.Errorf("resident memory %v MB", v/(1<<20))
	}
}
