package pipeline

// The writer seam. Every record a route writes goes through one writer:
// outputs to a topic sink, dead letters, repartition records, watermark
// markers and changelog records. The route's delivery picks the writer
// once, at setup, and nothing else branches on it:
//
//   - kafkaWriter (produce.go): at least once. A write kgo gives up on is
//     retried in order, behind a queue per topic, until it succeeds.
//   - txnWriter (txn.go): exactly once. Writes land in the checkpoint's
//     open transaction; a failed one fails the transaction, which aborts.
//   - the Driver (driver.go): `rtproxy test`, in memory, acknowledged at once.
//
// Outputs go through the route's sink (sink): the set of its sinks
// (sinkset.go: one, or one per branch of a switch), each of which for a
// topic is the writer itself and for another kind of sink (an HTTP
// endpoint) an implementation of its own. Whatever carries a write, its outcome comes
// back through one callback (write.done), which is where the checkpoint's
// accounting lives (outbox): a write is counted in the epoch it was made
// in until its callback ran, and a cut commits only once its epoch and the
// ones before it are empty. A sink therefore only has to call back once
// per write (nil: acknowledged) for checkpoints to wait on it.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/rules"
)

// transport carries writes: the route's writer, or its sink.
type transport interface {
	// send hands kr over; cb runs once with the outcome (nil error:
	// acknowledged).
	send(kr *kgo.Record, cb func(*kgo.Record, error))
	// retry takes back a write that failed for neither the record itself
	// (poisonErr) nor a stop, to write it again later; cb runs once more.
	// false: the write is given up (the transaction it was in can only
	// abort), and cb will not run again.
	retry(got *kgo.Record, cb func(*kgo.Record, error), err error) bool
}

// writer is where a route writes everything that is not an output of a
// sink of its own.
type writer interface {
	transport
	// flush sends what lingers in the producer now, without waiting.
	flush()
	// changelog writes recs and waits for every outcome. checkpoint says
	// they belong to a checkpoint (for an exactly-once route: its
	// transaction); otherwise they are written beside the route's
	// delivery (an assigned task's fence).
	changelog(ctx context.Context, recs []*kgo.Record, checkpoint bool) (kgo.ProduceResults, error)
	// aside writes kr beside the route's delivery, not waited for by
	// anything (a close journal's changelog record).
	aside(kr *kgo.Record, cb func(*kgo.Record, error))
}

// sink takes a route's outputs. A sink calls back once per write: nil when
// the output is acknowledged, an error wrapping errRefused when the
// receiver refused it for itself (it becomes a dead letter with reason
// "sink"), the stop's error when the route stops first. Checkpoints wait
// for those callbacks (outbox), so a sink never lets offsets commit past
// an output it has not delivered.
type sink interface {
	transport
	// put writes an output: o.kr with its origin (outRecord), o.w.cb its
	// callback.
	put(o *outRecord)
	// target names where outputs go: their kr.Topic, and the
	// rtproxy-target header of one refused.
	target() string
	// close ends the sink once the route stopped.
	close()
}

// errRefused marks a sink's error about the output itself: writing it
// again cannot succeed, so it becomes a dead letter (poisonErr).
var errRefused = errors.New("refused by the sink")

// deadLetterHeaders is implemented by a refusal that says more about
// itself on the dead letter (an HTTP status).
type deadLetterHeaders interface {
	deadLetterHeaders() []kgo.RecordHeader
}

// sinkKinds build the sinks that are not a topic; the first that takes
// a sink spec of the route builds it. A kind registers itself (init), so a
// new kind of sink is a file of its own.
var sinkKinds []func(r *route, spec *rules.Sink) (sink, bool, error)

