package pipeline

// Group membership. Every instance that runs a route is a member of its
// consumer group (rules.Route.GroupID), subscribed to the source topic and
// every repartition topic of the route; the group, not rtproxy, decides who
// owns which partition (cooperative-sticky: a rebalance moves only the
// partitions that must move).
//
// Assignment (adjustOffsets, called by franz-go after it fetched the
// group's committed offsets and before it fetches records):
//  1. A partition resumes at the group's committed offset; without one at
//     the offset of this instance's last local checkpoint; without that at
//     source.start (repartition topics: their start).
//  2. A keyed task uses its local state only when the local checkpoint
//     holds the same offset and changelog end as the group's commit;
//     otherwise it rebuilds the state from its changelog (changelog.go).
//  3. Before it processes anything, a keyed task writes a fence to its
//     changelog, so what an earlier owner logged but never committed is
//     never restored.
//
// Release (onRevoked, onLost, and a stop): dispatch pauses, a checkpoint of
// everything owned is taken and committed (outputs acknowledged, changelog
// written, pebble, group offsets), and only then are the partitions let go:
// a graceful leave repeats nothing.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
	"github.com/rtproxy/rtproxy/state"
)

// proto is the group protocol the route chose at its last setup ("" before).
func (g *groupState) proto() string {
	if p := g.protocol.Load(); p != nil {
		return *p
	}
	return ""
}

// groupState is what the route knows of its group.
type groupState struct {
	adm *kadm.Client
	// protocol is "consumer" (KIP-848) or "classic"; set by setup while
	// the status page may read it (groupState.proto).
	protocol atomic.Pointer[string]
	local    *state.Checkpoint // the checkpoint found at setup
	// commitFailed: the last OffsetCommit failed; the next checkpoint
	// commits again even when nothing moved (checkpointer.unchanged).
	commitFailed atomic.Bool
	// sourceChanged: the route last ran on another source topic, so the
	// local checkpoint's source offsets do not apply.
	sourceChanged bool

	mu struct {
		sync.Mutex
		owners    []PartitionOwner // the group's assignment, as last described (owners.go)
		ownersErr string
		ownersAt  time.Time                      // when owners were last asked for (askOwners)
		movedAt   time.Time                      // when this instance's assignment last moved
		fetched   map[string]map[int32]committed // the group's offsets, as last fetched
		lastOffs  map[int32]int64                // offsets of the last local checkpoint
		restoring int                            // tasks being restored now
		restored  int64                          // records restored since start
		restoreS  float64                        // seconds spent restoring since start
	}
}

type committed struct {
	off  int64
	meta string
}

// commitMeta is the metadata of a keyed task's group commit: the end offset
// of its changelog as of the committed checkpoint.
func commitMeta(clEnd int64) string { return "rtproxy:cl=" + strconv.FormatInt(clEnd, 10) }

func parseCommitMeta(m string) (int64, bool) {
	v, ok := strings.CutPrefix(m, "rtproxy:cl=")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil && n >= 0
}

// groupProtocolOpts chooses the group protocol: KIP-848 ("consumer") when
// asked for, or with "auto" when every broker speaks ConsumerGroupHeartbeat
// v1 (Kafka 4.0+); else the classic protocol with the cooperative-sticky
// balancer, so that a rebalance moves only the partitions that must move.
//
// With "auto", every broker must answer ApiVersions: deciding on a partial
// view (a broker restarting) could put this instance in the group with the
// classic protocol beside instances that use KIP-848, a mixed group that
// not every broker serves. Setup retries instead, until partialOK (a
// broker unreachable from here for long): then the brokers that answered
// decide.
func groupProtocolOpts(ctx context.Context, adm *kadm.Client, want string, partialOK bool) ([]kgo.Opt, string, error) {
	use848 := want == "consumer"
	if want == "auto" {
		vs, err := adm.ApiVersions(ctx)
		if err != nil {
			return nil, "", fmt.Errorf("api versions: %w", err)
		}
		answered := 0
		var verr error
		all848 := true
		vs.Each(func(v kadm.BrokerApiVersions) {
			if v.Err != nil {
				verr = fmt.Errorf("api versions of broker %d: %w", v.NodeID, v.Err)
				return
			}
			answered++
			if mx, ok := v.KeyMaxVersion(68); !ok || mx < 1 {
				all848 = false
			}
		})
		if verr != nil && (!partialOK || answered == 0) {
			return nil, "", verr
		}
		use848 = answered > 0 && all848
	}
	if use848 {
		// The broker assigns ("uniform", incremental by design).
		return []kgo.Opt{kgo.ServerSideBalancer(), kgo.Balancers(kgo.StickyBalancer())}, "consumer", nil
	}
	return []kgo.Opt{kgo.Balancers(kgo.CooperativeStickyBalancer())}, "classic", nil
}

