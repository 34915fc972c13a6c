package pipeline

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
)

// segment is a run of a route's steps read from one topic: segment 0 reads
// the source topic and runs the steps before the first keyed step; segment
// k reads the repartition topic of the keyed step that opens it and runs it
// and the steps up to the next keyed step. The last segment writes to the
// sink; the others write to the next segment's repartition topic.
type segment struct {
	idx       int
	topic     string // the topic its tasks read
	from, to  int    // steps [from, to)
	next      *segment
	keyStep   *rules.StepSpec // steps[from] of a keyed segment
	changelog string          // of a keyed segment
	// other is set on the segment of a stream join's second topic
	// (otherinput.go); others are those that write to this keyed segment.
	other  *otherInput
	others []*segment
	nparts int // partitions of topic (for markers sent to it)
	// hold is how far behind the watermark its keyed step emits
	// (Traits.HoldsWatermark, a stream join): the frontier it passes on
	// to the next segment is held back by as much.
	hold    int64
	timed   bool // a step of the segment reacts to the watermark
	markers bool // a later segment is timed: send it watermark markers
	// sourceShaped: the values this segment reads still have the source's
	// shape (no map or window before it), so they may be decoded in part
	// like source records (route.members).
	sourceShaped bool
}

// keepsTime reports whether the tasks of a keyed segment keep a watermark:
// their own steps react to it, or they pass it on to a later segment that
// does. Such a task learns its writers' frontiers from the records they
// wrote as well as from their markers (a writer sends no marker to a
// partition its records already brought the frontier to: noteDelivered),
// and ticks for idleness.
func (s *segment) keepsTime() bool { return s.keyed() && (s.timed || s.markers) }

// taskID numbers a task (segment, partition) for the offsets tracker and
// the checkpoint: segment 0 keeps the source partition number, so the
// checkpoint of a route without keyed steps reads as it always did.
func taskID(seg int, part int32) int32 { return int32(seg)<<20 | part }

// changelogID is where a keyed task's changelog end offset is kept in the
// checkpoint's offsets.
func changelogID(seg int, part int32) int32 { return 1<<30 | int32(seg)<<20 | part }

// maxTaskPartitions bounds the partitions of a route's topics (taskID).
const maxTaskPartitions = 1 << 20

// repartitionTopic and changelogTopic name a keyed step's topics. The
// fingerprint stays out of the name: an edited step keeps its topics, and
// its changelog records carry their step's full name (headerStep).
func repartitionTopic(route string, s *rules.StepSpec) string {
	return fmt.Sprintf("%s.%02d-%s.repartition", route, s.Index, s.Kind)
}

func changelogTopic(route string, s *rules.StepSpec) string {
	return fmt.Sprintf("%s.%02d-%s.changelog", route, s.Index, s.Kind)
}

// task is one owned (topic, partition) of a route: a goroutine that runs
// its segment's steps on each record in offset order.
type task struct {
	r    *route
	seg  *segment
	id   int32
	part int32
	ch   chan taskBatch // fetched batches in offset order, and tapped ones (tap.go)
	// held are tapped batches waiting for the fetch to reach them (tap.go);
	// only the task's goroutine touches them.
	held       []taskBatch
	stop       chan struct{} // closed when the partition is released
	done       chan struct{} // closed when the goroutine returned
	chain      *chain
	pos        int64 // next offset to dispatch; written under cut.RLock by its goroutine, read under cut.Lock
	resetPoint       // where an exactly-once task goes back to (txn.go)
	hwm        atomic.Int64
	label      string
	mIn        prometheus.Counter // tasks reading an input: the source, a stream join's second topic

	// keyer evaluates the next segment's key (a private instance: an
	// expression program is not shared between goroutines).
	keyer operators.Keyed

	// Writing to a repartition topic: the origin of what is written now.
	curOff int64
	seq    uint32

	front struct {
		sync.Mutex
		has       bool
		frontier  int64       // event-time frontier this task passes on
		sent      []int64     // frontier last delivered to each next partition
		sentAt    []time.Time // when
		sinceSent int         // records processed since the last marker round
	}

	keyedState // keyed tasks (segment > 0) only
}

