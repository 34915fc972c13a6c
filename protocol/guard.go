package protocol

// Produce guards. A guard (a guard rule file, rules.Guard) checks every
// record produced to the topics it matches, on the wire, before the
// request reaches the brokers. A partition's records that hold any record
// failing a check are refused whole with INVALID_RECORD, as a broker
// refuses an invalid batch: never trimmed, because idempotent producers
// number their batches and a dropped record would break the sequence. The
// other partitions of the request go on to the brokers, and the proxy adds
// the refused ones to the brokers' response (with RecordErrors and the
// ErrorMessage from v8 on), so the client sees one answer per partition,
// in order.
//
// Without guards the Produce path is untouched: the request streams to the
// broker as it arrives. With guards a Produce request is read whole (its
// bytes count against max_held_bytes), decoded, and only the partitions of
// guarded topics have their batches decoded, within the decode budgets
// (decode.go): proxy.max_decoded_bytes and proxy.max_records_per_request
// per request, proxy.max_decoded_bytes_total across the process.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Guards are the produce guards in force.
type Guards interface {
	// For returns the guard of topic, or nil when the topic has none.
	For(topic string) Guard
}

// Guard checks the records produced to one guarded topic.
type Guard interface {
	// Check checks one record; ok false refuses the partition's records
	// of the request, with check and message saying why.
	Check(topic string, partition int32, rec *ProducedRecord) (check, message string, ok bool)
	// Refused is told every refused partition of a request (dead letters,
	// metrics). It must not block, and must copy what it keeps: the
	// records alias the request's buffer, which is reused after the call.
	Refused(r Refusal)
}

// ProducedRecord is one record of a produced batch.
type ProducedRecord struct {
	Key       []byte // nil: a null key
	Value     []byte // nil: a null value
	Headers   []kmsg.Header
	Timestamp int64 // epoch millis
}

// Refusal is one partition's records refused by a guard.
type Refusal struct {
	Topic     string
	Partition int32
	Records   []ProducedRecord
	// Failures are the records that failed, by index in Records; the
	// others were refused with them.
	Failures []RecordFailure
	// Err is set when the batches could not be decoded at all (then
	// Records is empty).
	Err error
	// bufs are the pooled buffers Records were decompressed into, given
	// back once Refused has copied what it keeps.
	bufs [][]byte
}

// RecordFailure is one record that failed a check.
type RecordFailure struct {
	Index          int
	Check, Message string
	// Retry is set when the record could not be checked now
	// (RetriableGuard): the partition is refused with a retriable error.
	Retry bool
}

// Tap receives records produced through the proxy with acks=all, when the
// brokers acknowledge them (pipeline.Manager, through cmd/rtproxy).
type Tap interface {
	// Wants reports whether records of topic are wanted (a route of this
	// instance reads it).
	Wants(topic string) bool
	// Acked is given the records of one partition's batch at offsets base,
	// base+1, ... It must copy what it keeps: the records alias buffers
	// the proxy reuses after the call.
	Acked(topic string, partition int32, base int64, recs []ProducedRecord)
}

// SetTap sets the tap; nil removes it.
func (p *Proxy) SetTap(t Tap) {
	if t == nil {
		p.tap.Store(nil)
		return
	}
	p.tap.Store(&t)
}

// tapPart is one partition's batch of a Produce request, to be handed to
// the tap once the brokers acknowledge it.
type tapPart struct {
	topic     string
	topicID   [16]byte
	partition int32
	batches   []byte // aliases the request buffer kept in inflight.keep
}

// SetGuards sets the guards in force; nil removes them all. Requests read
// from then on are checked against them.
func (p *Proxy) SetGuards(g Guards) {
	if g == nil {
		p.guards.Store(nil)
		return
	}
	p.guards.Store(&g)
}

// refusedPart is a refused partition, to be added to the brokers' response.
type refusedPart struct {
	topic     string
	topicID   [16]byte
	partition int32
	code      int16
	message   string
	records   []RecordFailure
}

