package protocol

// The record batches of a partition fetched through a view (view.go) are
// decoded, each record handed to the view, and re-encoded: every batch
// keeps its base offset, its last offset delta, its timestamps, producer
// id, epoch, base sequence, partition leader epoch and attributes (so its
// codec, timestamp type and transactional bit); a record the view filters
// out is left out, its offset a gap, as compaction leaves one, and the
// kept ones keep their offset deltas. A batch whose records are all
// filtered out stays as an empty batch (no records, no compression), as
// the log cleaner writes one, so a client's next fetch offset still moves
// past it (base offset + last offset delta + 1). Control batches (commit
// and abort markers) are copied as they are, and the producer ids and
// aborted transactions of the response are not touched: read_committed
// consumers drop what they drop without a view.
//
// A record the view cannot process (Apply's error, a panic in it) and
// every record of a batch that does not decode (bad CRC, bad record
// framing, an unknown codec, an old message format, one batch over
// proxy.max_decoded_bytes) is never passed through: it becomes a record
// with a null value and the one header rtproxy-view-error saying why (for
// a batch that does not decode: one such record at the batch's last
// offset). A trailing partial batch (the broker cut the response at its
// byte limit) is dropped: the client asks for it again, as it would have.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// ViewErrorHeader is the header a record gets when the view could not
// process it; its value is null and the header says why.
const ViewErrorHeader = "rtproxy-view-error"

var viewCRCTable = crc32.MakeTable(crc32.Castagnoli)

// batchHeaderLen is the v2 record batch header, up to its record count.
const batchHeaderLen = 61

// viewCounts are what one partition's records did under a view.
type viewCounts struct{ kept, filtered, errors int64 }

// viewPartition rewrites one partition's record batches (in) through v,
// appending the new batches to dst. m bounds the decode of each batch;
// the budget is given back between batches, so a partition costs at most
// one batch's decoded records at a time. sc holds scratch buffers reused
// across batches.
//
// A batch whose records are all filtered out is not written as an empty
// batch when it need not be: its offsets are folded into the batch
// written before it (its last offset delta grows, as when a batch's last
// records are filtered) or, when there is none, into the next one (whose
// base offset moves down, as when a batch's first records are filtered).
// Only a partition whose batches are all filtered out, or a run of them
// before a control batch, ends in an empty batch, and only for a client
// that can read one (sc.noEmpty unset): segmentio/kafka-go (v0.4.51)
// panics on a batch of no records, kafka-python (2.0.2) fails on a
// partition whose batches hold none.
func viewPartition(dst []byte, v View, partition int32, in []byte, m *decodeMeter, sc *viewScratch, c *viewCounts) ([]byte, error) {
	prev := -1           // where in dst the last data batch starts; -1: none, or a control batch since
	pending := int64(-1) // first offset of the filtered-out batches not folded yet
	var pendEnd int64    // their last offset
	var pendHdr [batchHeaderLen]byte
	flush := func() {
		if pending < 0 {
			return
		}
		if sc.noEmpty {
			// A client that cannot read an empty batch: the offsets
			// are left out (the client fetches them again, or moves
			// past them with the next batch).
			sc.dropped++
		} else {
			dst = appendEmptyBatch(dst, pendHdr[:], pending, int32(pendEnd-pending))
		}
		prev, pending = -1, -1
	}
	for len(in) >= 17 {
		size := int64(int32(binary.BigEndian.Uint32(in[8:12])))
		if size < 14 || 12+size > int64(len(in)) {
			// A trailing partial batch, or a length too short for any
			// message format: nothing after it can be framed.
			break
		}
		b := in[:12+size]
		in = in[12+size:]
		if b[16] != 2 {
			// An old message set entry (magic 0 or 1): its offset is the
			// entry's (a compressed wrapper's is its last inner one).
			flush()
			off := int64(binary.BigEndian.Uint64(b[0:8]))
			prev = len(dst)
			dst = appendErrorBatch(dst, nil, off, 0, "record format (magic "+fmt.Sprint(b[16])+") older than Kafka 0.11 batches")
			c.errors++
			continue
		}
		if len(b) < batchHeaderLen {
			continue // no room for a header: not a batch a client could read either
		}
		base := int64(binary.BigEndian.Uint64(b[0:8]))
		end := base + int64(int32(binary.BigEndian.Uint32(b[23:27])))
		if pending >= 0 && (end-pending > math.MaxInt32 || end < pending) {
			flush() // too far to fold
		}
		start := len(dst)
		out, kind, err := sc.batch(dst, v, partition, b, m, c)
		if err != nil {
			return out, err
		}
		switch kind {
		case batchWritten:
			if pending >= 0 {
				// Earlier batches were all filtered out: this one
				// starts at the first of them instead.
				if out, err = rebaseBatch(out, start, pending, sc); err != nil {
					return out[:start], err
				}
			}
			dst, prev, pending = out, start, -1
		case batchControl:
			if pending >= 0 {
				dst = dst[:start]
				flush()
				dst = append(dst, b...)
			} else {
				dst = out
			}
			prev = -1
		case batchFiltered:
			if prev >= 0 {
				if pb := int64(binary.BigEndian.Uint64(dst[prev:])); end-pb <= math.MaxInt32 && end >= pb {
					binary.BigEndian.PutUint32(dst[prev+23:], uint32(end-pb))
					dst = finishBatch(dst, prev) // prev is the last batch in dst
					continue
				}
			}
			if pending < 0 {
				pending = base
				copy(pendHdr[:], b[:batchHeaderLen])
			}
			pendEnd = end
		}
	}
	flush()
	return dst, nil
}

