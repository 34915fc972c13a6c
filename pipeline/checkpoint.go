package pipeline

// Checkpoints: a consistent cut every checkpoint_interval, committed once
// its outputs are acknowledged (changelog, then pebble, then the group).

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rtproxy/rtproxy/state"
)

type stateCheckpoint = state.Checkpoint

// checkpointLoop writes a checkpoint every checkpoint_interval.
func (cp *checkpointer) checkpointLoop() {
	r := cp.r
	iv := r.def.CheckpointInterval
	if iv <= 0 {
		iv = 5 * time.Second
	}
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		select {
		case <-r.life.stopping:
			return
		case <-t.C:
		}
		if !cp.mode.tick(cp) {
			return
		}
	}
}

// checkpointMode is how a route's checkpoints commit, chosen with its
// writer at setup (newWriter): at least once (the cut commits once its
// writes are acknowledged, dispatch running meanwhile), or exactly once
// (each cut is one transaction, dispatch paused throughout: txn.go).
type checkpointMode interface {
	// tick takes and commits one checkpoint; false ends the loop.
	tick(cp *checkpointer) bool
	// commit commits the pending cuts; cp.mu is held.
	commit(cp *checkpointer, limit time.Duration, abort <-chan struct{}) error
}

// atLeastOnce is the checkpoint mode of an at-least-once route (and the
// Driver's, which never checkpoints).
type atLeastOnce struct{}

func (atLeastOnce) tick(cp *checkpointer) bool {
	r := cp.r
	end, err := cp.checkpointOnce()
	if end {
		return false
	}
	if errors.Is(err, state.ErrBroken) {
		r.stateFailed(err)
		return false
	}
	if err != nil && !errors.Is(err, errStopping) {
		r.noteError(fmt.Errorf("checkpoint: %w", err))
	}
	return true
}

func (atLeastOnce) commit(cp *checkpointer, limit time.Duration, abort <-chan struct{}) error {
	return cp.commitAcked(limit, abort)
}

// exactlyOnce is the checkpoint mode of an exactly-once route (txn.go).
type exactlyOnce struct{}

func (exactlyOnce) tick(cp *checkpointer) bool { return cp.checkpointTxn() }
func (exactlyOnce) commit(cp *checkpointer, limit time.Duration, abort <-chan struct{}) error {
	return cp.commitTxnCuts(limit, abort)
}

// checkpointOnce takes a cut of an at-least-once route and commits it;
// end says the checkpoint loop should end. Its locks are released by
// defers, so a panic in it (survive restarts the route) leaves none held
// for the stop to wait on.
func (cp *checkpointer) checkpointOnce() (end bool, err error) {
	r := cp.r
	r.cp.mu.Lock()
	defer r.cp.mu.Unlock()
	if isClosed(r.life.stopping) {
		return true, nil // the stop took (or takes) the final checkpoint
	}
	if len(r.cp.pending) > 0 {
		// The last commit failed (brokers refused the changelog, the
		// disk is full): commit what is pending before cutting again,
		// so at most one cut (with its copies of snapshots) waits.
		if err := r.cp.commitCuts(0, r.life.stopping); err != nil {
			return false, err
		}
	}
	c, halted, err := r.cp.takeCutPaused()
	if halted {
		return true, nil
	}
	if err == nil && c == nil {
		return false, nil // nothing moved since the last checkpoint
	}
	if err != nil {
		return false, err
	}
	r.cp.pending = append(r.cp.pending, c)
	// Dispatch runs again while the cut waits for its outputs.
	return false, r.cp.commitCuts(0, r.life.stopping)
}

// takeCutPaused takes a cut with dispatch paused (cut held) and notes the
// pause; halted when the route is halting.
func (cp *checkpointer) takeCutPaused() (c *cutPoint, halted bool, err error) {
	r := cp.r
	r.cut.Lock()
	defer r.cut.Unlock()
	if r.halted {
		return nil, true, nil
	}
	if h := panicTestHook; h != nil {
		h(r.name, "cut") // with cpMu and cut held
	}
	if cp.unchanged() {
		cp.rested()
		return nil, false, nil
	}
	paused := time.Now()
	defer func() { r.notePause(time.Since(paused)) }()
	c, err = r.cp.takeCutLocked()
	return c, false, err
}

// cutSeen is what a committed cut saw of its route: its tasks, their
// offsets, and how many writes and idle advances had been made.
type cutSeen struct {
	tasks  map[int32]*task
	offs   map[int32]int64
	writes int64
	moves  uint64
}