func (r *route) segmentOf(topic string) *segment {
	for _, s := range r.plan.segs {
		if s.topic == topic {
			return s
		}
	}
	return nil
}

func (r *route) onOffsetsFetched(_ context.Context, _ *kgo.Client, resp *kmsg.OffsetFetchResponse) error {
	got := map[string]map[int32]committed{}
	add := func(topic string, p int32, off int64, meta *string) {
		if got[topic] == nil {
			got[topic] = map[int32]committed{}
		}
		c := committed{off: off}
		if meta != nil {
			c.meta = *meta
		}
		got[topic][p] = c
	}
	for _, g := range resp.Groups {
		for _, t := range g.Topics {
			for _, p := range t.Partitions {
				add(t.Topic, p.Partition, p.Offset, p.Metadata)
			}
		}
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			add(t.Topic, p.Partition, p.Offset, p.Metadata)
		}
	}
	r.grp.mu.Lock()
	r.grp.mu.fetched = got
	r.grp.mu.Unlock()
	return nil
}

func (r *route) onAssigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	r.m.met.rebalances.WithLabelValues(r.name).Inc()
	n := 0
	for _, ps := range assigned {
		n += len(ps)
	}
	_, gen := cl.GroupMetadata()
	r.log.Info("partitions assigned", "partitions", n, "generation", gen)
	r.assignmentMoved()
}

// adjustOffsets creates a task for each newly assigned partition: its
// state made ready and its start offset chosen (the invariants at the top
// of this file).
func (r *route) adjustOffsets(ctx context.Context, offs map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	// The group may hand out partitions while setupClients still holds
	// cut to make the writer: a keyed task's fence goes through it
	// (prepareState), so wait until it exists.
	r.cut.RLock()
	//lint:ignore SA2001 an empty critical section: waiting for setupClients
	r.cut.RUnlock()
	r.grp.mu.Lock()
	fetched := r.grp.mu.fetched
	last := r.grp.mu.lastOffs
	r.grp.mu.Unlock()
	staleSource := false // last holds source offsets of another topic
	if last == nil && r.grp.local != nil {
		last = r.grp.local.Offsets
		staleSource = r.grp.sourceChanged
	}
	out := make(map[string]map[int32]kgo.Offset, len(offs))
	var fresh []*task
	resumed := map[int32]int64{} // source partitions that continue a checkpoint
	from := ""
	for topic, ps := range offs {
		seg := r.segmentOf(topic)
		if seg == nil {
			continue
		}
		need := map[int32]bool{}
		for p := range ps {
			need[p] = true
		}
		starts, err := r.startOffsets(ctx, seg, need)
		if err != nil {
			return nil, err
		}
		out[topic] = map[int32]kgo.Offset{}
		for p := range ps {
			if p >= maxTaskPartitions {
				continue
			}
			id := taskID(seg.idx, p)
			c, hasCommit := fetched[topic][p]
			hasCommit = hasCommit && c.off >= 0
			pos, hasLocal := last[id]
			if seg.idx == 0 && staleSource {
				hasLocal = false
			}
			switch {
			case hasCommit:
				pos = c.off
				from = "group"
			case hasLocal:
				if from == "" {
					from = "local checkpoint"
				}
			default:
				pos = starts[p]
			}
			if seg.idx == 0 && (hasCommit || hasLocal) {
				resumed[p] = pos
			}
			t, err := r.newTask(seg, p, pos)
			if err != nil {
				return nil, err
			}
			if seg.keyed() {
				if err := r.prepareState(ctx, t, c, hasCommit, last); err != nil {
					return nil, fmt.Errorf("route %q: %s[%d]: %w", r.name, topic, p, err)
				}
			}
			fresh = append(fresh, t)
			out[topic][p] = kgo.NewOffset().At(pos)
		}
	}
	if len(resumed) > 0 {
		var seq uint64
		if r.grp.local != nil {
			seq = r.grp.local.Seq
		}
		r.log.Info("route restored from checkpoint", "from", from, "seq", seq, "offsets", formatOffsets(resumed))
	}
	r.cut.Lock()
	if r.halted {
		r.cut.Unlock()
		return out, nil
	}
	for _, t := range fresh {
		if old := r.tm.tasks[t.id]; old != nil {
			close(old.stop)
		}
		r.installTask(t)
		go r.survive("dispatch", func() { t.dispatchLoop() })
	}
	r.m.met.partitionsOwned.WithLabelValues(r.name).Set(float64(len(r.tm.tasks)))
	r.cut.Unlock()
	return out, nil
}

