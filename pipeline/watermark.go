package pipeline

import (
	"math"
	"sync"
	"time"

	"github.com/rtproxy/rtproxy/rules"
)

// watermark is a task's event-time watermark: the minimum over the active
// upstream partitions of (max event time seen − allowed lateness). A task
// reading a repartition topic keeps one over the writers of that topic
// (the source partitions, or the tasks of the keyed step before), fed by
// their frontiers with lateness 0: the writers subtracted it already.
//
//  1. A partition that has seen no record holds the watermark back for
//     idle_timeout after the route starts, then counts as idle.
//  2. A partition idle longer than idle_timeout does not hold it back.
//  3. When every partition is idle the watermark moves at wall-clock speed
//     from where it stood; before the first record it does not exist.
//  4. It never moves backwards.
type watermark struct {
	mu       sync.Mutex
	lateness int64 // millis
	idle     time.Duration
	started  time.Time

	// ws are the upstream writers: ws[0] the writers of the segment
	// before (source partitions or keyed tasks), ws[1] the tasks of a
	// stream join's second topic, whose writer ids start at
	// otherWriterBase. The watermark is the minimum over both.
	ws [2]writerSet

	cur          int64
	has          bool
	allIdleSince time.Time
	base         int64

	// wake, when set, is told (without blocking) when a partition is
	// first seen: the route's idle loop rests while no watermark has
	// seen one (route.noteTimed). copyFrom leaves it alone.
	wake chan struct{}
}

// writerSet is what a watermark knows of a set of upstream writers,
// indexed by writer id (less the set's base).
type writerSet struct {
	maxEv      []int64
	seen       []bool
	lastActive []time.Time
}

func newWriterSet(n int) writerSet {
	return writerSet{maxEv: make([]int64, n), seen: make([]bool, n), lastActive: make([]time.Time, n)}
}

func (s *writerSet) grow(i int) {
	for i >= len(s.maxEv) {
		s.maxEv = append(s.maxEv, 0)
		s.seen = append(s.seen, false)
		s.lastActive = append(s.lastActive, time.Time{})
	}
}

func (s writerSet) clone() writerSet {
	return writerSet{maxEv: append([]int64(nil), s.maxEv...), seen: append([]bool(nil), s.seen...),
		lastActive: append([]time.Time(nil), s.lastActive...)}
}

// otherWriterBase is the first writer id of a stream join's second input:
// its task of partition p writes as otherWriterBase + p, apart from the
// source partitions (and keyed tasks) below it.
const otherWriterBase = int32(maxTaskPartitions)

// writerSlot is the set and index of writer id p.
func writerSlot(p int32) (int, int) {
	if p >= otherWriterBase {
		return 1, int(p - otherWriterBase)
	}
	return 0, int(p)
}

func (w *watermark) init(src rules.Source, nparts int, now time.Time) {
	w.initWith(src, nparts, 0, now)
}

// initWith is init for a task with nother writers of a second input too.
func (w *watermark) initWith(src rules.Source, nparts, nother int, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lateness = src.Watermark.Milliseconds()
	w.idle = src.IdleTimeout // checkDefinition refuses a route without one
	w.started = now
	w.ws = [2]writerSet{newWriterSet(nparts), newWriterSet(nother)}
	w.has = false
}

// observe notes an event time on partition p and returns the watermark if
// it moved.
func (w *watermark) observe(p int32, ev int64, now time.Time) (int64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if p < 0 {
		return 0, false
	}
	g, i := writerSlot(p)
	s := &w.ws[g]
	// A writer beyond the count known at start: partitions were added
	// upstream. It counts from now on.
	s.grow(i)
	if !s.seen[i] && w.wake != nil {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	if !s.seen[i] || ev > s.maxEv[i] {
		s.maxEv[i] = ev
	}
	s.seen[i] = true
	s.lastActive[i] = now
	return w.computeLocked(now)
}

// dormant: the watermark does not exist and no partition has been seen,
// so only observe can change it (tick never does).
func (w *watermark) dormant() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.has {
		return false
	}
	for _, set := range w.ws {
		for _, s := range set.seen {
			if s {
				return false
			}
		}
	}
	return true
}

// tick re-evaluates idleness.
func (w *watermark) tick(now time.Time) (int64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.computeLocked(now)
}

// copyFrom sets w to a copy of o's state.
func (w *watermark) copyFrom(o *watermark) {
	o.mu.Lock()
	defer o.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lateness, w.idle, w.started = o.lateness, o.idle, o.started
	w.ws = [2]writerSet{o.ws[0].clone(), o.ws[1].clone()}
	w.cur, w.has, w.allIdleSince, w.base = o.cur, o.has, o.allIdleSince, o.base
}

func (w *watermark) current() (int64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cur, w.has
}

func (w *watermark) computeLocked(now time.Time) (int64, bool) {
	low := int64(math.MaxInt64)
	active := false
	for _, set := range w.ws {
		for p := range set.maxEv {
			if !set.seen[p] {
				if now.Sub(w.started) < w.idle {
					return 0, false
				}
				continue
			}
			if now.Sub(set.lastActive[p]) >= w.idle {
				continue
			}
			active = true
			low = min(low, set.maxEv[p])
		}
	}
	var cand int64
	if active {
		w.allIdleSince = time.Time{}
		cand = low - w.lateness
	} else {
		if !w.has {
			return 0, false
		}
		if w.allIdleSince.IsZero() {
			w.allIdleSince, w.base = now, w.cur
		}
		cand = w.base + now.Sub(w.allIdleSince).Milliseconds()
	}
	if w.has && cand <= w.cur {
		return w.cur, false
	}
	w.cur, w.has = cand, true
	return cand, true
}

// holder is the upstream partition that holds the watermark back now: the
// active one with the lowest frontier, or one not heard from yet while
// the route is younger than idle_timeout (seen false). ok is false when
// every upstream partition is idle (the watermark moves with the clock)
// or there are none.
func (w *watermark) holder(now time.Time) (p int32, frontier int64, last time.Time, seen, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	low := int64(math.MaxInt64)
	for g, set := range w.ws {
		base := int32(0)
		if g == 1 {
			base = otherWriterBase
		}
		for q := range set.maxEv {
			if !set.seen[q] {
				if now.Sub(w.started) < w.idle {
					return base + int32(q), 0, time.Time{}, false, true
				}
				continue
			}
			if now.Sub(set.lastActive[q]) >= w.idle || set.maxEv[q] >= low {
				continue
			}
			low, p, last, ok = set.maxEv[q], base+int32(q), set.lastActive[q], true
		}
	}
	return p, low, last, true, ok
}
