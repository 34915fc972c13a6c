package operators

// Session window snapshot layout (Snapshot / Restore), byte by byte, in
// the terms of window.go's layout (times are putTime: 8 bytes, sign bit
// flipped, so byte order is time order):
//
//	key "m"  (written first)
//	  [0]      version = 1
//	  [1]      1 if a watermark has been seen, else 0
//	  [2:10]   watermark (time)
//	  uvarint  number of aggregates, then per aggregate: uvarint len + func
//	           name; Restore refuses a snapshot whose aggregates differ
//
//	key "s" <start: time> <session key bytes>   (one per open session, in
//	                                             no particular order: a store
//	                                             sorts them, Restore takes any)
//	  [0:8]    end (time); the session is [start, end)
//	  then per aggregate, in spec order, its encoding (window.go's table)
//
// A tumbling or sliding window's snapshot ("w" entries) is refused, and a
// session's ("s" entries) by those windows.

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// sessionWindow is the `window: { kind: session }` step.
//
// Sessions: each key's open sessions are disjoint intervals [start, end)
// of event time. start is the event time of the session's earliest
// record; end is at most its latest record's time + gap and at most
// start + max_duration. A record at event time t reaches the sessions
// whose interval meets [t, t+gap):
//
//   - none: it starts the session [t, t+gap);
//   - some, and together with them it spans at most max_duration (or there
//     is no max_duration): they merge into one session
//     [min(starts, t), max(ends, t+gap)); a record falling between two
//     sessions so joins them;
//   - some, but together they would span more than max_duration: nothing
//     merges. If t lies inside a session, the record joins that one, whose
//     end moves to min(t+gap, start+max_duration, the next session's
//     start) if that is later; otherwise the record starts a session of
//     its own, [t, min(t+gap, the next session's start)).
//
// So a session that reached max_duration ends at start+max_duration: a
// record from then on starts the next session, and the full one closes
// when the watermark passes its end, as every session does.
//
// Late: a record whose session, as computed above, would end at or before
// the watermark is late (dead letter, ReasonLate) and changes nothing; a
// record inside an open session, or meeting one, never is. A record whose
// session would have met one that has already closed starts a new one.
//
// Closing: Advance(wm) closes every session with end <= wm; emit on_close
// emits their rows in order of end, then key, then start. With on_update
// a row is emitted after every change (a merge emits the merged session's
// row once; the rows of the sessions it absorbed are superseded by it, its
// interval covering theirs) and nothing at close.
//
// Memory: a session is one 80-byte struct (plus its accumulators), one
// map entry per key with open sessions (the key's sessions are a list by
// start) and one slot in a heap ordered by the end each session was
// scheduled under. A record that extends a session does not touch the
// heap: Advance re-schedules a session it pops whose end moved on, and
// drops one that a merge absorbed.
type sessionWindow struct {
	spec     WindowSpec
	aggs     []aggregator
	gap, max int64 // millis; max 0: no max_duration

	byKey     map[string]*session // the key's open session with the smallest start
	heap      []*session          // by sched; holds absorbed sessions until popped
	open      int64               // open sessions (absorbed ones not counted)
	watermark int64
	hasWM     bool
	invalid   error
	applied   map[int32]int64 // as window.applied

	args    []any // scratch
	probe   acc   // scratch: the merged kind a merge checks an argument against
	closing []*session
}

// session is one open session of a key.
type session struct {
	start, end int64
	sched      int64 // the end it is in the heap under (<= end)
	key        string
	next       *session // the key's next open session by start
	accs       []acc    // nil: absorbed by a merge
}

func newSessionWindow(spec WindowSpec) *sessionWindow {
	w := &sessionWindow{
		spec:  spec,
		gap:   spec.Gap.Milliseconds(),
		max:   spec.MaxDuration.Milliseconds(),
		byKey: make(map[string]*session),
	}
	for _, a := range spec.Aggregates {
		w.aggs = append(w.aggs, aggregatorOf(a.Func))
	}
	w.invalid = spec.Validate()
	if w.gap <= 0 {
		w.gap = 1
	}
	return w
}

