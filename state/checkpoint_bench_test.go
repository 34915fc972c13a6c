package state

import (
	"fmt"
	"testing"
)

// BenchmarkCheckpoint is the checkpoint path: n keys written to a route's
// namespace since the last checkpoint (new keys, 8-byte values), then one
// Checkpoint (freeze, one synced pebble batch with the keys, the step's
// meta, the offsets and the checkpoint record, commit). One iteration is
// one checkpoint; keys/s is the write rate it sustains.
func BenchmarkCheckpoint(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			db := openTest(b, b.TempDir())
			defer db.Close()
			kv := db.Namespace("bench", "s")
			val := []byte("12345678")
			var key []byte
			next := uint64(0)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				for range n {
					key = dedupKey(key, next)
					next++
					if err := kv.Set(key, val); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				if err := db.Checkpoint("bench", map[int32]int64{0: int64(next)}, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "keys/s")
		})
	}
}
