package pipeline

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rtproxy/rtproxy/internal/benchkit"
	"github.com/rtproxy/rtproxy/rules"
)

// BenchmarkProcessSource runs records of 1 KiB JSON through a stateless
// route (filter + set) with the route's own per-record code
// (processSource, the chain, output), by way of the Driver: no broker, so
// what it measures is the route's work per record.
func BenchmarkProcessSource(b *testing.B) {
	dir := b.TempDir()
	p := filepath.Join(dir, "bench.yaml")
	if err := os.WriteFile(p, []byte(`route: bench
source: { topic: in, format: json }
sink: { topic: out }
steps:
  - filter: value.amount >= 0
  - set: { tag: '"seen"' }
`), 0o600); err != nil {
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
	if out += len(d.out); out != i {
		b.Fatalf("%d outputs for %d records", out, i)
	}
}
