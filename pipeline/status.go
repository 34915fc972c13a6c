package pipeline

// A route's status: its state and last error, and its entry in the
// /routes view (RouteStatus).

import (
	"slices"
	"time"
)

// notePause records how long a checkpoint held dispatch at a record
// boundary (drain + snapshot copy + freeze), for /routes.
func (r *route) notePause(d time.Duration) {
	r.st.Lock()
	r.st.lastPause = d
	r.st.maxPause = max(r.st.maxPause, d)
	r.st.Unlock()
}

func (r *route) setState(s, errText string) {
	r.st.Lock()
	r.st.state = s
	if errText != "" {
		r.st.lastErr, r.st.lastErrAt = errText, time.Now()
	}
	r.st.Unlock()
}

// clearError forgets the last error if it is still msg.
func (r *route) clearError(msg string) {
	r.st.Lock()
	if r.st.lastErr == msg {
		r.st.lastErr, r.st.lastErrAt = "", time.Time{}
	}
	r.st.Unlock()
}

func (r *route) noteError(err error) {
	r.log.Warn("route error", "err", err)
	r.st.Lock()
	r.st.lastErr, r.st.lastErrAt = err.Error(), time.Now()
	r.st.Unlock()
}

func (r *route) status() RouteStatus {
	d := r.def
	s := RouteStatus{Name: d.Name, File: d.File, Source: d.Source.Topic, Sink: sinkText(d), Sinks: r.sinkStatus(), Partitions: []PartitionStatus{}}
	r.st.Lock()
	s.State = r.st.state
	if r.st.sinkDown && s.State == "running" {
		s.State = "error"
	}
	s.LastError = r.st.lastErr
	// Before the first setup opened the store there is nothing to break.
	if db := r.m.store(); db != nil {
		if err := db.Broken(); err != nil {
			s.State, s.LastError = "error", err.Error()
		}
	}
	s.CheckpointPauseMs = float64(r.st.lastPause) / 1e6
	s.MaxCheckpointPauseMs = float64(r.st.maxPause) / 1e6
	if !r.st.lastCheckpoint.IsZero() {
		t := r.st.lastCheckpoint
		s.LastCheckpoint = &t
	}
	r.st.Unlock()
	s.Group = d.GroupID()
	s.Delivery = d.Sink.Delivery
	s.Transaction = r.txnStatus()
	s.TappedRecords = r.mx.nTapped.Load()
	s.RecordsIn, s.RecordsInByTopic = r.mx.recordsIn(d.Source.Topic)
	if in := r.mx.in.Load(); in > 0 {
		s.TappedShare = float64(s.TappedRecords) / float64(in)
	}
	s.Protocol = r.grp.proto()
	s.Owned = []OwnedPartition{}
	r.grp.mu.Lock()
	s.Restore = RestoreStatus{State: "idle", Records: r.grp.mu.restored, Seconds: r.grp.mu.restoreS}
	s.Assignment = slices.Clone(r.grp.mu.owners)
	s.AssignmentError = r.grp.mu.ownersErr
	stale := r.ownersStaleLocked()
	if r.grp.mu.restoring > 0 {
		s.Restore.State = "restoring"
	}
	r.grp.mu.Unlock()
	if stale {
		// Shown as last described; the next read shows the new ones.
		r.askOwners()
	}
	select {
	case <-r.life.done:
		return s
	default:
	}
	if !r.ready.Load() {
		return s
	}
	if cl := r.cl; cl != nil {
		_, s.Generation = cl.GroupMetadata()
	}
	tr := r.tm.tracker
	ts := r.tasksSnapshot()
	slices.SortFunc(ts, func(a, b *task) int { return int(a.id) - int(b.id) })
	var low int64
	hasWM := false
	now := r.plan.clock()
	for _, t := range ts {
		done := tr.DoneOffset(t.id)
		hwm := t.hwm.Load()
		lag := max(hwm-done, 0)
		op := OwnedPartition{Topic: t.seg.topic, Partition: t.part, DoneOffset: done, Lag: lag}
		if r.plan.timed {
			if f, ok := t.frontier(); ok {
				w := time.UnixMilli(f).UTC()
				op.Watermark = &w
			}
		}
		if t.seg.keepsTime() {
			if wp, f, last, seen, ok := t.wm.holder(now); ok {
				h := &WatermarkHolder{Writer: wp}
				if seen {
					ft, lt := time.UnixMilli(f).UTC(), last.UTC()
					h.Frontier, h.LastHeard = &ft, &lt
				}
				op.HeldBy = h
			}
		}
		s.Owned = append(s.Owned, op)
		if t.seg.idx == 0 {
			s.Partitions = append(s.Partitions, PartitionStatus{Partition: t.part, DoneOffset: done, HighWatermark: hwm, Lag: lag, Watermark: op.Watermark})
		} else if wm, ok := t.wm.current(); ok && t.seg.timed {
			if !hasWM || wm < low {
				low, hasWM = wm, true
			}
		}
		r.m.met.lag.WithLabelValues(r.name, t.label).Set(float64(lag))
	}
	if hasWM {
		t := time.UnixMilli(low).UTC()
		s.Watermark = &t
	}
	return s
}
