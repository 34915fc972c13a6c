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
func (r *route) idleLoop() {
	tick := time.NewTicker(r.idleInterval())
	defer tick.Stop()
	for {
		select {
		case <-r.life.halt:
			return
		case now := <-tick.C:
			r.cut.RLock()
			if !r.halted {
				r.idleTick(now)
			}
			r.cut.RUnlock()
			// Markers and the rows of windows idleness closed leave now
			// (batch.go).
			r.flushWrites()
		}
	}
}

// idleInterval is how often the idle loop ticks.
func (r *route) idleInterval() time.Duration {
	iv := min(r.def.Source.IdleTimeout/4, 200*time.Millisecond)
	return max(iv, 10*time.Millisecond)
}

// idleTick is one tick of the idle loop, under cut.RLock.
func (r *route) idleTick(now time.Time) {
	for _, t := range r.tm.tasks {
		r.idleTickTask(t, now)
	}
}

func (r *route) idleTickTask(t *task, now time.Time) {
	if isClosed(t.stop) {
		return
	}
	if t.seg.keepsTime() {
		// The task's dispatch goroutine may be running its chain.
		t.steps.Lock()
		if wm, moved := t.wm.tick(now); moved {
			// An idle advance emits without a source record; its origin
			// follows the last one.
			t.advanceTask(wm, nil)
		}
		t.steps.Unlock()
	}
	t.sendMarkers(now, true)
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
