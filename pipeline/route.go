package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
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
	// logCl is the route's non-group client: admin requests (grp.adm) and
	// changelog records (changelog.go, journal.go).
	logCl *kgo.Client
	// recreate: topics a write found missing (recreate.go).
	recreate struct {
		sync.Mutex
		created map[string]bool      // sink and dead-letter topics this run created
		last    map[string]time.Time // last recreation attempt per topic
	}

	m    *Manager
	def  *rules.Route
	log  *slog.Logger
	name string

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when the route has fully stopped
	halt   chan struct{} // closed once dispatch stopped for good

	// setupSince is when the first setup attempt began.
	setupSince time.Time
	// sourceWasMissing is set once setup found no source topic. A route
	// with start: latest that waited for its topic then starts at the
	// topic's beginning: everything in it was written after the route
	// began, and "latest" at the retry would skip what arrived since the
	// topic was created. Only the start goroutine touches it.
	sourceWasMissing bool

	cl      *kgo.Client // group consumer, and producer of every output
	tables  []*topicTable
	tableOf map[string]operators.Table
	tracker *offsets.Tracker
	segs    []*segment
	timed   bool // some step reacts to the watermark

	// tasks are the owned partitions; the map changes under cut.Lock only
	// (assignment, release), so holding cut.RLock reads it safely.
	tasks map[int32]*task
	tg    struct {
		sync.Mutex
		byTopic map[string]map[int32]*task // for the poll loop
	}
	grp groupState

	cut    sync.RWMutex
	halted bool        // under cut: set once by stop
	ready  atomic.Bool // setup done: parts, stages, tracker and cl are set

	cpMu        sync.Mutex  // one checkpoint (cut → commit) at a time; also held by a release
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

// taskStepName names the state of a keyed step in one partition of its
// repartition topic: state belongs to the partition, never to a worker or
// a process, so any instance that owns the partition can hold it.
func taskStepName(s *rules.StepSpec, part int32) string {
	return fmt.Sprintf("%s/p%d", stepName(s), part)
}

// inboxName names the snapshot of a keyed task's inbox (repartition.go).
func inboxName(s *rules.StepSpec, part int32) string { return taskStepName(s, part) + "/in" }