// ValidateSession is the one check of a session window's gap and
// max_duration, for the analyzer and the step (as ValidateWindow is for
// the other kinds): the gap must be at least 1ms, and max_duration, when
// given (non-zero), at least the gap.
func ValidateSession(gap, maxDuration time.Duration) error {
	var errs WindowErrors
	if gap < time.Millisecond {
		errs = append(errs, &WindowError{Key: "gap",
			Rule: "`window.gap` must be at least 1ms: event times are epoch milliseconds",
			msg:  fmt.Sprintf("session window gap %v must be at least 1ms", gap)})
	}
	if maxDuration != 0 && maxDuration < max(gap, time.Millisecond) {
		errs = append(errs, &WindowError{Key: "max_duration",
			Rule: fmt.Sprintf("`max_duration` (%s) is shorter than `gap` (%s): no session could ever end by a pause; make it at least the gap", maxDuration, gap),
			msg:  fmt.Sprintf("session window max_duration %v must be at least the gap %v", maxDuration, gap)})
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

func (w *sessionWindow) Kind() string { return "window" }

// Absorbs implements Absorbing.
func (w *sessionWindow) Absorbs() {}

var (
	_ StateSizer = (*sessionWindow)(nil)
	_ Closer     = (*sessionWindow)(nil)
	_ Stateful   = (*sessionWindow)(nil)
	_ Keyed      = (*sessionWindow)(nil)
)

// ShuffleKey implements Keyed.
func (w *sessionWindow) ShuffleKey(r *Record) (string, error) { return shuffleKey(w.spec.Key, r) }

// StateKeys implements StateSizer: the open sessions.
func (w *sessionWindow) StateKeys() int { return int(w.open) }

// sessionPlan is what a record does to its key's sessions.
type sessionPlan struct {
	into       *session // the session the record joins (nil: a new one)
	prev       *session // the session before into (or before the new one) in the key's list
	last       *session // merge: the last session merged (into..last, in list order)
	start, end int64    // the session's interval after the record
}

// plan decides, without changing anything, what a record at t does to the
// sessions starting at head.
func (w *sessionWindow) plan(head *session, t int64) sessionPlan {
	var prev, first, last *session
	for s := head; s != nil && s.start < t+w.gap; s = s.next {
		if t < s.end {
			if first == nil {
				first = s
			}
			last = s
		} else if first == nil {
			prev = s
		}
	}
	if first == nil {
		// No session meets [t, t+gap): a new one. The next session, if
		// any, starts at t+gap or later.
		return sessionPlan{prev: prev, start: t, end: t + w.gap}
	}
	start, end := min(first.start, t), max(last.end, t+w.gap)
	if w.max == 0 || end-start <= w.max {
		return sessionPlan{into: first, prev: prev, last: last, start: start, end: end}
	}
	// The cap binds: nothing merges. A record inside a session joins it;
	// its end may move up to start+max and never past the next session.
	for s := first; s != last.next; s = s.next {
		if s.start <= t && t < s.end {
			e := max(s.end, min(t+w.gap, s.start+w.max))
			if s.next != nil {
				e = min(e, s.next.start)
			}
			return sessionPlan{into: s, last: s, start: s.start, end: e}
		}
	}
	// Otherwise every session meeting [t, t+gap) starts after t (one
	// starting at or before t that it meets would hold t): a session of
	// its own up to the next one.
	return sessionPlan{prev: prev, start: t, end: min(t+w.gap, first.start)}
}

func (w *sessionWindow) Process(r *Record, out Emitter) {
	defer recoverTo("window", r, out)
	if w.invalid != nil {
		out.DeadLetter(r, ReasonError, fmt.Errorf("window: %w", w.invalid))
		return
	}
	key, err := shuffleKey(w.spec.Key, r)
	if err != nil {
		out.DeadLetter(r, evalReason(err), fmt.Errorf("window: key: %w", err))
		return
	}
	t := r.EventTime
	head := w.byKey[key]
	p := w.plan(head, t)
	if w.hasWM && p.end <= w.watermark {
		if a, ok := w.applied[r.Partition]; ok && r.Partition >= 0 && r.Offset >= 0 && r.Offset <= a {
			return // replayed after a crash: its session was emitted with it
		}
		out.DeadLetter(r, ReasonLate, fmt.Errorf("window: event time %d is late: its session [%d, %d) would end at or before the watermark %d",
			t, p.start, p.end, w.watermark))
		return
	}

	// Every argument is evaluated and checked, against the sessions it
	// would join, before any state changes.
	var ok bool
	if w.args, ok = evalArgs(w.spec.Aggregates, w.aggs, w.args[:0], r, out); !ok {
		return
	}
	if p.into != nil {
		for i, a := range w.spec.Aggregates {
			target := &p.into.accs[i]
			if p.last != p.into {
				// A merge: the merged accumulators must agree (min and
				// max: numbers or strings), and the argument fit them.
				var kind uint8
				for s := p.into; s != p.last.next; s = s.next {
					k := w.aggs[i].mixKind(&s.accs[i])
					if k != 0 && kind != 0 && k != kind {
						out.DeadLetter(r, ReasonError, fmt.Errorf("window: %s: %s(%s) would merge sessions of numbers and of strings",
							a.Name, a.Func, a.Arg.Source))
						return
					}
					kind = max(kind, k)
				}
				w.probe = acc{kind: kind}
				target = &w.probe
			}
			if w.args[i] != nil {
				if err := w.aggs[i].fits(a, target, w.args[i]); err != nil {
					out.DeadLetter(r, ReasonError, fmt.Errorf("window: %s: %w", a.Name, err))
					return
				}
			}
		}
	}
	if !r.fanPaid {
		if err := chargeFanOut(r, "window", 1); err != nil {
			if err != errFanOutSpent {
				out.DeadLetter(r, ReasonBudget, fmt.Errorf("window: %w", err))
			}
			return
		}
	}
	if p.into == nil {
		if lim := limits.Load().OpenWindows; w.open+1 > lim {
			out.DeadLetter(r, ReasonBudget, fmt.Errorf("window: %w", tripped(BudgetOpenWindows,
				"open-windows budget exceeded: the record would open a session where %d of at most %d are open (limits.max_open_windows)",
				w.open, lim)))
			return
		}
	}

	s := p.into
	if s == nil {
		s = &session{start: p.start, end: p.end, sched: p.end, key: key, accs: make([]acc, len(w.aggs))}
		if p.prev == nil {
			s.next = head
			w.byKey[key] = s
		} else {
			s.next, p.prev.next = p.prev.next, s
		}
		w.push(s)
		w.open++
	} else {
		// Merge into..last into `into`; the absorbed ones stay in the
		// heap, marked by nil accs, until Advance pops them.
		stop := p.last.next
		for o := s.next; o != stop; {
			nx := o.next
			for i := range w.aggs {
				w.aggs[i].merge(&s.accs[i], &o.accs[i])
			}
			o.accs, o.next = nil, nil
			w.open--
			s.next = nx
			o = nx
		}
		s.start, s.end = p.start, p.end
	}
	for i, agg := range w.aggs {
		if w.args[i] != nil || agg.arity() == 0 {
			agg.add(&s.accs[i], w.args[i], t)
		}
	}
	if w.spec.EmitOnUpdate {
		out.Emit(w.row(s))
	}
}

// row is the output record of session s.
func (w *sessionWindow) row(s *session) *Record {
	v := make(map[string]any, 3+len(w.spec.Aggregates))
	v["key"] = s.key
	v["window_start"] = s.start
	v["window_end"] = s.end
	for i, a := range w.spec.Aggregates {
		v[a.Name] = w.aggs[i].value(&s.accs[i])
	}
	hv := strconv.AppendInt(make([]byte, 0, 28), s.start, 10)
	hv = append(hv, '-')
	hv = strconv.AppendInt(hv, s.end, 10)
	return &Record{
		Key:       []byte(s.key),
		Value:     v,
		Timestamp: s.end - 1,
		EventTime: s.end - 1,
		Offset:    -1,
		Partition: -1,
		Headers:   []Header{{Key: WindowHeader, Value: hv}},
		Window:    &WindowRef{Start: s.start, End: s.end},
	}
}

// The heap: a binary min-heap of sessions by sched.

func (w *sessionWindow) push(s *session) {
	w.heap = append(w.heap, s)
	i := len(w.heap) - 1
	for i > 0 {
		p := (i - 1) / 2
		if w.heap[p].sched <= s.sched {
			break
		}
		w.heap[i] = w.heap[p]
		i = p
	}
	w.heap[i] = s
}

func (w *sessionWindow) pop() *session {
	h := w.heap
	top := h[0]
	n := len(h) - 1
	x := h[n]
	h[n] = nil
	h = h[:n]
	w.heap = h
	if n == 0 {
		return top
	}
	i := 0
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if c+1 < n && h[c+1].sched < h[c].sched {
			c++
		}
		if x.sched <= h[c].sched {
			break
		}
		h[i] = h[c]
		i = c
	}
	h[i] = x
	return top
}

// settle makes the heap's top exact: absorbed sessions are dropped and a
// session whose end moved past its sched is put back under its end, until
// the top is an open session with sched == end, whose end is then the
// smallest of every open session.
func (w *sessionWindow) settle() {
	for len(w.heap) > 0 {
		s := w.heap[0]
		switch {
		case s.accs == nil:
			w.pop()
		case s.end > s.sched:
			w.pop()
			s.sched = s.end
			w.push(s)
		default:
			return
		}
	}
}

// unlink removes open session s from its key's list.
func (w *sessionWindow) unlink(s *session) {
	head := w.byKey[s.key]
	if head == s {
		if s.next == nil {
			delete(w.byKey, s.key)
		} else {
			w.byKey[s.key] = s.next
		}
		return
	}
	for p := head; p != nil; p = p.next {
		if p.next == s {
			p.next = s.next
			return
		}
	}
}

// closeUpTo removes every session with end <= wm, in order of end, key,
// start, and returns them (w.closing, reused).
func (w *sessionWindow) closeUpTo(wm int64) []*session {
	w.closing = w.closing[:0]
	for {
		w.settle()
		if len(w.heap) == 0 || w.heap[0].end > wm {
			break
		}
		s := w.pop()
		w.unlink(s)
		w.open--
		w.closing = append(w.closing, s)
	}
	slices.SortFunc(w.closing, func(a, b *session) int {
		if c := cmp.Compare(a.end, b.end); c != 0 {
			return c
		}
		if c := cmp.Compare(a.key, b.key); c != 0 {
			return c
		}
		return cmp.Compare(a.start, b.start)
	})
	return w.closing
}

// Advance closes every session with end <= watermark. The watermark never
// moves back.
func (w *sessionWindow) Advance(watermark int64, out Emitter) {
	if w.hasWM && watermark <= w.watermark {
		return
	}
	w.watermark, w.hasWM = watermark, true
	for i, s := range w.closeUpTo(watermark) {
		if !w.spec.EmitOnUpdate {
			out.Emit(w.row(s))
		}
		s.accs, s.next = nil, nil
		w.closing[i] = nil
	}
}

// ClosesAt implements Closer.
func (w *sessionWindow) ClosesAt(watermark int64) bool {
	if w.hasWM && watermark <= w.watermark {
		return false
	}
	w.settle()
	return len(w.heap) > 0 && w.heap[0].end <= watermark
}

// Resume implements Closer, as window.Resume: sessions that end at or
// before the journal's watermark were emitted before the crash and are
// dropped without a row.
func (w *sessionWindow) Resume(watermark int64, applied map[int32]int64) {
	w.applied = make(map[int32]int64, len(applied))
	for p, o := range applied {
		w.applied[p] = o
	}
	if w.hasWM && watermark <= w.watermark {
		return
	}
	w.watermark, w.hasWM = watermark, true
	for i, s := range w.closeUpTo(watermark) {
		s.accs, s.next = nil, nil
		w.closing[i] = nil
	}
}

// Snapshot implements Stateful; the layout is at the top of this file.
func (w *sessionWindow) Snapshot(sw Writer) error {
	if err := sw.Put([]byte{'m'}, windowMeta(w.hasWM, w.watermark, w.spec.Aggregates)); err != nil {
		return fmt.Errorf("window snapshot: %w", err)
	}
	// No sort: the cut copies snapshots while dispatch waits, and the
	// store orders the entries itself.
	var kb, vb []byte
	for _, head := range w.byKey {
		for s := head; s != nil; s = s.next {
			kb = append(putTime(append(kb[:0], 's'), s.start), s.key...)
			vb = putTime(vb[:0], s.end)
			for i, a := range w.spec.Aggregates {
				var err error
				if vb, err = w.aggs[i].encode(vb, &s.accs[i]); err != nil {
					return fmt.Errorf("window snapshot: %s: %w", a.Name, err)
				}
			}
			if err := sw.Put(kb, vb); err != nil {
				return fmt.Errorf("window snapshot: %w", err)
			}
		}
	}
	return nil
}

// windowMeta is the "m" entry of a window's snapshot (both layouts).
func windowMeta(hasWM bool, wm int64, aggs []Aggregate) []byte {
	meta := []byte{1, 0}
	if hasWM {
		meta[1] = 1
	}
	meta = putTime(meta, wm)
	meta = binary.AppendUvarint(meta, uint64(len(aggs)))
	for _, a := range aggs {
		meta = binary.AppendUvarint(meta, uint64(len(a.Func)))
		meta = append(meta, a.Func...)
	}
	return meta
}

func (w *sessionWindow) reset() {
	w.byKey = make(map[string]*session)
	clear(w.heap)
	w.heap = w.heap[:0]
	w.open = 0
	w.watermark, w.hasWM = 0, false
	w.applied = nil
}

// Restore implements Stateful: it replaces the state with the snapshot.
// On error the state is left empty.
func (w *sessionWindow) Restore(sr Reader) error {
	w.reset()
	sawMeta := false
	err := sr.Each(func(k, v []byte) error {
		switch {
		case len(k) == 1 && k[0] == 'm':
			hasWM, wm, err := readWindowMeta(v, w.spec.Aggregates)
			if err != nil {
				return err
			}
			w.watermark, w.hasWM = wm, hasWM
			sawMeta = true
			return nil
		case len(k) >= 9 && k[0] == 's':
			if !sawMeta {
				return fmt.Errorf("%w: session entry before meta entry", errSnapshot)
			}
			start, key := getTime(k[1:9]), string(k[9:])
			d := snapDec{b: v}
			end := d.time()
			s := &session{start: start, end: end, sched: end, key: key, accs: make([]acc, len(w.aggs))}
			for i, agg := range w.aggs {
				agg.decode(&d, &s.accs[i])
			}
			switch {
			case d.err != nil:
				return fmt.Errorf("%w: session %d key %q: %v", errSnapshot, start, key, d.err)
			case len(d.b) != 0:
				return fmt.Errorf("%w: session %d key %q: %d trailing bytes", errSnapshot, start, key, len(d.b))
			case end <= start:
				return fmt.Errorf("%w: session key %q ends at %d, not after its start %d", errSnapshot, key, end, start)
			case w.max > 0 && end-start > w.max:
				return fmt.Errorf("%w: session key %q spans %d ms, more than max_duration", errSnapshot, key, end-start)
			}
			// Entries may come in any order: s goes to its place by
			// start in the key's list, and must not overlap its
			// neighbours.
			var prev *session
			next := w.byKey[key]
			for next != nil && next.start < start {
				prev, next = next, next.next
			}
			if (prev != nil && prev.end > start) || (next != nil && next.start < end) {
				return fmt.Errorf("%w: sessions of key %q overlap at %d", errSnapshot, key, start)
			}
			s.next = next
			if prev == nil {
				w.byKey[key] = s
			} else {
				prev.next = s
			}
			w.push(s)
			w.open++
			return nil
		}
		return fmt.Errorf("%w: unknown entry %q", errSnapshot, k)
	})
	if err != nil {
		w.reset()
		return fmt.Errorf("window restore: %w", err)
	}
	return nil
}

// readWindowMeta reads an "m" entry, refusing one of other aggregates.
func readWindowMeta(v []byte, aggs []Aggregate) (bool, int64, error) {
	d := snapDec{b: v}
	ver := d.byte()
	has := d.byte()
	wm := d.time()
	n := d.uvarint()
	if d.err != nil {
		return false, 0, fmt.Errorf("%w: meta: %v", errSnapshot, d.err)
	}
	if ver != 1 {
		return false, 0, fmt.Errorf("%w: meta: version %d, this build reads 1", errSnapshot, ver)
	}
	if n != uint64(len(aggs)) {
		return false, 0, fmt.Errorf("window snapshot has %d aggregates, the step has %d", n, len(aggs))
	}
	for _, a := range aggs {
		fn := d.bytes()
		if d.err != nil {
			return false, 0, fmt.Errorf("%w: meta: %v", errSnapshot, d.err)
		}
		if AggFunc(fn) != a.Func {
			return false, 0, fmt.Errorf("window snapshot aggregate %q is %s, the step has %s", a.Name, fn, a.Func)
		}
	}
	if len(d.b) != 0 {
		return false, 0, fmt.Errorf("%w: meta: %d trailing bytes", errSnapshot, len(d.b))
	}
	return has == 1, wm, nil
}
