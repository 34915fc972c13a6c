package pipeline

// Exactly-once routes (`sink.delivery: exactly_once`). Each checkpoint is
// one Kafka transaction of the route's group client: the sink outputs, the
// dead letters, the repartition records, the changelog writes and the
// group offsets (TxnOffsetCommit with the group's member and generation,
// KIP-447) become visible together or not at all.
//
// The protocol differs from the at-least-once checkpoint (checkpoint.go)
// in three ways:
//  1. Dispatch stays paused from the cut until the next transaction has
//     begun: a record processed after the cut must not land in the
//     transaction that commits the cut.
//  2. pebble commits the cut only after the transaction committed. A
//     transaction that fails (a produce refused, the broker aborted it on
//     timeout, the group fenced this member, the producer was fenced)
//     is aborted, and every task is rebuilt from the last committed
//     checkpoint (resetTasks): pebble's uncommitted state is discarded,
//     the fetch positions go back, and the records since are processed
//     again into the next transaction.
//  3. Every topic is read read_committed: the repartition topics (a
//     keyed task never applies what an aborted transaction wrote), the
//     source, and the changelog at restore.
//
// Fencing. The transactional id is stable per route and state directory
// (txnID), so a restarted instance fences its previous incarnation when it
// initialises its producer. Another instance that took partitions over is
// protected by the group: a stalled instance's TxnOffsetCommit carries its
// old generation, the coordinator refuses it, and the transaction aborts.
// An instance's transaction still pending when a new owner fetches the
// group's offsets holds that fetch (RequireStable) until it ends.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/rtproxy/rtproxy/state"
)

// txnTimeout is the producer's transaction timeout: the brokers abort a
// transaction open longer. rules refuses checkpoint intervals above half
// of it (rules.MaxExactlyOnceInterval).
const txnTimeout = 10 * time.Second

// txnTestHook, when set by a test, runs before each transaction that
// wrote records commits; an error aborts the transaction.
var txnTestHook func(route string) error

// txnState is an exactly-once route's transaction bookkeeping.
type txnState struct {
	on bool
	id string // transactional id

	// failed is set when a write of the open transaction failed: it can
	// only abort.
	failed atomic.Pointer[error]
	// produced counts the records written in the open transaction.
	produced atomic.Int64

	// The poll loop holds pollRun while it polls; a reset cancels the
	// poll, takes pollRun to move the fetch positions and bump pollGen, and
	// the poll loop drops what a poll begun before the bump returned
	// (pollOnce, rewindFetches).
	pollRun    sync.Mutex
	pollGen    atomic.Int64
	pollCMu    sync.Mutex
	pollCancel context.CancelFunc // under pollCMu
	rewinding  bool               // under pollCMu

	mu struct {
		sync.Mutex
		state      string // open, committing, aborting, failed
		commits    int64
		aborts     int64
		lastCommit time.Time
		lastAbort  string
	}
}

// TxnStatus is an exactly-once route's transaction in /routes.
type TxnStatus struct {
	TransactionalID string     `json:"transactional_id"`
	State           string     `json:"state"` // open, committing, aborting, failed
	Commits         int64      `json:"commits"`
	Aborts          int64      `json:"aborts"`
	LastCommit      *time.Time `json:"last_commit,omitempty"`
	LastAbort       string     `json:"last_abort,omitempty"`
}

func (r *route) setTxnState(s string) {
	r.txn.mu.Lock()
	r.txn.mu.state = s
	r.txn.mu.Unlock()
}

func (r *route) txnState() string {
	r.txn.mu.Lock()
	defer r.txn.mu.Unlock()
	return r.txn.mu.state
}

func (r *route) txnStatus() *TxnStatus {
	if !r.txn.on {
		return nil
	}
	r.txn.mu.Lock()
	defer r.txn.mu.Unlock()
	s := &TxnStatus{TransactionalID: r.txn.id, State: r.txn.mu.state, Commits: r.txn.mu.commits,
		Aborts: r.txn.mu.aborts, LastAbort: r.txn.mu.lastAbort}
	if !r.txn.mu.lastCommit.IsZero() {
		t := r.txn.mu.lastCommit
		s.LastCommit = &t
	}
	return s
}

