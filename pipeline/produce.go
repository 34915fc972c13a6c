package pipeline

// Producing: a failed write is retried with backoff while the route runs;
// one the brokers refuse for the record itself (poison) becomes a dead
// letter instead.

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

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
	r.write(&write{tk: tk, isOutput: isOutput, srcMillis: srcMillis, acked: acked}, kr)
}

// write is one write's state until it is acknowledged (or given up):
// produceTo's callback is its method done. output keeps it in the same
// allocation as the record (outRecord).
type write struct {
	r         *route
	tk        *ticket
	ep        int64
	isOutput  bool
	srcMillis int64
	acked     func(*kgo.Record)
	attempt   int
	diverted  int // 1: written as a dead letter; 2: as a dead letter without its value
	cb        func(*kgo.Record, error)
}

// write sends kr with w's state (tk, isOutput, srcMillis, acked set).
func (r *route) write(w *write, kr *kgo.Record) {
	if w.tk != nil {
		w.tk.hold()
	}
	w.r = r
	w.ep = r.inflightAdd(1, -1)
	w.cb = w.done
	r.send(kr, w.cb)
}

func (w *write) done(got *kgo.Record, err error) {
	r := w.r
	if err != nil {
		if errors.Is(err, kgo.ErrClientClosed) || r.ctx.Err() != nil || r.prodCtx.Err() != nil {
			r.abandoned.Store(true)
			r.inflightAdd(-1, w.ep)
			return
		}
		if poisonErr(err) && w.diverted < 2 {
			if got.Topic == deadLetterTopic(r.def) {
				w.diverted = 2 // a dead letter already: keep its reason, drop its value
			} else {
				w.diverted = 1
				r.m.met.deadLetters.WithLabelValues(r.name, reasonSink).Inc()
			}
			dl := r.sinkDeadLetter(got, err, w.diverted == 2)
			r.log.Warn("output refused by the brokers; written to the dead-letter topic",
				"topic", got.Topic, "dead_letter", dl.Topic, "bytes", len(got.Value), "err", err)
			r.send(dl, w.cb)
			return
		}
		if r.txn.on {
			// The transaction can only abort now; the checkpoint
			// does it, and the records are processed again.
			r.txnFail(fmt.Errorf("write %s: %w", got.Topic, err))
			r.inflightAdd(-1, w.ep)
			return
		}
		w.attempt++
		r.sinkError(fmt.Errorf("write %s: %w", got.Topic, err))
		r.missingTopic(got.Topic, err)
		r.retryLater(got, w.cb)
		return
	}
	if w.attempt > 0 {
		r.sinkRecovered()
	}
	if w.isOutput && w.diverted == 0 {
		r.mOut.Inc()
		r.mE2E.Observe(time.Since(time.UnixMilli(w.srcMillis)).Seconds())
	}
	if w.acked != nil && w.diverted == 0 {
		w.acked(got)
	}
	r.inflightAdd(-1, w.ep)
	if w.tk != nil {
		w.tk.release()
	}
}

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

// Retries keep the order of writes. kgo keeps a partition's writes in
// order while it retries them itself; a write it gives up on (a deleted
// topic, a sink down past the delivery timeout) comes back to produceTo,
// together with every write buffered after it in that partition. Those
// are retried by one loop per topic, in the order they failed, and every
// new write to the topic waits behind them until the loop has handed them
// all back to kgo. So per partition the sink receives outputs in the order
// the route wrote them: a retried window update never lands after a newer
// one, and a watermark marker never overtakes the records it follows.

// retryQueue holds the writes waiting to be retried, by topic.
type retryQueue struct {
	// active counts the topics in topics: while it is 0, which is almost
	// always, send goes straight to kgo without taking mu.
	active atomic.Int32
	mu     sync.Mutex
	topics map[string]*retryTopic
}

// retryTopic is one topic's queue: failed are writes kgo gave up on, in
// the order it did (per partition, the order they were written); pending
// are writes made since, which no write of failed may follow.
type retryTopic struct {
	failed, pending []pendingWrite
}

type pendingWrite struct {
	kr *kgo.Record
	cb func(*kgo.Record, error)
}