// startOffsets is where partitions without any checkpoint start: the
// source at source.start, a repartition topic at its start.
func (r *route) startOffsets(ctx context.Context, seg *segment, ps map[int32]bool) (map[int32]int64, error) {
	// A partition added to the source after the route started holds only
	// records written since: it starts at its beginning whatever
	// source.start says.
	latest := !seg.keyed() && r.def.Source.Start == "latest" && !r.life.sourceWasMissing
	lo, err := r.grp.adm.ListStartOffsets(ctx, seg.topic)
	var hi kadm.ListedOffsets
	if err == nil && latest {
		hi, err = r.grp.adm.ListEndOffsets(ctx, seg.topic)
	}
	if err == nil {
		err = lo.Error()
	}
	if err == nil && latest {
		err = hi.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("route %q: list offsets of %s: %w", r.name, seg.topic, err)
	}
	out := map[int32]int64{}
	for p := range ps {
		from := lo
		if latest && int(p) < seg.nparts {
			from = hi
		}
		o, ok := from.Lookup(seg.topic, p)
		if !ok {
			return nil, fmt.Errorf("route %q: no offset for %s[%d]", r.name, seg.topic, p)
		}
		out[p] = o.Offset
	}
	return out, nil
}

// newTask builds the task for partition p of seg, starting at pos; a
// keyed task's steps are built later by prepareState, once its state is
// in place.
func (r *route) newTask(seg *segment, p int32, pos int64) (*task, error) {
	t := &task{r: r, seg: seg, id: taskID(seg.idx, p), part: p, pos: pos, resetPoint: resetPoint{base: pos, expectBy: -1},
		ch: make(chan taskBatch, 16), stop: make(chan struct{}), done: make(chan struct{})}
	switch {
	case seg.idx == 0:
		t.label = partLabel(p)
		t.mIn = r.m.met.recordsIn.WithLabelValues(r.name, t.label)
	case seg.other != nil:
		t.label = fmt.Sprintf("%s:%d", seg.topic, p)
		t.mIn = r.m.met.recordsIn.WithLabelValues(r.name, t.label)
	default:
		t.label = fmt.Sprintf("%d:%d", seg.idx, p)
		t.stepName = taskStepName(seg.keyStep, p)
		t.inboxName = inboxName(seg.keyStep, p)
		t.wm.initWith(r.def.Source, r.plan.segs[seg.idx-1].nparts, seg.otherWriters(), r.plan.clock())
		t.wm.wake = r.idleWake
		t.wm.lateness = 0 // writers subtract it (task.frontier)
	}
	if seg.next != nil {
		// Build never touches state; this instance only evaluates the key.
		k, err := seg.next.keyStep.Build(rules.BuildEnv{Tables: r.plan.tableOf})
		if err != nil {
			return nil, err
		}
		kd, ok := k.(operators.Keyed)
		if !ok {
			return nil, fmt.Errorf("step %s is not keyed", stepLabel(seg.next.keyStep))
		}
		if seg.other != nil {
			two, ok := k.(operators.TwoInputs)
			if !ok {
				return nil, fmt.Errorf("step %s has no second input", stepLabel(seg.next.keyStep))
			}
			kd = otherKeyer{two}
		}
		t.keyer = kd
	}
	if !seg.keyed() {
		if err := r.buildTaskChain(t); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// installTask makes t an owned task: in r.tm.tasks (under cut.Lock), in the
// offsets tracker from its position, and in the poll loop's index.
func (r *route) installTask(t *task) {
	r.tm.tasks[t.id] = t
	r.tm.tracker.Start(t.id, t.pos)
	r.tm.mu.Lock()
	if r.tm.byTopic[t.seg.topic] == nil {
		r.tm.byTopic[t.seg.topic] = map[int32]*task{}
	}
	r.tm.byTopic[t.seg.topic][t.part] = t
	r.tm.mu.Unlock()
}

// buildTaskChain builds t's steps, and for a keyed task hands them the
// state pebble holds for it.
func (r *route) buildTaskChain(t *task) error {
	c, err := r.buildChain(t, r.plan.tableOf)
	if err != nil {
		return err
	}
	t.chain = c
	if !t.seg.keyed() {
		return nil
	}
	if err := c.restore(); err != nil {
		return err
	}
	t.inbox = map[int32]origin{}
	err = r.m.store().SnapshotReader(r.name, t.inboxName).Each(func(k, v []byte) error {
		p, o, err := decodeInboxEntry(k, v)
		if err != nil {
			return err
		}
		t.inbox[p] = o
		return nil
	})
	if err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	t.jwm = minWatermark
	// An exactly-once route keeps no close journal: rows of windows closed
	// after the last commit were never visible, and are emitted again.
	// The chain's instances have the traits of their specs (buildChain).
	if c.specs[0].Traits.Closes && t.seg.next == nil && !r.txn.on {
		t.journal, t.closer, t.applied = t.stepName, c.steps[0].(operators.Closer), map[int32]int64{}
		if err := t.loadJournal(); err != nil {
			return err
		}
	}
	return nil
}

// release takes and commits a checkpoint of everything owned, then lets
// the given partitions go. commit says whether the group may still take
// the offsets (a revoke) or not (lost: the checkpoint is local only).
func (r *route) release(which map[string][]int32, why string) {
	if isClosed(r.life.stopping) {
		// stop writes the final checkpoint itself, then leaves the group,
		// which revokes everything from inside its wait: nothing to do.
		return
	}
	r.cp.mu.Lock()
	defer r.cp.mu.Unlock()
	r.cut.Lock()
	if r.halted {
		r.cut.Unlock()
		return
	}
	gone := r.tasksIn(which)
	if len(gone) == 0 {
		r.cut.Unlock()
		return
	}
	c, err := r.cp.takeCutLocked()
	if err == nil {
		r.cp.pending = append(r.cp.pending, c)
		err = r.cp.commitCuts(r.m.cfg.StopTimeout, nil)
	}
	if err != nil {
		r.log.Warn("checkpoint before releasing partitions not written; their next owner replays from the last one",
			"why", why, "err", err)
		if r.txn.on {
			// The transaction aborted: what stays goes back to the last
			// commit too (rebuilt tasks, so look them up again).
			r.resetTasks()
			gone = r.tasksIn(which)
		}
	}
	for _, t := range gone {
		close(t.stop)
		delete(r.tm.tasks, t.id)
		r.tm.mu.Lock()
		delete(r.tm.byTopic[t.seg.topic], t.part)
		r.tm.mu.Unlock()
		r.m.met.lag.DeleteLabelValues(r.name, t.label)
	}
	r.m.met.partitionsOwned.WithLabelValues(r.name).Set(float64(len(r.tm.tasks)))
	r.cut.Unlock()
	for _, t := range gone {
		<-t.done
	}
	r.log.Info("partitions released", "why", why, "partitions", len(gone))
}

// tasksIn returns the owned tasks among which.
func (r *route) tasksIn(which map[string][]int32) []*task {
	var out []*task
	for topic, ps := range which {
		for _, p := range ps {
			if t := r.taskAt(topic, p); t != nil {
				out = append(out, t)
			}
		}
	}
	return out
}

func (r *route) onRevoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	r.assignmentMoved()
	r.release(revoked, "revoked")
}

func (r *route) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	r.assignmentMoved()
	r.release(lost, "lost")
}

