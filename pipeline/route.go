package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/offsets"
	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
	"github.com/rtproxy/rtproxy/state"
)

// route is one running version of a rules.Route. A swap stops one route
// value and starts another for the same name.
//
// Concurrency. Partition goroutines hold cut.RLock while they process one
// record, so cut.Lock is held only at record boundaries: that is how a
// checkpoint or a stop pauses dispatch. Workers never take cut; they are
// drained by barrier messages sent while cut is held.
type route struct {
	m    *Manager
	def  *rules.Route
	log  *slog.Logger
	name string

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when the route has fully stopped
	halt   chan struct{} // closed once dispatch stopped for good

	// sourceWasMissing is set once setup found no source topic. A route
	// with start: latest that waited for its topic then starts at the
	// topic's beginning: everything in it was written after the route
	// began, and "latest" at the retry would skip what arrived since the
	// topic was created. Only the start goroutine touches it.
	sourceWasMissing bool

	cl      *kgo.Client // source consumer and sink/DLQ producer
	tables  []*topicTable
	tracker *offsets.Tracker
	parts   []*partition
	stages  []*stage // worker stages, in step order
	seg0    []int    // step indices run in the partition goroutines: [0, seg0End)
	seg0End int
	timed   bool // some step reacts to the watermark
	wm      watermark

	cut    sync.RWMutex
	halted bool        // under cut: set once by stop
	ready  atomic.Bool // setup done: parts, stages, tracker and cl are set

	cpMu        sync.Mutex  // one checkpoint (cut → commit) at a time
	pendingCuts []*cutPoint // under cpMu
	stopping    chan struct{}

	inflight struct {
		sync.Mutex
		epoch   int64         // outputs produced now belong to this epoch
		byEpoch map[int64]int // unacknowledged outputs per epoch
		zero    *sync.Cond
	}

	st struct {
		sync.Mutex
		state          string
		lastErr        string
		lastErrAt      time.Time
		lastCheckpoint time.Time
		sinkDown       bool
		lastPause      time.Duration
		maxPause       time.Duration
	}

	cpSeq atomic.Int64

	// prodCtx is what outputs are produced with; cancelled only when a stop
	// gives up on unacknowledged outputs (abandoned), so no later cut may
	// commit.
	prodCtx    context.Context
	prodCancel context.CancelFunc
	abandoned  atomic.Bool

	// Metric children resolved once: a label lookup per record would cost
	// more than the rest of a filter step.
	mOut  prometheus.Counter
	mE2E  prometheus.Observer
	mProc prometheus.Observer
}

// partition is one source partition's dispatch goroutine and position.
type partition struct {
	id    int32
	ch    chan []*kgo.Record // fetched batches, in offset order
	chain *chain
	pos   int64 // next offset to dispatch; written under cut.RLock by its goroutine, read under cut.Lock
	hwm   atomic.Int64
	label string
	mIn   prometheus.Counter
}

func newRoute(m *Manager, d *rules.Route) *route {
	r := &route{m: m, def: d, name: d.Name, log: m.log.With("route", d.Name),
		done: make(chan struct{}), halt: make(chan struct{}), stopping: make(chan struct{})}
	r.inflight.byEpoch = map[int64]int{}
	r.prodCtx, r.prodCancel = context.WithCancel(context.Background())
	r.mOut = m.met.recordsOut.WithLabelValues(d.Name)
	r.mE2E = m.met.endToEnd.WithLabelValues(d.Name)
	r.mProc = m.met.processing.WithLabelValues(d.Name)
	r.inflight.zero = sync.NewCond(&r.inflight.Mutex)
	r.st.state = "starting"
	return r
}

