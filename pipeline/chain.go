package pipeline

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
	"github.com/rtproxy/rtproxy/state"
)

// ticket follows one source record through the steps and the sink. n counts
// what is still outstanding for it: one for each pass through a chain in
// progress and one for each output not yet acknowledged. When it reaches
// zero the record is done and the tracker learns it.
type ticket struct {
	r       *route
	p       int32
	off     int64
	fetched time.Time
	n       int32 // atomic
}

// chain is one instance of a run of consecutive steps: the steps a
// partition goroutine runs before the first stateful step, or the steps a
// worker runs from its stateful step to the next one. A chain is used by one
// goroutine only.
type chain struct {
	r     *route
	specs []*rules.StepSpec
	steps []operators.Step
	names []string // state/snapshot name of each step ("" when stateless)
	ems   []emitter
	drops []bool // count a Process that emits nothing as a drop
	cur   *ticket
	next  *stage // where records go after the last step; nil: the sink
}

// emitter is what step i of a chain emits into.
type emitter struct {
	c     *chain
	i     int
	label string // the step label used in metrics and dead letters
	emits int
	dls   int
}

func (e *emitter) Emit(rec *operators.Record) {
	e.emits++
	e.c.run(e.i+1, rec)
}

func (e *emitter) DeadLetter(rec *operators.Record, reason operators.Reason, err error) {
	e.dls++
	e.c.r.deadLetter(rec, reason, err, e.label, e.c.cur)
}

func (c *chain) run(i int, rec *operators.Record) {
	if i == len(c.steps) {
		if c.next != nil {
			c.next.send(c.r, rec, c.cur)
		} else {
			c.r.output(rec, c.cur)
		}
		return
	}
	e := &c.ems[i]
	emits, dls := e.emits, e.dls
	c.process(i, rec)
	if c.drops[i] && e.emits == emits && e.dls == dls {
		c.r.m.met.dropped.WithLabelValues(c.r.name, e.label).Inc()
	}
}

// process runs one step; a panicking step (a bug) costs one dead letter,
// never the route.
func (c *chain) process(i int, rec *operators.Record) {
	defer func() {
		if p := recover(); p != nil {
			c.r.deadLetter(rec, operators.ReasonError, fmt.Errorf("step panicked: %v", p), c.ems[i].label, c.cur)
		}
	}()
	c.steps[i].Process(rec, &c.ems[i])
}

// advance tells every Timed step of the chain that the watermark moved.
func (c *chain) advance(wm int64) {
	c.cur = nil
	for i, s := range c.steps {
		if t, ok := s.(operators.Timed); ok {
			func() {
				defer func() {
					if p := recover(); p != nil {
						c.r.noteError(fmt.Errorf("step %s: advance panicked: %v", c.ems[i].label, p))
					}
				}()
				t.Advance(wm, &c.ems[i])
			}()
		}
	}
}

func (c *chain) restore(cp *stateCheckpoint) error {
	for i, s := range c.steps {
		sf, ok := s.(operators.Stateful)
		if !ok || c.names[i] == "" {
			continue
		}
		rd := cp.Snapshot(c.names[i])
		if rd == nil {
			continue
		}
		if err := sf.Restore(rd); err != nil {
			return fmt.Errorf("restore step %s: %w", c.names[i], err)
		}
	}
	return nil
}

// memSnapshot is a step snapshot copied at the cut, written to pebble when
// the cut commits (by then the step has moved on).
type memSnapshot struct {
	kv    [][]byte // key, value, key, value, …
	bytes int64
}

func (m *memSnapshot) Put(k, v []byte) error {
	m.kv = append(m.kv, append([]byte(nil), k...), append([]byte(nil), v...))
	m.bytes += int64(len(k) + len(v))
	return nil
}

func (m *memSnapshot) writeTo(w state.Writer) error {
	for i := 0; i+1 < len(m.kv); i += 2 {
		if err := w.Put(m.kv[i], m.kv[i+1]); err != nil {
			return err
		}
	}
	return nil
}

func (c *chain) snapshotInto(into map[string]*memSnapshot) error {
	for i, s := range c.steps {
		sf, ok := s.(operators.Stateful)
		if !ok || c.names[i] == "" {
			continue
		}
		ms := &memSnapshot{}
		if err := sf.Snapshot(ms); err != nil {
			return fmt.Errorf("snapshot step %s: %w", c.names[i], err)
		}
		into[c.names[i]] = ms
	}
	return nil
}