// unchanged reports whether the route is exactly as its last committed
// cut saw it, so a cut now would commit the same offsets, snapshots and
// keyed state again (a pebble commit with its fdatasync, an OffsetCommit,
// a transaction: an idle route paid them every checkpoint_interval). cut
// and mu are held: every task sits at a record boundary. Unchanged means
// all of: nothing is pending; the last group commit succeeded (else the
// next cut commits it again); the same tasks at the same positions (a
// record dispatched moves its task's pos, filtered or not); no write made
// (outputs, dead letters, repartition records: outbox.made); no
// idle advance of a watermark (moves); no keyed-state write since the last
// freeze (PendingBytes); and for an exactly-once route, nothing written in
// the open transaction (txn.produced, which counts the watermark markers
// outbox.made leaves out: a marker the idle loop sent after the last cut
// stayed in a transaction no tick committed, and the windows behind it
// never closed; docs/ARCHITECTURE.md, invariant 80).
func (cp *checkpointer) unchanged() bool {
	r := cp.r
	l := cp.last
	if l == nil || len(cp.pending) > 0 || r.grp.commitFailed.Load() || r.txn.produced.Load() != 0 {
		return false
	}
	if len(r.tm.tasks) != len(l.tasks) || r.out.made.Load() != l.writes || cp.moves.Load() != l.moves {
		return false
	}
	for id, t := range r.tm.tasks {
		if l.tasks[id] != t || l.offs[id] != t.pos {
			return false
		}
	}
	return r.m.store().PendingBytes(r.name) == 0
}

// rested notes a checkpoint tick that had nothing to write: the durable
// checkpoint is current, so its time (/routes, the age alert on
// rtproxy_checkpoint_last_timestamp_seconds) moves as if it were written.
func (cp *checkpointer) rested() {
	r := cp.r
	now := time.Now()
	r.st.Lock()
	r.st.lastCheckpoint = now
	r.st.Unlock()
	r.m.met.checkpointLast.WithLabelValues(r.name).Set(float64(now.UnixNano()) / 1e9)
	r.m.met.checkpointSkipped.WithLabelValues(r.name).Inc()
}

// checkpointTxn takes a cut of an exactly-once route and commits it as
// one transaction, with dispatch paused throughout (txn.go); a failed
// transaction sends every task back to the last commit. It returns false
// once the checkpoint loop should end.
func (cp *checkpointer) checkpointTxn() bool {
	r := cp.r
	r.cp.mu.Lock()
	defer r.cp.mu.Unlock()
	if isClosed(r.life.stopping) {
		return false // the stop takes the final checkpoint
	}
	r.cut.Lock()
	defer r.cut.Unlock()
	if r.halted {
		return false
	}
	if cp.unchanged() {
		// Nothing moved since the last committed cut, which carried
		// every writer's frontier (task.cutMarkers), and nothing was
		// written in the open transaction: it stays open, empty, for
		// the next records (the broker knows nothing of it until a
		// write adds a partition).
		cp.rested()
		return true
	}
	paused := time.Now()
	c, err := r.cp.takeCutLocked()
	if err == nil {
		r.cp.pending = append(r.cp.pending, c)
		err = r.cp.commitCuts(0, r.life.stopping)
	}
	r.notePause(time.Since(paused))
	switch {
	case err == nil:
		return true
	case errors.Is(err, errStopping):
		return false // the stop commits the pending cut with its own
	case errors.Is(err, state.ErrBroken):
		r.stateFailed(err)
		return false
	}
	r.noteError(fmt.Errorf("checkpoint: %w", err))
	if r.txnState() == "failed" {
		r.resetFailed(err)
	} else {
		r.resetTasks()
	}
	return true
}

// stateFailed stops a route whose checkpoint found the state store broken
// (a full or failing disk; state.ErrBroken): it cannot commit again in
// this process. It leaves its group, so the other instances running the
// route take its partitions over from the last commit, and it stays in
// state error until the process restarts.
func (r *route) stateFailed(err error) {
	r.noteError(fmt.Errorf("checkpoint: %w", err))
	r.m.met.stateFailed.Set(1)
	r.log.Error("the state store failed: the route stops and leaves its group; restart the process once the disk is fixed",
		"err", err)
	go r.stop()
}

// cutPoint is a consistent cut waiting for its outputs to be acknowledged.
type cutPoint struct {
	t0     time.Time
	frozen *state.Frozen
	offs   map[int32]int64
	snaps  map[string]*memSnapshot
	tasks  []*task
	epoch  int64
	// wms: the watermark of each keyed task that keeps time as of the cut (exactly-once
	// routes go back to it after an abort).
	wms map[int32]*watermark
	// writes and moves: outbox.made and checkpointer.moves at the cut.
	writes int64
	moves  uint64
}

var errStopping = errors.New("route stopping")

