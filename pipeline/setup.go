package pipeline

// Route setup: the route's topics (checked, the missing ones created), its
// segments and state namespaces, its clients; and the teardown of a setup
// that failed.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/offsets"
	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
)

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
// step reads through a repartition topic. Its spec's traits say so, never
// its kind name.
func isBoundary(s *rules.StepSpec) bool { return s.Traits.Keyed }

func (r *route) setup() error {
	if err := r.setupCheck(); err != nil {
		return err
	}
	s, err := r.newSetupEnv()
	if err != nil {
		return err
	}
	defer s.close()
	parts, err := r.setupTopics(s)
	if err != nil {
		return err
	}
	if err := r.setupTables(s); err != nil {
		return err
	}
	if err := r.buildSegments(parts); err != nil {
		return err
	}
	if err := r.setupState(parts); err != nil {
		return err
	}
	return r.setupClients(s, parts)
}

// setupEnv is what setup's phases share: the base client options, the
// instance's shared client (shared.go), and the deadline of the phase.
type setupEnv struct {
	base   []kgo.Opt
	admCl  *kgo.Client
	adm    *kadm.Client
	ctx    context.Context
	cancel context.CancelFunc
	parent context.Context
	limit  time.Duration
}

func (r *route) newSetupEnv() (*setupEnv, error) {
	cfg := r.m.cfg
	s := &setupEnv{base: clientBase(cfg), parent: r.ctx, limit: cfg.SetupTimeout}
	cl, adm, err := r.m.shared.get(s.base)
	if err != nil {
		return nil, fmt.Errorf("route %q: %w", r.name, err)
	}
	s.admCl, s.adm = cl, adm
	s.ctx, s.cancel = context.WithTimeout(s.parent, s.limit)
	return s, nil
}

// clientBase is the start of every pipeline client's options: the seeds,
// no KIP-714 client metrics, then the configured options (TLS, SASL).
// A broker that asks for client metrics (kfake does, and Kafka with a
// telemetry plugin) got them from every client every push interval, each
// client with a gzip compressor of its own: at rest they were 80% of the
// quickstart's Go heap, 7 MiB for six clients (docs/BENCHMARKS.md,
// "Footprint"). The pipeline's clients are the sidecar's own, not the
// application's: their metrics are on /metrics.
func clientBase(cfg Config) []kgo.Opt {
	return append([]kgo.Opt{kgo.SeedBrokers(cfg.Seeds...), kgo.DisableClientMetrics()}, cfg.ClientOpts...)
}

// renew gives the phases that follow a deadline of their own.
func (s *setupEnv) renew() {
	s.cancel()
	s.ctx, s.cancel = context.WithTimeout(s.parent, s.limit)
}

func (s *setupEnv) close() {
	s.cancel() // the shared client stays for every route
}

// setupCheck refuses a definition the pipeline cannot run, and a state
// store that cannot checkpoint.
func (r *route) setupCheck() error {
	d := r.def
	if err := checkDefinition(d); err != nil {
		return err
	}
	// The first route to start opens the state store (statestore.go); a
	// failed open is this setup's error, and the next try opens again.
	db, err := r.m.openState()
	if err != nil {
		return fmt.Errorf("route %q: %w", d.Name, err)
	}
	if err := db.Broken(); err != nil {
		// Nothing could be checkpointed: the route waits in state error
		// for a restart of the process.
		return fmt.Errorf("route %q: %w", d.Name, err)
	}
	return nil
}

// setupTopics checks the source and creates the topics the route writes
// to; it returns every topic's partition count.
func (r *route) setupTopics(s *setupEnv) (map[string]int, error) {
	d := r.def
	parts, created, err := ensureTopicsCreated(s.ctx, s.adm, d)
	if err != nil {
		return nil, err
	}
	r.recreate.created = created
	if len(created) > 0 {
		// The shared client cached them as unknown a moment ago (the
		// Metadata above): its next sharded request on them (the group's
		// first ListOffsets of a new repartition topic) would be refused
		// for up to metadata_min_age.
		s.admCl.PurgeTopicsFromClient(slices.Collect(maps.Keys(created))...)
	}

	return parts, nil
}

