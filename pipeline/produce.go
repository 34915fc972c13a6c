package pipeline

// The at-least-once writer (writer.go): a failed write is retried with
// backoff, in order, while the route runs; one the brokers refuse for the
// record itself (poison) becomes a dead letter instead (write.done).

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// poisonErr reports whether a produce error is about the record itself, so
// that retrying it can never succeed.
func poisonErr(err error) bool {
	if errors.Is(err, errRefused) {
		return true
	}
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

// kafkaWriter writes an at-least-once route's records with its group
// client (outputs, dead letters, repartition records, markers) and its log
// client (changelog records).
type kafkaWriter struct {
	r       *route
	cl      *kgo.Client
	logCl   *kgo.Client
	ctx     context.Context // the outbox's: ends when a stop gives up
	batched bool            // writes linger until a flush (batch.go)
	retries retryQueue
}

// send hands kr to kgo, or queues it behind the topic's retries.
func (k *kafkaWriter) send(kr *kgo.Record, cb func(*kgo.Record, error)) {
	if k.retries.active.Load() == 0 {
		k.cl.Produce(k.ctx, kr, cb)
		return
	}
	k.retries.mu.Lock()
	if t := k.retries.topics[kr.Topic]; t != nil {
		t.pending = append(t.pending, pendingWrite{kr, cb})
		k.retries.mu.Unlock()
		return
	}
	k.retries.mu.Unlock()
	k.cl.Produce(k.ctx, kr, cb)
}

// retry notes the sink down and queues the write behind the topic's
// retries.
func (k *kafkaWriter) retry(got *kgo.Record, cb func(*kgo.Record, error), err error) bool {
	k.r.sinkError(fmt.Errorf("write %s: %w", got.Topic, err))
	k.r.missingTopic(got.Topic, err)
	k.retryLater(got, cb)
	return true
}

// flush sends what lingers in the producer (batch.go).
func (k *kafkaWriter) flush() {
	if !k.batched {
		return // with no window, writes do not linger
	}
	// kgo's Flush with a done context unlingers every partition and
	// returns at once (franz-go has no flush that does not wait).
	_ = k.cl.Flush(flushed)
}

// changelog writes recs with the log client: a checkpoint logs every key
// it changed at once, and through the group client that burst would
// queue ahead of the repartition records.
func (k *kafkaWriter) changelog(ctx context.Context, recs []*kgo.Record, _ bool) (kgo.ProduceResults, error) {
	return produceAll(ctx, k.logCl, recs)
}

func (k *kafkaWriter) aside(kr *kgo.Record, cb func(*kgo.Record, error)) {
	k.logCl.Produce(k.ctx, kr, cb)
}

// retryLater queues a write kgo gave up on, starting the topic's retry
// loop if it is not running.
func (k *kafkaWriter) retryLater(got *kgo.Record, cb func(*kgo.Record, error)) {
	w := pendingWrite{retryRecord(got), cb}
	k.retries.mu.Lock()
	defer k.retries.mu.Unlock()
	if k.retries.topics == nil {
		k.retries.topics = map[string]*retryTopic{}
	}
	t := k.retries.topics[got.Topic]
	if t == nil {
		t = &retryTopic{}
		k.retries.topics[got.Topic] = t
		k.retries.active.Add(1)
		go k.retryLoop(got.Topic, t)
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
func (k *kafkaWriter) retryLoop(topic string, t *retryTopic) {
	r := k.r
	attempt := 1
	for {
		wait := min(50*time.Millisecond<<min(attempt, 7), 5*time.Second)
		if attempt == 0 {
			wait = 0
		}
		select {
		case <-k.ctx.Done():
		case <-time.After(wait):
		}
		k.retries.mu.Lock()
		batch := append(t.failed, t.pending...)
		t.failed, t.pending = nil, nil
		if k.ctx.Err() != nil {
			delete(k.retries.topics, topic)
			k.retries.active.Add(-1)
			k.retries.mu.Unlock()
			for _, w := range batch {
				w.cb(w.kr, k.ctx.Err())
			}
			return
		}
		k.retries.mu.Unlock()

		again := make([]*pendingWrite, len(batch))
		var wg sync.WaitGroup
		for i := range batch {
			w := &batch[i]
			wg.Add(1)
			k.cl.Produce(k.ctx, w.kr, func(got *kgo.Record, err error) {
				defer wg.Done()
				if err != nil && !poisonErr(err) && !errors.Is(err, kgo.ErrClientClosed) && k.ctx.Err() == nil {
					r.sinkError(fmt.Errorf("write %s: %w", got.Topic, err))
					r.missingTopic(got.Topic, err)
					again[i] = &pendingWrite{retryRecord(got), w.cb}
					return
				}
				w.cb(got, err)
			})
		}
		k.flush() // the round leaves now, not after the linger (batch.go)
		wg.Wait()

		var front []pendingWrite
		for _, w := range again {
			if w != nil {
				front = append(front, *w)
			}
		}
		k.retries.mu.Lock()
		t.failed = append(front, t.failed...)
		if len(front) > 0 {
			attempt++
		} else {
			attempt = 0
		}
		if len(t.failed) == 0 && len(t.pending) == 0 {
			delete(k.retries.topics, topic)
			k.retries.active.Add(-1)
			k.retries.mu.Unlock()
			return
		}
		k.retries.mu.Unlock()
	}
}