// What viewBatch did with a batch.
const (
	batchWritten  = iota // a data batch (or its error record) was appended
	batchControl         // a control batch was appended as it is
	batchFiltered        // every record was filtered out: nothing was appended
)

// viewBatch rewrites one v2 batch b (whole) through v, appending what it
// writes to dst. Its error is only that the connection closed while the
// decode waited for the global budget.
func viewBatch(dst []byte, v View, partition int32, b []byte, m *decodeMeter, sc *viewScratch, c *viewCounts) ([]byte, int, error) {
	attrs := int16(binary.BigEndian.Uint16(b[21:23]))
	hdr := b[:batchHeaderLen]
	base := int64(binary.BigEndian.Uint64(b[0:8]))
	lastDelta := int32(binary.BigEndian.Uint32(b[23:27]))
	if crc32.Checksum(b[21:], viewCRCTable) != binary.BigEndian.Uint32(b[17:21]) {
		c.errors++
		return appendErrorBatch(dst, hdr, base, lastDelta, "record batch CRC mismatch"), batchWritten, nil
	}
	if attrs&0x20 != 0 {
		return append(dst, b...), batchControl, nil
	}
	mk := m.mark()
	for {
		out, kept, err := viewRecords(dst, v, partition, b, m, sc, c)
		m.unwind(mk)
		switch {
		case err == nil && kept == 0:
			return dst, batchFiltered, nil
		case err == nil:
			return out, batchWritten, nil
		case errors.Is(err, errLeaseShort):
			if !m.retry(mk) {
				return dst, 0, errors.New("connection closed while waiting for the decode budget")
			}
			continue
		}
		c.errors++
		return appendErrorBatch(dst, hdr, base, lastDelta, err.Error()), batchWritten, nil
	}
}

// appendEmptyBatch appends a batch of no records covering base to
// base+lastDelta, with hdr's producer fields, timestamps and
// transactional bit, uncompressed, as the log cleaner writes one.
func appendEmptyBatch(dst, hdr []byte, base int64, lastDelta int32) []byte {
	start := len(dst)
	dst = append(dst, hdr[:batchHeaderLen]...)
	h := dst[start:]
	binary.BigEndian.PutUint64(h[0:8], uint64(base))
	binary.BigEndian.PutUint16(h[21:23], binary.BigEndian.Uint16(h[21:23])&^0x27) // no codec, not control
	binary.BigEndian.PutUint32(h[23:27], uint32(lastDelta))
	binary.BigEndian.PutUint32(h[57:61], 0)
	return finishBatch(dst, start)
}