func (r *route) taskAt(topic string, p int32) *task {
	r.tm.mu.Lock()
	defer r.tm.mu.Unlock()
	return r.tm.byTopic[topic][p]
}

// commitGroup commits a committed cut's offsets to the group, for the
// partitions this instance still owns (a commit for a partition that moved
// could rewind its new owner). Keyed tasks' commits carry their changelog
// end in the metadata.
func (r *route) commitGroup(c *cutPoint) {
	offs, meta := r.groupOffsets(c)
	if len(offs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
		for i := range req.Topics {
			rt := &req.Topics[i]
			for j := range rt.Partitions {
				if m, ok := meta[rt.Topic][rt.Partitions[j].Partition]; ok {
					rt.Partitions[j].Metadata = &m
				}
			}
		}
		return nil
	})
	var cerr error
	r.cl.CommitOffsetsSync(ctx, offs, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			cerr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if e := kerr.ErrorForCode(p.ErrorCode); e != nil && cerr == nil {
					cerr = fmt.Errorf("%s[%d]: %w", t.Topic, p.Partition, e)
				}
			}
		}
	})
	r.grp.commitFailed.Store(cerr != nil)
	if cerr != nil && !errors.Is(cerr, context.Canceled) {
		// The local checkpoint stands; the next one commits again. Until
		// then a new owner of these partitions replays from the previous
		// commit.
		r.noteError(fmt.Errorf("commit offsets to group %s: %w", r.def.GroupID(), cerr))
	}
}

