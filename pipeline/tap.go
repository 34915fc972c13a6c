package pipeline

// The produce-path tap. A record produced through this proxy with
// acks=all, to a partition whose route this instance owns, is handed to
// that partition's task when the brokers acknowledge it, with the offsets
// the acknowledgement gives: the task processes it at once when it
// continues the task's offsets, instead of a fetch round trip later.
//
// The fetch stays the source of truth:
//   - a tapped batch is processed only from the record whose offset is the
//     task's next offset (t.pos), so records are processed in offset order,
//     each once, exactly as the fetch alone would have them;
//   - the same offsets returned later by the fetch are below t.pos and
//     skipped, as every repeat is;
//   - a tapped batch that starts beyond t.pos (records of other producers
//     still to be fetched) is held, at most maxHeldTaps batches, until the
//     fetch reaches it; past that, tapped data is dropped (the fetch brings
//     the records anyway), never a record.
//
// Exactly-once routes are not tapped: they read read_committed, and a
// record produced after another producer's open transaction is fetched
// only once that transaction ends. The protocol side (protocol.Tap) taps
// neither transactional batches nor acks=0/1 produces.

import (
	"bytes"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// maxHeldTaps bounds the tapped batches a task holds while the fetch has
// not reached them.
const maxHeldTaps = 64

// taskBatch is what a task's goroutine receives: fetched records, or
// records tapped from the produce path.
type taskBatch struct {
	recs   []*kgo.Record
	tapped bool
	poll   *pollWrites // a fetched batch: its poll's count (batch.go)
}

// TapRecord is one produced record the brokers acknowledged.
type TapRecord struct {
	Key, Value []byte
	Headers    []kgo.RecordHeader
	Timestamp  time.Time
}

// TapWants reports whether a route of this instance may take tapped
// records of topic (protocol.Tap).
func (m *Manager) TapWants(topic string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.mu.routes {
		if r.def.Source.Topic == topic && !r.def.Sink.ExactlyOnce() {
			return true
		}
	}
	return false
}

// Tapped hands acknowledged records of topic's partition, at offsets base,
// base+1, ..., to the routes of this instance that read topic and own the
// partition. The records are copied: the caller's buffers are reused.
func (m *Manager) Tapped(topic string, partition int32, base int64, recs []TapRecord) {
	m.mu.Lock()
	var rs []*route
	for _, r := range m.mu.routes {
		if r.def.Source.Topic == topic && !r.def.Sink.ExactlyOnce() {
			rs = append(rs, r)
		}
	}
	m.mu.Unlock()
	if len(rs) == 0 || len(recs) == 0 {
		return
	}
	krs := make([]*kgo.Record, len(recs))
	for i, tr := range recs {
		kr := &kgo.Record{Topic: topic, Partition: partition, Offset: base + int64(i),
			Key: bytes.Clone(tr.Key), Value: bytes.Clone(tr.Value), Timestamp: tr.Timestamp}
		if len(tr.Headers) > 0 {
			kr.Headers = make([]kgo.RecordHeader, len(tr.Headers))
			for j, h := range tr.Headers {
				kr.Headers[j] = kgo.RecordHeader{Key: strings.Clone(h.Key), Value: bytes.Clone(h.Value)}
			}
		}
		krs[i] = kr
	}
	for _, r := range rs {
		r.tapped(partition, krs)
	}
}

// tapped offers a tapped batch to the task of source partition p, if this
// route version runs and owns it. It never blocks the produce path: a full
// task queue drops the batch (the fetch brings the records).
func (r *route) tapped(p int32, krs []*kgo.Record) {
	if !r.ready.Load() || r.txn.on {
		return
	}
	t := r.taskAt(r.def.Source.Topic, p)
	if t == nil || t.seg.idx != 0 {
		return
	}
	select {
	case t.ch <- taskBatch{recs: krs, tapped: true}:
	default:
		r.m.met.tapDropped.WithLabelValues(r.name).Inc()
	}
}

// continuing returns the records of tapped batch b from t.pos on when b
// continues t's offsets; otherwise it holds b (it starts beyond t.pos) or
// drops it (the fetch delivered it already), and returns nil.
func (t *task) continuing(b taskBatch) []*kgo.Record {
	recs := b.recs
	for len(recs) > 0 && recs[0].Offset < t.pos {
		recs = recs[1:]
	}
	switch {
	case len(recs) == 0:
		return nil
	case recs[0].Offset == t.pos:
		return recs
	}
	if len(t.held) >= maxHeldTaps {
		t.r.m.met.tapDropped.WithLabelValues(t.r.name).Inc()
		return nil
	}
	t.held = append(t.held, taskBatch{recs: recs, tapped: true})
	return nil
}

// heldContinuing returns the records of a held tapped batch that now
// continues t's offsets, dropping the held batches the fetch went past; nil
// when none continues.
func (t *task) heldContinuing() []*kgo.Record {
	kept := t.held[:0]
	var out []*kgo.Record
	for _, b := range t.held {
		recs := b.recs
		for len(recs) > 0 && recs[0].Offset < t.pos {
			recs = recs[1:]
		}
		switch {
		case len(recs) == 0:
		case out == nil && recs[0].Offset == t.pos:
			out = recs
		default:
			kept = append(kept, taskBatch{recs: recs, tapped: true})
		}
	}
	clear(t.held[len(kept):])
	t.held = kept
	return out
}