// start launches the route: setup is retried with backoff until it works or
// the route is stopped, so a broker that is down at start only delays it.
func (r *route) start(parent context.Context) {
	r.ctx, r.cancel = context.WithCancel(parent)
	go func() {
		backoff := 100 * time.Millisecond
		waiting := "" // the waiting message while the source topic is missing
		for {
			err := r.setup()
			if err == nil {
				r.cut.Lock()
				if r.halted {
					r.cut.Unlock()
					r.teardown()
					r.setState("stopped", "")
					close(r.done)
					return
				}
				r.ready.Store(true)
				r.cut.Unlock()
				// A zero series for the counter that moves only on trouble,
				// so dashboards and alerts read 0 rather than "no data".
				r.m.met.sinkErrors.WithLabelValues(r.name)
				r.setState("running", "")
				if waiting != "" {
					r.clearError(waiting)
					r.log.Info("source topic exists now; route running", "topic", r.def.Source.Topic)
				}
				r.run()
				return
			}
			r.teardown()
			if r.ctx.Err() != nil {
				r.setState("stopped", "")
				close(r.done)
				return
			}
			wait := backoff
			if errors.Is(err, errSourceMissing) {
				r.sourceWasMissing = true
				// Not a fault: routes are often written before anyone
				// produced to their topic. Said once, then checked quietly.
				wait = r.m.cfg.SourceRetry
				msg := fmt.Sprintf("source topic %q does not exist yet; retrying every %s", r.def.Source.Topic, wait)
				if waiting != msg {
					r.log.Info(msg)
				}
				waiting = msg
				r.setState("waiting", msg)
			} else {
				waiting = ""
				r.log.Warn("route setup failed; retrying", "err", err, "backoff", backoff)
				r.setState("error", err.Error())
				backoff = min(backoff*2, 5*time.Second)
			}
			select {
			case <-r.ctx.Done():
				r.setState("stopped", "")
				close(r.done)
				return
			case <-time.After(wait):
			}
		}
	}()
}

// stepName is a step's state and snapshot name: index, kind and fingerprint,
// so a changed step gets a fresh namespace.
func stepName(s *rules.StepSpec) string {
	return fmt.Sprintf("%02d-%s-%s", s.Index, s.Kind, s.Fingerprint)
}

// workerStepName names one worker's instance of a keyed step. The worker
// count is part of the name: keys are owned by hash modulo the count.
func (r *route) workerStepName(s *rules.StepSpec, w int) string {
	return fmt.Sprintf("%s/w%dof%d", stepName(s), w, r.m.cfg.Workers)
}

// isBoundary reports whether step kind needs its own worker stage.
func isBoundary(kind string) bool { return kind == "window" || kind == "drop_duplicates" }

func (r *route) setup() error {
	d := r.def
	cfg := r.m.cfg
	base := append([]kgo.Opt{kgo.SeedBrokers(cfg.Seeds...)}, cfg.ClientOpts...)
	admCl, err := kgo.NewClient(base...)
	if err != nil {
		return fmt.Errorf("route %q: client: %w", d.Name, err)
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	ctx, cancel := context.WithTimeout(r.ctx, 15*time.Second)
	defer cancel()

	nparts, err := ensureTopics(ctx, adm, d)
	if err != nil {
		return err
	}

	// Topic tables are read to their end before the first source record, so
	// a join is right from the start.
	tables := map[string]operators.Table{}
	for name, ts := range d.Tables {
		if ts.Topic == "" {
			tables[name] = ts.Table
			continue
		}
		tt, err := openTopicTable(ctx, r, base, adm, ts)
		if err != nil {
			return err
		}
		r.tables = append(r.tables, tt)
		tables[name] = tt.table
	}

	// Step instances. Changed steps (new fingerprint) start empty: their old
	// namespaces are dropped.
	var keep []string
	for i := range d.Steps {
		s := &d.Steps[i]
		if isBoundary(s.Kind) {
			for w := 0; w < cfg.Workers; w++ {
				keep = append(keep, r.workerStepName(s, w))
			}
		}
	}
	if err := r.m.db.DropStepsExcept(d.Name, keep); err != nil {
		return fmt.Errorf("route %q: drop changed steps: %w", d.Name, err)
	}
	if err := r.buildStages(tables, nparts); err != nil {
		return err
	}

	// Recovery: restore the steps' snapshots and the offsets of the last
	// checkpoint; partitions it does not cover start at source.start.
	from := map[int32]int64{}
	cp, ok, err := r.m.db.LoadCheckpoint(d.Name)
	if err != nil {
		return fmt.Errorf("route %q: load checkpoint: %w", d.Name, err)
	}
	if ok {
		for _, st := range r.stages {
			for _, w := range st.workers {
				if err := w.chain.restore(cp); err != nil {
					return fmt.Errorf("route %q: %w", d.Name, err)
				}
			}
		}
		for p, off := range cp.Offsets {
			from[p] = off
		}
		r.st.Lock()
		r.st.lastCheckpoint = cp.Time
		r.st.Unlock()
		r.log.Info("route restored from checkpoint", "seq", cp.Seq, "offsets", formatOffsets(cp.Offsets))
	}
	// Windows closed after that checkpoint stay closed (journal.go).
	if len(r.stages) > 0 {
		for _, w := range r.stages[0].workers {
			if w.closer == nil {
				continue
			}
			if err := w.loadJournal(); err != nil {
				return fmt.Errorf("route %q: close journal: %w", d.Name, err)
			}
		}
	}
	var missing []int32
	for p := int32(0); p < int32(nparts); p++ {
		if _, ok := from[p]; !ok {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		var lo kadm.ListedOffsets
		if d.Source.Start == "latest" && !r.sourceWasMissing {
			lo, err = adm.ListEndOffsets(ctx, d.Source.Topic)
		} else {
			lo, err = adm.ListStartOffsets(ctx, d.Source.Topic)
		}
		if err == nil {
			err = lo.Error()
		}
		if err != nil {
			return fmt.Errorf("route %q: list offsets of %s: %w", d.Name, d.Source.Topic, err)
		}
		for _, p := range missing {
			o, ok := lo.Lookup(d.Source.Topic, p)
			if !ok {
				return fmt.Errorf("route %q: no offset for %s[%d]", d.Name, d.Source.Topic, p)
			}
			from[p] = o.Offset
		}
	}

	r.tracker = offsets.NewTracker()
	consume := map[int32]kgo.Offset{}
	for _, p := range r.parts {
		p.pos = from[p.id]
		r.tracker.Start(p.id, p.pos)
		consume[p.id] = kgo.NewOffset().At(p.pos)
	}
	opts := append(base,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{d.Source.Topic: consume}),
		kgo.FetchMaxWait(fetchMaxWait),
		kgo.FetchMinBytes(1),
		kgo.ProducerLinger(0),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordDeliveryTimeout(10*time.Second),
		kgo.WithHooks(&connHook{r: r}),
	)
	r.cl, err = kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("route %q: client: %w", d.Name, err)
	}
	r.wm.init(d.Source, nparts, time.Now())
	return nil
}

