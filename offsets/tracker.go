// Package offsets tracks, per source partition, how far a route has got:
// the highest offset below which every record is done (applied to state and
// every output derived from it acknowledged by the broker). Completions may
// arrive out of order; the Tracker merges them into one contiguous position
// per partition, the mergeOffsets contract of Spark's real-time mode. That
// position is what a checkpoint records and where recovery seeks.
//
// It owns the checkpoint position's byte layout (Encode/Decode) too.
//
// It imports only the standard library and must never import pipeline/,
// operators/, protocol/ or state/.
package offsets

import "sync"

// Tracker tracks the done offset of every assigned partition. It is safe
// for concurrent use: the reader calls Begin, sink acknowledgements call
// Done, the checkpointer calls Snapshot.
//
// Invariants, per partition (kept by Begin, Done and pop):
//  1. inflight holds begun offsets in strictly increasing order, each
//     greater than or equal to base.
//  2. Every offset below base is done, and so is every offset that is not
//     in inflight and lies between base and last.
//  3. inflight[0], if any, is not done (pop removes a done prefix at once),
//     so DoneOffset is inflight[0].off, or last+1 when inflight is empty.
type Tracker struct {
	mu    sync.Mutex
	parts map[int32]*partition
}

type partition struct {
	// last is the highest offset begun, or from-1 before any.
	last int64
	// inflight is a FIFO of begun records; head indexes its first live
	// entry so that popping does not copy.
	inflight []pending
	head     int
}

type pending struct {
	off  int64
	done bool
}

// NewTracker returns an empty tracker.
func NewTracker() *Tracker {
	return &Tracker{parts: make(map[int32]*partition)}
}

// Start (re)assigns partition p: from is the first offset that will be
// read, so everything below it counts as done. Starting a partition that is
// already tracked forgets its in-flight records (a seek after recovery or a
// reassignment); Done calls for them that arrive afterwards are ignored
// unless an offset is begun again.
func (t *Tracker) Start(p int32, from int64) {
	t.mu.Lock()
	t.parts[p] = &partition{last: from - 1}
	t.mu.Unlock()
}

// Begin records that the record at off was fetched. Offsets arrive in
// increasing order per partition; a gap (compacted records, transaction
// markers) counts as done. An offset not above the last one begun is
// ignored: it was already begun. Beginning on a partition that was never
// started starts it at off.
func (t *Tracker) Begin(p int32, off int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	pt := t.parts[p]
	if pt == nil {
		pt = &partition{last: off - 1}
		t.parts[p] = pt
	}
	if off <= pt.last {
		return
	}
	pt.last = off
	if pt.head > 0 && pt.head == len(pt.inflight) {
		// Empty again: reuse the backing array from its start.
		pt.inflight, pt.head = pt.inflight[:0], 0
	} else if pt.head > 1024 && pt.head*2 > len(pt.inflight) {
		// Mostly consumed: slide the live part down so the array stays
		// proportional to what is in flight rather than to history.
		n := copy(pt.inflight, pt.inflight[pt.head:])
		pt.inflight, pt.head = pt.inflight[:n], 0
	}
	pt.inflight = append(pt.inflight, pending{off: off})
}

// Done records that the record at off is done. It may be called in any
// order, more than once, and for offsets that are no longer tracked (after
// Remove or a new Start); those calls are ignored.
func (t *Tracker) Done(p int32, off int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	pt := t.parts[p]
	if pt == nil {
		return
	}
	live := pt.inflight[pt.head:]
	// Binary search by hand: sort.Search's closure would escape and
	// allocate on every acknowledgement.
	lo, hi := 0, len(live)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if live[m].off < off {
			lo = m + 1
		} else {
			hi = m
		}
	}
	i := lo
	if i == len(live) || live[i].off != off {
		return
	}
	live[i].done = true
	if i == 0 {
		pt.pop()
	}
}

// pop drops the done prefix of inflight (invariant 3).
func (pt *partition) pop() {
	for pt.head < len(pt.inflight) && pt.inflight[pt.head].done {
		pt.head++
	}
}

func (pt *partition) doneOffset() int64 {
	if pt.head < len(pt.inflight) {
		return pt.inflight[pt.head].off
	}
	return pt.last + 1
}

// DoneOffset returns the offset to resume partition p from: the lowest
// begun offset that is not done, or the last begun offset + 1 when all are
// done. For a partition that is not tracked it returns -1.
func (t *Tracker) DoneOffset(p int32) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	pt := t.parts[p]
	if pt == nil {
		return -1
	}
	return pt.doneOffset()
}

// InFlight returns how many begun records of partition p are not yet
// merged into its done offset (some may be done, waiting on an earlier one).
func (t *Tracker) InFlight(p int32) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	pt := t.parts[p]
	if pt == nil {
		return 0
	}
	return len(pt.inflight) - pt.head
}

// Snapshot returns the done offset of every tracked partition, taken at
// one instant.
func (t *Tracker) Snapshot() map[int32]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := make(map[int32]int64, len(t.parts))
	for p, pt := range t.parts {
		m[p] = pt.doneOffset()
	}
	return m
}

// Remove stops tracking partition p (revoked, or its route stopped).
func (t *Tracker) Remove(p int32) {
	t.mu.Lock()
	delete(t.parts, p)
	t.mu.Unlock()
}
