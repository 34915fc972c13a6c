package protocol

// Budgets on decoded work (issue 25, finding 3). A guarded or tapped
// Produce request has its record batches decompressed and decoded in the
// proxy, and a few kilobytes of zstd can hold millions of tiny records:
// decoded, each costs a ProducedRecord (80 bytes) on top of its bytes, and
// each refused one a record error in the response. So every decode is
// metered:
//
//   - per request, proxy.max_decoded_bytes bounds what its records cost in
//     memory once decoded (decompressed bytes, plus 80 bytes per record and
//     40 per header), and proxy.max_records_per_request how many records
//     it may hold;
//   - across the process, proxy.max_decoded_bytes_total bounds what all
//     decodes in progress hold at once.
//
// Decompression streams into a buffer that is charged before it grows, so
// it stops at the bound instead of decompressing gigabytes and checking
// after; a batch's record count is charged from its header before its
// records are decoded. A request over its own bound has the partition
// that crossed it, and every guarded partition after it, refused with
// MESSAGE_TOO_LARGE (the Java producer splits such a batch and retries;
// others fail the records with the message, which names the key). The
// global bound never refuses: a decode that does not find room waits for
// it, holding none of it (one partition at a time; no hold-and-wait, so
// no deadlock). The tap never waits: a tapped batch that does not fit is
// left to the fetch, as any tap miss is.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"unsafe"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// maxRecordErrors bounds the record errors (Produce v8+ RecordErrors) of
// one refused partition in the response: the partition's ErrorMessage
// counts the others.
const maxRecordErrors = 100

// What a decoded record and a decoded header cost beyond their bytes.
var (
	recordCost = int64(unsafe.Sizeof(ProducedRecord{}))
	headerCost = int64(unsafe.Sizeof(kmsg.Header{}))
)

// ErrDecodeLimit is wrapped by the error of a decode that went over a
// per-request bound.
var ErrDecodeLimit = errors.New("over the proxy's decode budget")

// decodeLimitError names the bound a request went over.
type decodeLimitError struct {
	key   string // config key
	limit int64
}

func (e *decodeLimitError) Error() string {
	if e.key == "max_records_per_request" {
		return fmt.Sprintf("the request holds more than proxy.max_records_per_request (%d) records", e.limit)
	}
	return fmt.Sprintf("the request's records decode to more than proxy.max_decoded_bytes (%d bytes)", e.limit)
}

func (e *decodeLimitError) Unwrap() error { return ErrDecodeLimit }

// bound is the metric label of the bound.
func (e *decodeLimitError) bound() string {
	if e.key == "max_records_per_request" {
		return "records"
	}
	return "bytes"
}

// errLeaseShort: the global budget had no room for a decode that holds
// some of it already; the decode of the partition gives it back, waits
// for room and starts over (decodeMeter.retry).
var errLeaseShort = errors.New("decode budget busy")

// decodeMeter meters the decoding of one request.
type decodeMeter struct {
	global  *heldBudget
	done    <-chan struct{} // nil: never wait (the tap)
	maxCost int64
	maxRecs int64

	cost, recs  int64 // the request's totals so far
	lease, used int64 // of the global budget, for the partition in hand
	bufs        *decompressBufs
	// over is the bound the request went over: its later partitions are
	// refused (or not tapped) without being decoded.
	over *decodeLimitError
}

func (p *Proxy) newMeter(done <-chan struct{}, bufs *decompressBufs) *decodeMeter {
	return &decodeMeter{global: p.decoded, done: done, maxCost: p.cfg.MaxDecodedBytes,
		maxRecs: int64(p.cfg.MaxRecordsPerRequest), bufs: bufs}
}

type meterMark struct{ cost, recs int64 }

func (m *decodeMeter) mark() meterMark { return meterMark{m.cost, m.recs} }

// remaining is what the request may still cost.
func (m *decodeMeter) remaining() int64 { return m.maxCost - m.cost }

