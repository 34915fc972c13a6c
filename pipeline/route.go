package pipeline

// A route's life: the route type, start (setup retried until it works),
// the poll and lag loops while it runs, and stop.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/offsets"
	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
)

// route is one running version of a rules.Route. A swap stops one route
// value and starts another for the same name.
//
// Its parts, each with its own state and lock (ARCHITECTURE.md, "The
// route runtime in parts", with the lock order):
//   - life (routeLife): start, stop and the channels that say how far;
//   - plan (routePlan): what setup built from the definition (segments,
//     tables, the source's decoding), fixed while the route runs;
//   - tm (taskManager): the owned tasks and their offsets' tracker, for
//     the poll loop and the checkpoint; assignment, revocation and restore
//     are group.go;
//   - dispatchGate: how dispatch pauses at record boundaries (cut);
//   - each task (task.go): dispatch and processing of its records, its
//     watermark and its state;
//   - routeWrites (writer.go): the writes in flight per checkpoint epoch
//     (out), the writer of the route's delivery (wr), and its sink (snk);
//   - cp (checkpointer, checkpoint.go): cuts and their commits;
//   - txn (txnState, txn.go): an exactly-once route's transaction;
//   - st (routeStatus, status.go), mx (routeMetrics): what /routes and the
//     metrics show.
type route struct {
	m    *Manager
	def  *rules.Route
	log  *slog.Logger
	name string
	ctx  context.Context
	// cancel ends ctx: the start loop, the poll and the route's loops.
	cancel context.CancelFunc
	life   routeLife
	// idleWake wakes a resting idle loop (process.go, noteTimed).
	idleWake chan struct{}
	// lagWake wakes a resting lag loop (noteLag); ownersWake asks it to
	// describe the group's owners again (askOwners).
	lagWake, ownersWake chan struct{}
	// lagResting: the lag loop rests until noteLag wakes it.
	lagResting atomic.Bool

	// cl is the group consumer, and the producer of every write but the
	// changelog's; logCl the instance's non-group client, shared by every
	// route (shared.go): admin requests (grp.adm) and changelog records
	// (changelog.go, journal.go). The route never closes it.
	cl    *kgo.Client
	logCl *kgo.Client
	plan  routePlan
	tm    taskManager
	grp   groupState
	dispatchGate
	cp checkpointer
	routeWrites
	txn txnState // exactly-once routes (txn.go)

	st routeStatus
	mx routeMetrics
	// recreate: topics a write found missing (recreate.go).
	recreate recreateState
}

// dispatchGate is how dispatch is paused. Task goroutines hold cut.RLock
// while they process one record, so cut.Lock is held only at record
// boundaries: a checkpoint's cut, a release, a reset and a stop take it.
type dispatchGate struct {
	cut    sync.RWMutex
	halted bool        // under cut: set once by stop
	ready  atomic.Bool // setup done: plan, tracker and cl are set
}

// routeWrites are the route's writer part (writer.go): the writes in
// flight per checkpoint epoch, the writer of its delivery and its sink.
type routeWrites struct {
	out *outbox
	wr  writer
	snk sink
	// outs are the route's sinks (sinkset.go), made with the route; the
	// switch's branch of an output (operators.Record.Branch) indexes it.
	outs []*outlet
}

// routeLife is how far a route's life has gone.
type routeLife struct {
	done     chan struct{} // closed when the route has fully stopped
	halt     chan struct{} // closed once dispatch stopped for good
	stopping chan struct{} // closed when a stop begins
	// stopOnce runs stopNow once, whoever calls stop first.
	stopOnce sync.Once
	// setupSince is when the first setup attempt began.
	setupSince time.Time
	// sourceWasMissing is set once setup found no source topic. A route
	// with start: latest that waited for its topic then starts at the
	// topic's beginning: everything in it was written after the route
	// began, and "latest" at the retry would skip what arrived since the
	// topic was created. Only the start goroutine touches it.
	sourceWasMissing bool
	// setupAttempts counts setups tried (tests wait on it, not on time).
	setupAttempts atomic.Int64
}

// routePlan is what setup built from the route's definition; it does not
// change while the route runs.
type routePlan struct {
	segs    []*segment
	timed   bool // some step reacts to the watermark
	tables  []*topicTable
	tableOf map[string]operators.Table
	// members are the only top-level members of a source value the route
	// reads (rules.Source.Members): source records decode just those. nil:
	// decode whole.
	members jsoncodec.Fields
	format  valueFormat // of the source, chosen once (valueformat.go)
	codec   *codec      // source.format or sink.format avro | protobuf (format.go); nil otherwise
	// clock is what watermarks and markers read as now: time.Now, or a
	// Driver's clock (driver.go).
	clock func() time.Time
}

