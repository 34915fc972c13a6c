package benchkit

import (
	"context"
	"log"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Latency is one latency run of a pipeline benchmark: Prod writes
// SendRecords of Size bytes to Topic at Rate records/s (paced by elapsed
// time, so a late tick does not lower the rate) for Warmup+Duration, and
// Cons, which reads the outputs, measures receive time − send_ns of every
// output sent after the warmup.
type Latency struct {
	Prod, Cons *kgo.Client
	Topic      string
	Rate, Size int
	Warmup     time.Duration
	Duration   time.Duration
	// Tail bounds the wait, after the last record is sent, for the
	// outputs of the measured records.
	Tail time.Duration
	// OnMeasure, when set, is called as the measured window begins (CPU
	// readings).
	OnMeasure func()
}

// Run runs l. Cons must already hold its partitions at their ends. It
// returns the sorted latencies, and the records sent in the measured
// window.
func (l Latency) Run() (lats []time.Duration, sent int) {
	start := time.Now()
	from := start.Add(l.Warmup).UnixNano()
	end := start.Add(l.Warmup + l.Duration)
	var mu sync.Mutex
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			fs := l.Cons.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			now := time.Now().UnixNano()
			mu.Lock()
			fs.EachRecord(func(r *kgo.Record) {
				if s, ok := SendNS(r.Value); ok && s >= from {
					lats = append(lats, time.Duration(now-s))
				}
			})
			mu.Unlock()
		}
	}()
	measuring := false
	id := 0
	tick := time.NewTicker(time.Millisecond)
	for now := range tick.C {
		if now.After(end) {
			break
		}
		owed := int(now.Sub(start).Seconds() * float64(l.Rate))
		for ; id < owed; id++ {
			s := time.Now().UnixNano()
			if s >= from {
				if !measuring && l.OnMeasure != nil {
					l.OnMeasure()
				}
				measuring = true
				sent++
			}
			l.Prod.Produce(context.Background(), SendRecord(l.Topic, id, s, l.Size), func(_ *kgo.Record, err error) {
				if err != nil {
					log.Printf("%s: produce: %v", l.Topic, err)
				}
			})
		}
	}
	tick.Stop()
	if err := l.Prod.Flush(context.Background()); err != nil {
		log.Fatal(err)
	}
	deadline := time.Now().Add(l.Tail)
	for time.Now().Before(deadline) {
		mu.Lock()
		got := len(lats)
		mu.Unlock()
		if got >= sent {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	slices.Sort(lats)
	return lats, sent
}

// Quantile is quantile q of sorted latencies (0 for none).
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(int(q*float64(len(sorted))), len(sorted)-1)]
}