// txnInstanceStep is the durable record holding this state directory's
// part of the route's transactional id.
const txnInstanceStep = "txn-instance"

// txnID is the route's transactional id: the group and an id kept in the
// state directory, so that the same instance restarted (the same pod and
// volume) fences its previous incarnation, and two instances never share
// one.
func (r *route) txnID() (string, error) {
	v, ok, err := r.m.store().GetDurable(r.name, txnInstanceStep)
	if err != nil {
		return "", err
	}
	if !ok {
		b := make([]byte, 8)
		if _, err := rand.Read(b); err != nil {
			return "", err
		}
		v = []byte(hex.EncodeToString(b))
		if err := r.m.store().PutDurable(r.name, txnInstanceStep, v); err != nil {
			return "", err
		}
	}
	return r.def.GroupID() + "." + string(v), nil
}

// txnOpts are the group client's options for an exactly-once route.
func (r *route) txnOpts() ([]kgo.Opt, error) {
	id, err := r.txnID()
	if err != nil {
		return nil, fmt.Errorf("transactional id: %w", err)
	}
	r.txn.on, r.txn.id = true, id
	// TxnOffsetCommit v6 names topics by id; the offsets are sent by name
	// (commitTxnOffsets), which v5 still carries.
	vs := kversion.Stable()
	vs.SetMaxKeyVersion(int16(kmsg.TxnOffsetCommit), 5)
	return []kgo.Opt{
		kgo.TransactionalID(id),
		kgo.TransactionTimeout(txnTimeout),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequireStableFetchOffsets(),
		kgo.MaxVersions(vs),
	}, nil
}

// initTxn initialises the route's producer id (its first transaction is
// open already), which fences an earlier incarnation with the same id and
// aborts what it left open. Brokers that refuse transactions fail setup
// here: the route waits in state error, and never falls back to
// at-least-once.
func (r *route) initTxn(ctx context.Context) error {
	if _, _, err := r.cl.ProducerID(ctx); err != nil {
		return fmt.Errorf("route %q: %w", r.name, r.txnRefused(err))
	}
	r.setTxnState("open")
	return nil
}

// txnRefused is the error of a setup whose transactional producer could
// not start.
func (r *route) txnRefused(err error) error {
	r.setTxnState("failed")
	return fmt.Errorf("sink.delivery exactly_once needs transactions, and the brokers refused them (transactional id %q): %w", r.txn.id, err)
}

// txnFail records that a write of the open transaction failed.
func (r *route) txnFail(err error) {
	r.txn.failed.CompareAndSwap(nil, &err)
}

// txnWriter writes an exactly-once route's records (writer.go) in the open
// transaction of its group client: a write that fails fails the
// transaction, which the checkpoint aborts (no retry queue: the records
// are processed again).
type txnWriter struct {
	r     *route
	cl    *kgo.Client
	logCl *kgo.Client
	ctx   context.Context // the outbox's
	txn   *txnState
}

func (w *txnWriter) send(kr *kgo.Record, cb func(*kgo.Record, error)) {
	w.txn.produced.Add(1)
	w.cl.Produce(w.ctx, kr, cb)
}

// retry gives the write up: the transaction can only abort now; the
// checkpoint does it, and the records are processed again.
func (w *txnWriter) retry(got *kgo.Record, _ func(*kgo.Record, error), err error) bool {
	w.r.txnFail(fmt.Errorf("write %s: %w", got.Topic, err))
	return false
}

// flush: the transaction's writes do not linger (its commit flushes).
func (w *txnWriter) flush() {
	if w.r.m.cfg.BatchWindow > 0 {
		_ = w.cl.Flush(flushed)
	}
}

// changelog writes a checkpoint's records in its transaction; a fence
// (not a checkpoint's) beside it, with the log client.
func (w *txnWriter) changelog(ctx context.Context, recs []*kgo.Record, checkpoint bool) (kgo.ProduceResults, error) {
	if !checkpoint {
		return produceAll(ctx, w.logCl, recs)
	}
	w.txn.produced.Add(int64(len(recs)))
	return produceAll(ctx, w.cl, recs)
}