// stage is a stateful step and the steps after it up to the next stateful
// one, run by cfg.Workers workers that each own the keys hashing to them.
type stage struct {
	first   int // index of the stateful step
	label   string
	keyed   operators.Keyed // worker 0's instance, for ShuffleKey
	workers []*worker
}

type msgKind uint8

const (
	msgRecord msgKind = iota
	msgBarrier
	msgWatermark
)

type msg struct {
	kind msgKind
	rec  *operators.Record
	tk   *ticket
	wm   int64
	from int
	ack  chan struct{}
}

type worker struct {
	idx   int
	st    *stage
	ch    chan msg
	chain *chain
	ups   []int64 // last watermark from each upstream sender
	wm    int64

	// Close journal (journal.go); journal is "" when the worker keeps none.
	journal string
	closer  closer
	applied map[int32]int64 // highest source offset applied, per partition
	jmu     sync.Mutex      // serialises journal writes (journalAfterAck)
	jwm     int64           // under jmu: watermark of the last journal written
}

// send hands rec to the worker owning its key, without waiting for it to be
// processed. The ticket gains a hold that the worker releases.
func (s *stage) send(r *route, rec *operators.Record, tk *ticket) {
	w := 0
	if s.keyed != nil && len(s.workers) > 1 {
		k, err := s.keyed.ShuffleKey(rec)
		if err != nil {
			r.deadLetter(rec, operators.ReasonError, err, s.label, tk)
			return
		}
		w = int(fnv32(k) % uint32(len(s.workers)))
	} else if s.keyed != nil {
		if _, err := s.keyed.ShuffleKey(rec); err != nil {
			r.deadLetter(rec, operators.ReasonError, err, s.label, tk)
			return
		}
	}
	if tk != nil {
		tk.hold()
	}
	s.workers[w].ch <- msg{kind: msgRecord, rec: rec, tk: tk}
}

// barrier waits until every worker has processed what was queued before it.
func (s *stage) barrier() {
	acks := make([]chan struct{}, len(s.workers))
	for i, w := range s.workers {
		acks[i] = make(chan struct{})
		w.ch <- msg{kind: msgBarrier, ack: acks[i]}
	}
	for _, a := range acks {
		<-a
	}
}

// watermark sends a new watermark to every worker, behind the records
// already queued, so windows close in order with the records.
func (s *stage) watermark(wm int64, from int) {
	for _, w := range s.workers {
		w.ch <- msg{kind: msgWatermark, wm: wm, from: from}
	}
}

func (w *worker) loop() {
	for m := range w.ch {
		switch m.kind {
		case msgRecord:
			if w.applied != nil && m.rec.Partition >= 0 && m.rec.Offset >= 0 {
				if a, ok := w.applied[m.rec.Partition]; !ok || m.rec.Offset > a {
					w.applied[m.rec.Partition] = m.rec.Offset
				}
			}
			w.chain.cur = m.tk
			w.chain.run(0, m.rec)
			w.chain.cur = nil
			if m.tk != nil {
				m.tk.release()
			}
		case msgBarrier:
			close(m.ack)
		case msgWatermark:
			// A stage fed by another stage advances at the minimum over its
			// upstream workers.
			if m.from >= 0 && m.from < len(w.ups) {
				w.ups[m.from] = max(w.ups[m.from], m.wm)
			}
			wm := m.wm
			if len(w.ups) > 1 {
				wm = w.ups[0]
				for _, u := range w.ups[1:] {
					wm = min(wm, u)
				}
			}
			if wm <= w.wm {
				continue
			}
			w.wm = wm
			closing := w.closer != nil && w.closer.ClosesAt(wm)
			w.chain.advance(wm)
			if closing {
				w.journalAfterAck(wm)
			}
			if w.chain.next != nil {
				w.chain.next.watermark(wm, w.idx)
			}
		}
	}
}

func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

func (t *ticket) hold() { atomicAdd(&t.n, 1) }

func (t *ticket) release() {
	if atomicAdd(&t.n, -1) == 0 {
		t.r.recordDone(t)
	}
}

