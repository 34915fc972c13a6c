package pipeline

// The Driver runs one route without brokers, for `rtproxy test`: the
// route's own tasks, chains, operators, repartition envelopes, watermark
// markers, sink encoding and dead letters, exactly as `rtproxy run` builds
// them, with two things replaced. Writes go to memory instead of Kafka
// (the Driver is the route's writer: writer.go), and time is a clock the test
// moves. Repartition topics become in-memory logs whose records are handed
// to their keyed task at once, in the order they were written; markers go
// the same way. Nothing is checkpointed: a test is one run from empty
// state.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/offsets"
	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
	"github.com/rtproxy/rtproxy/state"
)

// DriverConfig configures a Driver.
type DriverConfig struct {
	// Partitions is the number of source partitions (default 1); every
	// repartition topic gets as many, as setup would create them.
	Partitions int
	// Start is the clock's time when the route starts (default
	// 2026-01-01T00:00:00Z, so that runs are reproducible).
	Start time.Time
	// Tables replace the route's tables of the same name. A topic table
	// not replaced is empty.
	Tables map[string]operators.Table
	// Logger receives the route's logs; nil discards them.
	Logger *slog.Logger
}

// DriverInput is one source record.
type DriverInput struct {
	Partition int32
	// Offset is the record's offset; -1 takes the partition's next one.
	// An offset may skip ahead (a compacted topic), never go back.
	Offset    int64
	Key       []byte // nil: no key
	Value     []byte // nil: a tombstone
	Headers   []operators.Header
	Timestamp time.Time // zero: the clock's now
}

// DriverOutput is one record the route wrote to its sink or its
// dead-letter topic.
type DriverOutput struct {
	Topic      string
	DeadLetter bool
	Key        []byte
	Value      []byte
	Headers    []operators.Header
	Timestamp  time.Time
}

// Driver runs one route on records handed to it. It is not safe for
// concurrent use.
type Driver struct {
	r     *route
	dir   string
	now   time.Time
	next  []int64                    // next source offset per partition
	ends  map[string][]int64         // next offset per repartition partition, by topic
	queue []*kgo.Record              // repartition records not yet processed
	keyed map[string]map[int32]*task // keyed tasks by topic and partition
	src   []*task
	// other are the tasks of stream joins' second topics, and otherNext
	// their next offsets, by topic.
	other     map[string][]*task
	otherNext map[string][]int64
	out       []DriverOutput
	sinks     *sinkSet // the route's sinks, in memory
	// lastIn is the clock when the last record was sent (or the start).
	lastIn time.Time
	reg    *prometheus.Registry // the route's metrics
}