// send hands kr to kgo, or queues it behind the topic's retries.
func (r *route) send(kr *kgo.Record, cb func(*kgo.Record, error)) {
	if r.local != nil {
		r.local.write(kr, cb)
		return
	}
	if r.txn.on {
		// No retry queue: a failed write aborts the transaction.
		r.txn.produced.Add(1)
		r.cl.Produce(r.prodCtx, kr, cb)
		return
	}
	if r.retries.active.Load() == 0 {
		r.cl.Produce(r.prodCtx, kr, cb)
		return
	}
	r.retries.mu.Lock()
	if t := r.retries.topics[kr.Topic]; t != nil {
		t.pending = append(t.pending, pendingWrite{kr, cb})
		r.retries.mu.Unlock()
		return
	}
	r.retries.mu.Unlock()
	r.cl.Produce(r.prodCtx, kr, cb)
}

// retryLater queues a write kgo gave up on, starting the topic's retry
// loop if it is not running.
func (r *route) retryLater(got *kgo.Record, cb func(*kgo.Record, error)) {
	w := pendingWrite{retryRecord(got), cb}
	r.retries.mu.Lock()
	defer r.retries.mu.Unlock()
	if r.retries.topics == nil {
		r.retries.topics = map[string]*retryTopic{}
	}
	t := r.retries.topics[got.Topic]
	if t == nil {
		t = &retryTopic{}
		r.retries.topics[got.Topic] = t
		r.retries.active.Add(1)
		go r.retryLoop(got.Topic, t)
	}
	t.failed = append(t.failed, w)
}

// retryRecord is a fresh record for writing got again: the same topic,
// partition (markers are sent to one), key, value, headers and timestamp.
func retryRecord(got *kgo.Record) *kgo.Record {
	return &kgo.Record{Topic: got.Topic, Partition: got.Partition, Key: got.Key, Value: got.Value, Headers: got.Headers, Timestamp: got.Timestamp}
}

// retryLoop writes the topic's queue again, oldest first, waiting for the
// outcome of each round: writes that fail again go back to the front of
// the queue, ahead of every later one. The loop ends, and new writes go
// straight to kgo again, when a round leaves nothing queued; when the
// route stops, what is queued fails with the stop (abandoned).
func (r *route) retryLoop(topic string, t *retryTopic) {
	attempt := 1
	for {
		wait := min(50*time.Millisecond<<min(attempt, 7), 5*time.Second)
		if attempt == 0 {
			wait = 0
		}
		select {
		case <-r.prodCtx.Done():
		case <-time.After(wait):
		}
		r.retries.mu.Lock()
		batch := append(t.failed, t.pending...)
		t.failed, t.pending = nil, nil
		if r.prodCtx.Err() != nil {
			delete(r.retries.topics, topic)
			r.retries.active.Add(-1)
			r.retries.mu.Unlock()
			for _, w := range batch {
				w.cb(w.kr, r.prodCtx.Err())
			}
			return
		}
		r.retries.mu.Unlock()

		again := make([]*pendingWrite, len(batch))
		var wg sync.WaitGroup
		for i := range batch {
			w := &batch[i]
			wg.Add(1)
			r.cl.Produce(r.prodCtx, w.kr, func(got *kgo.Record, err error) {
				defer wg.Done()
				if err != nil && !poisonErr(err) && !errors.Is(err, kgo.ErrClientClosed) && r.prodCtx.Err() == nil {
					r.sinkError(fmt.Errorf("write %s: %w", got.Topic, err))
					r.missingTopic(got.Topic, err)
					again[i] = &pendingWrite{retryRecord(got), w.cb}
					return
				}
				w.cb(got, err)
			})
		}
		r.flushWrites() // the round leaves now, not after the linger (batch.go)
		wg.Wait()

		var front []pendingWrite
		for _, w := range again {
			if w != nil {
				front = append(front, *w)
			}
		}
		r.retries.mu.Lock()
		t.failed = append(front, t.failed...)
		if len(front) > 0 {
			attempt++
		} else {
			attempt = 0
		}
		if len(t.failed) == 0 && len(t.pending) == 0 {
			delete(r.retries.topics, topic)
			r.retries.active.Add(-1)
			r.retries.mu.Unlock()
			return
		}
		r.retries.mu.Unlock()
	}
}