// taskManager holds the owned tasks. tasks changes under cut.Lock only
// (assignment, release, reset), so holding cut.RLock reads it safely;
// byTopic, for the poll loop, is under mu.
//
// Lock order: cut, then mu.
type taskManager struct {
	tasks   map[int32]*task
	tracker *offsets.Tracker // which offsets of each task are done
	mu      sync.Mutex
	byTopic map[string]map[int32]*task
}

// checkpointer is the route's cuts (checkpoint.go): one checkpoint (cut →
// commit) at a time, under mu; a release holds it too.
//
// Lock order: cp.mu, then cut.
type checkpointer struct {
	r       *route
	mode    checkpointMode // at least once, or exactly once (set with the writer)
	mu      sync.Mutex
	pending []*cutPoint // under mu: cuts taken, not yet committed
	seq     atomic.Int64
	// last is what the last committed cut saw (under mu; checkpointed):
	// a tick that finds the route just as it was skips its checkpoint
	// (unchanged, checkpoint.go).
	last *cutSeen
	// moves counts idle advances of a watermark (idleTickTask): they
	// change a task's state without a record.
	moves atomic.Uint64
}

// routeStatus is what /routes says of the route's health (status.go,
// sinkdown.go). A leaf lock.
type routeStatus struct {
	sync.Mutex
	state          string
	lastErr        string
	lastErrAt      time.Time
	lastCheckpoint time.Time
	sinkDown       bool
	lastPause      time.Duration
	maxPause       time.Duration
}

// routeMetrics are the route's metric children, resolved once (a label
// lookup per record would cost more than the rest of a filter step), and
// its counts of source records processed, and of them those from the tap.
type routeMetrics struct {
	out, tapped prometheus.Counter
	busy        prometheus.Counter // rtproxy_route_busy_seconds_total
	e2e, proc   prometheus.Observer
	in, nTapped atomic.Int64 // in: the source's records
	// inOther counts the records of each stream join's second topic, by
	// topic (*atomic.Int64): records_in covers every input.
	inOther sync.Map
}

// addOther counts n records read from topic, a stream join's second
// input.
func (x *routeMetrics) addOther(topic string, n int64) {
	c, ok := x.inOther.Load(topic)
	if !ok {
		c, _ = x.inOther.LoadOrStore(topic, new(atomic.Int64))
	}
	c.(*atomic.Int64).Add(n)
}

// recordsIn are the records read from every input, in all and by topic.
func (x *routeMetrics) recordsIn(source string) (int64, map[string]int64) {
	by := map[string]int64{source: x.in.Load()}
	all := by[source]
	x.inOther.Range(func(k, v any) bool {
		n := v.(*atomic.Int64).Load()
		by[k.(string)] += n
		all += n
		return true
	})
	return all, by
}

// recreateState is the topics a version of the route created, and when
// each missing one was last recreated (recreate.go). A leaf lock.
type recreateState struct {
	sync.Mutex
	created map[string]bool      // sink and dead-letter topics a version of the route created
	last    map[string]time.Time // last recreation attempt per topic
}

func newRoute(m *Manager, d *rules.Route) *route {
	r := &route{m: m, def: d, name: d.Name, log: m.log.With("route", d.Name),
		life: routeLife{done: make(chan struct{}), halt: make(chan struct{}), stopping: make(chan struct{})}}
	r.out = newOutbox()
	r.cp.r, r.cp.mode = r, atLeastOnce{}
	r.mx.out = m.met.recordsOut.WithLabelValues(d.Name)
	r.mx.e2e = m.met.endToEnd.WithLabelValues(d.Name)
	r.mx.proc = m.met.processing.WithLabelValues(d.Name)
	r.mx.tapped = m.met.tapped.WithLabelValues(d.Name)
	r.mx.busy = m.met.busy.WithLabelValues(d.Name)
	r.outs = r.newOutlets()
	r.idleWake = make(chan struct{}, 1)
	r.lagWake, r.ownersWake = make(chan struct{}, 1), make(chan struct{}, 1)
	r.st.state = "starting"
	r.plan.clock = time.Now
	r.plan.format = sourceFormatOf(d)
	r.plan.members = r.plan.format.members()
	r.plan.codec = newCodec(m.cfg.SchemaRegistry, d)
	return r
}