func (r *route) recordDone(t *ticket) {
	r.tracker.Done(t.p, t.off)
	r.mProc.Observe(time.Since(t.fetched).Seconds())
}

// buildStages builds the partition chains and the worker stages.
func (r *route) buildStages(tables map[string]operators.Table, nparts int) error {
	d := r.def
	cfg := r.m.cfg
	var bounds []int
	for i := range d.Steps {
		if isBoundary(d.Steps[i].Kind) {
			bounds = append(bounds, i)
		}
	}
	r.seg0End = len(d.Steps)
	if len(bounds) > 0 {
		r.seg0End = bounds[0]
	}
	// Build stages back to front so each chain knows its next stage.
	var next *stage
	stages := make([]*stage, len(bounds))
	for bi := len(bounds) - 1; bi >= 0; bi-- {
		from, to := bounds[bi], len(d.Steps)
		if bi+1 < len(bounds) {
			to = bounds[bi+1]
		}
		st := &stage{first: from, label: stepLabel(&d.Steps[from])}
		ups := 1
		if bi > 0 {
			ups = cfg.Workers
		}
		for w := 0; w < cfg.Workers; w++ {
			c, err := r.buildChain(from, to, tables, w, next)
			if err != nil {
				return err
			}
			wk := &worker{idx: w, st: st, ch: make(chan msg, 1024), chain: c, ups: make([]int64, ups), wm: minWatermark}
			// Journal only where the window's rows leave this worker's chain
			// for the sink: rows handed to a later stage are produced by
			// other workers, after the acknowledgement the journal waits for.
			if cl, ok := c.steps[0].(closer); ok && bi == 0 && next == nil && c.names[0] != "" {
				wk.journal, wk.closer, wk.applied, wk.jwm = c.names[0], cl, map[int32]int64{}, minWatermark
			}
			for i := range wk.ups {
				wk.ups[i] = minWatermark
			}
			st.workers = append(st.workers, wk)
			for _, s := range c.steps {
				if _, ok := s.(operators.Timed); ok {
					r.timed = true
				}
			}
		}
		if k, ok := st.workers[0].chain.steps[0].(operators.Keyed); ok {
			st.keyed = k
		}
		stages[bi] = st
		next = st
	}
	r.stages = stages
	r.parts = make([]*partition, nparts)
	for p := range r.parts {
		c, err := r.buildChain(0, r.seg0End, tables, -1, next)
		if err != nil {
			return err
		}
		r.parts[p] = &partition{id: int32(p), ch: make(chan []*kgo.Record, 16), chain: c, label: partLabel(int32(p))}
		r.parts[p].mIn = r.m.met.recordsIn.WithLabelValues(r.name, r.parts[p].label)
	}
	return nil
}

// minWatermark is "no watermark yet".
const minWatermark = int64(-1) << 62

func stepLabel(s *rules.StepSpec) string { return fmt.Sprintf("%d:%s", s.Index, s.Kind) }

func (r *route) buildChain(from, to int, tables map[string]operators.Table, w int, next *stage) (*chain, error) {
	d := r.def
	c := &chain{r: r, next: next}
	for i := from; i < to; i++ {
		spec := &d.Steps[i]
		env := rules.BuildEnv{Tables: tables}
		name := ""
		if w >= 0 && isBoundary(spec.Kind) {
			name = r.workerStepName(spec, w)
			env.KV = r.m.db.Namespace(d.Name, name)
		}
		if spec.Build == nil {
			return nil, fmt.Errorf("route %q step %d (%s): not buildable", d.Name, spec.Index, spec.Kind)
		}
		s, err := spec.Build(env)
		if err != nil {
			return nil, fmt.Errorf("route %q step %d (%s): %w", d.Name, spec.Index, spec.Kind, err)
		}
		c.specs = append(c.specs, spec)
		c.steps = append(c.steps, s)
		c.names = append(c.names, name)
		c.drops = append(c.drops, spec.Kind != "window")
	}
	c.ems = make([]emitter, len(c.steps))
	for i := range c.ems {
		c.ems[i] = emitter{c: c, i: i, label: stepLabel(c.specs[i])}
	}
	return c, nil
}

var errNoEventTime = errors.New("event_time is not a number of epoch millis, an RFC 3339 string or a time")
