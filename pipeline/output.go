package pipeline

// Outputs: a record that left its segment is written to the sink (output)
// or to the next segment's repartition topic (repartition). The names of
// our headers on outputs and dead letters are here too.

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/operators"
)

// Header names on outputs and dead letters. They are a contract with
// consumers: they tell a repeat after recovery apart and say why a record
// was dead-lettered.
const (
	HeaderSource = "rtproxy-source" // topic/partition/offset of the source record
	HeaderWindow = "rtproxy-window" // <start>-<end> epoch millis of a window row
	HeaderReason = "rtproxy-reason"
	HeaderError  = "rtproxy-error"
	HeaderRoute  = "rtproxy-route"
	HeaderStep   = "rtproxy-step" // "<index>:<kind>", or "source" / "sink"
	// HeaderTarget names the topic an output was meant for when the
	// brokers refused it (dead letters with reason "sink").
	HeaderTarget = "rtproxy-target"
)

// output writes a record that left task t's last step to its sink: the
// route's, or the one of the branch its switch chose (sinkset.go), with
// that sink's key and format.
func (t *task) output(rec *operators.Record, tk *ticket) {
	r := t.r
	to := r.outletOf(rec.Branch)
	if to == nil {
		r.deadLetter(rec, operators.ReasonError, fmt.Errorf("no sink for switch branch %d", rec.Branch), "sink", tk)
		return
	}
	key := rec.Key
	if k := to.spec.Key; k != nil {
		v, err := k.Eval(rec)
		if err != nil {
			to.failed()
			r.deadLetter(rec, operators.ReasonError, err, "sink", tk)
			return
		}
		key = keyBytes(v)
	}
	val, err := r.sinkValue(rec, to.idx) // format.go
	if err != nil {
		to.failed()
		r.deadLetter(rec, outputReason(err), err, "sink", tk)
		return
	}
	o := new(outRecord)
	hs := o.hs[:0]
	for _, h := range rec.Headers {
		if strings.HasPrefix(h.Key, "rtproxy-") {
			continue // a route reading another route's sink: ours replace theirs
		}
		hs = append(hs, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	if w := rec.Window; w != nil {
		hs = append(hs, kgo.RecordHeader{Key: HeaderWindow, Value: fmt.Appendf(nil, "%d-%d", w.Start, w.End)})
	} else {
		hs = append(hs, kgo.RecordHeader{Key: HeaderSource, Value: appendSourceRef(o.ref[:0], rec)})
	}
	// The source record's timestamp (a window row's is window_end − 1):
	// consumers and time-based retention see event time, not our write.
	o.kr = kgo.Record{Topic: to.snk.target(), Key: key, Value: val, Headers: hs, Timestamp: time.UnixMilli(rec.Timestamp)}
	// Where it comes from: the task, the offset of the record it was
	// processing and its place among that record's outputs (a sink that
	// is not a topic names an output by them: outputID).
	o.t, o.off, o.idx = t, t.curOff, t.seq
	t.seq++
	o.w = write{via: to.snk, tk: tk, isOutput: true, srcMillis: rec.Timestamp, to: to}
	r.writeOutput(o)
}

// outRecord is an output with its write state, its first headers and its
// source reference in one allocation (they live exactly as long: until
// the write is acknowledged). More headers or a longer reference grow
// into allocations of their own.
type outRecord struct {
	kr  kgo.Record
	w   write
	t   *task  // the task that wrote it
	off int64  // the offset (in t's topic) of the record t was processing
	idx uint32 // its place among that record's outputs
	hs  [1]kgo.RecordHeader
	ref [40]byte
}

// outputID names an output for a receiver that drops repeats: the route,
// the topic, partition and offset of the record its task was processing
// (the source record, or a keyed step's repartition record) and its index
// among that record's outputs. A replay from a checkpoint processes the
// same records at the same offsets into the same outputs, so a repeat
// carries the id its first write carried. Window rows closed by idleness
// (no record processed) take the last record's offset and count on.
func (o *outRecord) outputID(route string) string {
	b := make([]byte, 0, len(route)+len(o.t.seg.topic)+32)
	b = append(b, route...)
	b = append(b, '/')
	b = append(b, o.t.seg.topic...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(o.t.part), 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, o.off, 10)
	b = append(b, '/')
	b = strconv.AppendUint(b, uint64(o.idx), 10)
	return string(b)
}

// repartition writes a record that left task t's segment to the next
// segment's repartition topic, keyed by the next keyed step's key.
func (t *task) repartition(rec *operators.Record, tk *ticket) {
	r := t.r
	key, err := t.keyer.ShuffleKey(rec)
	if err != nil {
		r.deadLetter(rec, operators.ReasonError, err, stepLabel(t.seg.next.keyStep), tk)
		return
	}
	val, raw := r.plan.format.sourceBytes(rec)
	if !raw && !(rec.Value == nil && rec.Raw == nil) {
		if val, err = r.encodeValue(rec); err != nil {
			r.deadLetter(rec, operators.ReasonError, err, "repartition", tk)
			return
		}
	}
	f, _ := t.frontier()
	if t.passing {
		// Emitted by a watermark move (advanceTask): the frontier from
		// before it; a marker brings the new one after these rows.
		f = t.passedBefore
	}
	f = t.passOn(f)
	env, err := encodeEnvelope(nil, rec, t.writer(), t.curOff, t.seq, f, raw)
	if err != nil {
		r.deadLetter(rec, operators.ReasonError, err, "repartition", tk)
		return
	}
	if t.seg.other != nil {
		env[1] |= envOther
	}
	t.seq++
	hs := make([]kgo.RecordHeader, 0, len(rec.Headers)+1)
	for _, h := range rec.Headers {
		if strings.HasPrefix(h.Key, "rtproxy-") {
			continue
		}
		hs = append(hs, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	hs = append(hs, kgo.RecordHeader{Key: headerEnvelope, Value: env})
	kr := &kgo.Record{Topic: t.seg.next.topic, Key: []byte(key), Value: val, Headers: hs, Timestamp: time.UnixMilli(rec.Timestamp)}
	r.produceTo(kr, tk, false, rec.Timestamp, func(got *kgo.Record) {
		t.noteDelivered(got.Partition, f, r.plan.clock())
	})
}

func sourceRef(rec *operators.Record) []byte {
	return appendSourceRef(make([]byte, 0, len(rec.Topic)+24), rec)
}

// appendSourceRef appends rec's topic/partition/offset to b.
func appendSourceRef(b []byte, rec *operators.Record) []byte {
	b = append(b, rec.Topic...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(rec.Partition), 10)
	b = append(b, '/')
	return strconv.AppendInt(b, rec.Offset, 10)
}

// encodeValue is the sink value of rec. A value decoded from JSON that no
// step changed (filters, joins, drop_duplicates) is forwarded as the bytes
// the producer sent, without encoding; one decoded in part and changed by
// set is those bytes with the members set wrote spliced in; a window row,
// or a value map built, is encoded as canonical JSON.
func (r *route) encodeValue(rec *operators.Record) ([]byte, error) {
	if rec.Window == nil {
		if raw, ok := rec.ValueBytes(); ok {
			return raw, nil
		}
		if rec.Partial() {
			return rec.EncodeValue(nil)
		}
	}
	if b, ok := r.plan.format.sourceBytes(rec); ok {
		return b, nil
	}
	if v, ok := rec.Value.([]byte); ok {
		return v, nil
	}
	return jsoncodec.Append(nil, rec.Value)
}

func keyBytes(v any) []byte {
	switch x := v.(type) {
	case nil:
		return nil
	case string:
		return []byte(x)
	case []byte:
		return x
	case float64:
		return strconv.AppendFloat(nil, x, 'f', -1, 64)
	}
	b, err := jsoncodec.Append(nil, v)
	if err != nil {
		return fmt.Append(nil, v)
	}
	return b
}
