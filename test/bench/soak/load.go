package main

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// book is the oracle of one route: what the producer got acknowledged and
// what the sink consumer read, by sequence number (the id is
// "<letter>-<seq>").
type book struct {
	letter         string // "a" or "b"
	route          string
	src, sink, dlq string

	mu sync.Mutex
	// per sequence number
	ackPart  []int32 // source partition, -1 while not acknowledged
	ackOff   []int64 // source offset
	ackAt    []int64 // ns since the soak's start
	seen     []uint16
	firstSrc []int64 // rtproxy-source of the first output, packed (partition<<40 | offset); -1 none
	firstOut []int64 // where the first output was read: sink partition<<40 | offset
	firstAt  []int32 // when, in 100 ms since the start

	failed       int64 // produce callbacks with an error (not counted as acked)
	acked        int64
	outputs      int64 // sink records read
	distinct     int64 // sequence numbers read at least once
	repeatsSame  int64 // an output whose rtproxy-source was read before (rtproxy wrote it twice)
	repeatsOther int64 // an id read again from another source record (the producer wrote it twice)
	unparsed     int64
	lastOut      time.Time
	dlqSeqs      map[int64]string // seq → rtproxy-reason
	repeatAt     map[int64]int64  // repeats by the 10 s bucket they were read in
	repeatSample []string
	dlqOther     int64

	// route A: the highest source offset read from the sink, per source
	// partition, and its history (one sample a second), for the deletion
	// bands.
	maxRead []int64
	hist    []readSnap
}

type readSnap struct {
	at  time.Duration
	max []int64
}

func newBook(letter, route string, parts, capacity int) *book {
	b := &book{letter: letter, route: route, src: "soak." + letter, sink: "soak." + letter + ".out", dlq: "soak." + letter + ".dlq",
		dlqSeqs: map[int64]string{}, maxRead: make([]int64, parts), lastOut: time.Now()}
	b.ackPart = make([]int32, 0, capacity)
	b.ackOff = make([]int64, 0, capacity)
	b.ackAt = make([]int64, 0, capacity)
	b.seen = make([]uint16, 0, capacity)
	b.firstSrc = make([]int64, 0, capacity)
	b.firstOut = make([]int64, 0, capacity)
	b.firstAt = make([]int32, 0, capacity)
	b.repeatAt = map[int64]int64{}
	for i := range b.maxRead {
		b.maxRead[i] = -1
	}
	return b
}

// next allocates a sequence number.
func (b *book) next() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	seq := int64(len(b.ackPart))
	b.ackPart = append(b.ackPart, -1)
	b.ackOff = append(b.ackOff, -1)
	b.ackAt = append(b.ackAt, 0)
	b.seen = append(b.seen, 0)
	b.firstSrc = append(b.firstSrc, -1)
	b.firstOut = append(b.firstOut, -1)
	b.firstAt = append(b.firstAt, 0)
	return seq
}

func (b *book) ack(seq int64, r *kgo.Record, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		b.failed++
		return
	}
	b.acked++
	b.ackPart[seq], b.ackOff[seq], b.ackAt[seq] = r.Partition, r.Offset, int64(since())
}

// value is a ~size-byte JSON record.
func value(letter string, seq int64, size int) []byte {
	v := fmt.Appendf(make([]byte, 0, size+16), `{"id":"%s-%09d","seq":%d,"route":"%s","produced_ns":%d,"pad":"`,
		letter, seq, seq, letter, time.Now().UnixNano())
	for len(v) < size-2 {
		v = append(v, 'x')
	}
	return append(v, '"', '}')
}

// output notes one sink record.
func (b *book) output(r *kgo.Record) {
	seq, ok := numField(r.Value, `"seq":`)
	src := int64(-1)
	for _, h := range r.Headers {
		if h.Key == "rtproxy-source" {
			src = packSource(h.Value)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.outputs++
	b.lastOut = time.Now()
	if !ok || seq < 0 || seq >= int64(len(b.seen)) {
		b.unparsed++
		return
	}
	if b.seen[seq] < 65535 {
		b.seen[seq]++
	}
	now := since()
	if b.seen[seq] == 1 {
		b.distinct++
		b.firstSrc[seq] = src
		b.firstOut[seq] = int64(r.Partition)<<40 | r.Offset
		b.firstAt[seq] = int32(now / (100 * time.Millisecond))
	} else {
		if src >= 0 && src == b.firstSrc[seq] {
			b.repeatsSame++
		} else {
			b.repeatsOther++
		}
		b.repeatAt[int64(now/(10*time.Second))]++
		if len(b.repeatSample) < 12 {
			fo := b.firstOut[seq]
			b.repeatSample = append(b.repeatSample, fmt.Sprintf("%s-%09d source %s: first read at %s from %s/%d@%d, again at %s from %s/%d@%d",
				b.letter, seq, srcText(src), clock(time.Duration(b.firstAt[seq])*100*time.Millisecond), r.Topic, fo>>40, fo&(1<<40-1),
				clock(now), r.Topic, r.Partition, r.Offset))
		}
	}
	if src >= 0 {
		p, o := int(src>>40), src&(1<<40-1)
		if p < len(b.maxRead) && o > b.maxRead[p] {
			b.maxRead[p] = o
		}
	}
}

// packSource reads "topic/partition/offset".
func packSource(h []byte) int64 {
	j := bytes.LastIndexByte(h, '/')
	if j < 0 {
		return -1
	}
	i := bytes.LastIndexByte(h[:j], '/')
	if i < 0 {
		return -1
	}
	p, err1 := strconv.ParseInt(string(h[i+1:j]), 10, 32)
	o, err2 := strconv.ParseInt(string(h[j+1:]), 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return p<<40 | o
}

// deadLetter notes one dead-letter record of this route.
func (b *book) deadLetter(r *kgo.Record) {
	reason := ""
	for _, h := range r.Headers {
		if h.Key == "rtproxy-reason" {
			reason = string(h.Value)
		}
	}
	seq, ok := numField(r.Value, `"seq":`)
	b.mu.Lock()
	defer b.mu.Unlock()
	if !ok {
		b.dlqOther++
		return
	}
	b.dlqSeqs[seq] = reason
}

// snapshot appends the current maxRead to the history.
func (b *book) snapshot() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.hist = append(b.hist, readSnap{at: since(), max: append([]int64(nil), b.maxRead...)})
}

// readAt is maxRead as of the last sample at or before at (all -1 before
// the first).
func (b *book) readAt(at time.Duration) []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]int64, len(b.maxRead))
	for i := range out {
		out[i] = -1
	}
	for _, s := range b.hist {
		if s.at > at {
			break
		}
		copy(out, s.max)
	}
	return out
}