// isBoundary reports whether step s opens a segment of its own: a keyed
// step (operators.Keyed) reads through a repartition topic. The step says
// so by its type, not its kind name: a throwaway instance is built (Build
// never touches state; tables are not needed to build).
func isBoundary(s *rules.StepSpec) bool {
	st, err := s.Build(rules.BuildEnv{})
	if err != nil {
		return false
	}
	_, keyed := st.(operators.Keyed)
	return keyed
}

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
	ctx, cancel := context.WithTimeout(r.ctx, cfg.SetupTimeout)
	defer cancel()

	parts, created, err := ensureTopicsCreated(ctx, adm, d)
	if err != nil {
		return err
	}
	r.recreate.created = created
	nparts := parts[d.Source.Topic]

	// Topic tables are read to their end before the first source record, so
	// a join is right from the start.
	tables := map[string]operators.Table{}
	for name, ts := range d.Tables {
		if ts.Topic == "" {
			tables[name] = ts.Table
			continue
		}
		// The catch-up has no setup deadline: a large table takes as long
		// as it takes, with progress in the log (table.go).
		tt, err := openTopicTable(ctx, r.ctx, r, base, adm, ts)
		if err != nil {
			return err
		}
		r.tables = append(r.tables, tt)
		tables[name] = tt.table
	}
	r.tableOf = tables
	if len(d.Tables) > 0 {
		// The rest of setup gets its own deadline after the catch-up.
		cancel()
		ctx, cancel = context.WithTimeout(r.ctx, cfg.SetupTimeout)
		defer cancel()
	}
	if err := r.buildSegments(parts); err != nil {
		return err
	}

	// Changed steps (new fingerprint) start empty: their old namespaces are
	// dropped. Every partition's namespaces of an unchanged step stay, the
	// ones this instance does not own among them: it may own them again.
	keep := []string{kafkaStateStep}
	for _, seg := range r.segs[1:] {
		for q := int32(0); q < int32(max(seg.nparts, nparts)); q++ {
			keep = append(keep, taskStepName(seg.keyStep, q), inboxName(seg.keyStep, q))
		}
	}
	if err := r.m.db.DropStepsExcept(d.Name, keep); err != nil {
		return fmt.Errorf("route %q: drop changed steps: %w", d.Name, err)
	}
	prevSource, err := r.recordKafkaState()
	if err != nil {
		return err
	}
	cp, ok, err := r.m.db.LoadCheckpoint(d.Name)
	if err != nil {
		return fmt.Errorf("route %q: load checkpoint: %w", d.Name, err)
	}
	if ok && prevSource != "" && prevSource != d.Source.Topic {
		// The checkpoint's source offsets are positions in the old topic:
		// the new one starts where the group has committed it (never, or
		// when the route ran on it before), else at source.start.
		r.grp.sourceChanged = true
		r.log.Info("source topic changed; the checkpoint's offsets of the old topic are not used for the new one",
			"from", prevSource, "to", d.Source.Topic, "start", d.Source.Start)
	}
	if ok {
		r.grp.local = cp
		r.st.Lock()
		r.st.lastCheckpoint = cp.Time
		r.st.Unlock()
	}
	r.tracker = offsets.NewTracker()
	r.tasks = map[int32]*task{}
	r.tg.byTopic = map[string]map[int32]*task{}

	topics := []string{d.Source.Topic}
	manual := map[string]bool{}
	hashed := map[string]bool{}
	for _, seg := range r.segs[1:] {
		topics = append(topics, seg.topic)
		hashed[seg.topic] = true
		manual[seg.changelog] = true
	}
	// Batches never exceed a topic's max.message.bytes: a batch the broker
	// refuses as too large would take its well-sized records down with the
	// one that is too large, and a single record over the limit is then
	// refused alone, as a poison (produceTo).
	limits := batchLimits(ctx, adm, append([]string{d.Sink.Topic, deadLetterTopic(d)}, slices.Collect(maps.Keys(parts))...))
	// A broker unreachable for a minute of setup retries no longer holds
	// the protocol choice (groupProtocolOpts).
	if r.setupSince.IsZero() {
		r.setupSince = time.Now()
	}
	groupOpts, proto, err := groupProtocolOpts(ctx, adm, cfg.GroupProtocol, time.Since(r.setupSince) > time.Minute)
	if err != nil {
		return fmt.Errorf("route %q: %w", d.Name, err)
	}
	r.grp.protocol = proto
	opts := append(base, groupOpts...)
	opts = append(opts,
		kgo.ConsumerGroup(d.GroupID()),
		kgo.ConsumeTopics(topics...),
		kgo.DisableAutoCommit(),
		kgo.SessionTimeout(cfg.SessionTimeout),
		kgo.OnOffsetsFetched(r.onOffsetsFetched),
		kgo.AdjustFetchOffsetsFn(r.adjustOffsets),
		kgo.OnPartitionsAssigned(r.onAssigned),
		kgo.OnPartitionsRevoked(r.onRevoked),
		kgo.OnPartitionsLost(r.onLost),
		// Partitions added to the source are seen within this.
		kgo.MetadataMaxAge(cfg.MetadataMaxAge),
		kgo.RecordPartitioner(routePartitioner{
			manual: func(t string) bool { return manual[t] },
			hashed: func(t string) bool { return hashed[t] },
		}),
		kgo.ProducerBatchMaxBytesFn(limits.of),
		kgo.FetchMaxWait(fetchMaxWait),
		kgo.FetchMinBytes(1),
		kgo.ProducerLinger(0),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordDeliveryTimeout(10*time.Second),
		kgo.WithHooks(&connHook{r: r}),
	)
	if r.log.Enabled(r.ctx, slog.LevelDebug) {
		// The client's own account of the group (joins, heartbeats,
		// assignments) at log_level debug.
		opts = append(opts, kgo.WithLogger(kgoLogger{r.log.With("component", "kgo")}))
	}
	// The route's own non-group client exists before the group client
	// starts: the group calls adjustOffsets (which lists offsets through
	// r.grp.adm) as soon as it joins. It also writes changelog records: a
	// checkpoint logs every key it changed at once, and through the group
	// client that burst would queue ahead of the repartition records,
	// adding its time to their latency.
	r.logCl, err = kgo.NewClient(append(append([]kgo.Opt(nil), base...),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchMaxBytesFn(limits.of),
		kgo.ProducerLinger(0),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordDeliveryTimeout(10*time.Second),
	)...)
	if err != nil {
		return fmt.Errorf("route %q: client: %w", d.Name, err)
	}
	r.grp.adm = kadm.NewClient(r.logCl)
	r.cl, err = kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("route %q: client: %w", d.Name, err)
	}

	return nil
}

