package integration

// Stream-stream interval joins through the binary: payments matched to
// their authorizations within five minutes (docs/RULES.md, "Joining two
// streams"), the sink read by real clients and compared exactly with a
// brute-force recomputation.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

const sjBase = int64(1_700_000_000_000)

// sjPayment and sjAuth are the two topics' values.
type sjPayment struct {
	ID     string `json:"id"`
	AuthID string `json:"auth_id"`
	Amount int    `json:"amount"`
	TS     int64  `json:"ts"`
}

type sjAuth struct {
	ID       string `json:"id"`
	Approved bool   `json:"approved"`
	TS       int64  `json:"ts"`
}

// sjData is n payments and their authorizations. Authorization i is at
// base + i s; its payment comes, by i % 5, 2 minutes before it (no match:
// more than `after`), 1 or 3 minutes after (matches), 10 minutes after
// (no match: more than `before`), or names an authorization that does not
// exist. Every 11th authorization is given twice (a retry): its payment
// matches both.
func sjData(from, n int) ([]sjPayment, []sjAuth) {
	var ps []sjPayment
	var as []sjAuth
	for i := from; i < from+n; i++ {
		ta := sjBase + int64(i)*1000
		aid := fmt.Sprintf("A%d", i)
		as = append(as, sjAuth{ID: aid, Approved: i%3 != 0, TS: ta})
		if i%11 == 0 {
			as = append(as, sjAuth{ID: aid, Approved: true, TS: ta + 500})
		}
		d := []int64{-2 * 60_000, 60_000, 3 * 60_000, 10 * 60_000, 0}[i%5]
		p := sjPayment{ID: fmt.Sprintf("P%d", i), AuthID: aid, Amount: i%97 + 1, TS: ta + d}
		if i%5 == 4 {
			p.AuthID = aid + "-none"
		}
		ps = append(ps, p)
	}
	return ps, as
}

// sjWant is the brute-force left join: "payment|auth-id@auth-ts" for each
// payment and each authorization of its auth_id with
// tP − 5m ≤ tA ≤ tP + 1m, and "payment|-" for a payment with none.
func sjWant(ps []sjPayment, as []sjAuth) []string {
	var out []string
	for _, p := range ps {
		n := 0
		for _, a := range as {
			if a.ID == p.AuthID && p.TS-5*60_000 <= a.TS && a.TS <= p.TS+60_000 {
				out = append(out, fmt.Sprintf("%s|%s@%d", p.ID, a.ID, a.TS))
				n++
			}
		}
		if n == 0 {
			out = append(out, p.ID+"|-")
		}
	}
	slices.Sort(out)
	return out
}

// sjRule is the route: payments source, authorizations the stream.
func sjRule(name, payments, auths, sink, dlq, delivery string) string {
	return fmt.Sprintf(`route: %s
source: { topic: %s, format: json, event_time: value.ts, watermark: 15m, idle_timeout: 2m }
sink: { topic: %s, delivery: %s }
dead_letter: %s
checkpoint_interval: 200ms
steps:
  - join:
      stream: { topic: %s, event_time: value.ts, format: json }
      on: value.auth_id
      other: value.id
      within: { before: 5m, after: 1m }
      grace: 30s
      kind: left
      as: auth
  - map:
      payment: value.id
      amount: value.amount
      auth: auth?.id
      auth_ts: auth?.ts
      approved: auth?.approved
`, name, payments, sink, delivery, dlq, auths)
}