// teardown releases what a failed setup opened.
func (r *route) teardown() {
	for _, t := range r.tables {
		t.close()
	}
	r.tables = nil
	if r.cl != nil {
		r.cl.Close()
		r.cl = nil
	}
	r.parts, r.stages = nil, nil
}

// ensureTopics checks the source and creates a missing sink or dead-letter
// topic with the source's partition count. It returns that count.
func ensureTopics(ctx context.Context, adm *kadm.Client, d *rules.Route) (int, error) {
	dlq := deadLetterTopic(d)
	md, err := adm.Metadata(ctx, d.Source.Topic, d.Sink.Topic, dlq)
	if err != nil {
		return 0, fmt.Errorf("route %q: metadata: %w", d.Name, err)
	}
	src, ok := md.Topics[d.Source.Topic]
	if !ok || errors.Is(src.Err, kerr.UnknownTopicOrPartition) || (src.Err == nil && len(src.Partitions) == 0) {
		return 0, fmt.Errorf("route %q: source topic %s: %w", d.Name, d.Source.Topic, errSourceMissing)
	}
	if src.Err != nil {
		return 0, fmt.Errorf("route %q: source topic %s: %w", d.Name, d.Source.Topic, src.Err)
	}
	n := len(src.Partitions)
	for _, t := range []string{d.Sink.Topic, dlq} {
		if td, ok := md.Topics[t]; ok && td.Err == nil && len(td.Partitions) > 0 {
			continue
		}
		resp, err := adm.CreateTopic(ctx, int32(n), -1, nil, t)
		if err == nil {
			err = resp.Err
		}
		if err != nil && !errors.Is(err, kerrTopicExists) {
			return 0, fmt.Errorf("route %q: create topic %s: %w", d.Name, t, err)
		}
	}
	return n, nil
}

// errSourceMissing is a setup failure because the source topic does not
// exist (yet): the route waits for it rather than being in error.
var errSourceMissing = errors.New("does not exist")

func deadLetterTopic(d *rules.Route) string {
	if d.DeadLetter != "" {
		return d.DeadLetter
	}
	return d.Source.Topic + ".dlq"
}