// buildSegments cuts the route's steps at each keyed step (ARCHITECTURE.md).
func (r *route) buildSegments(parts map[string]int) error {
	d := r.def
	seg := &segment{idx: 0, topic: d.Source.Topic, from: 0, nparts: parts[d.Source.Topic]}
	r.segs = []*segment{seg}
	for i := range d.Steps {
		s := &d.Steps[i]
		if !isBoundary(s) {
			continue
		}
		seg.to = i
		next := &segment{idx: len(r.segs), topic: repartitionTopic(d.Name, s), from: i, keyStep: s,
			changelog: changelogTopic(d.Name, s)}
		next.nparts = parts[next.topic]
		if next.nparts >= maxTaskPartitions {
			return fmt.Errorf("route %q: %s has %d partitions; at most %d are supported", d.Name, next.topic, next.nparts, maxTaskPartitions-1)
		}
		seg.next = next
		seg = next
		r.segs = append(r.segs, seg)
	}
	seg.to = len(d.Steps)
	// Which segments react to the watermark: ask a throwaway instance of
	// each step (state is never touched by Build).
	for _, sg := range r.segs {
		for i := sg.from; i < sg.to; i++ {
			st, err := d.Steps[i].Build(rules.BuildEnv{Tables: r.tableOf})
			if err != nil {
				return fmt.Errorf("route %q step %d (%s): %w", d.Name, d.Steps[i].Index, d.Steps[i].Kind, err)
			}
			if _, ok := st.(operators.Timed); ok {
				sg.timed, r.timed = true, true
			}
		}
	}
	// A segment's writers send watermark markers only when a segment after
	// it reacts to the watermark: markers to untimed steps would only cost
	// produce and fetch.
	for i := len(r.segs) - 2; i >= 0; i-- {
		next := r.segs[i+1]
		r.segs[i].markers = next.timed || next.markers
	}
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
	if r.logCl != nil {
		r.logCl.Close()
		r.logCl = nil
	}
	r.segs, r.tasks = nil, nil
}

// ensureTopics checks the source and creates what is missing of the sink,
// the dead-letter topic, and each keyed step's repartition topic and
// compacted changelog topic, each with the source's partition count. It
// returns every topic's partition count.
func ensureTopics(ctx context.Context, adm *kadm.Client, d *rules.Route) (map[string]int, error) {
	parts, _, err := ensureTopicsCreated(ctx, adm, d)
	return parts, err
}

