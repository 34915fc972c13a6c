package pipeline

// Close journal. A checkpoint holds a window step's open windows and its
// watermark as of the cut; a window that closes (and is emitted) after the
// cut is open again when a crash restores the checkpoint. Replay then
// judges records against a watermark that starts over and rises only as
// fast as the slowest partition replays, so a record written while the
// proxy was down could join a window emitted before the crash, and the
// window would be emitted again with other content.
//
// So each keyed task whose step has the trait Closes (operators.Closer: a
// window), when the step closes windows (ClosesAt), writes a journal
// record with state.DB.PutDurable (synced, outside the checkpoint, never
// rolled back) once the closed windows' rows are acknowledged
// (journalAfterAck): the watermark and, per source partition, the highest
// source offset the task had applied when they closed. It goes to the
// step's changelog partition too, for the partition's next owner. On
// restore the step gets it through Resume: its watermark becomes
// max(checkpointed, journal), and a replayed record whose windows are all
// closed is skipped if its offset is at or below the journal's for its
// partition (it is in the rows already emitted), and dead-lettered as late
// otherwise. Each write replaces the previous one, so the journal is one
// small record per task; the synced write happens only when windows close,
// never per record.
//
// Only a task of the last segment journals (its rows go straight to the
// sink, so waiting for acknowledgements covers them), and only in an
// at-least-once route: an exactly-once route's rows of windows closed after
// the last commit were never visible, and are emitted again.
//
// Journal record (the value under the task's step name):
//
//	[0]      version = 1
//	[1:9]    watermark, int64 big-endian (epoch millis)
//	uvarint  number of partitions, then per partition in ascending order:
//	         uvarint partition, uvarint applied offset

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"
)

const journalVersion = 1

func encodeJournal(wm int64, applied map[int32]int64) []byte {
	parts := make([]int32, 0, len(applied))
	for p := range applied {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	b := make([]byte, 0, 10+len(parts)*12)
	b = append(b, journalVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(wm))
	b = binary.AppendUvarint(b, uint64(len(parts)))
	for _, p := range parts {
		b = binary.AppendUvarint(b, uint64(p))
		b = binary.AppendUvarint(b, uint64(applied[p]))
	}
	return b
}

func decodeJournal(b []byte) (wm int64, applied map[int32]int64, err error) {
	if len(b) < 10 || b[0] != journalVersion {
		return 0, nil, fmt.Errorf("close journal %x: bad version or length", b)
	}
	wm = int64(binary.BigEndian.Uint64(b[1:9]))
	b = b[9:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return 0, nil, fmt.Errorf("close journal: bad partition count")
	}
	b = b[k:]
	applied = make(map[int32]int64, n)
	for range n {
		p, k1 := binary.Uvarint(b)
		if k1 <= 0 || p > 1<<31-1 {
			return 0, nil, fmt.Errorf("close journal: bad partition")
		}
		b = b[k1:]
		o, k2 := binary.Uvarint(b)
		if k2 <= 0 || o > 1<<62 {
			return 0, nil, fmt.Errorf("close journal: bad offset")
		}
		b = b[k2:]
		applied[int32(p)] = int64(o)
	}
	if len(b) != 0 {
		return 0, nil, fmt.Errorf("close journal: %d trailing bytes", len(b))
	}
	return wm, applied, nil
}

// journalAfterAck records, durably, that task w's window closed its windows at
// wm with what it had applied so far — but only once every output produced
// so far, the rows of those windows among them, is acknowledged. Written
// before the acknowledgement, a crash in between would restore the windows
// as closed while their rows never reached the sink: lost. Written after,
// a crash in between leaves the windows open, so replay emits them again (a
// recognisable repeat, as without a journal).
//
// The wait runs off the task's goroutine: the epoch is closed here, so
// outputs that follow belong to the next one and cannot keep the wait going
// under load. Writes of one task can finish out of order; w.jmu keeps the
// journal moving forward only.
func (w *task) journalAfterAck(wm int64) {
	r := w.r
	val := encodeJournal(wm, w.applied)
	e := r.out.nextEpoch()
	go func() {
		if err := r.waitEpoch(e, 0, r.ctx.Done()); err != nil || r.out.abandoned.Load() {
			// Stopping, or outputs dropped unacknowledged: the windows
			// stay open in the journal's eyes, so replay emits them.
			return
		}
		w.jmu.Lock()
		defer w.jmu.Unlock()
		if wm <= w.jwm {
			return
		}
		if err := r.m.store().PutDurable(r.name, w.journal, val); err != nil {
			r.noteError(fmt.Errorf("close journal: %w", err))
			return
		}
		w.jwm = wm
		// And to the changelog, for the partition's next owner. Not
		// waited for: a lost journal record costs a repeat of windows
		// already emitted, as without a journal.
		r.wr.aside(r.clRecord(w, clJournal, nil, val), func(_ *kgo.Record, err error) {
			if err != nil && r.out.ctx.Err() == nil {
				r.log.Warn("close journal not written to the changelog", "task", w.label, "err", err)
			}
		})
	}()
}

// loadJournal hands w's journal, if any, to its window step after the
// checkpoint was restored, and seeds what w has applied with it so that a
// later journal record still covers the records applied before the crash.
func (w *task) loadJournal() error {
	r := w.r
	b, ok, err := r.m.store().GetDurable(r.name, w.journal)
	if err != nil || !ok {
		return err
	}
	wm, applied, err := decodeJournal(b)
	if err != nil {
		return fmt.Errorf("step %s: %w", w.journal, err)
	}
	w.closer.Resume(wm, applied)
	w.jwm = wm
	for p, o := range applied {
		w.applied[p] = max(w.applied[p], o)
	}
	return nil
}