// inspectProduce reads a Produce request whole (frame holds its head, rest
// bytes of it are still in the client's socket; held grows as they
// arrive), checks it against the
// guards (gs, may be nil) and picks the partitions to tap (tap, may be nil:
// acks=all, not transactional). It returns the frame to forward (the
// request read whole, or a new request without the refused partitions),
// the refused partitions, the tapped ones and, when there are, the buffer
// they alias (keep), which the caller releases once they are delivered. A
// request that does not decode is an error: its topics cannot be known, so
// it cannot pass.
func (pr *pair) inspectProduce(gs Guards, tap Tap, acks int16, h RequestHeader, frame []byte, rest int, held *hold) (out []byte, refused []refusedPart, taps []tapPart, keep []byte, err error) {
	full := frame
	if rest > 0 {
		if full, err = readHeld(pr.clientR, frame, rest, held, pr.done); err != nil {
			return nil, nil, nil, nil, err
		}
	}
	req := kmsg.NewPtrProduceRequest()
	req.SetVersion(h.APIVersion)
	if err := req.ReadFrom(full[4+h.BodyOffset:]); err != nil {
		ReleaseFrame(full)
		return nil, nil, nil, nil, fmt.Errorf("%w: produce request does not decode: %v", ErrBadHeader, err)
	}
	tapping := tap != nil && acks == -1 && req.TransactionID == nil
	m := pr.p.newMeter(pr.done, pr.p.guardBufs)
	defer m.endPart() // its lease goes back even if a guard panics
	for ti := range req.Topics {
		t := &req.Topics[ti]
		name := t.Topic
		if vn, refuse := pr.viewRefuses(name, t.TopicID, h.APIVersion >= 13); refuse {
			for _, pp := range t.Partitions {
				refused = append(refused, viewRefusal(vn, t.TopicID, pp.Partition))
			}
			pr.p.vm.refused.WithLabelValues("Produce").Add(float64(len(t.Partitions)))
			t.Partitions = nil
			continue
		}
		if h.APIVersion >= 13 {
			n, ok := pr.p.TopicName(t.TopicID)
			if !ok {
				// A topic id the proxy has not seen in metadata: the client
				// refreshes its metadata (through the proxy) and retries.
				for _, pp := range t.Partitions {
					refused = append(refused, refusedPart{topicID: t.TopicID, partition: pp.Partition, code: kerr.UnknownTopicID.Code})
				}
				t.Partitions = nil
				continue
			}
			name = n
		}
		var g Guard
		if gs != nil {
			g = gs.For(name)
		}
		tapped := tapping && tap.Wants(name)
		if g == nil {
			if tapped {
				for _, pp := range t.Partitions {
					taps = append(taps, tapPart{topic: name, topicID: t.TopicID, partition: pp.Partition, batches: pp.Records})
				}
			}
			continue
		}
		kept := t.Partitions[:0]
		for _, pp := range t.Partitions {
			rf, cerr := pr.p.checkPartition(g, name, pp.Partition, pp.Records, m)
			if cerr != nil {
				ReleaseFrame(full)
				return nil, nil, nil, nil, cerr
			}
			if rf == nil {
				kept = append(kept, pp)
				if tapped {
					taps = append(taps, tapPart{topic: name, topicID: t.TopicID, partition: pp.Partition, batches: pp.Records})
				}
				continue
			}
			g.Refused(*rf)
			refused = append(refused, refusedOf(name, t.TopicID, rf))
			pr.p.guardBufs.putAll(rf.bufs)
			m.endPart()
		}
		t.Partitions = kept
	}
	if len(taps) > 0 {
		keep = full
	}
	if len(refused) == 0 {
		return full, nil, taps, keep, nil
	}
	topics := req.Topics[:0]
	for _, t := range req.Topics {
		if len(t.Partitions) > 0 {
			topics = append(topics, t)
		}
	}
	req.Topics = topics
	out = getBuf(4 + h.BodyOffset)[:0]
	out = append(out, full[:4+h.BodyOffset]...)
	out = req.AppendTo(out)
	if keep == nil {
		ReleaseFrame(full)
	}
	binary.BigEndian.PutUint32(out, uint32(len(out)-4))
	return out, refused, taps, keep, nil
}