// setupTables reads topic tables to their end.
func (r *route) setupTables(s *setupEnv) error {
	d := r.def
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
		tt, err := openTopicTable(s.ctx, r.ctx, r, s.base, s.adm, ts)
		if err != nil {
			return err
		}
		r.plan.tables = append(r.plan.tables, tt)
		tables[name] = tt.table
	}
	r.plan.tableOf = tables
	if len(d.Tables) > 0 {
		// The rest of setup gets its own deadline after the catch-up.
		s.renew()
	}
	return nil
}

// setupState drops the state of changed steps, loads the checkpoint and
// makes the task manager ready for assignments.
func (r *route) setupState(parts map[string]int) error {
	d := r.def
	// Changed steps (new fingerprint) start empty: their old namespaces are
	// dropped. Every partition's namespaces of an unchanged step stay, the
	// ones this instance does not own among them: it may own them again.
	keep := []string{kafkaStateStep, txnInstanceStep}
	for _, seg := range r.keyedSegs() {
		for q := int32(0); q < int32(max(seg.nparts, parts[d.Source.Topic])); q++ {
			keep = append(keep, taskStepName(seg.keyStep, q), inboxName(seg.keyStep, q))
		}
	}
	if err := r.m.store().DropStepsExcept(d.Name, keep); err != nil {
		return fmt.Errorf("route %q: drop changed steps: %w", d.Name, err)
	}
	prevSource, err := r.recordKafkaState()
	if err != nil {
		return err
	}
	cp, ok, err := r.m.store().LoadCheckpoint(d.Name)
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
	r.tm.tracker = offsets.NewTracker()
	r.tm.tasks = map[int32]*task{}
	r.tm.byTopic = map[string]map[int32]*task{}

	return nil
}

// groupOpts are the options of the route's group client: the group, its
// topics, the partitioner of repartition and changelog records, batch
// limits, the protocol, and the transaction of an exactly-once route.
func (r *route) groupOpts(s *setupEnv, parts map[string]int) ([]kgo.Opt, topicLimits, error) {
	d := r.def
	cfg := r.m.cfg
	topics := []string{d.Source.Topic}
	manual := map[string]bool{}
	hashed := map[string]bool{}
	for _, seg := range r.plan.segs[1:] {
		topics = append(topics, seg.topic)
		if seg.keyed() {
			hashed[seg.topic] = true
			manual[seg.changelog] = true
		}
	}
	// Batches never exceed a topic's max.message.bytes: a batch the broker
	// refuses as too large would take its well-sized records down with the
	// one that is too large, and a single record over the limit is then
	// refused alone, as a poison (produceTo).
	limits := batchLimits(s.ctx, s.adm, slices.Collect(maps.Keys(parts)))
	// A broker unreachable for a minute of setup retries no longer holds
	// the protocol choice (groupProtocolOpts).
	if r.life.setupSince.IsZero() {
		r.life.setupSince = time.Now()
	}
	groupOpts, proto, err := groupProtocolOpts(s.ctx, s.adm, cfg.GroupProtocol, time.Since(r.life.setupSince) > time.Minute)
	if err != nil {
		return nil, nil, fmt.Errorf("route %q: %w", d.Name, err)
	}
	r.grp.protocol.Store(&proto)
	opts := append(append([]kgo.Opt(nil), s.base...), groupOpts...)
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
		// Writes wait for their poll's flush, at most this long (batch.go).
		kgo.ProducerLinger(r.writeLinger()),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// No delivery timeout: franz-go measures it from a record's
		// timestamp, and outputs carry their source record's (an hour old
		// when a route replays an hour), so any retry would time out at
		// once. A write is retried until it succeeds, fails for itself
		// (poison, unknown topic: produceTo) or the route stops; the
		// sink's health comes from connHook.
		kgo.WithHooks(&connHook{r: r}),
	)
	if d.Sink.ExactlyOnce() {
		txo, err := r.txnOpts()
		if err != nil {
			return nil, nil, fmt.Errorf("route %q: %w", d.Name, err)
		}
		opts = append(opts, txo...)
	}
	if r.log.Enabled(r.ctx, slog.LevelDebug) {
		// The client's own account of the group (joins, heartbeats,
		// assignments) at log_level debug.
		opts = append(opts, kgo.WithLogger(kgoLogger{r.log.With("component", "kgo")}))
	}
	return opts, limits, nil
}

