package pipeline

// Repartition records and watermark markers.
//
// A keyed step reads through its repartition topic, keyed by the step's own
// key, so each key has one owner in the whole group (ARCHITECTURE.md). The
// writer is the task that ran the steps before it; the Kafka record carries
// the step key as its key (for the partitioner), the record's value as its
// value, the record's own headers, and one header of ours:
//
// rtproxy-rp (envelope), all integers varint unless said otherwise:
//
//	[0]      version = 1
//	[1]      flags: 1 window row, 2 value is a raw string, 4 value is nil,
//	         8 bound (join bindings) present, 16 key is nil
//	uvarint  len(topic), topic            the original source record's
//	         partition, offset            topic, partition and offset
//	uvarint  len(key), key                (absent when flag 16)
//	         timestamp, event time        epoch millis
//	         writer partition, writer offset, uvarint seq   (the origin)
//	         writer frontier              event-time frontier of the writer
//	         window start, end            (when flag 1)
//	uvarint  len(bound), bound JSON       (when flag 8)
//
// A watermark marker has a nil key and value and one header:
//
// rtproxy-wm: writer partition, writer frontier (varints).
//
// The origin (writer partition, writer offset, seq) is what makes replays
// exact: a writer that replays from its last checkpoint after a crash
// writes the same origins again, in the same order, and the reading task
// skips every origin at or below the highest it applied from that writer
// (inbox, checkpointed with the task's state).

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/operators"
)

const (
	headerEnvelope = "rtproxy-rp"
	headerMarker   = "rtproxy-wm"

	envVersion = 1

	envWindow = 1 << iota
	envRaw
	envNil
	envBound
	envNilKey
)

// envOther flags a record of a stream join's second input (the other
// side): the reading task hands it to the step's ProcessOther.
const envOther byte = 1

var errEnvelope = errors.New("repartition envelope is corrupt")

// origin is where a repartitioned record came from: the writer task's
// input partition and offset, and its place among that input's outputs.
type origin struct {
	off int64
	seq uint32
}

func (o origin) after(p origin) bool {
	return o.off > p.off || (o.off == p.off && o.seq > p.seq)
}

// encodeEnvelope appends the envelope of rec, written by writer partition
// wp while processing its offset woff (the seq-th output of it).
func encodeEnvelope(b []byte, rec *operators.Record, wp int32, woff int64, seq uint32, frontier int64, raw bool) ([]byte, error) {
	var flags byte
	if rec.Window != nil {
		flags |= envWindow
	}
	if raw {
		flags |= envRaw
	}
	if rec.Value == nil && rec.Raw == nil {
		flags |= envNil
	}
	var bound []byte
	if len(rec.Bound) > 0 {
		var err error
		bound, err = jsoncodec.Append(nil, rec.Bound)
		if err != nil {
			return nil, fmt.Errorf("encode join bindings: %w", err)
		}
		flags |= envBound
	}
	if rec.Key == nil {
		flags |= envNilKey
	}
	b = append(b, envVersion, flags)
	b = binary.AppendUvarint(b, uint64(len(rec.Topic)))
	b = append(b, rec.Topic...)
	b = binary.AppendVarint(b, int64(rec.Partition))
	b = binary.AppendVarint(b, rec.Offset)
	if rec.Key != nil {
		b = binary.AppendUvarint(b, uint64(len(rec.Key)))
		b = append(b, rec.Key...)
	}
	b = binary.AppendVarint(b, rec.Timestamp)
	b = binary.AppendVarint(b, rec.EventTime)
	b = binary.AppendVarint(b, int64(wp))
	b = binary.AppendVarint(b, woff)
	b = binary.AppendUvarint(b, uint64(seq))
	b = binary.AppendVarint(b, frontier)
	if rec.Window != nil {
		b = binary.AppendVarint(b, rec.Window.Start)
		b = binary.AppendVarint(b, rec.Window.End)
	}
	if flags&envBound != 0 {
		b = binary.AppendUvarint(b, uint64(len(bound)))
		b = append(b, bound...)
	}
	return b, nil
}