func (w *txnWriter) aside(kr *kgo.Record, cb func(*kgo.Record, error)) {
	w.logCl.Produce(w.ctx, kr, cb)
}

// commitTxnCuts commits every pending cut in one transaction; cut is held
// (dispatch paused) by the caller and stays held. On success the next
// transaction has begun. On failure the transaction is aborted and the
// error returned; the caller then resets the tasks (resetTasks), except
// at a stop.
func (cp *checkpointer) commitTxnCuts(limit time.Duration, abort <-chan struct{}) error {
	r := cp.r
	if len(r.cp.pending) == 0 {
		return nil
	}
	start := time.Now()
	last := r.cp.pending[len(r.cp.pending)-1]
	if err := r.waitEpoch(last.epoch, limit, abort); err != nil {
		if errors.Is(err, errStopping) {
			// The stop commits these cuts with its own, in this
			// transaction.
			return err
		}
		return r.cp.abortTxn(err)
	}
	r.setTxnState("committing")
	if r.out.abandoned.Load() {
		return r.cp.abortTxn(errors.New("outputs abandoned at stop"))
	}
	if p := r.txn.failed.Load(); p != nil {
		return r.cp.abortTxn(*p)
	}
	var applies []func()
	for _, c := range r.cp.pending {
		apply, err := r.logChanges(c)
		if err != nil {
			return r.cp.abortTxn(err)
		}
		applies = append(applies, apply)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Watermark markers are not counted in flight: the transaction ends
	// only once every write of it is acknowledged.
	if err := r.cl.Flush(ctx); err != nil {
		return r.cp.abortTxn(fmt.Errorf("flush: %w", err))
	}
	if p := r.txn.failed.Load(); p != nil {
		return r.cp.abortTxn(*p)
	}
	if r.txn.produced.Load() == 0 {
		// Nothing was written: there is no transaction to end (kgo sends
		// no EndTxn for one), and the offsets are committed as they are.
		if err := r.cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			return r.cp.abortTxn(err)
		}
		r.grp.mu.Lock()
		moved := !maps.Equal(r.grp.mu.lastOffs, last.offs)
		r.grp.mu.Unlock()
		if moved { // an idle route does not commit ten times a second
			r.commitGroup(last)
		}
	} else {
		if h := txnTestHook; h != nil {
			if err := h(r.name); err != nil {
				return r.cp.abortTxn(err)
			}
		}
		if err := r.cp.commitTxnOffsets(ctx, last); err != nil {
			return r.cp.abortTxn(err)
		}
		if err := r.cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			return r.cp.abortTxn(fmt.Errorf("end transaction: %w", err))
		}
	}
	// Committed in Kafka: now pebble follows.
	for i, c := range r.cp.pending {
		applies[i]()
		snaps := make(map[string]func(state.Writer) error, len(c.snaps))
		for name, ms := range c.snaps {
			snaps[name] = ms.writeTo
		}
		if err := c.frozen.Commit(c.offs, snaps); err != nil {
			// Kafka holds the checkpoint; the next start restores from
			// it (the local one no longer matches the group's).
			r.cp.pending = nil
			r.setTxnState("failed")
			return fmt.Errorf("local state after a committed transaction: %w", err)
		}
		for _, t := range c.tasks {
			t.base = c.offs[t.id]
			if w := c.wms[t.id]; w != nil {
				t.baseWM = w
			}
		}
		r.grp.mu.Lock()
		r.grp.mu.lastOffs = c.offs
		r.grp.mu.Unlock()
		r.cp.checkpointed(c)
	}
	r.cp.pending = nil
	d := time.Since(start)
	r.m.met.txnCommit.WithLabelValues(r.name).Observe(d.Seconds())
	r.txn.produced.Store(0)
	r.txn.mu.Lock()
	r.txn.mu.commits++
	r.txn.mu.lastCommit = time.Now()
	r.txn.mu.Unlock()
	if err := r.cl.BeginTransaction(); err != nil {
		r.setTxnState("failed")
		return fmt.Errorf("begin transaction: %w", err)
	}
	r.setTxnState("open")
	return nil
}