// setupClients builds the route's clients (the group consumer last: it may
// hand out partitions at once), its writer and its sink.
func (r *route) setupClients(s *setupEnv, parts map[string]int) error {
	d := r.def
	opts, limits, err := r.groupOpts(s, parts)
	if err != nil {
		return err
	}
	// The instance's shared client is the route's non-group client
	// (shared.go), there before the group client starts: the group calls
	// adjustOffsets (which lists offsets through r.grp.adm) as soon as it
	// joins. It also writes changelog records: a checkpoint logs every key
	// it changed at once, and through the group client that burst would
	// queue ahead of the repartition records, adding its time to their
	// latency.
	r.m.shared.addLimits(limits)
	r.logCl, r.grp.adm = s.admCl, s.adm
	// The group starts with the client and may hand out partitions at
	// once; for an exactly-once route their tasks must find a transaction
	// open, so they wait on cut until it is.
	r.cut.Lock()
	r.cl, err = kgo.NewClient(opts...)
	if err == nil {
		err = r.newWriter()
	}
	r.cut.Unlock()
	if err != nil {
		return fmt.Errorf("route %q: client: %w", d.Name, err)
	}
	if r.txn.on {
		if err := r.initTxn(s.ctx); err != nil {
			return err
		}
	}

	return nil
}

// buildSegments cuts the route's steps at each keyed step (ARCHITECTURE.md).
func (r *route) buildSegments(parts map[string]int) error {
	d := r.def
	seg := &segment{idx: 0, topic: d.Source.Topic, from: 0, nparts: parts[d.Source.Topic], sourceShaped: true}
	r.plan.segs = []*segment{seg}
	shaped := true // no step has replaced the value yet
	for i := range d.Steps {
		s := &d.Steps[i]
		reshapes := !s.Traits.SourceShaped()
		if !isBoundary(s) {
			shaped = shaped && !reshapes
			continue
		}
		seg.to = i
		next := &segment{idx: len(r.plan.segs), topic: repartitionTopic(d.Name, s), from: i, keyStep: s,
			changelog: changelogTopic(d.Name, s), sourceShaped: shaped, hold: s.Traits.HoldsWatermark}
		shaped = shaped && !reshapes
		next.nparts = parts[next.topic]
		if next.nparts >= maxTaskPartitions {
			return fmt.Errorf("route %q: %s has %d partitions; at most %d are supported", d.Name, next.topic, next.nparts, maxTaskPartitions-1)
		}
		seg.next = next
		seg = next
		r.plan.segs = append(r.plan.segs, seg)
	}
	seg.to = len(d.Steps)
	// Which segments react to the watermark: their steps' traits say.
	for _, sg := range r.plan.segs {
		for i := sg.from; i < sg.to; i++ {
			if d.Steps[i].Traits.Timed {
				sg.timed, r.plan.timed = true, true
			}
		}
	}
	// A segment's writers send watermark markers only when a segment after
	// it reacts to the watermark: markers to untimed steps would only cost
	// produce and fetch.
	for i := len(r.plan.segs) - 2; i >= 0; i-- {
		next := r.plan.segs[i+1]
		r.plan.segs[i].markers = next.timed || next.markers
	}
	// The second topics of stream joins: segments of their own, after
	// the keyed ones (otherinput.go).
	return r.addOtherInputs(parts)
}