// refusedOf is a refused partition's answer: INVALID_RECORD for records a
// guard refused or batches that do not decode, MESSAGE_TOO_LARGE for a
// request over a decode budget (decode.go). At most maxRecordErrors record
// errors are listed; the message counts them all.
func refusedOf(topic string, id [16]byte, rf *Refusal) refusedPart {
	rp := refusedPart{topic: topic, topicID: id, partition: rf.Partition, code: kerr.InvalidRecord.Code, records: rf.Failures}
	if len(rp.records) > maxRecordErrors {
		rp.records = rp.records[:maxRecordErrors:maxRecordErrors]
	}
	switch {
	case rf.Retriable():
		rp.code, rp.records = kerr.RequestTimedOut.Code, nil
		f := rf.Failures[0]
		rp.message = fmt.Sprintf("rtproxy guard: record %d cannot be checked now (check %s: %s); retry", f.Index, f.Check, f.Message)
	case errors.Is(rf.Err, ErrDecodeLimit):
		rp.code = kerr.MessageTooLarge.Code
		rp.message = "rtproxy: " + rf.Err.Error()
	case rf.Err != nil:
		rp.message = "rtproxy guard: " + rf.Err.Error()
	case len(rf.Failures) > 0:
		f := rf.Failures[0]
		rp.message = fmt.Sprintf("rtproxy guard: record %d: check %s: %s", f.Index, f.Check, f.Message)
		if n := len(rf.Failures); n > 1 {
			rp.message += fmt.Sprintf(" (and %d more records)", n-1)
		}
	}
	return rp
}

// checkPartition checks one partition's batches; nil when they pass.
// Compressed batches are decompressed into buffers of p.guardBufs: given
// back here when the records pass, by the caller after Refused otherwise
// (then the caller also ends the meter's partition). A partition over a
// decode budget is refused (Refusal.Err wraps ErrDecodeLimit), and so is
// every guarded partition of the request after it, undecoded. The error is
// set only when the connection closed while the decode waited for the
// global budget.
func (p *Proxy) checkPartition(g Guard, topic string, partition int32, batches []byte, m *decodeMeter) (*Refusal, error) {
	if m.over != nil {
		return &Refusal{Topic: topic, Partition: partition, Err: m.over}, nil
	}
	for {
		mk := m.mark()
		recs, bufs, err := decodeBatches(batches, m)
		if errors.Is(err, errLeaseShort) {
			p.guardBufs.putAll(bufs)
			if !m.retry(mk) {
				return nil, fmt.Errorf("waiting for proxy.max_decoded_bytes_total: %w", net.ErrClosed)
			}
			continue
		}
		if err != nil {
			p.guardBufs.putAll(bufs)
			m.endPart()
			var le *decodeLimitError
			if errors.As(err, &le) {
				m.over = le
				p.m.decodeLimited.WithLabelValues("guard", le.bound()).Inc()
			}
			return &Refusal{Topic: topic, Partition: partition, Err: err}, nil
		}
		var fails []RecordFailure
		for i := range recs {
			check, msg, ok, retry := checkRecord(g, topic, partition, &recs[i])
			if retry {
				// The partition is refused whatever the rest holds: with
				// a retriable error unless a record failed for good.
				if len(fails) == 0 {
					fails = append(fails, RecordFailure{Index: i, Check: check, Message: msg, Retry: true})
				}
				break
			}
			if !ok {
				fails = append(fails, RecordFailure{Index: i, Check: check, Message: msg})
			}
		}
		if len(fails) == 0 {
			p.guardBufs.putAll(bufs)
			m.endPart()
			return nil, nil
		}
		return &Refusal{Topic: topic, Partition: partition, Records: recs, Failures: fails, bufs: bufs}, nil
	}
}

// decompressBufs is the pool of buffers batches are decompressed into: a
// guarded topic decompresses every batch produced to it, and a fresh
// buffer each time was a tenth of the guarded proxy's CPU in allocating
// and zeroing it.
type decompressBufs struct{ pool sync.Pool }

// maxPooledDecompress bounds the buffers kept: a rare huge batch is left
// to the GC rather than held.
const maxPooledDecompress = 4 << 20

// take returns an empty buffer of capacity at least n.
func (d *decompressBufs) take(n int) []byte {
	if n <= maxPooledDecompress {
		if b, ok := d.pool.Get().(*[]byte); ok {
			if cap(*b) >= n {
				return (*b)[:0]
			}
			d.pool.Put(b)
		}
	}
	return make([]byte, 0, n)
}

// give hands a buffer back (nil and oversized ones are dropped).
func (d *decompressBufs) give(b []byte) {
	if cap(b) == 0 || cap(b) > maxPooledDecompress {
		return
	}
	b = b[:0]
	d.pool.Put(&b)
}

func (d *decompressBufs) putAll(bufs [][]byte) {
	for _, b := range bufs {
		d.give(b)
	}
}

var errNotV2 = errors.New("only record batches (magic 2, Kafka 0.11+ clients) can be checked")

