package pipeline

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

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

// chain is one task's instance of its segment's steps. A chain is used by
// one goroutine only.
type chain struct {
	r     *route
	t     *task
	specs []*rules.StepSpec
	steps []operators.Step
	names []string // state/snapshot name of each step ("" when stateless)
	ems   []emitter
	drops []bool // count a Process that emits nothing as a drop
	cur   *ticket
	next  *segment // where records go after the last step; nil: the sink
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
			c.t.repartition(rec, c.cur)
		} else {
			c.t.output(rec, c.cur)
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

// runOther hands a record of a stream join's second input to the
// chain's first step (the join), which emits into the steps after it.
func (c *chain) runOther(rec *operators.Record) {
	s, ok := c.steps[0].(operators.TwoInputs)
	if !ok {
		c.r.deadLetter(rec, operators.ReasonError, fmt.Errorf("step %s has no second input", c.ems[0].label), c.ems[0].label, c.cur)
		return
	}
	defer func() {
		if p := recover(); p != nil {
			c.r.deadLetter(rec, operators.ReasonError, fmt.Errorf("step panicked: %v", p), c.ems[0].label, c.cur)
		}
	}()
	s.ProcessOther(rec, &c.ems[0])
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

// advance tells every Timed step of the chain that the watermark moved;
// what they emit is held by tk (the marker or record that moved it; nil on
// an idle tick).
func (c *chain) advance(wm int64, tk *ticket) {
	c.cur = tk
	defer func() { c.cur = nil }()
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

// restore hands every stateful step its snapshot as pebble holds it.
func (c *chain) restore() error {
	for i, s := range c.steps {
		sf, ok := s.(operators.Stateful)
		if !ok || c.names[i] == "" {
			continue
		}
		rd := c.r.m.store().SnapshotReader(c.r.name, c.names[i])
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

func atomicAdd(p *int32, d int32) int32 { return atomic.AddInt32(p, d) }

func (t *ticket) hold() { atomicAdd(&t.n, 1) }

func (t *ticket) release() {
	if atomicAdd(&t.n, -1) == 0 {
		t.r.recordDone(t)
	}
}

func (r *route) recordDone(t *ticket) {
	r.tm.tracker.Done(t.p, t.off)
	r.mx.proc.Observe(time.Since(t.fetched).Seconds())
}

// minWatermark is "no watermark yet".
const minWatermark = int64(-1) << 62

func stepLabel(s *rules.StepSpec) string { return fmt.Sprintf("%d:%s", s.Index, s.Kind) }

// buildChain builds task t's instance of its segment's steps; a keyed step
// gets the task's own state namespace.
func (r *route) buildChain(t *task, tables map[string]operators.Table) (*chain, error) {
	d := r.def
	seg := t.seg
	c := &chain{r: r, t: t, next: seg.next}
	for i := seg.from; i < seg.to; i++ {
		spec := &d.Steps[i]
		env := rules.BuildEnv{Tables: tables}
		name := ""
		if i == seg.from && seg.keyed() {
			name = t.stepName
			env.KV = r.m.store().Namespace(d.Name, name)
		}
		if spec.Build == nil {
			return nil, fmt.Errorf("route %q step %d (%s): not buildable", d.Name, spec.Index, spec.Kind)
		}
		s, err := spec.Build(env)
		if err == nil {
			// The route was cut into segments by the traits: an instance
			// that does not have them would run in the wrong place.
			err = operators.CheckTraits(spec.Traits, s)
		}
		if err != nil {
			return nil, fmt.Errorf("route %q step %d (%s): %w", d.Name, spec.Index, spec.Kind, err)
		}
		c.specs = append(c.specs, spec)
		c.steps = append(c.steps, s)
		c.names = append(c.names, name)
		c.drops = append(c.drops, !spec.Traits.Absorbing)
	}
	c.ems = make([]emitter, len(c.steps))
	for i := range c.ems {
		c.ems[i] = emitter{c: c, i: i, label: stepLabel(c.specs[i])}
	}
	return c, nil
}

var errNoEventTime = errors.New("event_time is not a number of epoch millis, an RFC 3339 string or a time")