// resetPoint is where a task of an exactly-once route goes back to when
// its transaction aborts (txn.go, resetTasks).
type resetPoint struct {
	// base is where the task resumes after an aborted transaction: its
	// offset in the last committed checkpoint, or where it was assigned.
	base int64
	// baseWM is the watermark at that checkpoint of a keyed task that keeps time.
	baseWM *watermark
	// expectBy is set on a task rebuilt by an aborted transaction whose
	// predecessor had processed records past base: the fetch moved back
	// to base must return one of those records first, at or below
	// expectBy. A fetch that starts above it was taken from before the
	// move (franz-go can hand out a response that was in flight while
	// the offsets were set, and taking it moves the fetch position to
	// its end): the task drops it and what follows, and the transaction
	// aborts again (freshFetch). -1: nothing to check. Only the task's
	// goroutine uses them once it runs.
	expectBy int64
	stale    bool
}

// keyedState is what a keyed task (segment > 0) holds beyond a source
// task: its watermark, its inbox of writers' origins, its state's names,
// its changelog position and its close journal (journal.go). Its dispatch
// goroutine and the idle loop use it under steps; the journal under jmu.
type keyedState struct {
	wm watermark
	// steps is held while a goroutine runs the task's chain: its dispatch
	// goroutine for a record, or the idle loop for a watermark move. Both
	// hold cut.RLock, which does not keep them apart (lock order: cut,
	// then steps).
	steps sync.Mutex
	// passed is the last watermark handed to the steps (advanceTask), and
	// passing is set while they emit what it closed: those rows carry
	// the frontier from before (passedBefore), and the new one follows
	// them in a marker (repartition). Only the goroutine running
	// advanceTask touches them.
	passed, passedBefore int64
	hasPassed, passing   bool
	inbox                map[int32]origin // highest origin applied per writer; checkpointed
	stepName             string           // namespace of the keyed step
	inboxName            string           // namespace holding the inbox snapshot
	clEnd                int64            // changelog end offset as of the last logged cut
	prevSnap             map[string]uint64
	journal              string // "" when the task keeps no close journal
	closer               operators.Closer
	applied              map[int32]int64 // highest source offset applied, per source partition
	jmu                  sync.Mutex      // serialises journal writes
	jwm                  int64           // under jmu
}

// frontier is the event-time frontier this task hands to the next segment:
// a source task's max event time minus the allowed lateness, a keyed task's
// watermark.
func (t *task) frontier() (int64, bool) {
	if t.seg.keyed() {
		return t.wm.current()
	}
	t.front.Lock()
	defer t.front.Unlock()
	return t.front.frontier, t.front.has
}

// passOn is the frontier f as the next segment gets it: held back by what
// the segment's keyed step may still emit behind it.
func (t *task) passOn(f int64) int64 {
	if f == minWatermark {
		return f
	}
	return f - t.seg.hold
}

// observeEvent notes a source record's event time.
func (t *task) observeEvent(ev int64) {
	f := ev - t.r.def.Source.Watermark.Milliseconds()
	t.front.Lock()
	first := !t.front.has
	if first || f > t.front.frontier {
		t.front.frontier, t.front.has = f, true
	}
	t.front.sinceSent++
	t.front.Unlock()
	if first {
		t.r.noteTimed()
	}
}

// markerEvery bounds how often a task sends watermark markers while its
// frontier moves: a window behind a repartition closes at most this late.
const markerEvery = 20 * time.Millisecond

// sendMarkers puts a watermark marker on every partition of the next
// repartition topic whose last record or marker from this task carried an
// older frontier; with force, also on those not written to for a quarter
// of idle_timeout while records flowed (the reader counts this task active).
// Without force, a partition sent a marker less than markerEvery ago waits
// for a later round (the idle loop's, or the cut's: cutMarkers).
func (t *task) sendMarkers(now time.Time, force bool) {
	t.markerRound(now, force, force)
}

// cutMarkers sends, at the cut of an exactly-once route (cut held), the
// markers sendMarkers held back by markerEvery: every partition of the
// next topic whose last record or marker from this task carried an older
// frontier gets one now, so the transaction that commits the task's
// position also commits the frontier that position implies. Sent after
// the cut, into the next transaction, the marker was lost when that one
// aborted (the task rebuilt at its committed position has no frontier and
// reads nothing again), and never committed while the route rested
// (docs/ARCHITECTURE.md, invariant 80).
func (t *task) cutMarkers(now time.Time) {
	t.markerRound(now, true, false)
}