// run is the route's life after setup: the poll loop, the partition
// goroutines, the workers, the checkpoint and idle tickers. It returns when
// the route is stopped.
func (r *route) run() {
	defer close(r.done)
	var wwg sync.WaitGroup
	for _, st := range r.stages {
		for _, w := range st.workers {
			wwg.Add(1)
			go func() { defer wwg.Done(); w.loop() }()
		}
	}
	var pwg sync.WaitGroup
	for _, p := range r.parts {
		pwg.Add(1)
		go func() { defer pwg.Done(); r.dispatchLoop(p) }()
	}
	var twg sync.WaitGroup
	twg.Add(1)
	go func() { defer twg.Done(); r.pollLoop() }()
	if r.timed {
		twg.Add(1)
		go func() { defer twg.Done(); r.idleLoop() }()
	}
	twg.Add(1)
	go func() { defer twg.Done(); r.checkpointLoop() }()
	twg.Add(1)
	go func() { defer twg.Done(); r.lagLoop() }()

	<-r.halt
	pwg.Wait()
	twg.Wait()
	for _, st := range r.stages {
		for _, w := range st.workers {
			close(w.ch)
		}
	}
	for _, t := range r.tables {
		t.close()
	}
	r.cl.Close()
	r.prodCancel()
	// No worker may touch state after done: a stop that gave up discards
	// the uncommitted state right after.
	wwg.Wait()
	r.setState("stopped", "")
}

// stop pauses dispatch at a record boundary, drains the workers, waits for
// every output to be acknowledged, writes the final checkpoint and closes.
func (r *route) stop() {
	if r.cancel == nil {
		return
	}
	select {
	case <-r.done:
		return
	default:
	}
	close(r.stopping)
	// With the sink unreachable a producer buffer can fill and block a
	// worker, and with it dispatch; after StopTimeout the route gives up
	// its outputs (and so any checkpoint past the last one) to stop.
	abandon := time.AfterFunc(r.m.cfg.StopTimeout, func() {
		r.abandoned.Store(true)
		r.prodCancel()
	})
	defer abandon.Stop()
	r.cpMu.Lock()
	defer r.cpMu.Unlock()
	r.cut.Lock()
	if r.halted || !r.ready.Load() {
		// Setup has not finished: cancelling makes the start loop give up.
		r.halted = true
		r.cut.Unlock()
		r.cancel()
		<-r.done
		return
	}
	r.halted = true
	c, err := r.takeCutLocked()
	if err == nil {
		r.pendingCuts = append(r.pendingCuts, c)
		err = r.commitCuts(r.m.cfg.StopTimeout, nil)
	}
	if err != nil {
		r.log.Warn("final checkpoint not written; the previous one stays the recovery point", "err", err)
	}
	close(r.halt)
	r.cut.Unlock()
	r.cancel()
	<-r.done
	if err != nil {
		r.discardUncommitted()
	}
}

// discardUncommitted drops the state written since the last committed
// checkpoint (pending cuts and live overlays) after a stop that gave up on
// its final checkpoint. Keeping it would leave the next version (or the
// route restored later in this process) with state ahead of the offsets it
// resumes from: a replayed record would find itself already applied (a
// drop_duplicates would drop it for good), and the pending cut would make
// every later DropStepsExcept fail with ErrFrozenPending. Without it the
// next run replays from the last checkpoint: at least once, never lost.
func (r *route) discardUncommitted() {
	r.pendingCuts = nil
	cuts, n, err := r.m.db.Discard(r.name)
	if err != nil {
		r.log.Error("uncommitted state not discarded", "err", err)
		return
	}
	r.log.Warn("uncommitted state discarded; the next run replays from the last checkpoint",
		"frozen_cuts", cuts, "bytes", n)
}