// commitTxnOffsets adds the group to the transaction and commits the cut's
// offsets in it, with this member's id and generation: a member the group
// has moved on from is refused (zombie fencing).
func (cp *checkpointer) commitTxnOffsets(ctx context.Context, c *cutPoint) error {
	r := cp.r
	offs, meta := r.groupOffsets(c)
	if len(offs) == 0 {
		return nil
	}
	id, epoch, err := r.cl.ProducerID(ctx)
	if err != nil {
		return fmt.Errorf("producer id: %w", err)
	}
	group := r.def.GroupID()
	add := kmsg.NewPtrAddOffsetsToTxnRequest()
	add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = r.txn.id, id, epoch, group
	addResp, err := add.RequestWith(ctx, r.cl)
	if err == nil {
		err = kerr.ErrorForCode(addResp.ErrorCode)
	}
	if err != nil {
		return fmt.Errorf("add offsets to transaction: %w", err)
	}
	member, gen := r.cl.GroupMetadata()
	req := kmsg.NewPtrTxnOffsetCommitRequest()
	req.TransactionalID, req.Group, req.ProducerID, req.ProducerEpoch = r.txn.id, group, id, epoch
	req.Generation, req.MemberID = gen, member
	for topic, ps := range offs {
		rt := kmsg.NewTxnOffsetCommitRequestTopic()
		rt.Topic = topic
		for p, eo := range ps {
			rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
			rp.Partition, rp.Offset, rp.LeaderEpoch = p, eo.Offset, -1
			if m, ok := meta[topic][p]; ok {
				rp.Metadata = &m
			}
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, r.cl)
	if err != nil {
		return fmt.Errorf("commit offsets in transaction: %w", err)
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if e := kerr.ErrorForCode(p.ErrorCode); e != nil {
				return fmt.Errorf("commit offsets in transaction: %s[%d]: %w", t.Topic, p.Partition, e)
			}
		}
	}
	return nil
}

// abortTxn aborts the open transaction after cause and returns cause.
func (cp *checkpointer) abortTxn(cause error) error {
	r := cp.r
	r.setTxnState("aborting")
	r.m.met.txnAborts.WithLabelValues(r.name).Inc()
	r.txn.mu.Lock()
	r.txn.mu.aborts++
	r.txn.mu.lastAbort = cause.Error()
	r.txn.mu.Unlock()
	r.log.Warn("transaction aborted; the route goes back to its last committed checkpoint", "err", cause)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := r.cl.AbortBufferedRecords(ctx)
	if err == nil {
		err = r.cl.EndTransaction(ctx, kgo.TryAbort)
	}
	if err != nil {
		r.setTxnState("failed")
		return fmt.Errorf("%w; and the abort failed: %v", cause, err)
	}
	return cause
}

// resetTasks rebuilds every task from the last committed checkpoint after
// an aborted transaction; cpMu and cut are held. It discards pebble's
// uncommitted state, rebuilds each task's steps from what pebble holds,
// moves the fetch positions back, and begins the next transaction. A
// transaction that cannot begin again (the producer fenced by a newer
// incarnation of this instance) stops the route.
func (r *route) resetTasks() {
	old := make([]*task, 0, len(r.tm.tasks))
	for _, t := range r.tm.tasks {
		close(t.stop)
		old = append(old, t)
	}
	r.cp.pending = nil
	if _, _, err := r.m.store().Discard(r.name); err != nil {
		r.resetFailed(fmt.Errorf("discard uncommitted state: %w", err))
		return
	}
	r.txn.failed.Store(nil)
	r.txn.produced.Store(0)
	r.tm.mu.Lock()
	r.tm.byTopic = map[string]map[int32]*task{}
	r.tm.mu.Unlock()
	clear(r.tm.tasks)
	// The fetch positions go back before any new task can be handed
	// records: what a poll fetched before is dropped (pollStale).
	set := map[string]map[int32]kgo.EpochOffset{}
	for _, o := range old {
		if set[o.seg.topic] == nil {
			set[o.seg.topic] = map[int32]kgo.EpochOffset{}
		}
		set[o.seg.topic][o.part] = kgo.EpochOffset{Epoch: -1, Offset: o.base}
	}
	r.rewindFetches(set)
	// Every installed task runs its goroutine, also when the reset fails
	// below: the stop that follows waits for each to end.
	defer func() {
		for _, t := range r.tm.tasks {
			go r.survive("dispatch", func() { t.dispatchLoop() })
		}
	}()
	for _, o := range old {
		t, err := r.newTask(o.seg, o.part, o.base)
		if err == nil && o.seg.keyed() {
			err = r.buildTaskChain(t)
		}
		if err != nil {
			r.resetFailed(fmt.Errorf("rebuild %s[%d]: %w", o.seg.topic, o.part, err))
			return
		}
		t.base, t.clEnd, t.prevSnap, t.baseWM = o.base, o.clEnd, o.prevSnap, o.baseWM
		if o.pos > o.base {
			t.expectBy = o.pos - 1
		}
		if o.baseWM != nil {
			// The inputs after the commit are read again, and judged
			// against the watermark they were judged against then.
			t.wm.copyFrom(o.baseWM)
		}
		r.installTask(t)
	}
	if err := r.cl.BeginTransaction(); err != nil {
		r.resetFailed(fmt.Errorf("begin transaction: %w", err))
		return
	}
	r.setTxnState("open")
	r.log.Info("tasks reset to the last committed checkpoint", "tasks", len(r.tm.tasks))
}