// maxAcked is, per source partition, one past the highest acknowledged
// offset.
func (b *book) maxAcked(parts int) []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]int64, parts)
	for i, p := range b.ackPart {
		if p >= 0 && int(p) < parts && b.ackOff[i]+1 > out[p] {
			out[p] = b.ackOff[i] + 1
		}
	}
	return out
}

// numField reads the integer after name (`"seq":`) in a JSON value without
// decoding all of it.
func numField(v []byte, name string) (int64, bool) {
	i := bytes.Index(v, []byte(name))
	if i < 0 {
		return 0, false
	}
	s := v[i+len(name):]
	j := 0
	for j < len(s) && (s[j] == '-' || (s[j] >= '0' && s[j] <= '9')) {
		j++
	}
	n, err := strconv.ParseInt(string(s[:j]), 10, 64)
	return n, err == nil
}

// producer writes rate records/s, alternating between the books, through
// the proxy until ctx ends; only records acknowledged without error count.
type producer struct {
	cl       *kgo.Client
	sent     atomic.Int64
	done     chan struct{}
	behindMx atomic.Int64 // the most records the pacing fell behind by
}

func startProducer(ctx context.Context, bootstrap string, rate, size int, books []*book) (*producer, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.ProducerLinger(0),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.MaxBufferedRecords(200_000))
	if err != nil {
		return nil, err
	}
	p := &producer{cl: cl, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		perMs := float64(rate) / 1000
		owed := 0.0
		i := 0
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			owed += perMs
			if owed > float64(rate) { // at most a second of catching up
				if int64(owed) > p.behindMx.Load() {
					p.behindMx.Store(int64(owed))
				}
				owed = float64(rate)
			}
			for ; owed >= 1; owed-- {
				b := books[i%len(books)]
				i++
				seq := b.next()
				id := fmt.Sprintf("%s-%09d", b.letter, seq)
				r := &kgo.Record{Topic: b.src, Key: []byte(id), Value: value(b.letter, seq, size)}
				p.sent.Add(1)
				// Produce blocks while MaxBufferedRecords are buffered
				// (the proxy or the brokers are down): the rate falls.
				cl.Produce(context.Background(), r, func(r *kgo.Record, err error) { b.ack(seq, r, err) })
				if ctx.Err() != nil {
					return
				}
			}
		}
	}()
	return p, nil
}

// finish waits for the pacing loop, then gives the buffered records up to
// wait to be acknowledged; what is still buffered after that fails (and is
// not counted).
func (p *producer) finish(wait time.Duration) {
	<-p.done
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := p.cl.Flush(ctx); err != nil {
		logf("producer: flush: %v (records not acknowledged by then are not counted)", err)
	}
	p.cl.Close()
}

// consumer reads topics from their start, directly from kfake, until
// stopped.
type consumer struct {
	cl     *kgo.Client
	cancel context.CancelFunc
	done   chan struct{}
}

func startConsumer(seeds []string, topics []string, handle func(*kgo.Record)) *consumer {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond),
		kgo.MetadataMinAge(time.Second), kgo.MetadataMaxAge(5*time.Second))
	if err != nil {
		fatalf("consumer: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &consumer{cl: cl, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			fs := cl.PollFetches(ctx)
			fs.EachRecord(handle)
			if ctx.Err() != nil {
				return
			}
		}
	}()
	return c
}

// stop ends the consumer; with handle, what it had fetched already is
// handed over first.
func (c *consumer) stop(handle func(*kgo.Record)) {
	c.cancel()
	<-c.done
	if handle != nil {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		for i := 0; i < 10; i++ {
			fs := c.cl.PollFetches(ctx)
			n := fs.NumRecords()
			fs.EachRecord(handle)
			if n == 0 {
				break
			}
		}
	}
	c.cl.Close()
}

func srcText(src int64) string {
	if src < 0 {
		return "none"
	}
	return fmt.Sprintf("%d/%d", src>>40, src&(1<<40-1))
}