// charge counts cost bytes and recs records against the request's
// bounds and the global one.
func (m *decodeMeter) charge(cost, recs int64) error {
	if m.recs+recs > m.maxRecs {
		return &decodeLimitError{key: "max_records_per_request", limit: m.maxRecs}
	}
	if m.cost+cost > m.maxCost {
		return &decodeLimitError{key: "max_decoded_bytes", limit: m.maxCost}
	}
	if need := m.used + cost - m.lease; need > 0 && m.global != nil {
		want := min(max(need, m.lease, 64<<10), m.remaining()-(m.lease-m.used))
		want = max(want, need)
		if !m.global.tryAcquire(want) {
			return errLeaseShort
		}
		m.lease += want
	}
	m.cost += cost
	m.recs += recs
	m.used += cost
	return nil
}

// refund takes back a charge of n bytes that were not used after all.
func (m *decodeMeter) refund(n int64) {
	m.cost -= n
	m.used -= n
}

// endPart gives back the global budget the partition in hand held: its
// records are no longer referenced (their buffers went back to the pool
// or to the GC).
func (m *decodeMeter) endPart() {
	if m.global != nil {
		m.global.release(m.lease)
	}
	m.lease, m.used = 0, 0
}

// retry, after errLeaseShort, rolls the request back to mark, gives back
// the partition's lease and waits, holding nothing, for room for all the
// request may still cost; false when it must not wait (the tap) or the
// connection closed meanwhile.
func (m *decodeMeter) retry(mk meterMark) bool {
	m.cost, m.recs = mk.cost, mk.recs
	m.endPart()
	if m.done == nil || m.global == nil {
		return false
	}
	got, ok := m.global.acquire(m.remaining(), m.done)
	if !ok {
		return false
	}
	m.lease = got
	return true
}

// Codec decoders are pooled: building a zstd or gzip reader allocates
// tables that a decode per batch would otherwise pay for every time.
var (
	gzipReaders sync.Pool // *gzip.Reader
	lz4Readers  sync.Pool // *lz4.Reader
	zstdReaders sync.Pool // *zstd.Decoder
)

// maxZstdWindow bounds the window a zstd frame may ask of the decoder
// (Kafka producers use 2 to 8 MiB; a frame declaring more is refused).
const maxZstdWindow = 64 << 20

func getZstd() (*zstd.Decoder, error) {
	if d, ok := zstdReaders.Get().(*zstd.Decoder); ok {
		return d, nil
	}
	return zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxWindow(maxZstdWindow))
}

// decompress decompresses one batch's records (codec 1 gzip, 2 snappy,
// 3 lz4, 4 zstd), charging m for the output before it is allocated.
func (m *decodeMeter) decompress(src []byte, codec int16) (out []byte, err error) {
	switch codec {
	case 1:
		zr, _ := gzipReaders.Get().(*gzip.Reader)
		if zr == nil {
			zr = new(gzip.Reader)
		}
		defer gzipReaders.Put(zr)
		if err := zr.Reset(bytes.NewReader(src)); err != nil {
			return nil, err
		}
		zr.Multistream(true)
		return m.readAll(zr)
	case 2:
		return m.snappy(src)
	case 3:
		lr, _ := lz4Readers.Get().(*lz4.Reader)
		if lr == nil {
			lr = lz4.NewReader(nil)
		}
		defer lz4Readers.Put(lr)
		lr.Reset(bytes.NewReader(src))
		return m.readAll(lr)
	case 4:
		// A frame that declares its size is refused before any of it is
		// decoded when that is over the bound.
		var h zstd.Header
		if h.Decode(src) == nil && h.HasFCS && h.FrameContentSize > uint64(m.remaining()) {
			return nil, &decodeLimitError{key: "max_decoded_bytes", limit: m.maxCost}
		}
		zd, err := getZstd()
		if err != nil {
			return nil, err
		}
		defer func() {
			zd.Reset(nil)
			zstdReaders.Put(zd)
		}()
		if err := zd.Reset(bytes.NewReader(src)); err != nil {
			return nil, err
		}
		return m.readAll(zd)
	}
	return nil, fmt.Errorf("unknown compression codec %d", codec)
}