// decodeBatches decodes the records of a partition's record batches,
// charged to m. The bytes are the request's own: the records alias them,
// or the buffers compressed batches were decompressed into (bufs, also
// on error).
func decodeBatches(b []byte, m *decodeMeter) (out []ProducedRecord, bufs [][]byte, err error) {
	for len(b) > 0 {
		batch, recs, rest, _, dec, err := readBatch(b, m, out)
		if dec != nil {
			bufs = append(bufs, dec)
		}
		if err != nil {
			return nil, bufs, err
		}
		b = rest
		if batch.Attributes&0x20 == 0 { // a control batch: brokers write these, not producers
			out = recs
		}
	}
	return out, bufs, nil
}

// tapRecords decodes a partition's batches for the tap: exactly one batch,
// not transactional, its records at offset deltas 0, 1, ... (so that the
// acknowledgement's base offset gives each its offset); err is nil and
// recs empty otherwise. dec is the buffer to give back after.
func tapRecords(b []byte, m *decodeMeter) (recs []ProducedRecord, dec []byte, err error) {
	batch, recs, rest, contiguous, dec, err := readBatch(b, m, nil)
	if err != nil || len(rest) != 0 || !contiguous || batch.Attributes&0x30 != 0 {
		return nil, dec, err
	}
	return recs, dec, nil
}

// readBatch decodes the first record batch of b, appending its records to
// out, charged to m; it returns the batch header, the records, the bytes
// after the batch, whether the records sit at offset deltas 0, 1, ... in
// order, and the buffer the batch was decompressed into (nil when not
// compressed).
func readBatch(b []byte, m *decodeMeter, out []ProducedRecord) (batch kmsg.RecordBatch, _ []ProducedRecord, rest []byte, contiguous bool, dec []byte, err error) {
	fail := func(e error) (kmsg.RecordBatch, []ProducedRecord, []byte, bool, []byte, error) {
		return batch, nil, nil, false, dec, e
	}
	if len(b) < 17 {
		return fail(fmt.Errorf("record batch truncated: %d bytes", len(b)))
	}
	size := int64(int32(binary.BigEndian.Uint32(b[8:12])))
	if size < 49 || 12+size > int64(len(b)) {
		return fail(fmt.Errorf("record batch length %d does not fit %d bytes", size, len(b)))
	}
	if b[16] != 2 {
		return fail(fmt.Errorf("record batch magic %d: %w", b[16], errNotV2))
	}
	if err := batch.ReadFrom(b[:12+size]); err != nil {
		return fail(fmt.Errorf("record batch: %w", err))
	}
	rest = b[12+size:]
	if batch.Attributes&0x20 != 0 {
		return batch, out, rest, false, nil, nil
	}
	if batch.NumRecords < 0 {
		return fail(fmt.Errorf("record batch claims %d records", batch.NumRecords))
	}
	// The records are charged from the header, before anything is
	// decompressed: a batch claiming too many costs nothing.
	if err := m.charge(int64(batch.NumRecords)*recordCost, int64(batch.NumRecords)); err != nil {
		return fail(err)
	}
	data := batch.Records
	if codec := batch.Attributes & 0x07; codec != 0 {
		if data, err = m.decompress(data, codec); err != nil {
			if errors.Is(err, ErrDecodeLimit) || errors.Is(err, errLeaseShort) {
				return fail(err)
			}
			return fail(fmt.Errorf("record batch: decompress: %w", err))
		}
		dec = data
	}
	if int(batch.NumRecords) > len(data) {
		return fail(fmt.Errorf("record batch claims %d records in %d bytes", batch.NumRecords, len(data)))
	}
	out = slices.Grow(out, int(batch.NumRecords))
	contiguous = batch.LastOffsetDelta == batch.NumRecords-1
	for i := range batch.NumRecords {
		l, n := binary.Varint(data)
		if n <= 0 || l < 0 || int64(n)+l > int64(len(data)) {
			return fail(errors.New("record length does not fit its batch"))
		}
		// Headers are charged before ReadFrom allocates them (40 bytes
		// each, however short on the wire), with the record's length
		// for the header keys it copies.
		if hc, ok := recordHeaderCount(data[n : int64(n)+l]); ok && hc > 0 {
			if err := m.charge(hc*headerCost+l, 0); err != nil {
				return fail(err)
			}
		}
		var r kmsg.Record
		if err := r.ReadFrom(data[:int64(n)+l]); err != nil {
			return fail(fmt.Errorf("record: %w", err))
		}
		data = data[int64(n)+l:]
		contiguous = contiguous && r.OffsetDelta == i
		out = append(out, ProducedRecord{Key: r.Key, Value: r.Value, Headers: r.Headers,
			Timestamp: batch.FirstTimestamp + r.TimestampDelta64})
	}
	if len(data) != 0 {
		return fail(fmt.Errorf("record batch: %d bytes after its %d records", len(data), batch.NumRecords))
	}
	return batch, out, rest, contiguous, dec, nil
}