// start launches the route: setup is retried with backoff until it works or
// the route is stopped, so a broker that is down at start only delays it.
func (r *route) start(parent context.Context) {
	r.ctx, r.cancel = context.WithCancel(parent)
	go func() {
		// Every goroutine of the route, its group client's among them,
		// carries its name in CPU profiles (cost.go).
		pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("route", r.name)))
		backoff := 100 * time.Millisecond
		waiting := "" // the waiting message while the source topic is missing
		for {
			err := r.setup()
			r.life.setupAttempts.Add(1)
			if err == nil {
				r.cut.Lock()
				if r.halted {
					r.cut.Unlock()
					r.teardown()
					r.setState("stopped", "")
					close(r.life.done)
					return
				}
				r.ready.Store(true)
				r.cut.Unlock()
				// A zero series for the counter that moves only on trouble,
				// so dashboards and alerts read 0 rather than "no data".
				r.m.met.sinkErrors.WithLabelValues(r.name)
				r.m.met.restoreRecords.WithLabelValues(r.name)
				r.m.met.restoreSeconds.WithLabelValues(r.name)
				r.m.met.rebalances.WithLabelValues(r.name)
				r.m.met.partitionsOwned.WithLabelValues(r.name)
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
				close(r.life.done)
				return
			}
			wait := backoff
			if errors.Is(err, errSourceMissing) {
				r.life.sourceWasMissing = true
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
				close(r.life.done)
				return
			case <-time.After(wait):
			}
		}
	}()
}

// run is the route's life after setup: the poll loop, the checkpoint, idle
// and lag tickers; the tasks come and go with the group's assignments. It
// returns when the route is stopped.
func (r *route) run() {
	defer close(r.life.done)
	var twg sync.WaitGroup
	twg.Add(1)
	go func() { defer twg.Done(); r.survive("poll", r.pollLoop) }()
	if r.plan.timed {
		twg.Add(1)
		go func() { defer twg.Done(); r.survive("idle", r.idleLoop) }()
	}
	twg.Add(1)
	go func() { defer twg.Done(); r.survive("checkpoint", r.cp.checkpointLoop) }()
	twg.Add(1)
	go func() { defer twg.Done(); r.survive("lag", r.lagLoop) }()

	<-r.life.halt
	for _, t := range r.tasksSnapshot() {
		<-t.done
	}
	twg.Wait()
	for _, t := range r.plan.tables {
		t.close()
	}
	// Leaves the group: the final checkpoint (stop) committed the offsets
	// already, so the partitions' next owners repeat nothing.
	r.cl.Close()
	r.snk.close()
	r.out.cancel()
	r.m.met.partitionsOwned.WithLabelValues(r.name).Set(0)
	r.setState("stopped", "")
}

// stop pauses dispatch at a record boundary of every task, waits for every
// output to be acknowledged, writes the final checkpoint and closes.
// It may be called more than once, also concurrently (a route that stops
// itself, then the manager): each call returns once the route is done.
func (r *route) stop() {
	if r.cancel == nil {
		return
	}
	r.life.stopOnce.Do(r.stopNow)
	<-r.life.done
}

func (r *route) stopNow() {
	select {
	case <-r.life.done:
		return
	default:
	}
	close(r.life.stopping)
	// With the sink unreachable a producer buffer can fill and block a
	// task, and with it dispatch; after StopTimeout the route gives up
	// its outputs (and so any checkpoint past the last one) to stop.
	abandon := time.AfterFunc(r.m.cfg.StopTimeout, func() {
		r.out.abandon()
	})
	defer abandon.Stop()
	// cpMu is let go before waiting for the route to end: the checkpoint
	// loop may be waiting for it, and the route ends only once that loop
	// has returned (it returns at once, seeing the route stopping).
	r.cp.mu.Lock()
	r.cut.Lock()
	if r.halted || !r.ready.Load() {
		// Setup has not finished: cancelling makes the start loop give up.
		r.halted = true
		r.cut.Unlock()
		r.cp.mu.Unlock()
		r.cancel()
		<-r.life.done
		return
	}
	r.halted = true
	c, err := r.cp.takeCutLocked()
	if err == nil {
		r.cp.pending = append(r.cp.pending, c)
		err = r.cp.commitCuts(r.m.cfg.StopTimeout, nil)
	}
	if err != nil {
		r.log.Warn("final checkpoint not written; the previous one stays the recovery point", "err", err)
	}
	close(r.life.halt)
	r.cut.Unlock()
	r.cp.mu.Unlock()
	r.cancel()
	<-r.life.done
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
	r.cp.pending = nil
	cuts, n, err := r.m.store().Discard(r.name)
	if err != nil {
		r.log.Error("uncommitted state not discarded", "err", err)
		return
	}
	r.log.Warn("uncommitted state discarded; the next run replays from the last checkpoint",
		"frozen_cuts", cuts, "bytes", n)
}

