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

	maxEv      []int64
	seen       []bool
	lastActive []time.Time

	cur          int64
	has          bool
	allIdleSince time.Time
	base         int64
}

func (w *watermark) init(src rules.Source, nparts int, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lateness = src.Watermark.Milliseconds()
	w.idle = src.IdleTimeout // checkDefinition refuses a route without one
	w.started = now
	w.maxEv = make([]int64, nparts)
	w.seen = make([]bool, nparts)
	w.lastActive = make([]time.Time, nparts)
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
	for int(p) >= len(w.maxEv) {
		// A writer beyond the count known at start: partitions were added
		// upstream. It counts from now on.
		w.maxEv = append(w.maxEv, 0)
		w.seen = append(w.seen, false)
		w.lastActive = append(w.lastActive, time.Time{})
	}
	if !w.seen[p] || ev > w.maxEv[p] {
		w.maxEv[p] = ev
	}
	w.seen[p] = true
	w.lastActive[p] = now
	return w.computeLocked(now)
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
	w.maxEv = append([]int64(nil), o.maxEv...)
	w.seen = append([]bool(nil), o.seen...)
	w.lastActive = append([]time.Time(nil), o.lastActive...)
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
	for p := range w.maxEv {
		if !w.seen[p] {
			if now.Sub(w.started) < w.idle {
				return 0, false
			}
			continue
		}
		if now.Sub(w.lastActive[p]) >= w.idle {
			continue
		}
		active = true
		low = min(low, w.maxEv[p])
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
	for q := range w.maxEv {
		if !w.seen[q] {
			if now.Sub(w.started) < w.idle {
				return int32(q), 0, time.Time{}, false, true
			}
			continue
		}
		if now.Sub(w.lastActive[q]) >= w.idle || w.maxEv[q] >= low {
			continue
		}
		low, p, last, ok = w.maxEv[q], int32(q), w.lastActive[q], true
	}
	return p, low, last, true, ok
}