// markerRound sends the markers due: to every partition whose frontier is
// stale (unpaced: at once, else at most every markerEvery), and with beat
// the heartbeats of an active task to those quiet for a quarter of
// idle_timeout.
func (t *task) markerRound(now time.Time, unpaced, beat bool) {
	next := t.seg.next
	if next == nil || !t.seg.markers {
		return
	}
	f, ok := t.frontier()
	if !ok {
		return
	}
	f = t.passOn(f)
	t.front.Lock()
	if len(t.front.sent) < next.nparts {
		for len(t.front.sent) < next.nparts {
			t.front.sent = append(t.front.sent, minWatermark)
			t.front.sentAt = append(t.front.sentAt, time.Time{})
		}
	}
	active := t.front.sinceSent > 0
	every := t.r.def.Source.IdleTimeout / 4
	var targets []int32
	for q := range next.nparts {
		stale := t.front.sent[q] < f
		quiet := beat && active && now.Sub(t.front.sentAt[q]) >= every
		if !stale && !quiet {
			continue
		}
		if !unpaced && now.Sub(t.front.sentAt[q]) < markerEvery {
			continue
		}
		t.front.sent[q], t.front.sentAt[q] = f, now
		targets = append(targets, int32(q))
	}
	if beat {
		t.front.sinceSent = 0
	}
	t.front.Unlock()
	if len(targets) == 0 {
		return
	}
	val := encodeMarker(t.writer(), f)
	for _, q := range targets {
		kr := &kgo.Record{Topic: next.topic, Partition: q, Headers: []kgo.RecordHeader{{Key: headerMarker, Value: val}}}
		t.r.send(kr, func(_ *kgo.Record, err error) {
			if err == nil || t.r.out.ctx.Err() != nil {
				return
			}
			// Nothing but a marker may carry f to q (at rest no record
			// follows): q is stale again, and the next round (the idle
			// loop's, the cut's) sends it once more. In a transaction the
			// write failed it: it aborts, and the cut after the reset
			// sends the frontier again.
			t.front.Lock()
			if int(q) < len(t.front.sent) && t.front.sent[q] == f {
				t.front.sent[q] = minWatermark
			}
			t.front.Unlock()
			if t.r.txn.on {
				t.r.txnFail(fmt.Errorf("watermark marker %s[%d]: %w", next.topic, q, err))
			}
			t.r.log.Debug("watermark marker not written", "topic", next.topic, "partition", q, "err", err)
		})
	}
}

// noteDelivered records that a repartition record carrying frontier f went
// to partition q of the next topic: its reader observes f when it reads
// the record (segment.keepsTime), so q needs no marker for f.
func (t *task) noteDelivered(q int32, f int64, now time.Time) {
	t.front.Lock()
	if int(q) < len(t.front.sent) && f > t.front.sent[q] {
		t.front.sent[q], t.front.sentAt[q] = f, now
	}
	t.front.Unlock()
}

// dispatchLoop runs the task's records through its chain until the task
// is released or the route halts.
func (t *task) dispatchLoop() {
	r := t.r
	defer close(t.done)
	for {
		var b taskBatch
		select {
		case b = <-t.ch:
		case <-t.stop:
			return
		case <-r.life.halt:
			return
		}
		recs := b.recs
		if b.tapped {
			if recs = t.continuing(b); recs == nil {
				continue // held for later, or already fetched
			}
		} else if !t.freshFetch(recs) {
			if b.poll != nil {
				b.poll.done()
			}
			continue
		}
		began := time.Now()
		ok := t.dispatch(recs, b.tapped)
		// Tapped batches the fetch has now caught up with.
		for ok {
			recs := t.heldContinuing()
			if recs == nil {
				break
			}
			ok = t.dispatch(recs, true)
		}
		r.mx.busy.Add(time.Since(began).Seconds())
		// Its done offsets moved: the lag gauge follows (lagLoop).
		r.noteLag()
		// The batch's writes leave with its poll's (batch.go); a tapped
		// one belongs to no poll and flushes its own.
		if b.poll != nil {
			b.poll.done()
		} else {
			r.flushWrites()
		}
		if !ok {
			return
		}
	}
}