// sjProduce writes payments and authorizations through the proxy with a
// real client, with random keys (so each lands on any partition).
func sjProduce(t *testing.T, bootstrap, payments, auths string, ps []sjPayment, as []sjAuth) {
	t.Helper()
	cl := NewClient(t, []string{bootstrap}, kgo.ProducerLinger(0))
	defer cl.Close()
	var rs []*kgo.Record
	for i := range max(len(ps), len(as)) {
		if i < len(as) {
			b, _ := json.Marshal(as[i])
			rs = append(rs, &kgo.Record{Topic: auths, Key: srRandKey(), Value: b})
		}
		if i < len(ps) {
			b, _ := json.Marshal(ps[i])
			rs = append(rs, &kgo.Record{Topic: payments, Key: srRandKey(), Value: b})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// sjFlush writes a record far ahead on every partition of both topics:
// the watermark passes every window, and the unmatched payments are
// emitted. Their keys match nothing, and they are left out of the check.
func sjFlush(t *testing.T, seeds []string, payments, auths string, parts int) {
	t.Helper()
	cl := NewClient(t, seeds, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	defer cl.Close()
	var rs []*kgo.Record
	for p := range int32(parts) {
		b, _ := json.Marshal(sjPayment{ID: fmt.Sprintf("flush-%d", p), AuthID: "flush", TS: sjBase + 48*3_600_000})
		rs = append(rs, &kgo.Record{Topic: payments, Partition: p, Value: b})
		b, _ = json.Marshal(sjAuth{ID: "flush-auth", TS: sjBase + 48*3_600_000})
		rs = append(rs, &kgo.Record{Topic: auths, Partition: p, Value: b})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("flush: %v", err)
	}
}

// sjRow reads one sink value as "payment|auth-id@auth-ts".
func sjRow(t *testing.T, v []byte) string {
	t.Helper()
	var row struct {
		Payment string  `json:"payment"`
		Auth    *string `json:"auth"`
		AuthTS  *int64  `json:"auth_ts"`
	}
	if err := json.Unmarshal(v, &row); err != nil {
		t.Fatalf("sink value %q: %v", v, err)
	}
	if row.Auth == nil {
		return row.Payment + "|-"
	}
	return fmt.Sprintf("%s|%s@%d", row.Payment, *row.Auth, *row.AuthTS)
}

// sjConfluentRows reads the sink through the proxy with confluent-kafka
// (read_committed) until every partition's end.
func sjConfluentRows(t *testing.T, bootstrap, topic string) []string {
	t.Helper()
	RequireTool(t, "python3-confluent-kafka")
	var res struct {
		Values []string `json:"values"`
		Errors []string `json:"errors"`
	}
	runJSONClient(t, &res, 120*time.Second, DebianPython, "clients/confluent_consume.py",
		mustJSON(map[string]any{"bootstrap": bootstrap, "topic": topic, "group": "sj-confluent-" + topic, "isolation": "read_committed", "timeout": 90}))
	if len(res.Errors) > 0 {
		t.Fatalf("confluent-kafka: %v", res.Errors)
	}
	var out []string
	for _, v := range res.Values {
		out = append(out, sjRow(t, []byte(v)))
	}
	slices.Sort(out)
	return out
}

// sjWaitRows waits until the sink (read_committed, straight from the
// broker) holds at least n rows.
func sjWaitRows(t *testing.T, seeds []string, topic string, n int, timeout time.Duration) {
	t.Helper()
	srWait(t, timeout, fmt.Sprintf("%s holds %d rows", topic, n), func() error {
		if got := len(srRead(t, seeds, topic)); got < n {
			return fmt.Errorf("%d rows", got)
		}
		return nil
	})
}

// TestStreamJoinPaymentsAuthorizations: the binary matches payments to
// their authorizations within five minutes: confluent-kafka reading the
// sink through the proxy sees exactly the brute-force join, each row
// once; a payment that comes after the watermark has passed its window
// is a dead letter with reason late; the join's state is trimmed (the
// rtproxy_state_keys gauge does not keep every record).
func TestStreamJoinPaymentsAuthorizations(t *testing.T) {
	const parts = 4
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{"payments": parts, "authorizations": parts, "payments.authorized": 2, "payments.dlq": 1}})
	rules := t.TempDir()
	WriteRuleFile(t, rules, "pa.yaml", sjRule("payments-authorized", "payments", "authorizations", "payments.authorized", "payments.dlq", "at_least_once"))
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules, StateDir: t.TempDir()})
	ps, as := sjData(0, 1500)
	want := sjWant(ps, as)
	sjProduce(t, p.Addr, "payments", "authorizations", ps, as)
	sjFlush(t, k.Addrs, "payments", "authorizations", parts)
	sjWaitRows(t, k.Addrs, "payments.authorized", len(want), 120*time.Second)
	got := sjConfluentRows(t, p.Addr, "payments.authorized")
	AssertSameSet(t, "payments.authorized", got, want)
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d: a row repeats", len(got), len(want))
	}
	// Late: a payment half an hour behind a watermark two days ahead.
	late, _ := sjData(9000, 1)
	sjProduce(t, p.Addr, "payments", "authorizations", late, nil)
	srWait(t, 30*time.Second, "the late payment in the dead-letter topic", func() error {
		for _, r := range srRead(t, k.Addrs, "payments.dlq") {
			var v sjPayment
			_ = json.Unmarshal(r.Value, &v)
			if v.ID == late[0].ID {
				reason := ""
				for _, h := range r.Headers {
					if h.Key == "rtproxy-reason" {
						reason = string(h.Value)
					}
				}
				if reason != "late" {
					return fmt.Errorf("dead letter with reason %q", reason)
				}
				return nil
			}
		}
		return fmt.Errorf("not yet")
	})
}

