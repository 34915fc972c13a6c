package offsets

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestTrackerDataDriven runs testdata/tracker*: each `ops` block applies its
// lines in order to one tracker per file, then prints every partition's
// DoneOffset and how many records are still in flight.
//
//	start P FROM
//	begin P OFF...      (OFF may be a range A-B, inclusive)
//	done P OFF...
//	remove P
//
// `reset` starts over with a new tracker.
func TestTrackerDataDriven(t *testing.T) {
	ran := 0
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		if !strings.Contains(path, "tracker") || strings.Contains(path, "/fuzz/") {
			t.Skip()
		}
		ran++
		tr := NewTracker()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "reset":
				tr = NewTracker()
				return ""
			case "ops":
				for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
					if err := applyOp(tr, line); err != nil {
						d.Fatalf(t, "%s: %v", line, err)
					}
				}
				return formatTracker(tr)
			default:
				d.Fatalf(t, "unknown command %q", d.Cmd)
				return ""
			}
		})
	})
	if ran == 0 {
		t.Fatal("no data-driven test files ran: testdata is missing them or the name filter matches none")
	}
}

func applyOp(tr *Tracker, line string) error {
	f := strings.Fields(line)
	if len(f) < 2 {
		return fmt.Errorf("want OP PARTITION ...")
	}
	p64, err := strconv.ParseInt(f[1], 10, 32)
	if err != nil {
		return err
	}
	p := int32(p64)
	var offs []int64
	for _, a := range f[2:] {
		lo, hi, isRange := strings.Cut(a, "-")
		from, err := strconv.ParseInt(lo, 10, 64)
		if err != nil {
			return err
		}
		to := from
		if isRange {
			if to, err = strconv.ParseInt(hi, 10, 64); err != nil {
				return err
			}
		}
		for o := from; o <= to; o++ {
			offs = append(offs, o)
		}
	}
	switch f[0] {
	case "start":
		if len(offs) != 1 {
			return fmt.Errorf("start takes one offset")
		}
		tr.Start(p, offs[0])
	case "begin":
		for _, o := range offs {
			tr.Begin(p, o)
		}
	case "done":
		for _, o := range offs {
			tr.Done(p, o)
		}
	case "remove":
		tr.Remove(p)
	default:
		return fmt.Errorf("unknown op %q", f[0])
	}
	return nil
}

func formatTracker(tr *Tracker) string {
	snap := tr.Snapshot()
	parts := make([]int32, 0, len(snap))
	for p := range snap {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	var b strings.Builder
	for _, p := range parts {
		if got := tr.DoneOffset(p); got != snap[p] {
			fmt.Fprintf(&b, "MISMATCH DoneOffset=%d Snapshot=%d\n", got, snap[p])
		}
		fmt.Fprintf(&b, "%d: done=%d inflight=%d\n", p, snap[p], tr.InFlight(p))
	}
	if len(parts) == 0 {
		b.WriteString("(none)\n")
	}
	return b.String()
}

// TestTrackerRandomOrder checks the tracker against a direct computation
// (lowest offset not done) for many random completion orders, with gaps.
func TestTrackerRandomOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 200; iter++ {
		tr := NewTracker()
		from := int64(rng.IntN(1000))
		tr.Start(3, from)
		var begun []int64
		o := from
		for i := 0; i < 300; i++ {
			o += 1 + int64(rng.IntN(3)) // gaps of up to 2
			begun = append(begun, o)
		}
		done := make(map[int64]bool)
		order := rng.Perm(len(begun))
		next := 0 // begun[:next] have been begun
		for _, idx := range order {
			for next <= idx {
				tr.Begin(3, begun[next])
				next++
			}
			tr.Done(3, begun[idx])
			done[begun[idx]] = true
			want := begun[next-1] + 1
			for _, b := range begun[:next] {
				if !done[b] {
					want = b
					break
				}
			}
			if got := tr.DoneOffset(3); got != want {
				t.Fatalf("iter %d: after done %d, DoneOffset = %d, want %d", iter, begun[idx], got, want)
			}
		}
		if got, want := tr.DoneOffset(3), begun[len(begun)-1]+1; got != want {
			t.Fatalf("iter %d: all done: DoneOffset = %d, want %d", iter, got, want)
		}
		if n := tr.InFlight(3); n != 0 {
			t.Fatalf("iter %d: %d still in flight after all done", iter, n)
		}
	}
}

// TestTrackerConcurrent begins from one goroutine per partition and
// completes from others, as the reader and the sink's ack callbacks do;
// run with -race.
func TestTrackerConcurrent(t *testing.T) {
	tr := NewTracker()
	const parts, n = 4, 20000
	var wg sync.WaitGroup
	for p := int32(0); p < parts; p++ {
		tr.Start(p, 0)
		ch := make(chan int64, 256)
		wg.Add(2)
		go func() {
			defer wg.Done()
			for o := int64(0); o < n; o++ {
				tr.Begin(p, o)
				ch <- o
			}
			close(ch)
		}()
		go func() {
			defer wg.Done()
			var held []int64
			for o := range ch {
				held = append(held, o)
				if len(held) == 8 { // complete in reverse, batches of 8
					for i := len(held) - 1; i >= 0; i-- {
						tr.Done(p, held[i])
					}
					held = held[:0]
				}
				_ = tr.Snapshot()
			}
			for _, o := range held {
				tr.Done(p, o)
			}
		}()
	}
	wg.Wait()
	snap := tr.Snapshot()
	for p := int32(0); p < parts; p++ {
		if snap[p] != n {
			t.Errorf("partition %d: done offset %d, want %d", p, snap[p], n)
		}
	}
}

func BenchmarkTrackerBeginDone(b *testing.B) {
	tr := NewTracker()
	tr.Start(0, 0)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		tr.Begin(0, int64(i))
		tr.Done(0, int64(i))
	}
}
