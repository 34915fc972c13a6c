package protocol

// The batches of a fetch response through a view are rewritten on
// several cores at once. A response is read whole and answered whole
// (view_fetch.go), and a client sends its next fetch to that broker only
// once it has the answer: the rewrite's latency, not only its CPU, sets
// the rate a consumer reads a view at. So the rewrite of one response is
// cut where it has no order: each v2 batch is decoded, run through its
// view, encoded and compressed by itself (viewBatch), by up to
// GOMAXPROCS workers, and viewPartition then takes the batches in order,
// folding those that were all filtered out as it does without workers.
//
// Bounds: at most 2×workers batches are rewritten ahead of the one
// viewPartition waits for, and each takes room for its output in
// proxy.max_held_bytes (without waiting: the connection holds its
// response there already; with no room, viewPartition rewrites that
// batch in line); each worker decodes under its own meter (decode.go),
// charged to the global decode budget as the connections' decodes are.
// A worker's panic is raised again in the connection's goroutine, which
// closes that connection as any panic of its loops does.

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
)

// maxViewWorkers bounds the workers of one response.
const maxViewWorkers = 8

// minViewParallelBytes is the least a response's batches must weigh to be
// rewritten on workers: below it (a consumer at the end of a log, a few
// records per fetch) handing batches to goroutines costs more than the
// rewrite itself, so they are rewritten in line.
const minViewParallelBytes = 64 << 10

// viewJob is one batch of a response to rewrite.
type viewJob struct {
	v         View
	partition int32
	b         []byte
	// What viewBatch made of it: out holds the batch written (its own
	// buffer, from viewOutBufs).
	out      []byte
	kind     int
	c        viewCounts
	err      error
	panicked any
	done     chan struct{}
	// charged is what the job holds of proxy.max_held_bytes for its
	// output until taken; inline: there was no room, and take's caller
	// rewrites the batch itself (into the response's output directly).
	charged int64
	inline  bool
}

// viewJobs rewrites the batches of one response on workers, handing the
// results back in order (take).
type viewJobs struct {
	jobs     []*viewJob
	next     int // the job take hands back next
	newMeter func() *decodeMeter
	held     *heldBudget   // proxy.max_held_bytes; nil: not bounded (tests)
	slots    chan struct{} // one per job fed and not taken yet
	feed     chan *viewJob
	quit     chan struct{}
	wg       sync.WaitGroup
}

var viewOutBufs sync.Pool // *[]byte

func getViewOut(n int) []byte {
	if b, ok := viewOutBufs.Get().(*[]byte); ok && cap(*b) >= n {
		return (*b)[:0]
	}
	return make([]byte, 0, n)
}

func putViewOut(b []byte) {
	if cap(b) == 0 || cap(b) > maxPooledDecompress {
		return
	}
	b = b[:0]
	viewOutBufs.Put(&b)
}

// viewWorkers is how many workers rewrite a response of n batches.
func viewWorkers(n int) int {
	return min(runtime.GOMAXPROCS(0), n, maxViewWorkers)
}

// eachViewBatch calls f with each v2 batch of in that viewPartition
// hands to viewBatch, in order.
func eachViewBatch(in []byte, f func(b []byte)) {
	for len(in) >= 17 {
		size := int64(int32(binary.BigEndian.Uint32(in[8:12])))
		if size < 14 || 12+size > int64(len(in)) {
			return
		}
		b := in[:12+size]
		in = in[12+size:]
		if b[16] == 2 && len(b) >= batchHeaderLen {
			f(b)
		}
	}
}

// minViewJobBytes is the least a response's batches must weigh on
// average to be rewritten on workers: a batch of a record or two (a
// producer without linger) is rewritten in less time than it takes to
// hand it to a worker and back.
const minViewJobBytes = 8 << 10

// viewParallel reports whether a response of n batches weighing size
// bytes is rewritten on workers: at least two batches, more than one
// core, minViewParallelBytes of batches, minViewJobBytes a batch.
func viewParallel(n, size int) bool {
	return viewWorkers(n) >= 2 && size >= minViewParallelBytes && size >= n*minViewJobBytes
}

// viewJobsStarted counts the responses rewritten on workers (tests).
var viewJobsStarted atomic.Int64

// startViewJobsN starts w workers on the jobs.
func startViewJobsN(jobs []*viewJob, w int, held *heldBudget, newMeter func() *decodeMeter) *viewJobs {
	viewJobsStarted.Add(1)
	j := &viewJobs{jobs: jobs, newMeter: newMeter, held: held, slots: make(chan struct{}, 2*w), feed: make(chan *viewJob),
		quit: make(chan struct{})}
	j.wg.Add(1 + w)
	go j.dispatch()
	for range w {
		go j.work()
	}
	return j
}

func (j *viewJobs) dispatch() {
	defer j.wg.Done()
	defer close(j.feed)
	for _, jb := range j.jobs {
		select {
		case j.slots <- struct{}{}:
		case <-j.quit:
			return
		}
		// A batch rewritten ahead holds its output besides the
		// response's: it takes room in proxy.max_held_bytes, without
		// waiting (the connection already holds its response there);
		// with no room the connection rewrites it in line when it gets
		// to it, as without workers.
		if j.held != nil && j.held.max > 0 {
			est := viewOutCap(jb.b)
			if !j.held.tryAcquire(est) {
				jb.inline = true
				close(jb.done)
				continue
			}
			jb.charged = est
		}
		select {
		case j.feed <- jb:
		case <-j.quit:
			j.release(jb) // fed to no worker: its room goes back now
			return
		}
	}
}

