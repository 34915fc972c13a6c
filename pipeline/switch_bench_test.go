package pipeline

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rtproxy/rtproxy/internal/benchkit"
	"github.com/rtproxy/rtproxy/rules"
)

// BenchmarkSwitchSinks runs 1 KiB JSON records through a stateless route
// (filter + set) writing to one sink, and through the same route ending in
// a switch to three sinks (two conditions, each with its own key on one),
// side by side, by way of the Driver: the route's work per record, with
// no broker, so the switch's share is as large as it can be
// (docs/BENCHMARKS.md, "switch with 3 sinks"). Run with -cpu 1: the
// process CPU time per record (cpu-ns/op) is then the per-core cost.
func BenchmarkSwitchSinks(b *testing.B) {
	const head = `route: bench
source: { topic: in, format: json }
steps:
  - filter: value.amount >= 0
  - set: { tag: '"seen"' }
`
	for _, c := range []struct{ name, rule string }{
		{"single-sink", head + "sink: { topic: out }\n"},
		{"switch-3-sinks", head + `  - switch:
      - when: value.amount > 300
        sink: { topic: out.large }
      - when: value.amount > 100
        sink: { topic: out.mid }
      - sink: { topic: out.rest }
`},
	} {
		b.Run(c.name, func(b *testing.B) { benchRoute(b, c.rule) })
	}
}

func benchRoute(b *testing.B, rule string) {
	p := filepath.Join(b.TempDir(), "bench.yaml")
	if err := os.WriteFile(p, []byte(rule), 0o600); err != nil {
		b.Fatal(err)
	}
	def, err := rules.LoadFile(p)
	if err != nil {
		b.Fatal(err)
	}
	d, err := NewDriver(def, DriverConfig{Partitions: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	in := benchkit.Inputs(1024)
	b.SetBytes(1024)
	b.ReportAllocs()
	cpu0 := benchkit.CPUNow()
	i, out := 0, 0
	for b.Loop() {
		if err := d.Send(DriverInput{Offset: -1, Value: in[i%len(in)]}); err != nil {
			b.Fatal(err)
		}
		i++
		if len(d.out) >= 4096 {
			out += len(d.out)
			d.out = d.out[:0]
		}
	}
	benchkit.RecPerSec(b, cpu0)
	if out += len(d.out); out != i {
		b.Fatalf("%d outputs for %d records", out, i)
	}
}