// freshFetch reports whether fetched recs may be dispatched to t: false
// for a task that met a fetch from before its reset (expectBy), whose
// records it drops until the transaction aborts again and rebuilds it.
func (t *task) freshFetch(recs []*kgo.Record) bool {
	r := t.r
	if t.stale {
		return false
	}
	if t.expectBy < 0 || len(recs) == 0 {
		return true
	}
	if first := recs[0].Offset; first > t.expectBy {
		t.stale = true
		r.m.met.staleFetches.WithLabelValues(r.name).Inc()
		err := fmt.Errorf("%w: %s[%d] resumed at %d after the reset to %d (expected a record at or below %d)",
			errStaleFetch, t.seg.topic, t.part, first, t.base, t.expectBy)
		r.txn.failed.CompareAndSwap(nil, &err)
		r.log.Warn("a fetch after an aborted transaction returned records from before it; aborting again", "err", err)
		return false
	}
	t.expectBy = -1
	return true
}

// errStaleFetch aborts a transaction whose rebuilt task was handed
// records fetched before its reset.
var errStaleFetch = errors.New("stale fetch after a reset")

// dispatch runs recs through t's steps in order, each record at or past
// t.pos; false once the task or the route stops.
func (t *task) dispatch(recs []*kgo.Record, tapped bool) bool {
	r := t.r
	n := 0
	for _, rec := range recs {
		// A record whose schema the registry has not given yet waits
		// here, outside cut (format.go).
		if !r.awaitSchema(t, rec) {
			return false
		}
		// Each record is a boundary: a checkpoint, a release or a stop
		// may take cut between any two.
		r.cut.RLock()
		if r.halted || isClosed(t.stop) {
			r.cut.RUnlock()
			return false
		}
		if rec.Offset >= t.pos {
			switch {
			case t.seg.other != nil:
				t.processOther(rec)
			case t.seg.idx == 0:
				t.processSource(rec)
			default:
				t.steps.Lock()
				t.processRepartitioned(rec)
				t.steps.Unlock()
			}
			t.pos = rec.Offset + 1
			n++
		}
		r.cut.RUnlock()
	}
	if t.seg.other != nil && n > 0 {
		r.mx.addOther(t.seg.topic, int64(n))
	}
	if t.seg.idx == 0 {
		r.mx.in.Add(int64(n))
		if tapped && n > 0 {
			r.mx.nTapped.Add(int64(n))
			r.mx.tapped.Add(float64(n))
		}
	}
	return true
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// processRepartitioned handles one record of a repartition topic: a
// watermark marker, or a record another task wrote for this keyed step.
func (t *task) processRepartitioned(kr *kgo.Record) {
	r := t.r
	now := r.plan.clock()
	r.tm.tracker.Begin(t.id, kr.Offset)
	tk := &ticket{r: r, p: t.id, off: kr.Offset, fetched: now, n: 1}
	defer tk.release()
	defer func() {
		if v := recover(); v != nil {
			r.recordPanicked(v, &operators.Record{Topic: kr.Topic, Partition: kr.Partition, Offset: kr.Offset, Key: kr.Key,
				Raw: kr.Value, Timestamp: kr.Timestamp.UnixMilli()}, tk)
		}
	}()
	t.curOff, t.seq = kr.Offset, 0
	var env []byte
	for _, h := range kr.Headers {
		switch h.Key {
		case headerMarker:
			wp, f, err := decodeMarker(h.Value)
			if err != nil {
				r.noteError(fmt.Errorf("%s[%d]@%d: bad watermark marker: %w", kr.Topic, kr.Partition, kr.Offset, err))
				return
			}
			if wm, moved := t.wm.observe(wp, f, now); moved {
				t.advanceTask(wm, tk)
			}
			return
		case headerEnvelope:
			env = h.Value
		}
	}
	rec := &operators.Record{Topic: kr.Topic, Partition: kr.Partition, Offset: kr.Offset, Key: kr.Key, Raw: kr.Value,
		Timestamp: kr.Timestamp.UnixMilli()}
	e, err := decodeEnvelope(env)
	if env == nil || err != nil {
		if err == nil {
			err = fmt.Errorf("%w: no %s header", errEnvelope, headerEnvelope)
		}
		r.deadLetter(rec, operators.ReasonDecode, err, stepLabel(t.seg.keyStep), tk)
		return
	}
	// The writer's frontier the record carries is observed after the
	// record is applied (so a watermark never overtakes the record that
	// raised it), and also when the record is skipped or dead-lettered:
	// the writer counts it delivered and sends this partition no marker
	// for that frontier (noteDelivered).
	observe := func() {
		if !t.seg.keepsTime() {
			return
		}
		if wm, moved := t.wm.observe(e.wp, e.frontier, now); moved {
			t.advanceTask(wm, tk)
		}
	}
	if last, ok := t.inbox[e.wp]; ok && !e.org.after(last) {
		// Written again by a writer replaying from its checkpoint: applied
		// already.
		r.m.met.repeatsSkipped.WithLabelValues(r.name).Inc()
		observe()
		return
	}
	t.inbox[e.wp] = e.org
	rec.Topic, rec.Partition, rec.Offset, rec.Key = e.topic, e.part, e.off, e.key
	rec.Timestamp, rec.EventTime, rec.Window = e.ts, e.ev, e.win
	for _, h := range kr.Headers {
		if h.Key != headerEnvelope {
			rec.Headers = append(rec.Headers, operators.Header{Key: h.Key, Value: h.Value})
		}
	}
	switch {
	case e.flags&envNil != 0:
		rec.Raw = nil
	case e.flags&envRaw != 0:
		rec.Value = string(kr.Value)
	default:
		var err error
		if r.plan.members != nil && t.seg.sourceShaped && rec.Window == nil && e.flags&envOther == 0 {
			err = rec.SetJSONMembers(kr.Value, r.plan.members)
		} else if in := t.seg.keyStep.Input; e.flags&envOther != 0 && in != nil && in.Members != nil {
			// A stream join's second input: the members anything reads
			// of it (operators.StreamInput.Members).
			err = rec.SetJSONMembers(kr.Value, in.Members)
		} else {
			err = rec.SetJSON(kr.Value)
		}
		if err != nil {
			r.deadLetter(rec, operators.ReasonDecode, err, stepLabel(t.seg.keyStep), tk)
			observe()
			return
		}
	}
	if e.bound != nil {
		v, err := jsoncodec.Decode(e.bound)
		m, ok := v.(map[string]any)
		if err != nil || !ok {
			r.deadLetter(rec, operators.ReasonDecode, fmt.Errorf("join bindings: %v", err), stepLabel(t.seg.keyStep), tk)
			observe()
			return
		}
		rec.Bound = m
	}
	if t.applied != nil && rec.Partition >= 0 && rec.Offset >= 0 {
		if a, ok := t.applied[rec.Partition]; !ok || rec.Offset > a {
			t.applied[rec.Partition] = rec.Offset
		}
	}
	c := t.chain
	c.cur = tk
	if e.flags&envOther != 0 {
		c.runOther(rec)
	} else {
		c.run(0, rec)
	}
	c.cur = nil
	observe()
}

// advanceTask hands a keyed task's new watermark to its steps, journals
// closed windows, and passes the watermark on to the next segment.
func (t *task) advanceTask(wm int64, tk *ticket) {
	r := t.r
	closing := t.closer != nil && t.closer.ClosesAt(wm)
	// The rows this move closes carry the frontier from before it: had
	// the first carried wm, the next segment would move past the event
	// time of the others (window_end − 1) before they arrived.
	t.passing, t.passedBefore = true, t.passed
	if !t.hasPassed {
		t.passedBefore = minWatermark
	}
	first := !t.hasPassed
	t.chain.advance(wm, tk)
	t.passing, t.passed, t.hasPassed = false, wm, true
	if first {
		// The route's watermark gauge has a value from now on
		// (refreshLag). A task's first watermark may come from an idle
		// tick, which no fetch accompanies: without this a resting lag
		// loop never set the gauge (TestDashboardMetricsExported failed
		// in a clean run).
		r.noteLag()
	}
	if closing {
		t.journalAfterAck(wm)
	}
	if t.seg.next != nil {
		t.front.Lock()
		t.front.sinceSent++
		t.front.Unlock()
		t.sendMarkers(r.plan.clock(), false)
	}
}