// groupOffsets are a cut's offsets as the group commits them, for the
// partitions this instance still owns, and the metadata of keyed tasks'
// commits (their changelog end).
func (r *route) groupOffsets(c *cutPoint) (map[string]map[int32]kgo.EpochOffset, map[string]map[int32]string) {
	offs := map[string]map[int32]kgo.EpochOffset{}
	meta := map[string]map[int32]string{}
	for _, t := range c.tasks {
		if r.taskAt(t.seg.topic, t.part) != t {
			continue
		}
		if offs[t.seg.topic] == nil {
			offs[t.seg.topic] = map[int32]kgo.EpochOffset{}
			meta[t.seg.topic] = map[int32]string{}
		}
		offs[t.seg.topic][t.part] = kgo.EpochOffset{Epoch: -1, Offset: c.offs[t.id]}
		if t.seg.keyed() {
			meta[t.seg.topic][t.part] = commitMeta(c.offs[changelogID(t.seg.idx, t.part)])
		}
	}
	return offs, meta
}

// kgoLogger hands franz-go's log lines to slog, all at debug: the client
// logs a group's normal life (joins, assignments) at info, which is too
// loud beside rtproxy's own summary lines.
type kgoLogger struct{ log *slog.Logger }

func (l kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelInfo }

func (l kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if msg == "flushing" {
		return // a route flushes after every poll (batch.go)
	}
	l.log.Debug(msg, append(keyvals, "kgo_level", level.String())...)
}
