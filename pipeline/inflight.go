package pipeline

// Outputs in flight, counted per checkpoint epoch: a cut commits only once
// every output produced before it is acknowledged.

import (
	"errors"
	"time"
)

// inflightAdd counts an output produced (d=1, ep<0: in the current epoch,
// which it returns) or acknowledged (d=-1 with the epoch it was produced in).
func (r *route) inflightAdd(d int, ep int64) int64 {
	r.inflight.Lock()
	if ep < 0 {
		ep = r.inflight.epoch
	}
	n := r.inflight.byEpoch[ep] + d
	if n == 0 {
		delete(r.inflight.byEpoch, ep)
		r.inflight.zero.Broadcast()
	} else {
		r.inflight.byEpoch[ep] = n
	}
	r.inflight.Unlock()
	return ep
}

// waitEpoch waits until every output produced in an epoch <= e is
// acknowledged.
func (r *route) waitEpoch(e int64, limit time.Duration, abort <-chan struct{}) error {
	// Writes lingering in the producer leave now, not after the linger
	// (batch.go).
	r.flushWrites()
	var why error
	wake := func(err error) {
		r.inflight.Lock()
		if why == nil {
			why = err
		}
		r.inflight.zero.Broadcast()
		r.inflight.Unlock()
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
	r.inflight.Lock()
	defer r.inflight.Unlock()
	for r.pendingUpToLocked(e) > 0 {
		if why != nil {
			return why
		}
		r.inflight.zero.Wait()
	}
	return nil
}

func (r *route) pendingUpToLocked(e int64) int {
	n := 0
	for ep, c := range r.inflight.byEpoch {
		if ep <= e {
			n += c
		}
	}
	return n
}
