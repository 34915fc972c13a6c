package protocol

import (
	"sort"
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
	// growing are the holds of requests still arriving (reserved as their
	// bytes arrive, hold.grow): what each holds and still needs
	// decides whether a grant is safe.
	growing map[*hold]struct{}
}

// A hold is the reservation of one request read whole from a client
// (a guarded or tapped Produce). It grows as the request's bytes arrive,
// so that a client that announces a large request and sends little of it
// holds only what it sent (issue 25, finding 8): before, the whole
// announced size was taken before the first byte of the body was read,
// and four slow senders could hold the whole budget for nothing, with
// every other produce waiting behind them.
//
// Growing reservations could deadlock: two requests each holding half the
// budget and each needing more. A grant is therefore made only when it
// completes its request (which then gives everything back once forwarded,
// needing nothing more), or when afterwards every request still arriving
// can complete in some order, each with what the others give back
// (the banker's check, smallest need first). A small request that fits
// is never kept waiting by large ones that are still arriving.
type hold struct {
	b          *heldBudget
	need, held int64 // need: the request's size, at most the whole budget
}

// begin starts the hold of a request of total bytes.
func (b *heldBudget) begin(total int64) *hold {
	h := &hold{b: b, need: min(total, b.max)}
	if b.max <= 0 {
		return h
	}
	b.mu.Lock()
	if b.growing == nil {
		b.growing = make(map[*hold]struct{})
	}
	b.growing[h] = struct{}{}
	b.mu.Unlock()
	return h
}

// grow takes n more bytes for the request (never past its need), waiting
// until the grant is safe; false when done closed first.
func (h *hold) grow(n int64, done <-chan struct{}) bool {
	b := h.b
	if b.max <= 0 {
		return true
	}
	counted := false
	for {
		b.mu.Lock()
		n = min(n, h.need-h.held)
		if n <= 0 {
			b.mu.Unlock()
			return true
		}
		if b.used+n <= b.max && (h.held+n == h.need || b.safeAfter(h, n)) {
			b.used += n
			h.held += n
			b.peak = max(b.peak, b.used)
			b.mu.Unlock()
			b.gauge.Add(float64(n))
			return true
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
			return false
		}
	}
}

// safeAfter reports whether, once h has n more bytes, every request still
// arriving can complete: taken smallest need first, each needs at most
// what is free plus what those before it gave back. Frames held whole
// (acquire) and complete requests are not counted: they give their bytes
// back needing nothing more. b.mu is held.
func (b *heldBudget) safeAfter(h *hold, n int64) bool {
	type req struct{ need, held int64 }
	rs := make([]req, 0, len(b.growing))
	free := b.max
	for g := range b.growing {
		held := g.held
		if g == h {
			held += n
		}
		free -= held
		rs = append(rs, req{need: g.need - held, held: held})
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].need < rs[j].need })
	for _, r := range rs {
		if r.need > free {
			return false
		}
		free += r.held
	}
	return true
}

// release gives back everything the hold took and ends it.
func (h *hold) release() {
	b := h.b
	if b.max <= 0 {
		return
	}
	b.mu.Lock()
	delete(b.growing, h)
	n := h.held
	h.held = 0
	b.mu.Unlock()
	if n > 0 {
		b.release(n)
	} else {
		b.wake()
	}
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

// wake wakes every waiter: a request that ended without holding anything
// may have made another's grant safe.
func (b *heldBudget) wake() {
	b.mu.Lock()
	ws := b.waiters
	b.waiters = nil
	b.mu.Unlock()
	for _, ch := range ws {
		close(ch)
	}
}

func (b *heldBudget) peakBytes() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.peak
}