// newSink is the route's sink: the set of its sinks (sinkset.go), each a
// kind of its own, else its topic, written through the route's writer.
func (r *route) newSink() (sink, error) {
	s, err := r.newSinkSet(nil)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// topicSink is a Kafka topic: outputs go through the route's writer, so in
// its delivery (at least once, or in the checkpoint's transaction).
type topicSink struct {
	w     writer
	topic string
}

func (s topicSink) put(o *outRecord)                                 { s.w.send(&o.kr, o.w.cb) }
func (s topicSink) send(kr *kgo.Record, cb func(*kgo.Record, error)) { s.w.send(kr, cb) }
func (s topicSink) retry(got *kgo.Record, cb func(*kgo.Record, error), err error) bool {
	return s.w.retry(got, cb, err)
}
func (s topicSink) target() string { return s.topic }
func (s topicSink) close()         {}

// write is one write's state until it is acknowledged (or given up): its
// method done is the write's callback. output keeps it in the same
// allocation as the record (outRecord).
type write struct {
	r         *route
	via       transport // what carries it: the sink for an output, else the writer
	tk        *ticket
	ep        int64
	isOutput  bool
	srcMillis int64
	acked     func(*kgo.Record)
	to        *outlet // an output's sink; nil for other writes
	attempt   int
	diverted  int // 1: written as a dead letter; 2: as a dead letter without its value
	cb        func(*kgo.Record, error)
}

// produce writes kr through the route's writer and, on acknowledgement,
// releases its hold on tk. A failed write is retried for as long as the
// route runs (or fails the transaction it is in): the record's offset
// cannot become done before, so nothing is dropped.
func (r *route) produce(kr *kgo.Record, tk *ticket, isOutput bool, srcMillis int64) {
	r.produceTo(kr, tk, isOutput, srcMillis, nil)
}

// produceTo is produce with a hook called on acknowledgement.
//
// A write refused for the record itself (too large, invalid: poisonErr) is
// never retried: the record goes to the dead-letter topic with reason
// "sink" instead, in the same epoch and under the same hold on tk, so the
// checkpoint covers it exactly as it would have covered the output. A dead
// letter refused in turn is written once more without its value (headers
// say why). Anything else goes back to the transport (retry).
//
// A write that fails once the route is being stopped (its context ended,
// the client closed) is given up: the route is marked abandoned, so no
// checkpoint after it commits and the next run replays it.
func (r *route) produceTo(kr *kgo.Record, tk *ticket, isOutput bool, srcMillis int64, acked func(*kgo.Record)) {
	r.write(&write{via: r.wr, tk: tk, isOutput: isOutput, srcMillis: srcMillis, acked: acked}, kr)
}

// write sends kr with w's state (via, tk, isOutput, srcMillis, acked set).
func (r *route) write(w *write, kr *kgo.Record) {
	if w.tk != nil {
		w.tk.hold()
	}
	w.r = r
	w.ep = r.out.add(1, -1)
	w.cb = w.done
	w.via.send(kr, w.cb)
}

// writeOutput hands output o (o.w set) to the route's sink.
func (r *route) writeOutput(o *outRecord) {
	w := &o.w
	if w.tk != nil {
		w.tk.hold()
	}
	w.r = r
	w.ep = r.out.add(1, -1)
	w.cb = w.done
	r.snk.put(o)
}

// send writes kr through the route's writer, outside the checkpoint's
// accounting (watermark markers: a later one carries the same frontier).
func (r *route) send(kr *kgo.Record, cb func(*kgo.Record, error)) { r.wr.send(kr, cb) }

func (w *write) done(got *kgo.Record, err error) {
	r := w.r
	if err != nil {
		if errors.Is(err, kgo.ErrClientClosed) || r.ctx.Err() != nil || r.out.ctx.Err() != nil {
			r.out.abandoned.Store(true)
			r.out.add(-1, w.ep)
			return
		}
		if w.to != nil && w.diverted == 0 {
			w.to.failed()
		}
		if poisonErr(err) && w.diverted < 2 {
			if got.Topic == deadLetterTopic(r.def) {
				w.diverted = 2 // a dead letter already: keep its reason, drop its value
			} else {
				w.diverted = 1
				r.m.met.deadLetters.WithLabelValues(r.name, reasonSink).Inc()
			}
			dl := r.sinkDeadLetter(got, err, w.diverted == 2)
			r.log.Warn("output refused; written to the dead-letter topic",
				"target", got.Topic, "dead_letter", dl.Topic, "bytes", len(got.Value), "err", err)
			w.via = r.wr // the dead letter is the writer's, whatever the sink
			r.wr.send(dl, w.cb)
			return
		}
		w.attempt++
		if !w.via.retry(got, w.cb, err) {
			r.out.add(-1, w.ep)
		}
		return
	}
	if w.attempt > 0 {
		r.sinkRecovered()
	}
	if w.isOutput && w.diverted == 0 {
		if w.to != nil {
			w.to.acked()
		}
		r.mx.out.Inc()
		r.mx.e2e.Observe(time.Since(time.UnixMilli(w.srcMillis)).Seconds())
	}
	if w.acked != nil && w.diverted == 0 {
		w.acked(got)
	}
	r.out.add(-1, w.ep)
	if w.tk != nil {
		w.tk.release()
	}
}

// flushWrites sends the writes lingering in the route's producer now,
// without waiting for them to be acknowledged (batch.go).
func (r *route) flushWrites() {
	if r.wr != nil {
		r.wr.flush()
	}
}

// outbox counts a route's writes in flight, per checkpoint epoch: a cut
// commits only once every write made before it is acknowledged. It also
// holds the context writes are made with, cancelled only when a stop gives
// up on unacknowledged writes (abandoned), so that no later cut commits.
//
// Lock order: outbox.mu is a leaf (nothing is taken under it).
type outbox struct {
	mu      sync.Mutex
	epoch   int64         // writes made now belong to this epoch
	byEpoch map[int64]int // unacknowledged writes per epoch
	zero    *sync.Cond    // on mu: an epoch emptied, or a wait was woken
	// made counts every write made: a checkpoint tick that finds it as
	// the last cut saw it knows no output was made since.
	made atomic.Int64

	ctx       context.Context
	cancel    context.CancelFunc
	abandoned atomic.Bool
}

func newOutbox() *outbox {
	o := &outbox{byEpoch: map[int64]int{}}
	o.zero = sync.NewCond(&o.mu)
	o.ctx, o.cancel = context.WithCancel(context.Background())
	return o
}

// add counts a write made (d=1, ep<0: in the current epoch, which it
// returns) or acknowledged (d=-1 with the epoch it was made in).
func (o *outbox) add(d int, ep int64) int64 {
	o.mu.Lock()
	if ep < 0 {
		ep = o.epoch
	}
	if d > 0 {
		o.made.Add(int64(d))
	}
	n := o.byEpoch[ep] + d
	if n == 0 {
		delete(o.byEpoch, ep)
		o.zero.Broadcast()
	} else {
		o.byEpoch[ep] = n
	}
	o.mu.Unlock()
	return ep
}

// nextEpoch closes the current epoch and returns it: writes made from now
// on belong to the next.
func (o *outbox) nextEpoch() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.epoch
	o.epoch++
	return e
}

