package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/rtproxy/rtproxy/test/shapes"
)

// TestShapesThreeInstances: the differential test of route shapes
// (test/shapes) through three rtproxy binaries sharing each route, with
// the live variants' fixed seeds: once the group has divided every source
// and repartition partition, the inputs are produced and every output and
// dead letter must equal the brute-force reference's (what the flush
// records cause left out), each once, in the sink topic the reference
// routes it to (4 and 82 end in a switch right after a window, 12 in one
// after a join in a table, sessions-27 in one right after a session
// window), and the switch's drops counted.
func TestShapesThreeInstances(t *testing.T) {
	type run struct {
		name string
		gen  func() *shapes.Shape
	}
	runs := []run{
		{"4", func() *shapes.Shape { return shapes.Generate(4, true, 3) }},
		{"82", func() *shapes.Shape { return shapes.Generate(82, true, 3) }},
		{"12", func() *shapes.Shape { return shapes.Generate(12, true, 3) }},
		// Two chained session windows and a drop_duplicates, 4 partitions:
		// sessions merged from records of every partition.
		{"sessions-113", func() *shapes.Shape { return shapes.GenerateSessions(113, true, 3) }},
		{"sessions-27", func() *shapes.Shape { return shapes.GenerateSessions(27, true, 3) }},
	}
	for _, rn := range runs {
		t.Run(rn.name, func(t *testing.T) {
			s := rn.gen()
			topics := map[string]int{s.Topic: s.Partitions, s.DLQ: 1}
			for _, st := range s.SinkTopics() {
				topics[st] = 2
			}
			k := StartKfake(t, KfakeOpts{Topics: topics})
			rules := t.TempDir()
			for name, text := range s.Files() {
				WriteRuleFile(t, rules, name, text) // before the rule file that reads it
			}
			WriteRuleFile(t, rules, s.Name+".yaml", s.YAML())
			ps := srStartProxies(t, k, rules, 3)
			r := srRoute{Name: s.Name, Source: s.Topic, Sink: s.Sink, DLQ: s.DLQ, Keyed: true}
			srWaitOwned(t, r, s.RepartitionTopics(), ps, 90*time.Second)
			got := shapes.RunLive(t, k.Addrs, s)
			if d := shapes.Diff(s.Expected(), got); d != "" {
				t.Fatalf("%s\n%s", s.Describe(), d)
			}
			if s.Branches != nil {
				// Every instance's count of records no branch took; the
				// flush records' own drops may be among them.
				all, flush := s.SwitchDrops()
				step := fmt.Sprintf(`step="%d:switch"`, len(s.Steps)-1)
				var n float64
				for _, p := range ps {
					v, _ := srMetric(srMustMetrics(t, p), "rtproxy_pipeline_records_dropped_total", `route="`+s.Name+`"`, step)
					n += v
				}
				if n < float64(all-flush) || n > float64(all) {
					t.Errorf("the switch dropped %v records; the reference's %d, %d of them caused by flush records", n, all, flush)
				}
			}
			t.Logf("%d inputs over %d partitions, %d outputs and dead letters as the reference's, sinks %v", len(s.Inputs), s.Partitions, len(got), s.SinkTopics())
		})
	}
}