func (j *viewJobs) work() {
	defer j.wg.Done()
	sc := viewScratches.Get().(*viewScratch)
	defer viewScratches.Put(sc)
	for jb := range j.feed {
		j.run(jb, sc)
		close(jb.done)
	}
}

func (j *viewJobs) run(jb *viewJob, sc *viewScratch) {
	defer func() {
		if p := recover(); p != nil {
			jb.panicked = fmt.Sprintf("%v (in a view worker)\n%s", p, debug.Stack())
		}
	}()
	m := j.newMeter()
	defer m.endPart()
	out := getViewOut(int(viewOutCap(jb.b)))
	jb.out, jb.kind, jb.err = viewBatch(out, jb.v, jb.partition, jb.b, m, sc, &jb.c)
}

// take waits for the next job, which must be batch b's.
func (j *viewJobs) take(b []byte) *viewJob {
	if j.next >= len(j.jobs) || &j.jobs[j.next].b[0] != &b[0] {
		panic("view workers: the batches are taken out of order")
	}
	jb := j.jobs[j.next]
	j.next++
	<-jb.done
	<-j.slots
	if jb.panicked != nil {
		panic(jb.panicked)
	}
	return jb
}

// stop ends the workers (those working finish their batch first) and
// gives back the buffers of the batches not taken. After stop no worker
// reads the response any more.
func (j *viewJobs) stop() {
	close(j.quit)
	j.wg.Wait()
	for _, jb := range j.jobs[j.next:] {
		select {
		case <-jb.done:
			j.release(jb)
		default:
		}
	}
}

// release gives back a job's output buffer and what it held.
func (j *viewJobs) release(jb *viewJob) {
	putViewOut(jb.out)
	jb.out = nil
	if jb.charged > 0 {
		j.held.release(jb.charged)
		jb.charged = 0
	}
}

// viewOutCap is the room a batch's rewrite starts with.
func viewOutCap(b []byte) int64 { return int64(len(b) + len(b)/16 + 128) }

// batch appends what viewBatch makes of b to dst: the workers' result
// when they run, or viewBatch's in line.
func (sc *viewScratch) batch(dst []byte, v View, partition int32, b []byte, m *decodeMeter, c *viewCounts) ([]byte, int, error) {
	if sc.jobs == nil {
		return viewBatch(dst, v, partition, b, m, sc, c)
	}
	jb := sc.jobs.take(b)
	if jb.inline {
		return viewBatch(dst, v, partition, b, m, sc, c)
	}
	defer sc.jobs.release(jb)
	c.kept += jb.c.kept
	c.filtered += jb.c.filtered
	c.errors += jb.c.errors
	if jb.err != nil {
		return dst, 0, jb.err
	}
	if jb.kind == batchFiltered {
		return dst, batchFiltered, nil
	}
	return append(dst, jb.out...), jb.kind, nil
}

// rebaseBatch moves the base offset of the batch at dst[start:] (the
// last in dst, one viewBatch wrote) down to base, the first offset of the
// batches before it that were all filtered out: its records keep their
// offsets (their offset deltas grow by the difference) and its last
// offset stays. The batch is this process's own output, so it is
// decompressed without a decode budget (what viewBatch encoded is as
// large, and was held as long).
func rebaseBatch(dst []byte, start int, base int64, sc *viewScratch) ([]byte, error) {
	b := dst[start:]
	old := int64(binary.BigEndian.Uint64(b[0:8]))
	shift := old - base
	if shift == 0 {
		return dst, nil
	}
	lastDelta := int64(int32(binary.BigEndian.Uint32(b[23:27]))) + shift
	n := int(int32(binary.BigEndian.Uint32(b[57:61])))
	codec := int16(binary.BigEndian.Uint16(b[21:23])) & 0x07
	sc.tmp = append(sc.tmp[:0], b...)
	data := sc.tmp[batchHeaderLen:]
	xerial := false
	if codec != 0 {
		m := &decodeMeter{maxCost: 1 << 62, maxRecs: 1 << 62, bufs: &sc.rebaseBufs}
		dec, err := m.decompress(data, codec)
		if err != nil {
			return dst, fmt.Errorf("rebase: %w", err)
		}
		defer sc.rebaseBufs.give(dec)
		xerial = codec == 2 && len(data) > 16 && string(data[:len(xerialPrefix)]) == string(xerialPrefix)
		data = dec
	}
	raw := sc.raw[:0]
	hdrs := sc.hdrs[:0]
	for range n {
		r, od, h, k, err := parseRecord(data, hdrs[:0])
		if err != nil {
			return dst, fmt.Errorf("rebase: %w", err)
		}
		hdrs = h
		data = data[k:]
		raw = appendRecord(raw, &r, r.Timestamp, int32(int64(od)+shift))
	}
	sc.raw, sc.hdrs = raw, hdrs
	dst = append(dst[:start], sc.tmp[:batchHeaderLen]...)
	if codec == 0 {
		dst = append(dst, raw...)
	} else {
		var err error
		if dst, err = sc.comp.compress(dst, raw, codec, xerial); err != nil {
			return dst[:start], err
		}
	}
	h := dst[start:]
	binary.BigEndian.PutUint64(h[0:8], uint64(base))
	binary.BigEndian.PutUint32(h[23:27], uint32(lastDelta))
	return finishBatch(dst, start), nil
}