// ensureTopicsCreated is ensureTopics that also says which topics it
// created.
func ensureTopicsCreated(ctx context.Context, adm *kadm.Client, d *rules.Route) (map[string]int, map[string]bool, error) {
	dlq := deadLetterTopic(d)
	want := []string{d.Sink.Topic, dlq}
	compact := map[string]bool{}
	for i := range d.Steps {
		if s := &d.Steps[i]; isBoundary(s) {
			want = append(want, repartitionTopic(d.Name, s), changelogTopic(d.Name, s))
			compact[changelogTopic(d.Name, s)] = true
		}
	}
	md, err := adm.Metadata(ctx, append([]string{d.Source.Topic}, want...)...)
	if err != nil {
		return nil, nil, fmt.Errorf("route %q: metadata: %w", d.Name, err)
	}
	src, ok := md.Topics[d.Source.Topic]
	if !ok || errors.Is(src.Err, kerr.UnknownTopicOrPartition) || (src.Err == nil && len(src.Partitions) == 0) {
		return nil, nil, fmt.Errorf("route %q: source topic %s: %w", d.Name, d.Source.Topic, errSourceMissing)
	}
	if src.Err != nil {
		return nil, nil, fmt.Errorf("route %q: source topic %s: %w", d.Name, d.Source.Topic, src.Err)
	}
	n := len(src.Partitions)
	parts := map[string]int{d.Source.Topic: n}
	created := map[string]bool{}
	for _, t := range want {
		if td, ok := md.Topics[t]; ok && td.Err == nil && len(td.Partitions) > 0 {
			parts[t] = len(td.Partitions)
			continue
		}
		var cfgs map[string]*string
		if compact[t] {
			pol := "compact"
			cfgs = map[string]*string{"cleanup.policy": &pol}
		}
		resp, err := adm.CreateTopic(ctx, int32(n), -1, cfgs, t)
		if err == nil {
			err = resp.Err
		}
		if err != nil && !errors.Is(err, kerrTopicExists) {
			return nil, nil, fmt.Errorf("route %q: create topic %s: %w", d.Name, t, err)
		}
		parts[t] = n
		if err == nil {
			created[t] = true
		}
		if errors.Is(err, kerrTopicExists) {
			// Created by another instance a moment ago: ask its real size.
			if md2, err := adm.Metadata(ctx, t); err == nil && len(md2.Topics[t].Partitions) > 0 {
				parts[t] = len(md2.Topics[t].Partitions)
			}
		}
	}
	return parts, created, nil
}

// defaultBatchMaxBytes is franz-go's default record batch limit, used for
// topics whose max.message.bytes could not be read.
const defaultBatchMaxBytes = 1_000_012

// topicLimits is max.message.bytes by topic.
type topicLimits map[string]int32

// of is topic's limit, franz-go's default for a topic that was not read.
func (l topicLimits) of(topic string) int32 {
	if v, ok := l[topic]; ok {
		return v
	}
	return defaultBatchMaxBytes
}