// keyedSegs are the segments that open at a keyed step.
func (r *route) keyedSegs() []*segment {
	var out []*segment
	for _, s := range r.plan.segs {
		if s.keyed() {
			out = append(out, s)
		}
	}
	return out
}

// teardown releases what a failed setup opened.
func (r *route) teardown() {
	for _, t := range r.plan.tables {
		t.close()
	}
	r.plan.tables = nil
	if r.cl != nil {
		r.cl.Close()
		r.cl = nil
	}
	r.logCl = nil // the instance's (shared.go): closed by the Manager
	if r.snk != nil {
		r.snk.close()
	}
	r.plan.segs, r.tm.tasks, r.wr, r.snk = nil, nil, nil, nil
}

// newWriter picks the route's writer and sink for its delivery
// (writer.go); cut is held. An exactly-once route's first transaction
// begins here.
func (r *route) newWriter() error {
	if r.txn.on {
		if err := r.cl.BeginTransaction(); err != nil {
			return r.txnRefused(err)
		}
		r.wr = &txnWriter{r: r, cl: r.cl, logCl: r.logCl, ctx: r.out.ctx, txn: &r.txn}
		r.cp.mode = exactlyOnce{}
	} else {
		r.wr = &kafkaWriter{r: r, cl: r.cl, logCl: r.logCl, ctx: r.out.ctx, batched: r.m.cfg.BatchWindow > 0}
	}
	snk, err := r.newSink()
	if err != nil {
		return err
	}
	r.snk = snk
	return nil
}

var kerrTopicExists = kerr.TopicAlreadyExists

// ensureTopics checks the source and creates what is missing of the sink,
// the dead-letter topic, and each keyed step's repartition topic and
// compacted changelog topic, each with the source's partition count. It
// returns every topic's partition count.
func ensureTopics(ctx context.Context, adm *kadm.Client, d *rules.Route) (map[string]int, error) {
	parts, _, err := ensureTopicsCreated(ctx, adm, d)
	return parts, err
}

// ensureTopicsCreated is ensureTopics that also says which topics were
// missing: true for those it created, false for those another instance
// created meanwhile.
func ensureTopicsCreated(ctx context.Context, adm *kadm.Client, d *rules.Route) (map[string]int, map[string]bool, error) {
	dlq := deadLetterTopic(d)
	want := []string{dlq}
	want = append(want, d.SinkTopics()...) // a sink of another kind has no topic
	compact := map[string]bool{}
	var inputs []string // second topics of stream joins: read, never created
	for i := range d.Steps {
		if s := &d.Steps[i]; isBoundary(s) {
			want = append(want, repartitionTopic(d.Name, s), changelogTopic(d.Name, s))
			compact[changelogTopic(d.Name, s)] = true
			if s.Input != nil {
				inputs = append(inputs, s.Input.Topic)
			}
		}
	}
	md, err := adm.Metadata(ctx, append(append([]string{d.Source.Topic}, inputs...), want...)...)
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
	for _, t := range inputs {
		in, ok := md.Topics[t]
		if !ok || errors.Is(in.Err, kerr.UnknownTopicOrPartition) || (in.Err == nil && len(in.Partitions) == 0) {
			return nil, nil, fmt.Errorf("route %q: stream topic %s: %w", d.Name, t, errSourceMissing)
		}
		if in.Err != nil {
			return nil, nil, fmt.Errorf("route %q: stream topic %s: %w", d.Name, t, in.Err)
		}
		parts[t] = len(in.Partitions)
	}
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
		// Every topic that was missing is a key (the shared client's
		// cache is purged of them); true when this call created it.
		created[t] = err == nil
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