// DefaultDriverStart is where a Driver's clock starts by default.
var DefaultDriverStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// NewDriver builds def's tasks for every partition, with empty state.
func NewDriver(def *rules.Route, cfg DriverConfig) (*Driver, error) {
	if err := checkDefinition(def); err != nil {
		return nil, err
	}
	if def.UsesRegistry() {
		// A test gives and expects values as the tree Avro and Protobuf
		// decode into, the one the steps see; the schemas and the registry
		// are not part of it.
		cp := *def
		cp.Source.Format, cp.Source.DecodeMembers, cp.Sink.Format = rules.FormatJSON, false, rules.FormatJSON
		cp.Switch = slices.Clone(def.Switch)
		for i := range cp.Switch {
			cp.Switch[i].Sink.Format = rules.FormatJSON
		}
		def = &cp
	}
	if cfg.Partitions <= 0 {
		cfg.Partitions = 1
	}
	if cfg.Partitions >= maxTaskPartitions {
		return nil, fmt.Errorf("pipeline: %d partitions; at most %d are supported", cfg.Partitions, maxTaskPartitions-1)
	}
	if cfg.Start.IsZero() {
		cfg.Start = DefaultDriverStart
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	reg := prometheus.NewRegistry()
	met, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	// Keyed steps keep their state in pebble as they do in a run; a test's
	// store is a temporary directory, small and removed by Close.
	dir, err := os.MkdirTemp("", "rtproxy-test-state-")
	if err != nil {
		return nil, fmt.Errorf("pipeline: state for a test: %w", err)
	}
	db, err := state.OpenWithOptions(dir, cfg.Logger, state.Options{CacheBytes: 1 << 20, MemTableBytes: 4 << 20})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pipeline: state for a test: %w", err)
	}
	m := &Manager{cfg: Config{StateDir: dir, Logger: cfg.Logger}, log: cfg.Logger, met: met}
	m.db.Store(db)
	d := &Driver{dir: dir, now: cfg.Start, lastIn: cfg.Start, next: make([]int64, cfg.Partitions),
		ends: map[string][]int64{}, keyed: map[string]map[int32]*task{},
		other: map[string][]*task{}, otherNext: map[string][]int64{}, reg: reg}
	r := newRoute(m, def)
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.plan.clock = func() time.Time { return d.now }
	r.wr = d
	// Every kind of sink is memory here, named by its target.
	set, err := r.newSinkSet(func(spec *rules.Sink) sink { return topicSink{w: d, topic: spec.Target()} })
	if err != nil {
		db.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	r.snk, d.sinks = set, set
	d.r = r

	r.plan.tableOf = map[string]operators.Table{}
	for name, ts := range def.Tables {
		switch t, ok := cfg.Tables[name]; {
		case ok:
			r.plan.tableOf[name] = t
		case ts.Topic != "":
			r.plan.tableOf[name] = operators.NewMapTable()
		default:
			r.plan.tableOf[name] = ts.Table
		}
	}
	for name := range cfg.Tables {
		if _, ok := def.Tables[name]; !ok {
			d.Close()
			return nil, fmt.Errorf("route %q has no table %q", def.Name, name)
		}
	}
	parts := map[string]int{def.Source.Topic: cfg.Partitions}
	for i := range def.Steps {
		if isBoundary(&def.Steps[i]) {
			parts[repartitionTopic(def.Name, &def.Steps[i])] = cfg.Partitions
		}
		if in := def.Steps[i].Input; in != nil {
			parts[in.Topic] = cfg.Partitions
		}
	}
	if err := r.buildSegments(parts); err != nil {
		d.Close()
		return nil, err
	}
	r.tm.tracker = offsets.NewTracker()
	r.tm.tasks = map[int32]*task{}
	r.tm.byTopic = map[string]map[int32]*task{}
	for _, seg := range r.plan.segs {
		if seg.keyed() {
			d.keyed[seg.topic] = map[int32]*task{}
			d.ends[seg.topic] = make([]int64, seg.nparts)
		}
		for p := int32(0); p < int32(seg.nparts); p++ {
			t, err := r.newTask(seg, p, 0)
			if err == nil && seg.keyed() {
				err = r.buildTaskChain(t)
				// No close journal: it serves recovery, and a test is one
				// run from empty state.
				t.journal, t.closer, t.applied = "", nil, nil
			}
			if err != nil {
				d.Close()
				return nil, err
			}
			r.installTask(t)
			switch {
			case seg.other != nil:
				d.other[seg.topic] = append(d.other[seg.topic], t)
				d.otherNext[seg.topic] = append(d.otherNext[seg.topic], 0)
			case seg.idx == 0:
				d.src = append(d.src, t)
			default:
				d.keyed[seg.topic][p] = t
			}
		}
	}
	r.ready.Store(true)
	r.st.state = "running"
	return d, nil
}

// Now is the driver's clock.
func (d *Driver) Now() time.Time { return d.now }

// Send processes one source record and everything it causes downstream.
func (d *Driver) Send(in DriverInput) error {
	if in.Partition < 0 || int(in.Partition) >= len(d.next) {
		return fmt.Errorf("partition %d: the source has partitions 0 to %d", in.Partition, len(d.next)-1)
	}
	off := d.next[in.Partition]
	if in.Offset >= 0 {
		if in.Offset < off {
			return fmt.Errorf("offset %d on partition %d: offsets only go up (the next one is %d)", in.Offset, in.Partition, off)
		}
		off = in.Offset
	}
	d.next[in.Partition] = off + 1
	ts := in.Timestamp
	if ts.IsZero() {
		ts = d.now
	}
	kr := &kgo.Record{Topic: d.r.def.Source.Topic, Partition: in.Partition, Offset: off,
		Key: in.Key, Value: in.Value, Timestamp: ts}
	for _, h := range in.Headers {
		kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	t := d.src[in.Partition]
	d.lastIn = d.now
	t.processSource(kr)
	t.pos = off + 1
	d.r.mx.in.Add(1)
	d.settle()
	return nil
}

// StreamTopics are the second topics of the route's stream joins, which
// SendTo takes records of.
func (d *Driver) StreamTopics() []string {
	out := make([]string, 0, len(d.other))
	for t := range d.other {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// SendTo processes one record of a stream join's second topic and
// everything it causes downstream. A topic that is the route's source is
// Send.
func (d *Driver) SendTo(topic string, in DriverInput) error {
	if topic == d.r.def.Source.Topic {
		return d.Send(in)
	}
	ts, ok := d.other[topic]
	if !ok {
		return fmt.Errorf("topic %s: the route reads %s (its source) and %s", topic, d.r.def.Source.Topic, strings.Join(d.StreamTopics(), ", "))
	}
	next := d.otherNext[topic]
	if in.Partition < 0 || int(in.Partition) >= len(ts) {
		return fmt.Errorf("partition %d of %s: it has partitions 0 to %d", in.Partition, topic, len(ts)-1)
	}
	off := next[in.Partition]
	if in.Offset >= 0 {
		if in.Offset < off {
			return fmt.Errorf("offset %d on %s partition %d: offsets only go up (the next one is %d)", in.Offset, topic, in.Partition, off)
		}
		off = in.Offset
	}
	next[in.Partition] = off + 1
	stamp := in.Timestamp
	if stamp.IsZero() {
		stamp = d.now
	}
	kr := &kgo.Record{Topic: topic, Partition: in.Partition, Offset: off, Key: in.Key, Value: in.Value, Timestamp: stamp}
	for _, h := range in.Headers {
		kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	t := ts[in.Partition]
	d.lastIn = d.now
	t.processOther(kr)
	t.pos = off + 1
	d.r.mx.addOther(topic, 1)
	d.settle()
	return nil
}

// AdvanceWatermark moves the event-time frontier of every source partition
// (and every partition of a stream join's second topic) to at least wm
// (lateness already subtracted), as records with that event time would,
// and lets the steps react.
func (d *Driver) AdvanceWatermark(wm time.Time) {
	ms := wm.UnixMilli()
	inputs := append([]*task(nil), d.src...)
	for _, ts := range d.other {
		inputs = append(inputs, ts...)
	}
	for _, t := range inputs {
		t.front.Lock()
		if !t.front.has || ms > t.front.frontier {
			t.front.frontier, t.front.has = ms, true
		}
		t.front.sinceSent++
		t.front.Unlock()
	}
	d.settle()
}

// AdvanceIdle moves the clock by dur with no source record, ticking as the
// idle loop does while a route runs: idle partitions stop holding the
// watermark back, and a watermark with every partition idle moves at
// wall-clock speed.
//
// Once no record has come for idle_timeout and two ticks, every partition
// is idle and the watermark moves with the clock, so the rest of dur is one
// tick: a long advance costs no more than a short one.
func (d *Driver) AdvanceIdle(dur time.Duration) {
	step := d.r.idleInterval()
	settled := d.r.def.Source.IdleTimeout + 2*step
	for dur > 0 {
		s := min(step, dur)
		if d.now.Sub(d.lastIn) >= settled {
			s = dur
		}
		d.now = d.now.Add(s)
		dur -= s
		for _, t := range d.tasksInOrder() {
			d.r.idleTickTask(t, d.now)
		}
		d.settle()
	}
}

// Outputs returns what the route wrote so far, in the order written.
func (d *Driver) Outputs() []DriverOutput { return d.out }

// Metrics is the route's metrics as a run would export them (drops per
// step, dead letters, outputs per sink…), counted since the Driver started.
func (d *Driver) Metrics() prometheus.Gatherer { return d.reg }

// Errors returns the route's last error ("" when none), such as a
// watermark marker it could not read.
func (d *Driver) Errors() string {
	d.r.st.Lock()
	defer d.r.st.Unlock()
	return d.r.st.lastErr
}

// Close releases the driver's state.
func (d *Driver) Close() error {
	d.r.cancel()
	err := d.r.m.store().Close()
	if errors.Is(err, state.ErrBroken) {
		err = nil
	}
	if rerr := os.RemoveAll(d.dir); err == nil {
		err = rerr
	}
	return err
}

// send takes a route's write (the Driver is the route's writer, and its
// sink's: writer.go): outputs and dead letters are kept, repartition
// records and markers queued for their keyed task. Every write is
// acknowledged at once.
func (d *Driver) send(kr *kgo.Record, cb func(*kgo.Record, error)) {
	if ends, ok := d.ends[kr.Topic]; ok {
		p := markerOrKey{kgo.StickyKeyPartitioner(nil).ForTopic(kr.Topic)}.Partition(kr, len(ends))
		kr.Partition, kr.Offset = int32(p), ends[p]
		ends[p]++
		if kr.Timestamp.IsZero() {
			kr.Timestamp = d.now
		}
		d.queue = append(d.queue, kr)
		cb(kr, nil)
		return
	}
	if d.sinks.isOutputTopic(kr.Topic) || kr.Topic == deadLetterTopic(d.r.def) {
		o := DriverOutput{Topic: kr.Topic, DeadLetter: kr.Topic == deadLetterTopic(d.r.def),
			Key: kr.Key, Value: kr.Value, Timestamp: kr.Timestamp}
		if o.Timestamp.IsZero() {
			o.Timestamp = d.now // the producer's time, as kgo stamps it
		}
		for _, h := range kr.Headers {
			o.Headers = append(o.Headers, operators.Header{Key: h.Key, Value: h.Value})
		}
		d.out = append(d.out, o)
	}
	// Changelog records are written only at checkpoints, which a test
	// never takes.
	cb(kr, nil)
}

// retry never runs: no write of a Driver fails.
func (d *Driver) retry(*kgo.Record, func(*kgo.Record, error), error) bool { return false }

// flush: nothing lingers.
func (d *Driver) flush() {}

// changelog is never called: a test takes no checkpoint and assigns no
// partitions. Each record is acknowledged.
func (d *Driver) changelog(_ context.Context, recs []*kgo.Record, _ bool) (kgo.ProduceResults, error) {
	res := make(kgo.ProduceResults, len(recs))
	for i, kr := range recs {
		res[i] = kgo.ProduceResult{Record: kr}
	}
	return res, nil
}

func (d *Driver) aside(kr *kgo.Record, cb func(*kgo.Record, error)) { cb(kr, nil) }

// settle hands queued repartition records to their tasks until nothing is
// left, with a marker round (as the idle loop's) after each pass so that
// frontiers that moved reach the next segment.
func (d *Driver) settle() {
	for {
		for len(d.queue) > 0 {
			kr := d.queue[0]
			d.queue = d.queue[1:]
			t := d.keyed[kr.Topic][kr.Partition]
			t.processRepartitioned(kr)
			t.pos = kr.Offset + 1
		}
		for _, t := range d.tasksInOrder() {
			t.sendMarkers(d.now, true)
		}
		if len(d.queue) == 0 {
			return
		}
	}
}

// tasksInOrder lists the tasks by segment and partition, so that a run is
// reproducible.
func (d *Driver) tasksInOrder() []*task {
	ts := make([]*task, 0, len(d.r.tm.tasks))
	for _, t := range d.r.tm.tasks {
		ts = append(ts, t)
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].id < ts[j].id })
	return ts
}
