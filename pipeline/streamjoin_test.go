package pipeline

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rtproxy/rtproxy/rules"
)

// streamJoinRoute matches payments to authorizations within 5 minutes
// before and 1 minute after, emitting the unmatched of both sides.
const streamJoinRoute = `route: pay
source: { topic: payments, event_time: value.ts, watermark: 2s, idle_timeout: 1s }
sink: { topic: pay.out }
dead_letter: pay.dlq
steps:
  - join:
      stream: { topic: auths, event_time: value.ts }
      on: value.auth_id
      other: value.id
      within: { before: 5m, after: 1m }
      grace: 30s
      kind: %s
      as: auth
  - map:
      p: value?.id
      a: auth?.aid
`

func loadStreamJoinRoute(t testing.TB, kind string) *rules.Route {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, "pay.yaml")
	if err := os.WriteFile(p, fmt.Appendf(nil, streamJoinRoute, kind), 0o644); err != nil {
		t.Fatal(err)
	}
	def, err := rules.LoadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return def
}

// sjInput is one record of either topic in the pipeline's reference test.
type sjInput struct {
	auth bool
	part int32
	id   string
	key  string
	t    int64
}

// sjReference is the brute-force result of the route above on ins, in
// the order the Driver gets them: the watermark when a record arrives is
// the minimum over the partitions of both topics of their highest event
// time before it, less source.watermark (none before every partition has
// a record); a record more than grace behind it is late; every pair of
// accepted records with equal keys within the interval is an output, and
// (outer) every accepted record without a partner too.
func sjReference(ins []sjInput, parts int, kind string) (out, late []string) {
	const lateness, grace, before, after = 2000, 30_000, 300_000, 60_000
	maxEv := map[string]int64{}
	wm, has := int64(0), false
	var pays, auths []sjInput
	for _, in := range ins {
		if len(maxEv) == 2*parts {
			low := int64(1 << 62)
			for _, v := range maxEv {
				low = min(low, v)
			}
			if c := low - lateness; !has || c > wm {
				wm, has = c, true
			}
		}
		slot := fmt.Sprint(in.auth, in.part)
		if v, ok := maxEv[slot]; !ok || in.t > v {
			maxEv[slot] = in.t
		}
		switch {
		case has && in.t < wm-grace:
			late = append(late, in.id)
		case in.auth:
			auths = append(auths, in)
		default:
			pays = append(pays, in)
		}
	}
	mp, ma := map[string]bool{}, map[string]bool{}
	for _, p := range pays {
		for _, a := range auths {
			if p.key == a.key && p.t-before <= a.t && a.t <= p.t+after {
				out = append(out, p.id+"|"+a.id)
				mp[p.id], ma[a.id] = true, true
			}
		}
	}
	if kind != "inner" {
		for _, p := range pays {
			if !mp[p.id] {
				out = append(out, p.id+"|-")
			}
		}
	}
	if kind == "outer" {
		for _, a := range auths {
			if !ma[a.id] {
				out = append(out, "-|"+a.id)
			}
		}
	}
	slices.Sort(out)
	slices.Sort(late)
	return out, late
}

func sjInputs(rng *rand.Rand, n, parts int) []sjInput {
	now := int64(1767225600000)
	var ins []sjInput
	for i := range n {
		now += rng.Int64N(20_000)
		t := now - rng.Int64N(90_000)
		if rng.IntN(20) == 0 {
			t = now - 10*60_000 // late
		}
		in := sjInput{auth: rng.IntN(2) == 0, part: int32(rng.IntN(parts)), key: fmt.Sprint("k", rng.IntN(8)), t: t}
		in.id = fmt.Sprint("p", i)
		if in.auth {
			in.id = fmt.Sprint("a", i)
		}
		ins = append(ins, in)
	}
	return ins
}

// TestStreamJoinDriverMatchesReference: the route's join through its
// tasks (the source and the second topic keyed into the join's
// repartition topic, the watermark over the partitions of both) gives on
// random out-of-order records of both topics, with late ones, exactly the
// outputs and late dead letters of the brute-force reference.
func TestStreamJoinDriverMatchesReference(t *testing.T) {
	const parts = 2
	for seed := range uint64(6) {
		kind := []string{"inner", "left", "outer"}[seed%3]
		rng := rand.New(rand.NewPCG(seed, 2727))
		ins := sjInputs(rng, 200, parts)
		d, err := NewDriver(loadStreamJoinRoute(t, kind), DriverConfig{Partitions: parts})
		if err != nil {
			t.Fatal(err)
		}
		if got := d.StreamTopics(); !slices.Equal(got, []string{"auths"}) {
			t.Fatalf("stream topics %v", got)
		}
		for _, in := range ins {
			topic := "payments"
			v, _ := json.Marshal(map[string]any{"id": in.id, "auth_id": in.key, "ts": in.t})
			if in.auth {
				// `other` reads the authorization's id (the key); aid names
				// the record.
				topic = "auths"
				v, _ = json.Marshal(map[string]any{"id": in.key, "aid": in.id, "ts": in.t})
			}
			if err := d.SendTo(topic, DriverInput{Partition: in.part, Offset: -1, Key: []byte(in.id), Value: v}); err != nil {
				t.Fatal(err)
			}
		}
		d.AdvanceWatermark(time.UnixMilli(1767225600000 + 1e9))
		var out, late []string
		for _, o := range d.Outputs() {
			if o.DeadLetter {
				var v map[string]any
				_ = json.Unmarshal(o.Value, &v)
				reason := ""
				for _, h := range o.Headers {
					if h.Key == HeaderReason {
						reason = string(h.Value)
					}
				}
				if reason != "late" {
					t.Fatalf("seed %d: dead letter %s: %s", seed, reason, o.Value)
				}
				id := fmt.Sprint(v["id"])
				if _, isAuth := v["aid"]; isAuth {
					id = fmt.Sprint(v["aid"])
				}
				late = append(late, id)
				continue
			}
			var v struct{ P, A *string }
			if err := json.Unmarshal(o.Value, &v); err != nil {
				t.Fatal(err)
			}
			l, r := "-", "-"
			if v.P != nil {
				l = *v.P
			}
			if v.A != nil {
				r = *v.A
			}
			out = append(out, l+"|"+r)
		}
		d.Close()
		wantOut, wantLate := sjReference(ins, parts, kind)
		slices.Sort(out)
		slices.Sort(late)
		if !slices.Equal(out, wantOut) {
			t.Fatalf("seed %d %s: outputs\n got %d %v\nwant %d %v", seed, kind, len(out), out, len(wantOut), wantOut)
		}
		if !slices.Equal(late, wantLate) {
			t.Fatalf("seed %d: late\n got %v\nwant %v", seed, late, wantLate)
		}
		if len(wantLate) == 0 || len(wantOut) == 0 {
			t.Fatalf("seed %d: the inputs exercise nothing (%d outputs, %d late)", seed, len(wantOut), len(wantLate))
		}
	}
}
