package pipeline

// Dead letters: a record that cannot be processed or written goes to the
// route's dead-letter topic, with headers saying why.

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
)

func deadLetterTopic(d *rules.Route) string {
	if d.DeadLetter != "" {
		return d.DeadLetter
	}
	return d.Source.Topic + ".dlq"
}

// deadLetter sends rec to the route's dead-letter topic with its original
// key, value and headers (those not named rtproxy-*), and headers saying
// why.
func (r *route) deadLetter(rec *operators.Record, reason operators.Reason, err error, step string, tk *ticket) {
	if reason == operators.ReasonError && operators.IsBudget(err) {
		reason = operators.ReasonBudget // an expression over its budget (event_time, a sink key)
	}
	r.m.met.deadLetters.WithLabelValues(r.name, string(reason)).Inc()
	// The value as it was when the record failed: the bytes it came with,
	// or, once a step changed what they decoded to (set, map), the value
	// encoded anew, as it would be across a repartition.
	val := rec.Raw
	if rec.Value != nil && (val == nil || rec.Rewritten()) {
		if b, err := rec.EncodeValue(nil); err == nil {
			val = b
		}
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	hs := make([]kgo.RecordHeader, 0, len(rec.Headers)+5)
	for _, h := range rec.Headers {
		if !strings.HasPrefix(h.Key, "rtproxy-") {
			hs = append(hs, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
	}
	hs = append(hs, []kgo.RecordHeader{
		{Key: HeaderReason, Value: []byte(reason)},
		{Key: HeaderError, Value: []byte(msg)},
		{Key: HeaderRoute, Value: []byte(r.name)},
		{Key: HeaderStep, Value: []byte(step)},
		{Key: HeaderSource, Value: sourceRef(rec)},
	}...)
	hs = append(hs, schemaHeaders(err)...)
	kr := &kgo.Record{Topic: deadLetterTopic(r.def), Key: rec.Key, Value: val, Headers: hs}
	if rec.Timestamp > 0 {
		// The source record's time, as an output carries it (docs/RULES.md,
		// dead_letter): not the time the dead letter was written.
		kr.Timestamp = time.UnixMilli(rec.Timestamp)
	}
	// For the status page: kr carries rec's headers; the error text is
	// shown without rec's values unless admin.show_records.
	r.noteDeadLetter(kr, nil, time.UnixMilli(rec.Timestamp), r.shownError(err, rec))
	r.produce(kr, tk, false, rec.Timestamp)
}

// reasonSink is the dead-letter reason of an output the brokers refused.
const reasonSink = "sink"

// sinkDeadLetter is the dead letter for a record the brokers (or the sink)
// refused. An
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
		return &kgo.Record{Topic: got.Topic, Key: got.Key, Timestamp: got.Timestamp, Headers: append(hs, kgo.RecordHeader{Key: HeaderError, Value: []byte(msg)})}
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
	var more deadLetterHeaders
	if errors.As(err, &more) {
		hs = append(hs, more.deadLetterHeaders()...) // what the sink said (writer.go)
	}
	dl := &kgo.Record{Topic: deadLetterTopic(r.def), Key: got.Key, Value: got.Value, Headers: hs, Timestamp: got.Timestamp}
	r.noteDeadLetter(dl, nil, got.Timestamp, r.shownText(msg, nil)) // for the status page
	return dl
}