// unwind gives back what the meter charged since mk (the batch's records
// are encoded and their buffers given back); the global lease stays for
// the next batch, and endPart gives it back.
func (m *decodeMeter) unwind(mk meterMark) {
	m.used -= m.cost - mk.cost
	m.cost, m.recs = mk.cost, mk.recs
}

// viewScratch is reused across the batches of a response.
type viewScratch struct {
	// noEmpty is set for a client that cannot read a batch of no
	// records; dropped counts the runs of filtered batches left out for
	// it.
	noEmpty bool
	dropped int
	raw     []byte // the kept records, encoded, before compression
	val     []byte // ViewRecord.Scratch: a record's new value until encoded
	recs    []ViewRecord
	hdrs    []kmsg.Header
	comp    compressors
	// jobs, when set, rewrite the response's batches on workers
	// (view_par.go); tmp and rebaseBufs serve rebaseBatch.
	jobs       *viewJobs
	tmp        []byte
	rebaseBufs decompressBufs
}

// viewRecords decodes batch b, runs v on its records and appends the
// batch of the kept ones (nothing when none is kept).
func viewRecords(dst []byte, v View, partition int32, b []byte, m *decodeMeter, sc *viewScratch, c *viewCounts) (out []byte, kept int32, err error) {
	var bh kmsg.RecordBatch
	if err := bh.ReadFrom(b); err != nil {
		return dst, 0, fmt.Errorf("record batch: %w", err)
	}
	if bh.NumRecords < 0 {
		return dst, 0, fmt.Errorf("record batch claims %d records", bh.NumRecords)
	}
	if err := m.charge(int64(bh.NumRecords)*recordCost, int64(bh.NumRecords)); err != nil {
		return dst, 0, err
	}
	data := bh.Records
	codec := bh.Attributes & 0x07
	xerial := false
	if codec != 0 {
		dec, err := m.viewDecompress(data, codec)
		if err != nil {
			if errors.Is(err, ErrDecodeLimit) || errors.Is(err, errLeaseShort) {
				return dst, 0, err
			}
			return dst, 0, fmt.Errorf("decompress: %w", err)
		}
		defer m.bufs.give(dec)
		xerial = codec == 2 && len(data) > 16 && string(data[:len(xerialPrefix)]) == string(xerialPrefix)
		data = dec
	}
	if int64(bh.NumRecords) > int64(len(data)) {
		return dst, 0, fmt.Errorf("record batch claims %d records in %d bytes", bh.NumRecords, len(data))
	}
	recs := sc.recs[:0]
	hdrs := sc.hdrs[:0]
	for range bh.NumRecords {
		var r ViewRecord
		var od int32
		var n int
		if r, od, hdrs, n, err = parseRecord(data, hdrs); err != nil {
			return dst, 0, err
		}
		data = data[n:]
		r.Partition = partition
		r.Offset = bh.FirstOffset + int64(od)
		r.Timestamp += bh.FirstTimestamp
		recs = append(recs, r)
	}
	if len(data) != 0 {
		return dst, 0, fmt.Errorf("record batch: %d bytes after its %d records", len(data), bh.NumRecords)
	}
	sc.recs, sc.hdrs = recs, hdrs // headers alias hdrs: reuse only after encoding
	raw := sc.raw[:0]
	for i := range recs {
		r := &recs[i]
		r.Scratch = sc.val[:0]
		orig := *r
		keep, aerr := applyView(v, r)
		if cap(r.Scratch) > cap(sc.val) {
			sc.val = r.Scratch[:0]
		}
		r.Scratch = nil
		if aerr != nil {
			r.Key, r.Value, r.Headers = orig.Key, nil, []kmsg.Header{{Key: ViewErrorHeader, Value: []byte(aerr.Error())}}
			keep = true
			c.errors++
		} else if !keep {
			c.filtered++
			continue
		} else {
			c.kept++
		}
		// Offsets and timestamps are the stored ones, whatever the view did.
		raw = appendRecord(raw, r, orig.Timestamp-bh.FirstTimestamp, int32(orig.Offset-bh.FirstOffset))
		kept++
	}
	sc.raw = raw
	if kept == 0 {
		return dst, 0, nil
	}
	start := len(dst)
	dst = append(dst, b[:batchHeaderLen]...)
	if codec == 0 {
		dst = append(dst, raw...)
	} else if dst, err = sc.comp.compress(dst, raw, codec, xerial); err != nil {
		return dst[:start], 0, err
	}
	h := dst[start:]
	binary.BigEndian.PutUint32(h[57:61], uint32(kept))
	return finishBatch(dst, start), kept, nil
}

