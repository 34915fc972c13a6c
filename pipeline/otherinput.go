package pipeline

// The second input of a stream join: one more part of the route.
//
// A step with two inputs (operators.TwoInputs, a stream join) reads, besides
// the records of the route, the records of a second topic. That topic is a
// segment of its own (segment.other): the route's group consumes it with
// the source, each of its partitions is a task like a source task, and
// the task runs no step. It decodes each record (json or raw), reads its
// event time (stream.event_time), and writes it to the join's repartition
// topic keyed by the step's `other` key, its envelope flagged envOther,
// so the task that owns the key's partition holds both sides of it and
// hands the record to the step's ProcessOther. Its writer id is
// otherWriterBase + partition: its origins and its frontier are kept apart
// from the source partitions', and the join task's watermark is the
// minimum over both (watermark.ws).

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
)

// otherInput is what a segment reading a stream join's second topic
// knows of it.
type otherInput struct {
	in   operators.StreamInput
	step *rules.StepSpec // the join
}

// otherSegBase numbers the segments of second inputs, apart from the
// keyed segments (taskID: below 1024, which changelogID reserves).
const otherSegBase = 512

// keyed reports whether the segment opens at a keyed step (it reads a
// repartition topic); the source and a second input do not.
func (s *segment) keyed() bool { return s.keyStep != nil }

// writer is the id t writes repartition records and markers under.
func (t *task) writer() int32 {
	if t.seg.other != nil {
		return otherWriterBase + t.part
	}
	return t.part
}

// otherKeyer keys a second input's records by the join's `other`.
type otherKeyer struct{ operators.TwoInputs }

func (k otherKeyer) ShuffleKey(r *operators.Record) (string, error) { return k.OtherKey(r) }

// addOtherInputs appends a segment for the second topic of every step
// with two inputs, writing to that step's segment.
func (r *route) addOtherInputs(parts map[string]int) error {
	for _, seg := range slices0(r.plan.segs) {
		s := seg.keyStep
		if s == nil || !s.Traits.TwoInputs {
			continue
		}
		if s.Input == nil {
			return fmt.Errorf("route %q step %s: two inputs but no second topic", r.def.Name, stepLabel(s))
		}
		idx := otherSegBase + len(r.plan.segs) - 1
		o := &segment{idx: idx, topic: s.Input.Topic, from: s.Index, to: s.Index, next: seg,
			nparts: parts[s.Input.Topic], other: &otherInput{in: *s.Input, step: s}, markers: seg.timed || seg.markers}
		if o.nparts >= maxTaskPartitions {
			return fmt.Errorf("route %q: %s has %d partitions; at most %d are supported", r.def.Name, o.topic, o.nparts, maxTaskPartitions-1)
		}
		seg.others = append(seg.others, o)
		r.plan.segs = append(r.plan.segs, o)
	}
	return nil
}

func slices0(s []*segment) []*segment { return append([]*segment(nil), s...) }

// otherWriters is how many writers of second inputs a keyed segment has.
func (s *segment) otherWriters() int {
	n := 0
	for _, o := range s.others {
		n += o.nparts
	}
	return n
}

// processOther handles one record of a second input: decoded, given its
// event time, and written to the join's repartition topic as the other
// side.
func (t *task) processOther(kr *kgo.Record) {
	r := t.r
	now := r.plan.clock()
	in := t.seg.other.in
	t.mIn.Inc()
	r.tm.tracker.Begin(t.id, kr.Offset)
	t.curOff, t.seq = kr.Offset, 0
	tk := &ticket{r: r, p: t.id, off: kr.Offset, fetched: now, n: 1}
	rec := &operators.Record{Topic: kr.Topic, Partition: kr.Partition, Offset: kr.Offset, Key: kr.Key, Raw: kr.Value,
		Timestamp: kr.Timestamp.UnixMilli()}
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
	label := stepLabel(t.seg.other.step)
	switch {
	case kr.Value == nil:
	case in.Format == string(rules.FormatRaw):
		rec.Value = string(kr.Value)
	default:
		if err := rec.SetJSON(kr.Value); err != nil {
			r.deadLetter(rec, operators.ReasonDecode, err, label, tk)
			return
		}
	}
	rec.EventTime = rec.Timestamp
	if et := in.EventTime; et != nil {
		v, err := et.Eval(rec)
		if err == nil {
			rec.EventTime, err = eventMillis(v)
		}
		if err != nil {
			r.deadLetter(rec, operators.ReasonError, fmt.Errorf("stream.event_time %s: %w", et.Source, err), label, tk)
			return
		}
	}
	t.observeEvent(rec.EventTime)
	t.repartition(rec, tk)
	t.sendMarkers(now, false)
}