// readAll reads r to its end, charging m for each chunk before it is
// taken; a byte beyond what the request may cost is a decodeLimitError.
// The output is read into pooled chunks (64 KiB growing to 4 MiB) and
// joined once at the end: a decode stopped at its bound gives every chunk
// back to the pool, so a stream of bombs leaves no garbage behind, where
// a doubling buffer left one of each size. (The join briefly holds the
// output twice; only the output is charged.)
func (m *decodeMeter) readAll(r io.Reader) ([]byte, error) {
	var chunks [][]byte
	total := 0
	giveAll := func() {
		for _, c := range chunks {
			m.bufs.give(c)
		}
	}
	for {
		size := int64(min(max(total/2, 64<<10), maxPooledDecompress))
		if size = min(size, m.remaining()); size == 0 {
			var one [1]byte
			n, err := io.ReadFull(r, one[:])
			if n > 0 {
				giveAll()
				return nil, &decodeLimitError{key: "max_decoded_bytes", limit: m.maxCost}
			}
			if err != io.EOF && err != io.ErrUnexpectedEOF {
				giveAll()
				return nil, err
			}
			break
		}
		if err := m.charge(size, 0); err != nil {
			giveAll()
			return nil, err
		}
		c := m.bufs.take(int(size))[:size]
		n, err := io.ReadFull(r, c)
		chunks = append(chunks, c[:n])
		total += n
		m.refund(size - int64(n)) // the last chunk's unfilled part
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			giveAll()
			return nil, err
		}
	}
	if len(chunks) == 1 {
		return chunks[0], nil
	}
	out := m.bufs.take(total)
	for _, c := range chunks {
		out = append(out, c...)
	}
	giveAll()
	return out, nil
}

var xerialPrefix = []byte{130, 83, 78, 65, 80, 80, 89, 0}

// snappy decodes raw snappy or the xerial framing Java producers write;
// both declare their decoded lengths, charged before decoding.
func (m *decodeMeter) snappy(src []byte) ([]byte, error) {
	if len(src) <= 16 || !bytes.HasPrefix(src, xerialPrefix) {
		l, err := s2.DecodedLen(src)
		if err != nil {
			return nil, err
		}
		if err := m.charge(int64(l), 0); err != nil {
			return nil, err
		}
		return s2.Decode(m.bufs.take(l)[:l], src)
	}
	body := src[16:]
	var total int64
	for rem := body; len(rem) > 0; {
		if len(rem) < 4 {
			return nil, errors.New("snappy: malformed xerial framing")
		}
		size := int64(binary.BigEndian.Uint32(rem))
		rem = rem[4:]
		if size > int64(len(rem)) {
			return nil, errors.New("snappy: malformed xerial framing")
		}
		l, err := s2.DecodedLen(rem[:size])
		if err != nil {
			return nil, err
		}
		total += int64(l)
		if total > m.remaining() {
			return nil, &decodeLimitError{key: "max_decoded_bytes", limit: m.maxCost}
		}
		rem = rem[size:]
	}
	if err := m.charge(total, 0); err != nil {
		return nil, err
	}
	out := m.bufs.take(int(total))
	for len(body) > 0 {
		size := int(binary.BigEndian.Uint32(body))
		body = body[4:]
		l, _ := s2.DecodedLen(body[:size])
		dec, err := s2.Decode(out[len(out):len(out)+l], body[:size])
		if err != nil {
			m.bufs.give(out)
			return nil, err
		}
		out = out[:len(out)+len(dec)]
		body = body[size:]
	}
	return out, nil
}

// recordHeaderCount reads how many headers an encoded record (after its
// length) declares, without decoding it; ok false when it does not parse
// (the decoder then says why).
func recordHeaderCount(b []byte) (int64, bool) {
	if len(b) < 1 {
		return 0, false
	}
	b = b[1:]     // attributes
	for range 2 { // timestamp delta, offset delta
		_, n := binary.Varint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
	}
	for range 2 { // key, value
		l, n := binary.Varint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		if l > 0 {
			if l > int64(len(b)) {
				return 0, false
			}
			b = b[l:]
		}
	}
	c, n := binary.Varint(b)
	if n <= 0 {
		return 0, false
	}
	return max(c, 0), true // a negative count decodes as no header
}