// batchLimits reads max.message.bytes of topics. A topic it cannot read
// keeps the default limit: the worst case is a poison batch, retried.
func batchLimits(ctx context.Context, adm *kadm.Client, topics []string) topicLimits {
	out := topicLimits{}
	rcs, err := adm.DescribeTopicConfigs(ctx, topics...)
	if err != nil {
		return out
	}
	for _, rc := range rcs {
		if rc.Err != nil {
			continue
		}
		for _, c := range rc.Configs {
			if c.Key != "max.message.bytes" || c.Value == nil {
				continue
			}
			if n, err := strconv.ParseInt(*c.Value, 10, 64); err == nil {
				out[rc.Name] = int32(min(max(n, 512), 1<<30))
			}
		}
	}
	return out
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

// run is the route's life after setup: the poll loop, the checkpoint, idle
// and lag tickers; the tasks come and go with the group's assignments. It
// returns when the route is stopped.
func (r *route) run() {
	defer close(r.done)
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
	for _, t := range r.tasksSnapshot() {
		<-t.done
	}
	twg.Wait()
	for _, t := range r.tables {
		t.close()
	}
	// Leaves the group: the final checkpoint (stop) committed the offsets
	// already, so the partitions' next owners repeat nothing.
	r.cl.Close()
	if r.logCl != nil {
		r.logCl.Close()
	}
	r.prodCancel()
	r.m.met.partitionsOwned.WithLabelValues(r.name).Set(0)
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
			t := r.taskAt(ftp.Topic, ftp.Partition)
			if t == nil {
				return // released since the fetch
			}
			if ftp.HighWatermark > 0 {
				t.hwm.Store(ftp.HighWatermark)
				lag := max(ftp.HighWatermark-r.tracker.DoneOffset(t.id), 0)
				r.m.met.lag.WithLabelValues(r.name, t.label).Set(float64(lag))
			}
			if len(ftp.Records) == 0 {
				return
			}
			// One hand-off per partition and fetch: records are passed on
			// the moment the fetch is decoded, without a channel operation
			// per record.
			select {
			case t.ch <- ftp.Records:
			case <-t.stop:
			case <-r.halt:
			}
		})
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
			var low int64
			has := false
			for _, t := range r.tasksSnapshot() {
				lag := max(t.hwm.Load()-r.tracker.DoneOffset(t.id), 0)
				r.m.met.lag.WithLabelValues(r.name, t.label).Set(float64(lag))
				if t.seg.idx > 0 && t.seg.timed {
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
		if len(r.pendingCuts) > 0 {
			// The last commit failed (brokers refused the changelog, the
			// disk is full): commit what is pending before cutting again,
			// so at most one cut (with its copies of snapshots) waits.
			if err := r.commitCuts(0, r.stopping); err != nil {
				r.cpMu.Unlock()
				if !errors.Is(err, errStopping) {
					r.noteError(fmt.Errorf("checkpoint: %w", err))
				}
				continue
			}
		}
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
	tasks  []*task
	epoch  int64
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
func (r *route) takeCutLocked() (*cutPoint, error) {
	c := &cutPoint{t0: time.Now(), offs: make(map[int32]int64, len(r.tasks)), snaps: map[string]*memSnapshot{}}
	for _, t := range r.tasks {
		c.offs[t.id] = t.pos
		c.tasks = append(c.tasks, t)
		if t.seg.idx == 0 {
			continue
		}
		if err := t.chain.snapshotInto(c.snaps); err != nil {
			return nil, err
		}
		c.snaps[t.inboxName] = t.inboxSnapshot()
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
// acknowledged: changelog, then pebble, then the group. limit bounds the
// wait (0: none); abort ends it early.
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
		if err := r.logChanges(c); err != nil {
			return err
		}
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
		if strings.HasSuffix(si.Step, "/in") {
			bytes += si.KVBytes + si.SnapBytes
			continue // a task's inbox: bookkeeping, not the step's keys
		}
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
	s.Group = d.GroupID()
	s.Protocol = r.grp.protocol
	s.Owned = []OwnedPartition{}
	r.grp.mu.Lock()
	s.Restore = RestoreStatus{State: "idle", Records: r.grp.mu.restored, Seconds: r.grp.mu.restoreS}
	if r.grp.mu.restoring > 0 {
		s.Restore.State = "restoring"
	}
	r.grp.mu.Unlock()
	select {
	case <-r.done:
		return s
	default:
	}
	if !r.ready.Load() {
		return s
	}
	if cl := r.cl; cl != nil {
		_, s.Generation = cl.GroupMetadata()
	}
	tr := r.tracker
	ts := r.tasksSnapshot()
	slices.SortFunc(ts, func(a, b *task) int { return int(a.id) - int(b.id) })
	var low int64
	hasWM := false
	for _, t := range ts {
		done := tr.DoneOffset(t.id)
		hwm := t.hwm.Load()
		lag := max(hwm-done, 0)
		s.Owned = append(s.Owned, OwnedPartition{Topic: t.seg.topic, Partition: t.part, DoneOffset: done, Lag: lag})
		if t.seg.idx == 0 {
			s.Partitions = append(s.Partitions, PartitionStatus{Partition: t.part, DoneOffset: done, HighWatermark: hwm, Lag: lag})
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
