package pipeline

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/state"
)

type stateCheckpoint = state.Checkpoint

var kerrTopicExists = kerr.TopicAlreadyExists

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

func atomicAdd(p *int32, d int32) int32 { return atomic.AddInt32(p, d) }

// processSource turns one fetched record into a step record and runs the
// partition's chain on it.
func (r *route) processSource(t *task, kr *kgo.Record) {
	now := time.Now()
	t.mIn.Inc()
	r.tracker.Begin(t.id, kr.Offset)
	t.curOff, t.seq = kr.Offset, 0
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
	if r.def.Source.Format == "raw" {
		rec.Value = string(kr.Value)
	} else {
		// SetJSON remembers the bytes, so a value no step changes goes to
		// the sink as it arrived (encodeValue). On error rec keeps Raw and a
		// nil Value: the dead letter carries the bytes as received.
		if err := rec.SetJSON(kr.Value); err != nil {
			r.deadLetter(rec, operators.ReasonDecode, err, "source", tk)
			return
		}
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
	if r.timed {
		// The record's own event time is in the frontier it carries: the
		// reader applies the record before the frontier, so a watermark
		// never overtakes the record that raised it.
		t.observeEvent(rec.EventTime)
	}
	c := t.chain
	c.cur = tk
	c.run(0, rec)
	c.cur = nil
	if r.timed {
		t.sendMarkers(now, false)
	}
}

// idleLoop moves keyed tasks' watermarks when their writers go idle, and
// has writers send the markers that say they are alive.
func (r *route) idleLoop() {
	iv := min(r.def.Source.IdleTimeout/4, 200*time.Millisecond)
	iv = max(iv, 10*time.Millisecond)
	tick := time.NewTicker(iv)
	defer tick.Stop()
	for {
		select {
		case <-r.halt:
			return
		case now := <-tick.C:
			r.cut.RLock()
			if !r.halted {
				for _, t := range r.tasks {
					if isClosed(t.stop) {
						continue
					}
					if t.seg.idx > 0 && t.seg.timed {
						if wm, moved := t.wm.tick(now); moved {
							// An idle advance emits without a source
							// record; its origin follows the last one.
							r.advanceTask(t, wm, nil)
						}
					}
					t.sendMarkers(now, true)
				}
			}
			r.cut.RUnlock()
		}
	}
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

// output writes a record that left the last step to the sink.
func (r *route) output(rec *operators.Record, tk *ticket) {
	key := rec.Key
	if k := r.def.Sink.Key; k != nil {
		v, err := k.Eval(rec)
		if err != nil {
			r.deadLetter(rec, operators.ReasonError, err, "sink", tk)
			return
		}
		key = keyBytes(v)
	}
	val, err := r.encodeValue(rec)
	if err != nil {
		r.deadLetter(rec, operators.ReasonError, err, "sink", tk)
		return
	}
	hs := make([]kgo.RecordHeader, 0, len(rec.Headers)+1)
	for _, h := range rec.Headers {
		if strings.HasPrefix(h.Key, "rtproxy-") {
			continue // a route reading another route's sink: ours replace theirs
		}
		hs = append(hs, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	if w := rec.Window; w != nil {
		hs = append(hs, kgo.RecordHeader{Key: HeaderWindow, Value: fmt.Appendf(nil, "%d-%d", w.Start, w.End)})
	} else {
		hs = append(hs, kgo.RecordHeader{Key: HeaderSource, Value: sourceRef(rec)})
	}
	kr := &kgo.Record{Topic: r.def.Sink.Topic, Key: key, Value: val, Headers: hs}
	r.produce(kr, tk, true, rec.Timestamp)
}

// repartition writes a record that left task t's segment to the next
// segment's repartition topic, keyed by the next keyed step's key.
func (r *route) repartition(t *task, rec *operators.Record, tk *ticket) {
	key, err := t.keyer.ShuffleKey(rec)
	if err != nil {
		r.deadLetter(rec, operators.ReasonError, err, stepLabel(t.seg.next.keyStep), tk)
		return
	}
	raw := false
	var val []byte
	switch v := rec.Value.(type) {
	case string:
		if r.def.Source.Format == "raw" && rec.Window == nil {
			raw, val = true, []byte(v)
		}
	case nil:
		if rec.Raw == nil {
			break
		}
		if rec.Window == nil && r.def.Source.Format == "raw" {
			raw, val = true, rec.Raw
		}
	}
	if !raw && !(rec.Value == nil && rec.Raw == nil) {
		if val, err = r.encodeValue(rec); err != nil {
			r.deadLetter(rec, operators.ReasonError, err, "repartition", tk)
			return
		}
	}
	f, _ := t.frontier()
	env, err := encodeEnvelope(nil, rec, t.part, t.curOff, t.seq, f, raw)
	if err != nil {
		r.deadLetter(rec, operators.ReasonError, err, "repartition", tk)
		return
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
	kr := &kgo.Record{Topic: t.seg.next.topic, Key: []byte(key), Value: val, Headers: hs}
	r.produceTo(kr, tk, false, rec.Timestamp, func(got *kgo.Record) {
		t.noteDelivered(got.Partition, f, time.Now())
	})
}

func sourceRef(rec *operators.Record) []byte {
	b := make([]byte, 0, len(rec.Topic)+24)
	b = append(b, rec.Topic...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(rec.Partition), 10)
	b = append(b, '/')
	return strconv.AppendInt(b, rec.Offset, 10)
}

// encodeValue is the sink value of rec. A value decoded from JSON that no
// step changed (filters, joins, drop_duplicates) is forwarded as the bytes
// the producer sent, without encoding; a window row, or a value set or map
// changed, is encoded as canonical JSON.
func (r *route) encodeValue(rec *operators.Record) ([]byte, error) {
	if rec.Window == nil {
		if raw, ok := rec.ValueBytes(); ok {
			return raw, nil
		}
	}
	switch v := rec.Value.(type) {
	case string:
		if r.def.Source.Format == "raw" && rec.Window == nil {
			return []byte(v), nil
		}
	case []byte:
		return v, nil
	case nil:
		if rec.Window == nil && rec.Raw != nil && r.def.Source.Format == "raw" {
			return rec.Raw, nil
		}
	}
	return operators.AppendJSON(nil, rec.Value)
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
	b, err := operators.AppendJSON(nil, v)
	if err != nil {
		return fmt.Append(nil, v)
	}
	return b
}

// deadLetter sends rec to the route's dead-letter topic with its original
// key and value and headers saying why.
func (r *route) deadLetter(rec *operators.Record, reason operators.Reason, err error, step string, tk *ticket) {
	r.m.met.deadLetters.WithLabelValues(r.name, string(reason)).Inc()
	val := rec.Raw
	if val == nil && rec.Value != nil {
		val, _ = operators.AppendJSON(nil, rec.Value)
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	hs := []kgo.RecordHeader{
		{Key: HeaderReason, Value: []byte(reason)},
		{Key: HeaderError, Value: []byte(msg)},
		{Key: HeaderRoute, Value: []byte(r.name)},
		{Key: HeaderStep, Value: []byte(step)},
		{Key: HeaderSource, Value: sourceRef(rec)},
	}
	kr := &kgo.Record{Topic: deadLetterTopic(r.def), Key: rec.Key, Value: val, Headers: hs}
	r.produce(kr, tk, false, rec.Timestamp)
}

// produce writes kr and, on acknowledgement, releases its hold on tk. A
// failed write is retried with backoff for as long as the route runs: the
// record's offset cannot become done before, so nothing is dropped.
func (r *route) produce(kr *kgo.Record, tk *ticket, isOutput bool, srcMillis int64) {
	r.produceTo(kr, tk, isOutput, srcMillis, nil)
}

// produceTo is produce with a hook called on acknowledgement.
//
// A write the brokers refuse for the record itself (too large, invalid:
// poisonErr) is never retried: the record goes to the dead-letter topic
// with reason "sink" instead, in the same epoch and under the same hold
// on tk, so the checkpoint covers it exactly as it would have covered the
// output. A dead letter refused in turn is written once more without its
// value (headers say why). Anything else is retried.
//
// A write that fails once the route is being stopped (its context ended,
// the client closed) is given up: the route is marked abandoned, so no
// checkpoint after it commits and the next run replays it.
func (r *route) produceTo(kr *kgo.Record, tk *ticket, isOutput bool, srcMillis int64, acked func(*kgo.Record)) {
	if tk != nil {
		tk.hold()
	}
	ep := r.inflightAdd(1, -1)
	attempt := 0
	diverted := 0 // 1: written as a dead letter; 2: as a dead letter without its value
	var cb func(*kgo.Record, error)
	cb = func(got *kgo.Record, err error) {
		if err != nil {
			if errors.Is(err, kgo.ErrClientClosed) || r.ctx.Err() != nil || r.prodCtx.Err() != nil {
				r.abandoned.Store(true)
				r.inflightAdd(-1, ep)
				return
			}
			if poisonErr(err) && diverted < 2 {
				if got.Topic == deadLetterTopic(r.def) {
					diverted = 2 // a dead letter already: keep its reason, drop its value
				} else {
					diverted = 1
					r.m.met.deadLetters.WithLabelValues(r.name, reasonSink).Inc()
				}
				dl := r.sinkDeadLetter(got, err, diverted == 2)
				r.log.Warn("output refused by the brokers; written to the dead-letter topic",
					"topic", got.Topic, "dead_letter", dl.Topic, "bytes", len(got.Value), "err", err)
				r.cl.Produce(r.prodCtx, dl, cb)
				return
			}
			attempt++
			r.sinkError(fmt.Errorf("write %s: %w", got.Topic, err))
			r.missingTopic(got.Topic, err)
			backoff := min(50*time.Millisecond<<min(attempt, 7), 5*time.Second)
			again := &kgo.Record{Topic: got.Topic, Key: got.Key, Value: got.Value, Headers: got.Headers}
			time.AfterFunc(backoff, func() { r.cl.Produce(r.prodCtx, again, cb) })
			return
		}
		if attempt > 0 {
			r.sinkRecovered()
		}
		if isOutput && diverted == 0 {
			r.mOut.Inc()
			r.mE2E.Observe(time.Since(time.UnixMilli(srcMillis)).Seconds())
		}
		if acked != nil && diverted == 0 {
			acked(got)
		}
		r.inflightAdd(-1, ep)
		if tk != nil {
			tk.release()
		}
	}
	r.cl.Produce(r.prodCtx, kr, cb)
}

// reasonSink is the dead-letter reason of an output the brokers refused.
const reasonSink = "sink"

// poisonErr reports whether a produce error is about the record itself, so
// that retrying it can never succeed.
func poisonErr(err error) bool {
	for _, e := range []error{kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidRecord,
		kerr.CorruptMessage, kerr.InvalidTimestamp} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// sinkDeadLetter is the dead letter for a record the brokers refused. An
// output becomes one with reason "sink": its key, value and headers (window
// and source headers stay, so it says where it came from) plus the reason
// headers and the topic it was meant for. A dead letter refused in turn
// (bare) is written again without its value, its headers kept and its
// error saying why.
func (r *route) sinkDeadLetter(got *kgo.Record, err error, bare bool) *kgo.Record {
	msg := fmt.Sprintf("write %s[%d]: %v", got.Topic, got.Partition, err)
	hs := make([]kgo.RecordHeader, 0, len(got.Headers)+6)
	if bare {
		prev := ""
		for _, h := range got.Headers {
			if h.Key == HeaderError {
				prev = string(h.Value) + "; "
				continue
			}
			hs = append(hs, h)
		}
		msg = fmt.Sprintf("%sthe dead letter was refused too, so it is written without its %d-byte value: %s", prev, len(got.Value), msg)
		return &kgo.Record{Topic: got.Topic, Key: got.Key, Headers: append(hs, kgo.RecordHeader{Key: HeaderError, Value: []byte(msg)})}
	}
	for _, h := range got.Headers {
		if h.Key == headerEnvelope {
			// A repartition record: its envelope names the source record.
			if e, err := decodeEnvelope(h.Value); err == nil {
				hs = append(hs, kgo.RecordHeader{Key: HeaderSource, Value: fmt.Appendf(nil, "%s/%d/%d", e.topic, e.part, e.off)})
			}
			continue
		}
		hs = append(hs, h)
	}
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderReason, Value: []byte(reasonSink)},
		kgo.RecordHeader{Key: HeaderError, Value: []byte(msg)},
		kgo.RecordHeader{Key: HeaderRoute, Value: []byte(r.name)},
		kgo.RecordHeader{Key: HeaderStep, Value: []byte("sink")},
		kgo.RecordHeader{Key: HeaderTarget, Value: []byte(got.Topic)},
	)
	return &kgo.Record{Topic: deadLetterTopic(r.def), Key: got.Key, Value: got.Value, Headers: hs}
}

// inflightAdd counts an output produced (d=1, ep<0: in the current epoch,
// which it returns) or acknowledged (d=-1 with the epoch it was produced in).
func (r *route) inflightAdd(d int, ep int64) int64 {
	r.inflight.Lock()
	if ep < 0 {
		ep = r.inflight.epoch
	}
	n := r.inflight.byEpoch[ep] + d
	if n == 0 {
		delete(r.inflight.byEpoch, ep)
		r.inflight.zero.Broadcast()
	} else {
		r.inflight.byEpoch[ep] = n
	}
	r.inflight.Unlock()
	return ep
}

func (r *route) sinkError(err error) {
	r.m.met.sinkErrors.WithLabelValues(r.name).Inc()
	r.st.Lock()
	first := !r.st.sinkDown
	r.st.sinkDown = true
	r.st.lastErr, r.st.lastErrAt = err.Error(), time.Now()
	r.st.Unlock()
	if first {
		r.log.Warn("sink unreachable; retrying, offsets hold", "err", err)
	}
}

func (r *route) sinkRecovered() {
	r.st.Lock()
	was := r.st.sinkDown
	r.st.sinkDown = false
	r.st.Unlock()
	if was {
		r.log.Info("sink reachable again")
	}
}

// connHook reports broker connection failures of the route's client, which
// would otherwise only surface after the delivery timeout.
type connHook struct{ r *route }

func (h *connHook) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err == nil || h.r.ctx.Err() != nil {
		return
	}
	h.r.sinkError(fmt.Errorf("connect broker %d (%s:%d): %w", meta.NodeID, meta.Host, meta.Port, err))
}

func (h *connHook) OnBrokerWrite(meta kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if err == nil && key == 0 {
		// A produce request went out: the sink is reachable.
		h.r.st.Lock()
		down := h.r.st.sinkDown
		h.r.st.Unlock()
		if down {
			h.r.sinkRecovered()
		}
	}
}