// envelope is a decoded rtproxy-rp header.
type envelope struct {
	flags    byte
	topic    string
	part     int32
	off      int64
	key      []byte
	ts, ev   int64
	wp       int32
	org      origin
	frontier int64
	win      *operators.WindowRef
	bound    []byte
}

type envReader struct {
	b   []byte
	err error
}

func (d *envReader) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errEnvelope
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *envReader) bytes() []byte {
	if d.err != nil {
		return nil
	}
	l, n := binary.Uvarint(d.b)
	if n <= 0 || l > uint64(len(d.b)-n) {
		d.err = errEnvelope
		return nil
	}
	v := d.b[n : n+int(l)]
	d.b = d.b[n+int(l):]
	return v
}

func decodeEnvelope(b []byte) (envelope, error) {
	var e envelope
	if len(b) < 2 || b[0] != envVersion {
		return e, fmt.Errorf("%w: version", errEnvelope)
	}
	e.flags = b[1]
	d := &envReader{b: b[2:]}
	e.topic = string(d.bytes())
	e.part = int32(d.varint())
	e.off = d.varint()
	if e.flags&envNilKey == 0 {
		e.key = d.bytes()
		if e.key == nil && d.err == nil {
			e.key = []byte{}
		}
	}
	e.ts = d.varint()
	e.ev = d.varint()
	e.wp = int32(d.varint())
	e.org.off = d.varint()
	if d.err == nil {
		s, n := binary.Uvarint(d.b)
		if n <= 0 || s > 1<<32-1 {
			d.err = errEnvelope
		} else {
			e.org.seq = uint32(s)
			d.b = d.b[n:]
		}
	}
	e.frontier = d.varint()
	if e.flags&envWindow != 0 {
		e.win = &operators.WindowRef{Start: d.varint(), End: d.varint()}
	}
	if e.flags&envBound != 0 {
		e.bound = d.bytes()
	}
	if d.err != nil {
		return e, d.err
	}
	if len(d.b) != 0 {
		return e, fmt.Errorf("%w: %d trailing bytes", errEnvelope, len(d.b))
	}
	return e, nil
}

func encodeMarker(wp int32, frontier int64) []byte {
	b := binary.AppendVarint(make([]byte, 0, 12), int64(wp))
	return binary.AppendVarint(b, frontier)
}

func decodeMarker(b []byte) (wp int32, frontier int64, err error) {
	d := &envReader{b: b}
	wp = int32(d.varint())
	frontier = d.varint()
	if d.err == nil && len(d.b) != 0 {
		d.err = errEnvelope
	}
	return wp, frontier, d.err
}

// routePartitioner sends changelog records and watermark markers to the
// partition they name (Record.Partition), repartition records by the
// murmur2 hash of their key (Kafka's default, so every instance agrees on a
// key's owner), and everything else (sink, dead letters) as franz-go's
// default does.
type routePartitioner struct {
	manual func(topic string) bool
	hashed func(topic string) bool
}

func (p routePartitioner) ForTopic(topic string) kgo.TopicPartitioner {
	switch {
	case p.manual(topic):
		return kgo.ManualPartitioner().ForTopic(topic)
	case p.hashed(topic):
		return markerOrKey{kgo.StickyKeyPartitioner(nil).ForTopic(topic)}
	}
	return kgo.UniformBytesPartitioner(64<<10, true, true, nil).ForTopic(topic)
}

// markerOrKey partitions a repartition topic: markers (nil key) go where
// they are sent, records by their key's hash.
type markerOrKey struct{ kgo.TopicPartitioner }

func (m markerOrKey) RequiresConsistency(*kgo.Record) bool { return true }

func (m markerOrKey) Partition(r *kgo.Record, n int) int {
	if r.Key == nil {
		return int(r.Partition)
	}
	return m.TopicPartitioner.Partition(r, n)
}