// applyView runs v on r; a panic in the view is an error of that record.
func applyView(v View, r *ViewRecord) (keep bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			keep, err = false, fmt.Errorf("view failed: %v", p)
		}
	}()
	return v.Apply(r)
}

// finishBatch sets the length and the CRC of the batch at dst[start:].
func finishBatch(dst []byte, start int) []byte {
	b := dst[start:]
	binary.BigEndian.PutUint32(b[8:12], uint32(len(b)-12))
	binary.BigEndian.PutUint32(b[17:21], crc32.Checksum(b[21:], viewCRCTable))
	return dst
}

// appendErrorBatch appends a batch holding one record at base+lastDelta
// with a null value and the rtproxy-view-error header. hdr, when not nil,
// is the original batch's header, whose producer fields, leader epoch,
// timestamps and transactional bit are kept.
func appendErrorBatch(dst, hdr []byte, base int64, lastDelta int32, reason string) []byte {
	start := len(dst)
	var ts int64 = -1
	if hdr != nil {
		dst = append(dst, hdr...)
		ts = int64(binary.BigEndian.Uint64(hdr[35:43]))
	} else {
		dst = append(dst, make([]byte, batchHeaderLen)...)
		h := dst[start:]
		binary.BigEndian.PutUint64(h[0:8], uint64(base))
		binary.BigEndian.PutUint32(h[12:16], math.MaxUint32) // leader epoch -1
		binary.BigEndian.PutUint64(h[27:35], uint64(ts))
		binary.BigEndian.PutUint64(h[35:43], uint64(ts))
		binary.BigEndian.PutUint64(h[43:51], math.MaxUint64) // producer id -1
		binary.BigEndian.PutUint16(h[51:53], math.MaxUint16) // producer epoch -1
		binary.BigEndian.PutUint32(h[53:57], math.MaxUint32) // base sequence -1
	}
	h := dst[start:]
	h[16] = 2
	binary.BigEndian.PutUint16(h[21:23], binary.BigEndian.Uint16(h[21:23])&0x18) // keep the timestamp type and transactional bits; no codec, not control
	binary.BigEndian.PutUint32(h[23:27], uint32(lastDelta))
	binary.BigEndian.PutUint32(h[57:61], 1)
	first := int64(binary.BigEndian.Uint64(h[27:35]))
	r := ViewRecord{Offset: base + int64(lastDelta), Timestamp: ts,
		Headers: []kmsg.Header{{Key: ViewErrorHeader, Value: []byte(reason)}}}
	dst = appendRecord(dst, &r, ts-first, lastDelta)
	return finishBatch(dst, start)
}

