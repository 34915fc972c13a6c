package pipeline

// Batching a fetch's writes. At live rates a route paid per request, not
// per record: the source producer's small batches came back as fetches of
// one or two records, and each output left in a produce request of its
// own (linger 0, five requests in flight per broker). Two things batch
// them (docs/BENCHMARKS.md, "Live rates: batching a fetch's writes"):
//
//   - The poll loop polls at most once per batch window (Config.
//     BatchWindow, the proxy's batch_window) while records flow.
//     franz-go asks a broker for more only once the previous fetch was
//     polled, so what arrives meanwhile waits at the broker and comes back
//     in one fetch. An idle route is not affected: a poll that returned
//     nothing is followed at once by the next, which waits at the broker
//     (fetchMaxWait) for the first record.
//   - Writes linger in the producer (produceLinger) and leave when every
//     task has run its share of the poll: the last one flushes, so the
//     outputs of one poll leave in one produce request per broker. The
//     linger is only the bound for writes no flush follows. (A tapped
//     batch belongs to no poll and flushes its own writes.)
//
// Writes are handed to kgo as before, one by one in the order the route
// makes them: ordering per partition, retries, the in-flight accounting
// of checkpoints and transactions are unchanged. Anything that waits for
// writes to be acknowledged flushes first (waitEpoch, the retry loop, the
// transaction's commit), so the linger never adds to a checkpoint.

import (
	"context"
	"sync/atomic"
	"time"
)

// A window trades latency for CPU, so batch_window is off (0) by default
// (config.Default): against none, at 10k and 2k records/s of 1 KiB on 8
// partitions (docs/BENCHMARKS.md, "Live rates: batching a fetch's
// writes"), 5ms gave 31-35% and 51% less CPU per record and 3.5-4x fewer
// requests, but p50 +7-8 ms and p99 +5-17 ms, and 2ms still +2-4 ms at
// p99: the bound (p99 no worse than before) holds only without one, so
// latency comes first and ops opt in.

const (
	// produceLinger bounds how long a write waits in the producer for a
	// flush. The dispatch, the idle loop, the retry loop and whatever
	// waits for acknowledgements flush; only a dead letter written for an
	// output the brokers refused (from a produce callback) waits for it.
	produceLinger = 20 * time.Millisecond
)

// pollWrites counts the batches of one poll that tasks have not run yet;
// the task that runs the last one flushes the poll's writes.
type pollWrites struct {
	r    *route
	left atomic.Int32
}

// newPollWrites starts the count of a poll with the poll loop's own hold,
// which the poll loop lets go (done) once it handed every batch.
func (r *route) newPollWrites() *pollWrites {
	p := &pollWrites{r: r}
	p.left.Store(1)
	return p
}

func (p *pollWrites) add() { p.left.Add(1) }

// done is one batch run (or dropped); the last flushes.
func (p *pollWrites) done() {
	if p == nil {
		return
	}
	if p.left.Add(-1) == 0 {
		p.r.flushWrites()
	}
}

// flushed is an already-ended context: Flush with it sends what lingers
// and returns without waiting for the acknowledgements.
var flushed = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// pollPace spaces the polls while records flow: a poll that returned
// records is followed by the next only a batch window after it. franz-go
// sends a broker its next fetch request only once the previous response
// was polled, so what arrives meanwhile waits at the broker and comes back
// in one response. A poll that returned nothing is followed at once by one
// that waits at the brokers for the first record: a trickle of records
// and an idle route pay nothing for the pacing.
type pollPace struct {
	last time.Time // when the last poll returned records; zero: it returned none
}

// polled notes whether the poll just made returned records.
func (p *pollPace) polled(records bool) {
	if records {
		p.last = time.Now()
	} else {
		p.last = time.Time{}
	}
}

// wait waits until the batch window has passed since the last poll that
// returned records; false when the route stops meanwhile.
func (p *pollPace) wait(r *route) bool {
	if p.last.IsZero() || r.m.cfg.BatchWindow == 0 {
		return true
	}
	wait := r.m.cfg.BatchWindow - time.Since(p.last)
	if wait <= 0 {
		return true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.ctx.Done():
		return false
	case <-r.life.halt:
		return false
	}
}

// writeLinger is the linger of the route's producer: produceLinger with a
// batch window, none without.
func (r *route) writeLinger() time.Duration {
	if r.m.cfg.BatchWindow == 0 {
		return 0
	}
	return produceLinger
}