// takeCutLocked takes a consistent cut; cut is held, so every task sits at
// a record boundary.
//
// Invariants kept here:
//  1. Every task runs its steps in its own goroutine, which holds cut.RLock
//     per record, so the state and the snapshots reflect exactly the
//     records below each task's pos.
//  2. Outputs produced before the cut (sink, dead letters, repartition
//     records) carry an epoch <= cut.epoch; the cut is committed only once
//     all of them are acknowledged (commitCuts).
//  3. Cuts are committed in the order they were taken (state.Frozen's rule),
//     and each cut's changelog is written before its offsets commit.
//
// Dispatch stays paused only for the in-memory snapshot copy and the Freeze
// swap; the wait for acknowledgements, the changelog and the pebble write
// happen while records flow again.
func (cp *checkpointer) takeCutLocked() (*cutPoint, error) {
	r := cp.r
	c := &cutPoint{t0: time.Now(), offs: make(map[int32]int64, len(r.tm.tasks)), snaps: map[string]*memSnapshot{}}
	for _, t := range r.tm.tasks {
		if r.txn.on {
			// The transaction committing t.pos carries the frontier
			// it implies (task.cutMarkers).
			t.cutMarkers(c.t0)
		}
		c.offs[t.id] = t.pos
		c.tasks = append(c.tasks, t)
		if !t.seg.keyed() {
			continue
		}
		if err := t.chain.snapshotInto(c.snaps); err != nil {
			return nil, err
		}
		c.snaps[t.inboxName] = t.inboxSnapshot()
		if r.txn.on && t.seg.keepsTime() {
			if c.wms == nil {
				c.wms = map[int32]*watermark{}
			}
			w := &watermark{}
			w.copyFrom(&t.wm)
			c.wms[t.id] = w
		}
	}
	c.writes, c.moves = r.out.made.Load(), cp.moves.Load()
	f, err := r.m.store().Freeze(r.name)
	if err != nil {
		return nil, err
	}
	c.frozen = f
	c.epoch = r.out.nextEpoch()
	return c, nil
}

// commitCuts commits the pending cuts in order, each once its outputs are
// acknowledged: changelog, then pebble, then the group. limit bounds the
// wait (0: none); abort ends it early.
func (cp *checkpointer) commitCuts(limit time.Duration, abort <-chan struct{}) error {
	return cp.mode.commit(cp, limit, abort)
}

// commitAcked commits the pending cuts of an at-least-once route.
func (cp *checkpointer) commitAcked(limit time.Duration, abort <-chan struct{}) error {
	r := cp.r
	for len(r.cp.pending) > 0 {
		c := r.cp.pending[0]
		if err := r.waitEpoch(c.epoch, limit, abort); err != nil {
			return err
		}
		if r.out.abandoned.Load() {
			// Outputs were dropped unacknowledged: committing would skip them.
			return errors.New("outputs abandoned at stop")
		}
		apply, err := r.logChanges(c)
		if err != nil {
			return err
		}
		apply()
		snaps := make(map[string]func(state.Writer) error, len(c.snaps))
		for name, ms := range c.snaps {
			snaps[name] = ms.writeTo
		}
		if err := c.frozen.Commit(c.offs, snaps); err != nil {
			return err
		}
		r.grp.mu.Lock()
		r.grp.mu.lastOffs = c.offs
		r.grp.mu.Unlock()
		r.commitGroup(c)
		// Cleared before it is sliced off: the backing array would keep
		// the committed cut's snapshots reachable for several checkpoints.
		r.cp.pending[0] = nil
		r.cp.pending = r.cp.pending[1:]
		r.cp.checkpointed(c)
	}
	return nil
}

func (cp *checkpointer) checkpointed(c *cutPoint) {
	r := cp.r
	now := time.Now()
	r.cp.seq.Add(1)
	seen := &cutSeen{tasks: make(map[int32]*task, len(c.tasks)), offs: c.offs, writes: c.writes, moves: c.moves}
	for _, t := range c.tasks {
		seen.tasks[t.id] = t
	}
	r.cp.last = seen
	r.st.Lock()
	r.st.lastCheckpoint = now
	r.st.Unlock()
	met := r.m.met
	met.checkpointDur.WithLabelValues(r.name).Observe(now.Sub(c.t0).Seconds())
	met.checkpointLast.WithLabelValues(r.name).Set(float64(now.UnixNano()) / 1e9)
	// Sizes as committed: keyed state (KV) plus snapshots, per step summed
	// over its partitions (one namespace per task: "<step>/p<q>").
	steps, err := r.m.store().StepStats(r.name)
	if err != nil {
		r.noteError(fmt.Errorf("state stats: %w", err))
		return
	}
	keysByStep := map[string]int64{}
	var bytes int64
	for _, si := range steps {
		if strings.HasSuffix(si.Step, "/in") {
			bytes += si.KVBytes + si.SnapBytes
			continue // a task's inbox: bookkeeping, not the step's keys
		}
		keysByStep[stepOfTaskName(si.Step)] += si.KVKeys + si.SnapKeys
		bytes += si.KVBytes + si.SnapBytes
	}
	for step, k := range keysByStep {
		met.stateKeys.WithLabelValues(r.name, step).Set(float64(k))
	}
	met.stateBytes.WithLabelValues(r.name).Set(float64(bytes))
}

// stepOfTaskName is the step of a task's state namespace (taskStepName).
func stepOfTaskName(n string) string {
	for i := 0; i < len(n); i++ {
		if n[i] == '/' {
			return n[:i]
		}
	}
	return n
}

// formatOffsets writes partition offsets as "0:120,1:98" in partition
// order: one token in text and JSON logs, easy to read back.
func formatOffsets(offs map[int32]int64) string {
	ps := make([]int32, 0, len(offs))
	for p := range offs {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	var b []byte
	for i, p := range ps {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(p), 10)
		b = append(b, ':')
		b = strconv.AppendInt(b, offs[p], 10)
	}
	return string(b)
}
