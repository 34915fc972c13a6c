package protocol

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// benchViewValue is make bench-proxy's view record (test/bench/proxy):
// ~1 KiB of JSON, one in ten with status "test".
func benchViewValue(r *rand.Rand, i int) []byte {
	status := "ok"
	if i%10 == 0 {
		status = "test"
	}
	words := []string{"payment", "settled", "refund", "merchant", "card", "present", "online", "batch", "retry", "fee",
		"currency", "EUR", "USD", "approved", "declined", "terminal", "region", "north", "south", "customer"}
	var note strings.Builder
	for note.Len() < 820 {
		note.WriteString(words[r.IntN(len(words))])
		note.WriteByte(' ')
	}
	return fmt.Appendf(nil, `{"id":%d,"status":%q,"card":"4111-1111-1111-%04d","email":"user%d@example.com","amount":%d.%02d,"note":%q}`,
		i, status, r.IntN(10000), i, r.IntN(100000), r.IntN(100), note.String())
}

// maskView is the bench's view done on bytes (no JSON decode): it drops
// records holding "status":"test" and masks the card's first 15
// characters, so that the benchmark measures the fetch path's own work
// (decompress, parse, re-encode, compress), not the rule engine's.
type maskView struct{ buf []byte }

func (*maskView) Name() string  { return "vb.view" }
func (*maskView) Topic() string { return "vb" }
func (v *maskView) Apply(r *ViewRecord) (bool, error) {
	if bytes.Contains(r.Value, []byte(`"status":"test"`)) {
		return false, nil
	}
	i := bytes.Index(r.Value, []byte(`"card":"`))
	if i < 0 {
		return true, nil
	}
	out := append([]byte(nil), r.Value...)
	for j := i + 8; j < i+8+15 && j < len(out); j++ {
		out[j] = '*'
	}
	r.Value = out
	return true, nil
}

// benchViewBatches is n bench records in batches of per, zstd as franz-go
// writes them.
func benchViewBatches(tb testing.TB, n, per int) []byte {
	rng := rand.New(rand.NewPCG(1, 2))
	var out []byte
	for at := 0; at < n; at += per {
		vals := make([]string, 0, per)
		for i := at; i < min(at+per, n); i++ {
			vals = append(vals, string(benchViewValue(rng, i)))
		}
		out = append(out, viewBatchSeed(tb, int64(2*at), kgo.ZstdCompression(), vals...)...)
	}
	return out
}

// BenchmarkViewPartitionZstd: one partition of 4,000 bench records in
// batches of 1,000 (zstd) through a view that filters and masks on
// bytes: the fetch path's cost per record, without the rule engine's, in
// line and on the workers of view_par.go (as many as GOMAXPROCS).
func BenchmarkViewPartitionZstd(b *testing.B) {
	const n = 4000
	in := benchViewBatches(b, n, 1000)
	for _, workers := range []int{1, viewWorkers(4)} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			var dst []byte
			b.SetBytes(int64(n * 1024))
			b.ReportAllocs()
			newMeter := func() *decodeMeter { return testMeter(64<<20, 1<<20) }
			cpu0 := processCPU()
			for range b.N {
				var c viewCounts
				var err error
				if workers > 1 {
					dst, err = viewPartitionOn(workers, &maskView{}, in, newMeter, &viewScratch{}, &c)
				} else {
					dst, err = viewPartition(dst[:0], &maskView{}, 0, in, newMeter(), &viewScratch{}, &c)
				}
				if err != nil {
					b.Fatal(err)
				}
				if c.kept != n-n/10 || c.errors != 0 {
					b.Fatalf("kept %d, errors %d", c.kept, c.errors)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/record")
			// CPU time holds still on a shared machine, where wall time
			// does not.
			b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N*n), "cpu-ns/record")
		})
	}
}
