package pipeline

// Source records: each fetched record is decoded, given its event time and
// run through its partition's chain; the idle loop keeps watermarks and
// markers moving while writers are idle.

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/operators"
)

// processSource turns one fetched record into a step record and runs the
// partition's chain on it.
func (t *task) processSource(kr *kgo.Record) {
	r := t.r
	now := r.plan.clock()
	t.mIn.Inc()
	r.tm.tracker.Begin(t.id, kr.Offset)
	t.curOff, t.seq = kr.Offset, 0
	// The ticket stays its own allocation: an output waiting for its
	// acknowledgement (a sink down for minutes) holds the ticket, and must
	// not hold the step record with it (its value, and through Raw the
	// fetched batch).
	tk := &ticket{r: r, p: t.id, off: kr.Offset, fetched: now, n: 1}
	rec := &operators.Record{
		Topic:     kr.Topic,
		Partition: kr.Partition,
		Offset:    kr.Offset,
		Key:       kr.Key,
		Raw:       kr.Value,
		Timestamp: kr.Timestamp.UnixMilli(),
	}
	if len(kr.Headers) > 0 {
		rec.Headers = make([]operators.Header, len(kr.Headers))
		for i, h := range kr.Headers {
			rec.Headers[i] = operators.Header{Key: h.Key, Value: h.Value}
		}
	}
	defer tk.release()
	defer func() {
		if v := recover(); v != nil {
			r.recordPanicked(v, rec, tk)
		}
	}()
	if h := panicTestHook; h != nil {
		h(r.name, "record")
	}
	if !r.plan.format.decode(r, rec, kr, tk) {
		return
	}
	rec.EventTime = rec.Timestamp
	if et := r.def.Source.EventTime; et != nil {
		v, err := et.Eval(rec)
		if err == nil {
			rec.EventTime, err = eventMillis(v)
		}
		if err != nil {
			r.deadLetter(rec, operators.ReasonError, fmt.Errorf("event_time %s: %w", et.Source, err), "source", tk)
			return
		}
	}
	if r.plan.timed {
		// The record's own event time is in the frontier it carries: the
		// reader applies the record before the frontier, so a watermark
		// never overtakes the record that raised it.
		t.observeEvent(rec.EventTime)
	}
	c := t.chain
	c.cur = tk
	c.run(0, rec)
	c.cur = nil
	if r.plan.timed {
		t.sendMarkers(now, false)
	}
}

// idleLoop moves keyed tasks' watermarks when their writers go idle, and
// has writers send the markers that say they are alive.
//
// A route whose tasks have nothing timed yet (no watermark, no frontier:
// no record since the tasks were assigned) has nothing to tick: the loop
// then rests, ticking every idleRest, until the first record wakes it
// (noteTimed). An idle sidecar's timed routes otherwise woke five times a
// second each (docs/BENCHMARKS.md, "Footprint").
func (r *route) idleLoop() {
	iv := r.idleInterval()
	tick := time.NewTicker(iv)
	defer tick.Stop()
	resting := false
	for {
		select {
		case <-r.life.halt:
			return
		case <-r.idleWake:
			if resting {
				resting = false
				tick.Reset(iv)
			}
		case now := <-tick.C:
			quiet := true
			r.cut.RLock()
			if !r.halted {
				quiet = r.idleTick(now)
			}
			r.cut.RUnlock()
			// Markers and the rows of windows idleness closed leave now
			// (batch.go).
			r.flushWrites()
			if quiet != resting {
				resting = quiet
				if quiet {
					tick.Reset(idleRest)
				} else {
					tick.Reset(iv)
				}
			}
		}
	}
}

// idleRest is how often the idle loop ticks while no task of its route
// has anything timed (a fallback: the first record wakes it at once).
const idleRest = 5 * time.Second

// noteTimed wakes a resting idle loop: a task's frontier came to exist
// (a watermark's first partition wakes it itself, watermark.wake). It
// never blocks (idleWake holds one wake-up).
func (r *route) noteTimed() {
	if r.idleWake == nil {
		return
	}
	select {
	case r.idleWake <- struct{}{}:
	default:
	}
}

// idleInterval is how often the idle loop ticks.
func (r *route) idleInterval() time.Duration {
	iv := min(r.def.Source.IdleTimeout/4, 200*time.Millisecond)
	return max(iv, 10*time.Millisecond)
}

// idleTick is one tick of the idle loop, under cut.RLock. quiet: no task
// has a frontier or a watermark that has seen a partition, so no tick can
// change anything until a record arrives.
func (r *route) idleTick(now time.Time) (quiet bool) {
	quiet = true
	for _, t := range r.tm.tasks {
		if !r.idleTickTask(t, now) {
			quiet = false
		}
	}
	return quiet
}

// idleTickTask ticks one task; quiet as for idleTick.
func (r *route) idleTickTask(t *task, now time.Time) (quiet bool) {
	if isClosed(t.stop) {
		return true
	}
	quiet = true
	if t.seg.keepsTime() {
		// The task's dispatch goroutine may be running its chain.
		t.steps.Lock()
		if wm, moved := t.wm.tick(now); moved {
			// An idle advance emits without a source record; its origin
			// follows the last one. It changes the task's state: the
			// next checkpoint is not skipped (checkpointer.unchanged).
			t.r.cp.moves.Add(1)
			t.advanceTask(wm, nil)
		}
		t.steps.Unlock()
		if !t.wm.dormant() {
			quiet = false
		}
	}
	t.sendMarkers(now, true)
	if t.seg.next != nil && t.seg.markers {
		if _, ok := t.frontier(); ok {
			quiet = false
		}
	}
	return quiet
}

// eventMillis reads an event_time value: epoch millis as a number, an RFC
// 3339 string, or a time.
func eventMillis(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case int:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case uint64:
		if x > math.MaxInt64 {
			return 0, errNoEventTime
		}
		return int64(x), nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) || math.Abs(x) > 1<<62 {
			return 0, errNoEventTime
		}
		return int64(x), nil
	case float32:
		return eventMillis(float64(x))
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n, nil
		}
		f, err := x.Float64()
		if err != nil {
			return 0, errNoEventTime
		}
		return eventMillis(f)
	case string:
		t, err := time.Parse(time.RFC3339Nano, x)
		if err != nil {
			return 0, fmt.Errorf("%w: %v", errNoEventTime, err)
		}
		return t.UnixMilli(), nil
	case time.Time:
		return x.UnixMilli(), nil
	}
	return 0, fmt.Errorf("%w: got %T", errNoEventTime, v)
}
