package pipeline

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// streamJoinWindowRoute counts, per minute of event time, the pairs and
// the records that matched nothing of a stream join.
const streamJoinWindowRoute = `route: paywin
source: { topic: payments, event_time: value.ts, watermark: 2s, idle_timeout: 1s }
sink: { topic: paywin.out }
dead_letter: paywin.dlq
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
      m: 'auth == nil ? "unmatched" : (value == nil ? "orphan" : "matched")'
  - window: { kind: tumbling, size: 1m, key: value.m, aggregate: { n: count() } }
`

// TestStreamJoinThenWindowCountsEveryRow: a window after a stream join
// counts every row the join emits, the pairs and (left, outer) the
// records that matched nothing, in the minute of their event time, as a
// brute-force count of the reference join's rows says; none of them is a
// late dead letter at the window. The join emits a record that matched
// nothing only once the watermark has passed its window plus grace, so
// the steps after it see the watermark held back by that much.
func TestStreamJoinThenWindowCountsEveryRow(t *testing.T) {
	const parts = 2
	for seed := range uint64(6) {
		kind := []string{"inner", "left", "outer"}[seed%3]
		rng := rand.New(rand.NewPCG(seed, 4141))
		ins := sjInputs(rng, 200, parts)
		d, err := NewDriver(loadJoinRouteOf(t, streamJoinWindowRoute, kind), DriverConfig{Partitions: parts})
		if err != nil {
			t.Fatal(err)
		}
		byID := map[string]sjInput{}
		for _, in := range ins {
			byID[in.id] = in
		}
		sendSJInputs(t, d, ins)
		d.AdvanceWatermark(time.UnixMilli(1767225600000 + 1e9))
		got := map[string]int{}
		lateAtWindow := 0
		for _, o := range d.Outputs() {
			if o.DeadLetter {
				step := ""
				for _, h := range o.Headers {
					if h.Key == "rtproxy-step" {
						step = string(h.Value)
					}
				}
				if step != "0:join" {
					lateAtWindow++
				}
				continue
			}
			var row struct {
				Key         string `json:"key"`
				WindowStart int64  `json:"window_start"`
				N           int    `json:"n"`
			}
			if err := json.Unmarshal(o.Value, &row); err != nil {
				t.Fatal(err)
			}
			got[fmt.Sprint(row.Key, "@", row.WindowStart)] += row.N
		}
		d.Close()
		wantRows, _ := sjReference(ins, parts, kind)
		want := map[string]int{}
		for _, r := range wantRows {
			l, a, _ := strings.Cut(r, "|")
			var m string
			var ev int64
			switch {
			case a == "-":
				m, ev = "unmatched", byID[l].t
			case l == "-":
				m, ev = "orphan", byID[a].t
			default:
				m, ev = "matched", max(byID[l].t, byID[a].t)
			}
			want[fmt.Sprint(m, "@", ev-ev%60_000)]++
		}
		if lateAtWindow > 0 || !maps.Equal(got, want) {
			t.Fatalf("seed %d %s: %d late dead letters at the window; counts\n got %v\nwant %v", seed, kind, lateAtWindow, got, want)
		}
	}
}
