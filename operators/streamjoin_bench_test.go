package operators

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rtproxy/rtproxy/internal/benchkit"
	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/state"
)

// joinMembers are what a route that reads only the join key decodes of
// its own records (json-members, json-members-both), and, in
// json-members-both, of the stream's records too (a route whose steps
// after the join read nothing of `as`: StreamInput.Members is the
// `other` key). json-members decodes the stream's records whole, as every
// route did before StreamInput.Members.
var joinMembers = jsoncodec.Fields{"txn_id": {}}

// BenchmarkStreamJoin100kBuffered is the interval join of issue 27 at
// 100k buffered records per side: 1 KiB payment records on both sides,
// keyed by txn_id, every left record matched by the right record of the
// same key that follows it; event time advances 1 ms per pair and the
// watermark follows 1 s behind, so each side holds about
// (within + grace + 1 s) / 1 ms = 100k records. An op is one record of
// either side: decoded, its partners looked up in the state, buffered,
// the matched pair emitted and encoded, and what the watermark passed
// forgotten. Run:
//
//	go test -run '^$' -bench StreamJoin -benchmem -cpu 1 ./operators/
func BenchmarkStreamJoin100kBuffered(b *testing.B) {
	const perSide = 100_000
	within := Interval{Before: 90 * time.Second, After: 90 * time.Second}
	const grace = 9 * time.Second // + 1 s of watermark lag: 100 s per side
	in := benchkit.Inputs(4096)
	run := func(b *testing.B, mode string, kv KV, checkpoint func()) {
		j := NewStreamJoin(StreamInput{Topic: "auths"}, mustExpr(b, "value.txn_id"), mustExpr(b, "value.txn_id"),
			within, grace, JoinInner, "auth", kv)
		adv := j.(Timed)
		sink := sinkFor(strings.TrimSuffix(mode, "-both"))
		i := 0
		step := func() {
			pair := i / 2
			raw := in[i%len(in)]
			stampTxn(raw, pair%100_000_000)
			r := &Record{EventTime: int64(pair), Timestamp: int64(pair)}
			if mode == "json-members" && i%2 == 1 {
				// The stream's records decoded whole.
				decodeAs(b, "json-raw", r, raw, nil)
			} else if mode == "json-members-both" {
				decodeAs(b, "json-members", r, raw, joinMembers)
			} else {
				decodeAs(b, mode, r, raw, joinMembers)
			}
			if i%2 == 0 {
				j.Process(r, sink)
			} else {
				j.ProcessOther(r, sink)
			}
			i++
			if i%200 == 0 {
				adv.Advance(int64(i/2)-1000, sink)
			}
			if checkpoint != nil && i%pebbleCheckpointEvery == 0 {
				checkpoint()
			}
		}
		// Fill both sides to their steady state first.
		for range 2*perSide + 20_000 {
			step()
		}
		if checkpoint != nil {
			checkpoint()
		}
		runtime.GC()
		n0, _ := sink.counts()
		b.SetBytes(1024)
		b.ReportAllocs()
		gc0 := readGCStats()
		cpu0 := benchkit.CPUNow()
		for b.Loop() {
			step()
		}
		benchkit.RecPerSec(b, cpu0)
		gc0.report(b, cpu0)
		n, dead := sink.counts()
		if dead != 0 || n-n0 < b.N/2-1 || n-n0 > b.N/2+1 {
			b.Fatalf("%d pairs for %d records (dead %d), want one per two records", n-n0, b.N, dead)
		}
		if m, ok := kv.(*MemKV); ok {
			// Two keys per buffered record, and 'w', 'n'.
			if held := (m.Len() - 2) / 2; held < 2*perSide*9/10 || held > 2*perSide*11/10 {
				b.Fatalf("%d records buffered, want about %d", held, 2*perSide)
			}
		}
	}
	for _, mode := range []string{"json", "json-raw", "json-members", "json-members-both"} {
		b.Run(mode, func(b *testing.B) { run(b, mode, NewMemKV(), nil) })
	}
	for _, mode := range []string{"json-raw", "json-members-both"} {
		b.Run("pebble-"+mode, func(b *testing.B) {
			db, err := state.Open(b.TempDir(), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			n := int64(0)
			run(b, mode, db.Namespace("bench", "join"), func() {
				n++
				if err := db.Checkpoint("bench", map[int32]int64{0: n}, nil); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}