func (r *route) pollLoop() {
	byPart := make(map[int32]*partition, len(r.parts))
	for _, p := range r.parts {
		byPart[p.id] = p
	}
	for {
		fs := r.cl.PollRecords(r.ctx, 4096)
		if fs.IsClientClosed() || r.ctx.Err() != nil {
			return
		}
		fs.EachError(func(t string, p int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			r.noteError(fmt.Errorf("fetch %s[%d]: %w", t, p, err))
		})
		fs.EachPartition(func(ftp kgo.FetchTopicPartition) {
			p := byPart[ftp.Partition]
			if p == nil {
				return
			}
			if ftp.HighWatermark > 0 {
				p.hwm.Store(ftp.HighWatermark)
				lag := max(ftp.HighWatermark-r.tracker.DoneOffset(p.id), 0)
				r.m.met.lag.WithLabelValues(r.name, p.label).Set(float64(lag))
			}
			if len(ftp.Records) == 0 {
				return
			}
			// One hand-off per partition and fetch: records are passed on
			// the moment the fetch is decoded, without a channel operation
			// per record.
			select {
			case p.ch <- ftp.Records:
			case <-r.halt:
			}
		})
	}
}

func (r *route) dispatchLoop(p *partition) {
	for {
		var recs []*kgo.Record
		select {
		case recs = <-p.ch:
		case <-r.halt:
			return
		}
		for _, rec := range recs {
			// Each record is a boundary: a checkpoint or stop may take cut
			// between any two.
			r.cut.RLock()
			if r.halted {
				r.cut.RUnlock()
				return
			}
			r.processSource(p, rec)
			p.pos = rec.Offset + 1
			r.cut.RUnlock()
		}
	}
}

// lagLoop refreshes the lag gauges once a second: a fetch sees the lag
// before its records are done, so the gauge must also move without one.
func (r *route) lagLoop() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-r.halt:
			return
		case <-t.C:
			for _, p := range r.parts {
				lag := max(p.hwm.Load()-r.tracker.DoneOffset(p.id), 0)
				r.m.met.lag.WithLabelValues(r.name, p.label).Set(float64(lag))
			}
		}
	}
}

// checkpointLoop writes a checkpoint every checkpoint_interval.
func (r *route) checkpointLoop() {
	iv := r.def.CheckpointInterval
	if iv <= 0 {
		iv = 5 * time.Second
	}
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		select {
		case <-r.stopping:
			return
		case <-t.C:
		}
		r.cpMu.Lock()
		r.cut.Lock()
		if r.halted {
			r.cut.Unlock()
			r.cpMu.Unlock()
			return
		}
		paused := time.Now()
		c, err := r.takeCutLocked()
		r.cut.Unlock()
		r.notePause(time.Since(paused))
		if err == nil {
			r.pendingCuts = append(r.pendingCuts, c)
			// Dispatch runs again while the cut waits for its outputs.
			err = r.commitCuts(0, r.stopping)
		}
		r.cpMu.Unlock()
		if err != nil && !errors.Is(err, errStopping) {
			r.noteError(fmt.Errorf("checkpoint: %w", err))
		}
	}
}

// cutPoint is a consistent cut waiting for its outputs to be acknowledged.
type cutPoint struct {
	t0     time.Time
	frozen *state.Frozen
	offs   map[int32]int64
	snaps  map[string]*memSnapshot
	epoch  int64
}

var errStopping = errors.New("route stopping")

// takeCutLocked takes a consistent cut; cut is held, so every partition
// goroutine sits at a record boundary.
//
// Invariants kept here:
//  1. Workers are drained stage by stage before the cut, so the state and
//     the snapshots reflect exactly the records below each partition's pos.
//  2. Outputs produced before the cut carry an epoch <= cut.epoch; the cut
//     is committed only once all of them are acknowledged (commitCuts).
//  3. Cuts are committed in the order they were taken (state.Frozen's rule).
//
// Dispatch stays paused only for the drain, the in-memory snapshot copy
// and the Freeze swap; the wait for acknowledgements and the pebble write
// happen while records flow again.
func (r *route) takeCutLocked() (*cutPoint, error) {
	c := &cutPoint{t0: time.Now(), offs: make(map[int32]int64, len(r.parts)), snaps: map[string]*memSnapshot{}}
	for _, st := range r.stages {
		st.barrier()
	}
	for _, p := range r.parts {
		c.offs[p.id] = p.pos
	}
	for _, st := range r.stages {
		for _, w := range st.workers {
			if err := w.chain.snapshotInto(c.snaps); err != nil {
				return nil, err
			}
		}
	}
	f, err := r.m.db.Freeze(r.name)
	if err != nil {
		return nil, err
	}
	c.frozen = f
	r.inflight.Lock()
	c.epoch = r.inflight.epoch
	r.inflight.epoch++
	r.inflight.Unlock()
	return c, nil
}