// resetFailed restarts a route whose transactional producer cannot go on
// (fenced by the brokers after its transaction timed out, or by a newer
// incarnation): the route stops, leaves its group, and a new version of it
// starts with a new producer, from the last committed checkpoint.
func (r *route) resetFailed(err error) {
	r.setTxnState("failed")
	r.noteError(fmt.Errorf("exactly-once: %w", err))
	r.log.Warn("the route's transactional producer cannot go on; the route restarts from its last committed checkpoint", "err", err)
	go r.m.restartRoute(r)
}

// rewindFetches moves the fetch positions while no poll runs, so the poll
// loop never hands a task records fetched before the move.
func (r *route) rewindFetches(set map[string]map[int32]kgo.EpochOffset) {
	r.txn.pollCMu.Lock()
	r.txn.rewinding = true
	if r.txn.pollCancel != nil {
		r.txn.pollCancel() // a poll waiting for data returns now
	}
	r.txn.pollCMu.Unlock()
	r.txn.pollRun.Lock()
	r.tm.mu.Lock() // taskFor reads pollGen under it
	r.txn.pollGen.Add(1)
	r.tm.mu.Unlock()
	r.cl.SetOffsets(set)
	r.txn.pollRun.Unlock()
	r.txn.pollCMu.Lock()
	r.txn.rewinding = false
	r.txn.pollCMu.Unlock()
}

// pollOnce polls the route's client. For an exactly-once route it also
// returns the poll generation the fetches belong to: a reset that moved
// the fetch positions since bumps it, and the caller drops them.
func (r *route) pollOnce() (kgo.Fetches, int64) {
	if !r.txn.on {
		return r.cl.PollRecords(r.ctx, 4096), 0
	}
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	r.txn.pollCMu.Lock()
	if r.txn.rewinding {
		r.txn.pollCMu.Unlock()
		time.Sleep(time.Millisecond)
		return nil, -1
	}
	r.txn.pollCancel = cancel
	r.txn.pollCMu.Unlock()
	r.txn.pollRun.Lock()
	gen := r.txn.pollGen.Load()
	fs := r.cl.PollRecords(ctx, 4096)
	r.txn.pollRun.Unlock()
	r.txn.pollCMu.Lock()
	r.txn.pollCancel = nil
	r.txn.pollCMu.Unlock()
	return fs, gen
}

// taskFor is the task that records of (topic, p) fetched by a poll of
// generation gen go to: nil when it was released since, or when a reset
// moved the fetch positions after the poll began.
func (r *route) taskFor(topic string, p int32, gen int64) *task {
	r.tm.mu.Lock()
	defer r.tm.mu.Unlock()
	if r.txn.on && r.txn.pollGen.Load() != gen {
		return nil
	}
	return r.tm.byTopic[topic][p]
}