// deliverTaps hands the tapped partitions of a Produce request to the tap,
// for those the brokers' response (body) acknowledged.
func (p *Proxy) deliverTaps(tap Tap, version int16, body []byte, taps []tapPart) {
	r, err := decodeResponse(int16(kmsg.Produce), version, body)
	if err != nil {
		return // the client gets the response as it is; the fetch brings the records
	}
	resp := r.(*kmsg.ProduceResponse)
	m := p.newMeter(nil, p.guardBufs)
	defer m.endPart()
	for _, tp := range taps {
		for _, rt := range resp.Topics {
			if (version >= 13 && rt.TopicID != tp.topicID) || (version < 13 && rt.Topic != tp.topic) {
				continue
			}
			for _, rp := range rt.Partitions {
				if rp.Partition != tp.partition || rp.ErrorCode != 0 || rp.BaseOffset < 0 {
					continue
				}
				if m.over != nil {
					continue
				}
				recs, dec, err := tapRecords(tp.batches, m)
				if err != nil || len(recs) == 0 {
					// Left to the fetch: over a decode budget (counted), or
					// not a batch the tap takes.
					var le *decodeLimitError
					switch {
					case errors.As(err, &le):
						m.over = le
						p.m.decodeLimited.WithLabelValues("tap", le.bound()).Inc()
					case errors.Is(err, errLeaseShort):
						p.m.decodeLimited.WithLabelValues("tap", "total").Inc()
					}
					p.guardBufs.give(dec)
					m.endPart()
					continue
				}
				if rp.LogAppendTime >= 0 { // the topic stamps records with the broker's time
					for i := range recs {
						recs[i].Timestamp = rp.LogAppendTime
					}
				}
				tap.Acked(tp.topic, tp.partition, rp.BaseOffset, recs)
				p.guardBufs.give(dec)
				m.endPart()
			}
		}
	}
}

// mergeRefused adds the refused partitions to a Produce response (the
// brokers' answer for the rest of the request), and maps the brokers'
// endpoints (v10+) as rewriteProduce does. body is the response body.
func mergeRefused(m Mapper, version int16, body, dst []byte, refused []refusedPart) ([]byte, error) {
	r, err := decodeResponse(int16(kmsg.Produce), version, body)
	if err != nil {
		return nil, err
	}
	resp := r.(*kmsg.ProduceResponse)
	for _, rp := range refused {
		var t *kmsg.ProduceResponseTopic
		for i := range resp.Topics {
			rt := &resp.Topics[i]
			if (version >= 13 && rt.TopicID == rp.topicID) || (version < 13 && rt.Topic == rp.topic) {
				t = rt
				break
			}
		}
		if t == nil {
			nt := kmsg.NewProduceResponseTopic()
			nt.Topic, nt.TopicID = rp.topic, rp.topicID
			resp.Topics = append(resp.Topics, nt)
			t = &resp.Topics[len(resp.Topics)-1]
		}
		p := kmsg.NewProduceResponseTopicPartition()
		p.Partition, p.ErrorCode = rp.partition, rp.code
		p.BaseOffset, p.LogAppendTime, p.LogStartOffset = -1, -1, -1
		if rp.message != "" {
			msg := rp.message
			p.ErrorMessage = &msg
		}
		for _, f := range rp.records {
			e := kmsg.NewProduceResponseTopicPartitionErrorRecord()
			e.RelativeOffset = int32(f.Index)
			msg := fmt.Sprintf("check %s: %s", f.Check, f.Message)
			e.ErrorMessage = &msg
			p.ErrorRecords = append(p.ErrorRecords, e)
		}
		t.Partitions = append(t.Partitions, p)
	}
	for i := range resp.Brokers {
		b := &resp.Brokers[i]
		h, port, err := m.MapBroker(b.NodeID, b.Host, b.Port)
		if err != nil {
			return nil, err
		}
		b.Host, b.Port = h, port
	}
	return resp.AppendTo(dst), nil
}