// commitCuts commits the pending cuts in order, each once its outputs are
// acknowledged. limit bounds the wait (0: none); abort ends it early.
func (r *route) commitCuts(limit time.Duration, abort <-chan struct{}) error {
	for len(r.pendingCuts) > 0 {
		c := r.pendingCuts[0]
		if err := r.waitEpoch(c.epoch, limit, abort); err != nil {
			return err
		}
		if r.abandoned.Load() {
			// Outputs were dropped unacknowledged: committing would skip them.
			return errors.New("outputs abandoned at stop")
		}
		snaps := make(map[string]func(state.Writer) error, len(c.snaps))
		for name, ms := range c.snaps {
			snaps[name] = ms.writeTo
		}
		if err := c.frozen.Commit(c.offs, snaps); err != nil {
			return err
		}
		r.pendingCuts = r.pendingCuts[1:]
		r.checkpointed(c)
	}
	return nil
}

func (r *route) checkpointed(c *cutPoint) {
	now := time.Now()
	r.cpSeq.Add(1)
	r.st.Lock()
	r.st.lastCheckpoint = now
	r.st.Unlock()
	met := r.m.met
	met.checkpointDur.WithLabelValues(r.name).Observe(now.Sub(c.t0).Seconds())
	met.checkpointLast.WithLabelValues(r.name).Set(float64(now.UnixNano()) / 1e9)
	// Sizes as committed: keyed state (KV) plus snapshots, per step summed
	// over its workers.
	steps, err := r.m.db.StepStats(r.name)
	if err != nil {
		r.noteError(fmt.Errorf("state stats: %w", err))
		return
	}
	keysByStep := map[string]int64{}
	var bytes int64
	for _, si := range steps {
		keysByStep[stepOfWorkerName(si.Step)] += si.KVKeys + si.SnapKeys
		bytes += si.KVBytes + si.SnapBytes
	}
	for step, k := range keysByStep {
		met.stateKeys.WithLabelValues(r.name, step).Set(float64(k))
	}
	met.stateBytes.WithLabelValues(r.name).Set(float64(bytes))
}

func stepOfWorkerName(n string) string {
	for i := 0; i < len(n); i++ {
		if n[i] == '/' {
			return n[:i]
		}
	}
	return n
}

// waitEpoch waits until every output produced in an epoch <= e is
// acknowledged.
func (r *route) waitEpoch(e int64, limit time.Duration, abort <-chan struct{}) error {
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
	s := RouteStatus{Name: d.Name, File: d.File, Source: d.Source.Topic, Sink: d.Sink.Topic, Partitions: []PartitionStatus{}}
	r.st.Lock()
	s.State = r.st.state
	if r.st.sinkDown && s.State == "running" {
		s.State = "error"
	}
	s.LastError = r.st.lastErr
	s.CheckpointPauseMs = float64(r.st.lastPause) / 1e6
	s.MaxCheckpointPauseMs = float64(r.st.maxPause) / 1e6
	if !r.st.lastCheckpoint.IsZero() {
		t := r.st.lastCheckpoint
		s.LastCheckpoint = &t
	}
	r.st.Unlock()
	if wm, ok := r.wm.current(); ok {
		t := time.UnixMilli(wm).UTC()
		s.Watermark = &t
	}
	select {
	case <-r.done:
		return s
	default:
	}
	if !r.ready.Load() {
		return s
	}
	tr := r.tracker
	for _, p := range r.parts {
		done := tr.DoneOffset(p.id)
		hwm := p.hwm.Load()
		lag := max(hwm-done, 0)
		s.Partitions = append(s.Partitions, PartitionStatus{Partition: p.id, DoneOffset: done, HighWatermark: hwm, Lag: lag})
		r.m.met.lag.WithLabelValues(r.name, p.label).Set(float64(lag))
	}
	return s
}

func partLabel(p int32) string { return strconv.Itoa(int(p)) }

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

// fetchMaxWait bounds how long a fetch waits for data. Brokers (and kfake)
// answer a fetch as soon as min-bytes 1 is met, so this does not delay
// records; it only sets how often an idle route polls. 10ms (franz-go's
// floor) made idle routes cost measurable CPU on a 2-core machine.
const fetchMaxWait = 250 * time.Millisecond