// abandon gives up every write in flight: their callbacks fail, and no
// checkpoint commits after them.
func (o *outbox) abandon() {
	o.abandoned.Store(true)
	o.cancel()
}

// wait waits until every write made in an epoch <= e is acknowledged;
// limit bounds the wait (0: none), abort ends it early with errStopping.
func (o *outbox) wait(e int64, limit time.Duration, abort <-chan struct{}) error {
	var why error
	wake := func(err error) {
		o.mu.Lock()
		if why == nil {
			why = err
		}
		o.zero.Broadcast()
		o.mu.Unlock()
	}
	if abort != nil {
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			select {
			case <-abort:
				wake(errStopping)
			case <-stop:
			}
		}()
	}
	if limit > 0 {
		t := time.AfterFunc(limit, func() { wake(errors.New("outputs not acknowledged in time")) })
		defer t.Stop()
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for o.pendingUpToLocked(e) > 0 {
		if why != nil {
			return why
		}
		o.zero.Wait()
	}
	return nil
}

func (o *outbox) pendingUpToLocked(e int64) int {
	n := 0
	for ep, c := range o.byEpoch {
		if ep <= e {
			n += c
		}
	}
	return n
}

// waitEpoch waits until every write made in an epoch <= e is acknowledged,
// having sent what lingers in the producer first (batch.go).
func (r *route) waitEpoch(e int64, limit time.Duration, abort <-chan struct{}) error {
	r.flushWrites()
	return r.out.wait(e, limit, abort)
}

// produceAll is ProduceSync that returns when ctx ends even while the
// client still holds the records: with every broker gone, kgo keeps
// buffered records until it can send them (routes set no delivery
// timeout), whatever their context, and a checkpoint waiting for them
// would hold cpMu and with it the route's stop for good. The records are
// failed when the client closes.
func produceAll(ctx context.Context, cl *kgo.Client, recs []*kgo.Record) (kgo.ProduceResults, error) {
	done := make(chan kgo.ProduceResults, 1)
	go func() { done <- cl.ProduceSync(ctx, recs...) }()
	select {
	case res := <-done:
		return res, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
