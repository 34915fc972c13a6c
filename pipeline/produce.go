package pipeline

// Producing: a failed write is retried with backoff while the route runs;
// one the brokers refuse for the record itself (poison) becomes a dead
// letter instead.

import (
	"errors"
	"fmt"
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
	if tk != nil {
		tk.hold()
	}
	ep := r.inflightAdd(1, -1)
	attempt := 0
	diverted := 0 // 1: written as a dead letter; 2: as a dead letter without its value
	var cb func(*kgo.Record, error)
	cb = func(got *kgo.Record, err error) {
		if err != nil {
			if errors.Is(err, kgo.ErrClientClosed) || r.ctx.Err() != nil || r.prodCtx.Err() != nil {
				r.abandoned.Store(true)
				r.inflightAdd(-1, ep)
				return
			}
			if poisonErr(err) && diverted < 2 {
				if got.Topic == deadLetterTopic(r.def) {
					diverted = 2 // a dead letter already: keep its reason, drop its value
				} else {
					diverted = 1
					r.m.met.deadLetters.WithLabelValues(r.name, reasonSink).Inc()
				}
				dl := r.sinkDeadLetter(got, err, diverted == 2)
				r.log.Warn("output refused by the brokers; written to the dead-letter topic",
					"topic", got.Topic, "dead_letter", dl.Topic, "bytes", len(got.Value), "err", err)
				r.cl.Produce(r.prodCtx, dl, cb)
				return
			}
			attempt++
			r.sinkError(fmt.Errorf("write %s: %w", got.Topic, err))
			r.missingTopic(got.Topic, err)
			backoff := min(50*time.Millisecond<<min(attempt, 7), 5*time.Second)
			again := &kgo.Record{Topic: got.Topic, Key: got.Key, Value: got.Value, Headers: got.Headers}
			time.AfterFunc(backoff, func() { r.cl.Produce(r.prodCtx, again, cb) })
			return
		}
		if attempt > 0 {
			r.sinkRecovered()
		}
		if isOutput && diverted == 0 {
			r.mOut.Inc()
			r.mE2E.Observe(time.Since(time.UnixMilli(srcMillis)).Seconds())
		}
		if acked != nil && diverted == 0 {
			acked(got)
		}
		r.inflightAdd(-1, ep)
		if tk != nil {
			tk.release()
		}
	}
	r.cl.Produce(r.prodCtx, kr, cb)
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
