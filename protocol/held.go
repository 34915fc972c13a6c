package protocol

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// heldBudget bounds the bytes of frames held whole in memory across every
// connection of the proxy. Most frames stream through a small buffer; a
// response that must be rewritten and is larger than the streaming
// threshold (a Fetch from v12 on carries broker endpoints at its end,
// KIP-951) is read whole first. Each such frame takes its size from the
// budget before its body is read and gives it back once written to the
// client. When the budget is used up, the frame waits, and its bytes stay
// in the broker's socket: TCP pushes back on the broker instead of the
// process growing. A frame larger than the whole budget takes all of it,
// alone, so nothing waits forever.
type heldBudget struct {
	max   int64
	gauge prometheus.Gauge
	waits prometheus.Counter

	mu      sync.Mutex
	used    int64
	peak    int64           // the most ever held at once (tests)
	waiters []chan struct{} // woken, all of them, by every release
}

// acquire takes n bytes (at most the whole budget), waiting while they
// are not free. It returns what it took, and false when done closed first.
func (b *heldBudget) acquire(n int64, done <-chan struct{}) (int64, bool) {
	if b.max <= 0 {
		return 0, true
	}
	n = min(n, b.max)
	counted := false
	for {
		b.mu.Lock()
		if b.used+n <= b.max {
			b.used += n
			b.peak = max(b.peak, b.used)
			b.mu.Unlock()
			b.gauge.Add(float64(n))
			return n, true
		}
		ch := make(chan struct{})
		b.waiters = append(b.waiters, ch)
		b.mu.Unlock()
		if !counted {
			b.waits.Inc()
			counted = true
		}
		select {
		case <-ch:
		case <-done:
			return 0, false
		}
	}
}

// tryAcquire takes n bytes when they are free now, without waiting.
func (b *heldBudget) tryAcquire(n int64) bool {
	if b.max <= 0 {
		return true
	}
	b.mu.Lock()
	if b.used+n > b.max {
		b.mu.Unlock()
		return false
	}
	b.used += n
	b.peak = max(b.peak, b.used)
	b.mu.Unlock()
	b.gauge.Add(float64(n))
	return true
}

// release gives back n bytes that acquire took.
func (b *heldBudget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	ws := b.waiters
	b.waiters = nil
	b.mu.Unlock()
	b.gauge.Sub(float64(n))
	for _, ch := range ws {
		close(ch)
	}
}

func (b *heldBudget) peakBytes() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.peak
}
