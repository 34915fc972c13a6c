package integration

import (
	"testing"
	"time"

	"github.com/rtproxy/rtproxy/test/shapes"
)

// TestShapesThreeInstances: the differential test of route shapes
// (test/shapes) through three rtproxy binaries sharing each route, with
// the live variants' fixed seeds: once the group has divided every source
// and repartition partition, the inputs are produced and every output and
// dead letter must equal the brute-force reference's (what the flush
// records cause left out), each once.
func TestShapesThreeInstances(t *testing.T) {
	type run struct {
		name string
		gen  func() *shapes.Shape
	}
	runs := []run{
		{"4", func() *shapes.Shape { return shapes.Generate(4, true, 3) }},
		{"82", func() *shapes.Shape { return shapes.Generate(82, true, 3) }},
		// Two chained session windows and a drop_duplicates, 4 partitions:
		// sessions merged from records of every partition.
		{"sessions-113", func() *shapes.Shape { return shapes.GenerateSessions(113, true, 3) }},
	}
	for _, rn := range runs {
		t.Run(rn.name, func(t *testing.T) {
			s := rn.gen()
			k := StartKfake(t, KfakeOpts{Topics: map[string]int{s.Topic: s.Partitions, s.Sink: 2, s.DLQ: 1}})
			rules := t.TempDir()
			WriteRuleFile(t, rules, s.Name+".yaml", s.YAML())
			ps := srStartProxies(t, k, rules, 3)
			r := srRoute{Name: s.Name, Source: s.Topic, Sink: s.Sink, DLQ: s.DLQ, Keyed: true}
			srWaitOwned(t, r, s.RepartitionTopics(), ps, 90*time.Second)
			got := shapes.RunLive(t, k.Addrs, s)
			if d := shapes.Diff(s.Expected(), got); d != "" {
				t.Fatalf("%s\n%s", s.Describe(), d)
			}
			t.Logf("%d inputs over %d partitions, %d outputs and dead letters as the reference's", len(s.Inputs), s.Partitions, len(got))
		})
	}
}