func (r *route) pollLoop() {
	var pace pollPace // batch.go
	for {
		if !pace.wait(r) {
			return
		}
		fs, gen := r.pollOnce()
		if fs.IsClientClosed() || r.ctx.Err() != nil {
			return
		}
		pace.polled(!fs.Empty())
		// The task that runs the poll's last batch flushes its writes.
		pw := r.newPollWrites()
		fs.EachError(func(t string, p int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			r.noteError(fmt.Errorf("fetch %s[%d]: %w", t, p, err))
		})
		fs.EachPartition(func(ftp kgo.FetchTopicPartition) {
			t := r.taskFor(ftp.Topic, ftp.Partition, gen)
			if t == nil {
				return // released since the fetch, or fetched before a reset
			}
			if ftp.HighWatermark > 0 {
				if t.hwm.Swap(ftp.HighWatermark) != ftp.HighWatermark {
					r.noteLag()
				}
				lag := max(ftp.HighWatermark-r.tm.tracker.DoneOffset(t.id), 0)
				r.m.met.lag.WithLabelValues(r.name, t.label).Set(float64(lag))
			}
			if len(ftp.Records) == 0 {
				return
			}
			r.noteLag()
			// One hand-off per partition and fetch: records are passed on
			// the moment the fetch is decoded, without a channel operation
			// per record.
			pw.add()
			select {
			case t.ch <- taskBatch{recs: ftp.Records, poll: pw}:
			case <-t.stop:
				pw.done()
			case <-r.life.halt:
				pw.done()
			}
		})
		pw.done()
	}
}

// lagLoop refreshes the lag gauges once a second while they move: a
// fetch sees the lag before its records are done, so the gauge must also
// move without one. A tick that finds every task's lag and the watermark
// as the last one did puts the loop to rest (no timer) until a fetch, a
// finished batch or an assignment wakes it (noteLag): an idle route's lag
// loop woke once a second for nothing (docs/BENCHMARKS.md, "Footprint").
// The loop also describes the group's owners when asked (askOwners).
func (r *route) lagLoop() {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	var last lagView
	for {
		select {
		case <-r.life.halt:
			return
		case <-r.ownersWake:
			r.describeOwners()
			continue
		case <-r.lagWake:
			// Sent only by the noteLag that ended a rest.
			t.Reset(time.Second)
			continue
		case <-t.C:
		}
		if r.refreshLag(&last) {
			t.Reset(time.Second)
			continue
		}
		// Rest: from now on noteLag wakes the loop. What moved between the
		// refresh and the flag woke nothing: look once more.
		r.lagResting.Store(true)
		if r.refreshLag(&last) && r.lagResting.CompareAndSwap(true, false) {
			t.Reset(time.Second)
		}
	}
}

// lagView is what one lag tick saw: each task's lag and the lowest
// watermark.
type lagView struct {
	lags  map[*task]int64
	low   int64
	hasWM bool
}

// refreshLag sets the lag and watermark gauges; it reports whether any
// differs from what the last tick (last, updated) saw.
func (r *route) refreshLag(last *lagView) (changed bool) {
	var low int64
	has := false
	ts := r.tasksSnapshot()
	lags := make(map[*task]int64, len(ts))
	for _, t := range ts {
		lag := max(t.hwm.Load()-r.tm.tracker.DoneOffset(t.id), 0)
		r.m.met.lag.WithLabelValues(r.name, t.label).Set(float64(lag))
		lags[t] = lag
		if prev, ok := last.lags[t]; !ok || prev != lag {
			changed = true
		}
		if t.seg.keyed() && t.seg.timed {
			if wm, ok := t.wm.current(); ok && (!has || wm < low) {
				low, has = wm, true
			}
		}
	}
	if has {
		// The lowest watermark of this instance's windows: the one
		// that decides the next window to close.
		r.m.met.watermark.WithLabelValues(r.name).Set(float64(low) / 1000)
	}
	changed = changed || len(lags) != len(last.lags) || has != last.hasWM || low != last.low
	*last = lagView{lags: lags, low: low, hasWM: has}
	return changed
}

// noteLag wakes a resting lag loop: a fetch brought records or a new high
// watermark, a batch finished, or the tasks changed. While the loop ticks
// it costs one atomic load (it is called per batch: a channel send per
// batch woke the loop's goroutine for nothing); it never blocks.
func (r *route) noteLag() {
	if !r.lagResting.Load() || !r.lagResting.CompareAndSwap(true, false) {
		return
	}
	select {
	case r.lagWake <- struct{}{}:
	default:
	}
}

func partLabel(p int32) string { return strconv.Itoa(int(p)) }

// fetchMaxWait bounds how long a fetch waits for data. Brokers (and kfake)
// answer a fetch as soon as min-bytes 1 is met (read_committed: once the
// transaction commits), so this does not delay records; it only sets how
// often an idle route polls. A reassignment, SetOffsets or Close does not
// wait for it either: kgo cancels the fetch in flight (its connection is
// closed). 10ms (franz-go's floor) made idle routes cost measurable CPU on
// a 2-core machine; 250ms still woke each idle route four times a second,
// the largest share of an idle sidecar's wake-ups (docs/BENCHMARKS.md,
// "Footprint"). 5s is franz-go's default.
const fetchMaxWait = 5 * time.Second