// parseRecord decodes the record at the start of b (its varint length
// first) into r, its header slices appended to hdrs (r.Headers aliases
// them); key, value and header values alias b. It returns the record's
// offset delta and how many bytes it took.
func parseRecord(b []byte, hdrs []kmsg.Header) (r ViewRecord, offsetDelta int32, _ []kmsg.Header, n int, err error) {
	bad := func(what string) (ViewRecord, int32, []kmsg.Header, int, error) {
		return r, 0, hdrs, 0, errors.New("record: " + what)
	}
	l, ln := binary.Varint(b)
	if ln <= 0 || l < 0 || int64(ln)+l > int64(len(b)) {
		return bad("length does not fit its batch")
	}
	n = ln + int(l)
	p := b[ln:n]
	if len(p) < 1 {
		return bad("empty")
	}
	p = p[1:] // attributes, unused
	tsd, k := binary.Varint(p)
	if k <= 0 {
		return bad("timestamp delta")
	}
	p = p[k:]
	od, k := binary.Varint(p)
	if k <= 0 || od < math.MinInt32 || od > math.MaxInt32 {
		return bad("offset delta")
	}
	p = p[k:]
	r.Timestamp = tsd // made absolute by the caller: kept as the delta here
	var ok bool
	if r.Key, p, ok = varBytes(p); !ok {
		return bad("key")
	}
	if r.Value, p, ok = varBytes(p); !ok {
		return bad("value")
	}
	hc, k := binary.Varint(p)
	if k <= 0 || hc > int64(len(p)) {
		return bad("header count")
	}
	hc = max(hc, 0) // a negative count reads as no header, as clients read it
	p = p[k:]
	first := len(hdrs)
	for range hc {
		var hk, hv []byte
		if hk, p, ok = varBytes(p); !ok {
			return bad("header key")
		}
		if hv, p, ok = varBytes(p); !ok {
			return bad("header value")
		}
		hdrs = append(hdrs, kmsg.Header{Key: string(hk), Value: hv})
	}
	// Bytes after the headers, inside the record's length, are ignored,
	// as franz-go reads them (and not re-encoded).
	if hc > 0 {
		r.Headers = hdrs[first:len(hdrs):len(hdrs)]
	}
	return r, int32(od), hdrs, n, nil
}

// varBytes reads a varint-length byte string (a negative length: nil,
// as Kafka reads it).
func varBytes(p []byte) ([]byte, []byte, bool) {
	l, k := binary.Varint(p)
	if k <= 0 || l > int64(len(p)-k) {
		return nil, p, false
	}
	p = p[k:]
	if l < 0 {
		return nil, p, true
	}
	return p[:l:l], p[l:], true
}

func varintLen(v int64) int {
	u := uint64(v<<1) ^ uint64(v>>63)
	n := 1
	for u >= 0x80 {
		u >>= 7
		n++
	}
	return n
}

func varBytesLen(b []byte) int {
	if b == nil {
		return varintLen(-1)
	}
	return varintLen(int64(len(b))) + len(b)
}

// appendRecord appends r encoded at the given deltas.
func appendRecord(dst []byte, r *ViewRecord, tsDelta int64, offsetDelta int32) []byte {
	size := 1 + varintLen(tsDelta) + varintLen(int64(offsetDelta)) + varBytesLen(r.Key) + varBytesLen(r.Value) +
		varintLen(int64(len(r.Headers)))
	for _, h := range r.Headers {
		size += varintLen(int64(len(h.Key))) + len(h.Key) + varBytesLen(h.Value)
	}
	dst = binary.AppendVarint(dst, int64(size))
	dst = append(dst, 0)
	dst = binary.AppendVarint(dst, tsDelta)
	dst = binary.AppendVarint(dst, int64(offsetDelta))
	dst = appendVarBytes(dst, r.Key)
	dst = appendVarBytes(dst, r.Value)
	dst = binary.AppendVarint(dst, int64(len(r.Headers)))
	for _, h := range r.Headers {
		dst = binary.AppendVarint(dst, int64(len(h.Key)))
		dst = append(dst, h.Key...)
		dst = appendVarBytes(dst, h.Value)
	}
	return dst
}

func appendVarBytes(dst, b []byte) []byte {
	if b == nil {
		return binary.AppendVarint(dst, -1)
	}
	dst = binary.AppendVarint(dst, int64(len(b)))
	return append(dst, b...)
}