// TestStreamJoinThreeInstancesKill: three instances share a stream join;
// one is SIGKILLed while the first half of the input is processed, the
// second half follows, and a fourth instance joins. Exactly once, a
// read_committed reader sees the brute-force join exactly: no row lost,
// none repeated. At least once, it sees every row, and a row more than
// once only as a repeat of the replay after the kill.
func TestStreamJoinThreeInstancesKill(t *testing.T) {
	for _, delivery := range []string{"exactly_once", "at_least_once"} {
		t.Run(delivery, func(t *testing.T) { sjThreeInstancesKill(t, delivery) })
	}
}

func sjThreeInstancesKill(t *testing.T, delivery string) {
	const parts = 4
	src, auths := "pay3-"+delivery[:2], "auth3-"+delivery[:2]
	r := srRoute{Name: src + "-join", Source: src, Sink: src + ".out", DLQ: src + ".dlq", Keyed: true}
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{src: parts, auths: parts, r.Sink: 2, r.DLQ: 1}})
	rules := t.TempDir()
	WriteRuleFile(t, rules, r.Name+".yaml", sjRule(r.Name, src, auths, r.Sink, r.DLQ, delivery))
	procs := srStartProxies(t, k, rules, 3)
	topics := srGroupTopics(t, k.Addrs, r)
	topics[auths] = parts
	srWaitOwned(t, r, topics, procs, 120*time.Second)
	ps1, as1 := sjData(0, 1000)
	ps2, as2 := sjData(1000, 1000)
	want := sjWant(append(ps1, ps2...), append(as1, as2...))
	sjProduce(t, k.Addrs[0], src, auths, ps1, as1)
	sjWaitRows(t, k.Addrs, r.Sink, 20, 120*time.Second)
	procs[0].Kill()
	t.Log("SIGKILL instance 0")
	sjProduce(t, k.Addrs[0], src, auths, ps2, as2)
	d := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules, StateDir: t.TempDir()})
	srWaitOwned(t, r, topics, []*Proxy{procs[1], procs[2], d}, 120*time.Second)
	sjFlush(t, k.Addrs, src, auths, parts)
	sjWaitRows(t, k.Addrs, r.Sink, len(want), 180*time.Second)
	var got []string
	for _, rec := range srRead(t, k.Addrs, r.Sink) {
		got = append(got, sjRow(t, rec.Value))
	}
	slices.Sort(got)
	distinct := slices.Compact(slices.Clone(got))
	AssertSameSet(t, r.Sink, distinct, want)
	if delivery == "exactly_once" && len(got) != len(want) {
		t.Fatalf("%d rows, want %d: exactly once, a row repeats", len(got), len(want))
	}
	t.Logf("%d rows, %d distinct (%d repeats after the kill)", len(got), len(distinct), len(got)-len(distinct))
	if delivery == "exactly_once" {
		AssertSameSet(t, "confluent-kafka "+r.Sink, sjConfluentRows(t, d.Addr, r.Sink), want)
	}
}
